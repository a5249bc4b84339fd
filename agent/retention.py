"""How long reconciliation history is kept.

Every sweep (every 10 s per node by default) records a run, so uneventful runs pile up at
thousands a day per node. Those that changed nothing are pruned once older than
``AKRI["RUN_RETENTION_HOURS"]``; runs that released, restored, or met a conflict or an error,
and any run a slot event points to, are kept: they are the history an operator reads. Deleted
in small batches, so a database with one writer at a time (SQLite) is never held for long.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from agent.models import ReconcileRun

BATCH = 500


def prune_runs(*, node: str | None = None, now: datetime | None = None) -> int:
    """Delete uneventful runs older than the retention (only ``node``'s, if given); how many."""
    hours = float(settings.AKRI["RUN_RETENTION_HOURS"])
    cutoff = (now or timezone.now()) - timedelta(hours=hours)
    old = ReconcileRun.objects.filter(
        started_at__lt=cutoff,
        released=0,
        restored=0,
        conflicts=0,
        errors=0,
        events__isnull=True,
    )
    if node is not None:
        old = old.filter(scope=ReconcileRun.Scope.NODE, node=node)
    deleted = 0
    while True:
        batch = list(old.values_list("pk", flat=True)[:BATCH])
        if not batch:
            return deleted
        deleted += ReconcileRun.objects.filter(pk__in=batch).delete()[0]
