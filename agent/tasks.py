"""Celery tasks: thin wrappers that unpack arguments and call a module function.

Tasks are acknowledged late and may run twice after a crash; what they call is idempotent
(conditional writes, re-read on conflict) and guarded by a lock against overlapping runs.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from agent import reconcile_cluster as cluster
from agent import retention
from agent.models import ReconcileRun
from agent.retrying import RETRY

# With RETRY, a task that meets the database away (restarting, failing over) or the API server
# failing in passing runs again later, backing off, until it is back or the task's expiry
# passes (beat's runs expire after one interval). Every task of the project takes it.


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True, **RETRY)
def reconcile_cluster(
    self, namespace: str | None = None, trigger: str = ReconcileRun.Trigger.SCHEDULE
) -> int | None:
    """One cluster-wide reconciliation pass; the ReconcileRun id, or None when skipped."""
    run = cluster.run_cluster_pass(
        namespace or settings.AKRI["NAMESPACE"],
        trigger=trigger,
        lock_url=str(self.app.conf.broker_url or ""),
        task_id=self.request.id or "",
    )
    return run.pk if run is not None else None


@shared_task(ignore_result=True, **RETRY)
def prune_runs() -> int:
    """Drop reconciliation runs past their retention (see ``agent.retention``)."""
    return retention.prune_runs()
