"""A Celery beat scheduler that sends tasks only while it leads the ``akri-site-beat`` Lease.

Run every beat replica with it (``celery -A akri_site beat -S agent.leader.beat:LeaderScheduler``);
exactly one sends, the others tick idle as candidates. Entries are not advanced while idle,
so a replica that takes over sends whatever fell due at once: the cluster pass and the pruning
are idempotent, and a late run is what the schedule wants anyway.

Why a scheduler rather than a lock around each task: the guard sits at the one place beat
sends (``apply_entry``), the worker side needs nothing, and a deposed beat stops at its next
send, before its Lease could be taken (``LeaderElector.is_leading`` is time-based). The
schedule is kept in memory: pods have no state to share, and the persistent shelve file of
the default scheduler would want a writable volume for nothing.
"""

from __future__ import annotations

import logging

from celery.beat import Scheduler

from agent.leader import BEAT_LEASE, configured_timing
from agent.leader.election import LeaderElector

log = logging.getLogger(__name__)


class LeaderScheduler(Scheduler):
    """Celery's in-memory scheduler, gated on a Lease."""

    elector: LeaderElector | None = None

    def setup_schedule(self) -> None:
        super().setup_schedule()
        if self.elector is None:
            self.elector = self._new_elector().start()

    def _new_elector(self) -> LeaderElector:
        from django.conf import settings

        from agent.kube.client import new_api_client

        namespace = settings.AKRI["NAMESPACE"]
        return LeaderElector(new_api_client(), namespace, BEAT_LEASE, timing=configured_timing())

    def tick(self, *args, **kwargs) -> float:
        if self.elector is not None and not self.elector.is_leading():
            return min(self.elector.timing.retry_period, self.max_interval)
        return super().tick(*args, **kwargs)

    def apply_entry(self, entry, producer=None) -> None:
        # The fence: tick() may have checked before this thread was paused for a while.
        if self.elector is not None and not self.elector.is_leading():
            log.info("beat: not the leader; %s left to the leader", entry.name)
            return
        super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        if self.elector is not None:
            self.elector.stop()
        super().close()
