"""Celery tasks of queue charges: thin wrappers around ``agent.queues.recompute``.

Recomputing is idempotent and label writes are create-only, so a task that runs twice, or
beside another replica's, changes nothing more than one run would.
"""

from __future__ import annotations

from celery import shared_task

from agent.queues import history, recompute


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
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
    return outcome.decided


@shared_task(ignore_result=True)
def prune_charge_samples() -> int:
    return history.prune_samples()
