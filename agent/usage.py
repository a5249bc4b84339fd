"""Slot usage and release latency over time: the samples behind the dashboard's charts.

``sample()`` counts held, free and foreign slots per Configuration, cluster-wide and as each
node sees them, into this minute's ``UsageSample`` rows (a later sample of the same minute
replaces them, so sampling more often than once a minute costs no rows). The leading controller
calls it every ``AKRI_USAGE_SAMPLE_SECONDS`` (``UsageSampler``), so the demo's charts fill from
its own cluster. ``record_release()`` is the agent's side: each release adds its latency to its
node's ``ReleaseSample`` of the minute. ``prune()`` drops both past ``AKRI_USAGE_HISTORY_HOURS``
in batches, as ``agent.retention`` does.

Counting is done by the database (GROUP BY), never by reading every slot: the controller of a
40,000-Instance cluster samples without holding its cache writers up.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, close_old_connections, transaction
from django.db.models import Count, F, Q
from django.db.models.functions import Greatest
from django.utils import timezone

from agent.dbthreads import start_thread
from agent.models import Instance, ReleaseSample, Slot, UsageSample

log = logging.getLogger(__name__)
BATCH = 2000
HELD = Q(level__in=(Slot.Level.IL, Slot.Level.CL))
FREE = Q(level=Slot.Level.FREE)
FOREIGN = Q(level=Slot.Level.FOREIGN)


def minute_of(at: datetime) -> int:
    return int(at.timestamp()) // 60


def counts() -> dict[tuple[str, str, str], dict[str, int]]:
    """{(namespace, configuration, node): {"held", "free", "foreign"}}; node "" = cluster-wide."""
    out: dict[tuple[str, str, str], dict[str, int]] = defaultdict(
        lambda: {"held": 0, "free": 0, "foreign": 0}
    )
    per_instance = (
        Slot.objects.order_by()
        .values("instance_id")
        .annotate(
            held=Count("id", filter=HELD),
            free=Count("id", filter=FREE),
            foreign=Count("id", filter=FOREIGN),
        )
    )
    by_instance = {row["instance_id"]: row for row in per_instance}
    instances = Instance.objects.order_by().values_list(
        "id", "namespace", "configuration_name", "nodes"
    )
    for pk, namespace, configuration, nodes in instances:
        row = by_instance.get(pk)
        if row is None:
            continue
        total = out[(namespace, configuration, "")]
        for state in ("held", "free", "foreign"):
            total[state] += row[state]
        # Each node that sees the Instance sees its free and foreign slots.
        for node in set(nodes or ()):
            seen = out[(namespace, configuration, node)]
            seen["free"] += row["free"]
            seen["foreign"] += row["foreign"]
    held = (
        Slot.objects.order_by()
        .filter(HELD)
        .exclude(holder_node="")
        .values_list("instance__namespace", "instance__configuration_name", "holder_node")
        .annotate(n=Count("id"))
    )
    for namespace, configuration, node, n in held:
        out[(namespace, configuration, node)]["held"] += n
    return dict(out)


def sample(now: datetime | None = None) -> int:
    """Record this minute's counts (replacing an earlier sample of it); how many rows."""
    minute = minute_of(now or timezone.now())
    rows = [
        UsageSample(minute=minute, namespace=ns, configuration=conf, node=node, **values)
        for (ns, conf, node), values in counts().items()
    ]
    with transaction.atomic():
        UsageSample.objects.filter(minute=minute).delete()
        UsageSample.objects.bulk_create(rows, batch_size=BATCH)
    return len(rows)


def record_release(node: str, seconds: float, now: datetime | None = None) -> None:
    """Add one release's latency to ``node``'s row of this minute."""
    record_releases(node, [seconds], now)


def record_releases(node: str, seconds: Sequence[float], now: datetime | None = None) -> None:
    """Add releases' latencies to ``node``'s row of this minute, in one statement for all (a
    storm's releases come by the hundred)."""
    if not seconds:
        return
    minute = minute_of(now or timezone.now())
    all_ms = [max(0.0, s * 1000.0) for s in seconds]
    n, total_ms, max_ms = len(all_ms), sum(all_ms), max(all_ms)
    for _ in range(2):  # a row made by another writer in between: update that one
        updated = ReleaseSample.objects.filter(node=node, minute=minute).update(
            releases=F("releases") + n,
            total_ms=F("total_ms") + total_ms,
            max_ms=Greatest(F("max_ms"), max_ms),
        )
        if updated:
            return
        try:
            with transaction.atomic():
                ReleaseSample.objects.create(
                    node=node, minute=minute, releases=n, total_ms=total_ms, max_ms=max_ms
                )
            return
        except IntegrityError:
            continue


def prune(now: datetime | None = None) -> int:
    """Drop samples past ``AKRI_USAGE_HISTORY_HOURS``, in batches; how many."""
    hours = float(settings.AKRI["USAGE_HISTORY_HOURS"])
    cutoff = minute_of((now or timezone.now()) - timedelta(hours=hours))
    deleted = 0
    for model in (UsageSample, ReleaseSample):
        while True:
            batch = list(
                model.objects.filter(minute__lt=cutoff).values_list("pk", flat=True)[:BATCH]
            )
            if not batch:
                break
            deleted += model.objects.filter(pk__in=batch).delete()[0]
    return deleted


class UsageSampler:
    """The controller's sampling loop: a sample at start, then every interval; prune hourly."""

    PRUNE_SECONDS = 3600.0

    def __init__(self, interval: float | None = None) -> None:
        self.interval = float(interval or settings.AKRI["USAGE_SAMPLE_SECONDS"])
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> UsageSampler:
        self._thread = start_thread(self._run, "usage-sampler")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def step(self, pruned_at: float | None) -> float | None:
        """One sample (and a prune when due); returns when it last pruned."""
        try:
            sample()
            now = timezone.now().timestamp()
            if pruned_at is None or now - pruned_at >= self.PRUNE_SECONDS:
                prune()
                return now
        except Exception:  # the database away: the next interval tries again
            log.warning("usage sampler: sample failed", exc_info=True)
        return pruned_at

    def _run(self) -> None:
        pruned_at = None
        try:
            while True:
                pruned_at = self.step(pruned_at)
                if self._stop.wait(self.interval):
                    return
        finally:
            close_old_connections()
