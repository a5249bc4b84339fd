"""The Celery app: cluster-wide reconciliation and broker deployment run here."""

import contextlib
import os
from collections.abc import Iterator

from celery import Celery

from akri_site import celery_metrics, env

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "akri_site.settings")

app = Celery("akri_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# The worker program serves /metrics with its pool children's series: set up now, before the
# worker imports its tasks (akri_site.celery_metrics says why).
if celery_metrics.worker_program():
    celery_metrics.install()

# The safety net behind the controller's node events: a pass every interval. A run that
# waited longer than one interval in the queue is dropped (the next one is as good), and the
# pass itself takes a lock, so beat and event-triggered runs never overlap.
CLUSTER_RECONCILE_SECONDS = env.number("AKRI_CLUSTER_RECONCILE_SECONDS", 30.0, minimum=1)
# Reconciliation history past its retention (agent.retention) goes once an hour.
PRUNE_SECONDS = 3600.0
# Broker deployment's repair pass (agent.brokers): a deleted broker comes back, a Pending one
# past its grace is replaced, objects of a deleted Configuration go.
BROKER_PASS_SECONDS = env.number("AKRI_BROKER_PASS_SECONDS", 30.0, minimum=1)
BEAT_SCHEDULE = {
    "reconcile-cluster": {
        "task": "agent.tasks.reconcile_cluster",
        "schedule": CLUSTER_RECONCILE_SECONDS,
        "kwargs": {"trigger": "schedule"},
        "options": {"expires": CLUSTER_RECONCILE_SECONDS},
    },
    "prune-runs": {
        "task": "agent.tasks.prune_runs",
        "schedule": PRUNE_SECONDS,
        "options": {"expires": PRUNE_SECONDS},
    },
    "broker-level-pass": {
        "task": "agent.brokers.tasks.level_pass",
        "schedule": BROKER_PASS_SECONDS,
        "options": {"expires": BROKER_PASS_SECONDS},
    },
}

# Queue charges (agent/queues): a full recompute and a history sample every interval, on top
# of the controller's debounced recomputes on change; samples past retention go hourly.
# (Assigned whole: reading app.conf here would load the settings before they are checked.)
QUEUE_RECOMPUTE_SECONDS = env.number("AKRI_QUEUE_RECOMPUTE_SECONDS", 30.0, minimum=1)
QUEUE_SCHEDULE = {
    "queue-charges": {
        "task": "agent.queues.tasks.recompute_charges",
        "schedule": QUEUE_RECOMPUTE_SECONDS,
        "kwargs": {"trigger": "schedule"},
        "options": {"expires": QUEUE_RECOMPUTE_SECONDS},
    },
    "prune-charge-samples": {
        "task": "agent.queues.tasks.prune_charge_samples",
        "schedule": PRUNE_SECONDS,
        "options": {"expires": PRUNE_SECONDS},
    },
}

app.conf.beat_schedule = {**BEAT_SCHEDULE, **QUEUE_SCHEDULE}


@contextlib.contextmanager
def on_broker(url: str, queue: str) -> Iterator[str]:
    """Send tasks to ``queue`` on the broker at ``url`` for a while, whatever the settings say
    (the benchmarks' and the tests' in-thread workers). The app's producer pools stay bound to
    the broker they were built for, the settings' ``memory://`` in the embedded default: they
    are dropped on the way in and out, else a task sent meanwhile goes where no worker is."""
    saved = {k: app.conf[k] for k in ("broker_url", "task_always_eager", "task_default_queue")}
    app.conf.update(broker_url=url, task_always_eager=False, task_default_queue=queue)
    _drop_producer_pools()
    try:
        yield queue
    finally:
        app.conf.update(saved)
        _drop_producer_pools()


def _drop_producer_pools() -> None:
    # What Celery itself does after a fork (``Celery._after_fork``), without its signal. The
    # pools stay open in kombu's registry, which hands the same one out again for its URL.
    app._pool = None
    if "amqp" in app.__dict__:
        app.amqp._producer_pool = None
