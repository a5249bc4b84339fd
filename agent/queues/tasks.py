"""Celery tasks of queue charges: thin wrappers around ``agent.queues.recompute``.

Recomputing is idempotent and label writes are create-only, so a task that runs twice, or
beside another replica's, changes nothing more than one run would. That is what lets both
retry (``agent.retrying.RETRY``) when the database is away or the API server fails in passing.
"""

from __future__ import annotations

from celery import shared_task

from agent.queues import history, recompute
from agent.retrying import RETRY, ApiAway


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True, **RETRY)
def recompute_charges(keys: list[str] | None = None, trigger: str = "schedule") -> int:
    """Recompute the named claims (all when None); on a full pass, record the interval."""
    from agent.kube.client import new_api_client

    api_client = new_api_client()
    try:
        outcome = recompute.recompute(keys, api_client=api_client)
    finally:
        api_client.close()
    if keys is None:
        history.sample()
    if outcome.written:
        from agent.queues.live import publish

        publish()
    if outcome.api_away:
        # The charges are stored; the owner labels the API server could not take now are
        # written by the retry.
        raise ApiAway(outcome.api_away)
    return outcome.decided


@shared_task(ignore_result=True, **RETRY)
def prune_charge_samples() -> int:
    return history.prune_samples()
