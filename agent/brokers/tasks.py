"""Celery tasks of broker deployment: one task, keyed by what it covers (see ``dispatch``).

Acknowledged late (a crashed worker's run is redelivered: the work is idempotent), retried
with backoff on API errors (``engine.Retry``, 0.5 s doubling to 60 s) and when the database is
away (``agent.retrying.RETRY``, as every task), and serialized per key by a Redis lock: a run
that finds its key locked retries shortly, after the run holding it.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from agent.brokers import dispatch, engine
from agent.brokers.models import BrokerAction
from agent.retrying import RETRY

log = logging.getLogger(__name__)

API_RETRIES = 10
BUSY_SECONDS = 0.5


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True, **RETRY)
def run_brokers(self, key: str) -> dict | None:
    """Bring the objects ``key`` covers to what Akri's rules want."""
    lock_url = str(self.app.conf.broker_url or "")
    dispatch.clear_pending(lock_url, key)  # events from now on enqueue a run after this one
    try:
        outcome = dispatch.run_key(key, lock_url)
    except dispatch.Busy:
        raise self.retry(countdown=BUSY_SECONDS, max_retries=None) from None
    except engine.Retry as exc:
        log.warning("brokers: %s: %s; retrying", key, exc)
        raise self.retry(
            countdown=dispatch.backoff(self.request.retries), max_retries=API_RETRIES
        ) from exc
    return {"created": outcome.created, "deleted": outcome.deleted, "error": outcome.error}


@shared_task(ignore_result=True, **RETRY)
def level_pass(namespace: str | None = None) -> None:
    """Beat's repair pass: enqueued like any other key, so it is serialized the same way.
    Broker history older than the reconciliation history's retention goes at the same time."""
    dispatch.Dispatcher().level(namespace or settings.AKRI["NAMESPACE"])
    prune_actions()


def prune_actions() -> int:
    hours = float(settings.AKRI["RUN_RETENTION_HOURS"])
    cutoff = timezone.now() - timedelta(hours=hours)
    deleted, _ = BrokerAction.objects.filter(at__lt=cutoff).delete()
    return deleted
