"""Prometheus metrics of the agent, the reconcilers, the Celery tasks and the live fan-out.

Per-process series live in prometheus_client's default registry, and each process serves its
own: the web on ``/metrics`` of its port, with gauges computed from the cache added (see the
dashboard's ``/metrics`` view); the agent, the controller and the Celery worker on
``METRICS_PORT`` (``agent.exporter``). Prometheus sums them; no process sees another's.
"""

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

ALLOCATE_SECONDS = Histogram(
    "akri_allocate_seconds",
    "Time to answer a kubelet Allocate call, claims included",
    ["level"],
    buckets=_LATENCY_BUCKETS,
)
CLAIM_SECONDS = Histogram(
    "akri_claim_write_seconds",
    "Time of one conditional claim or release write through the claim store",
    ["op"],
    buckets=_LATENCY_BUCKETS,
)
RELEASE_LATENCY_SECONDS = Histogram(
    "akri_release_latency_seconds",
    "From a pod's deletion or termination being seen to its slot free in the API server",
    buckets=_LATENCY_BUCKETS,
)
RECONCILE_RUNS = Counter("akri_reconcile_runs_total", "Reconciliation runs", ["scope", "trigger"])
RECONCILE_SLOTS = Counter(
    "akri_reconcile_slots_total",
    "Slots changed or found by reconciliation",
    ["scope", "result"],  # released, restored, conflict, error
)
# livesum: with several web workers (``runweb``), the sum over the workers alive.
WEBSOCKET_CLIENTS = Gauge(
    "akri_websocket_clients", "Connected dashboard websocket clients", multiprocess_mode="livesum"
)

# Liveness that an open port alone does not prove. The agent's event loop, which serves every
# device plugin's gRPC, stamps this each time round its kubelet check (every half second): an
# agent that is scraped but stuck shows as an old stamp, one that is gone as no stamp at all.
AGENT_HEARTBEAT = Gauge(
    "akri_agent_heartbeat_timestamp_seconds",
    "When this node's agent event loop last ran (Unix time)",
    ["node"],
    multiprocess_mode="max",
)
# The controller replicas: 1 on the one that leads (runs the watchers), 0 on those waiting. A
# sum of 0 over every replica means nobody watches the cluster into the cache.
LEADER = Gauge(
    "akri_leader",
    "1 while this process leads its Lease, else 0",
    ["lease"],
    multiprocess_mode="livemax",
)
# Celery tasks (reconciliation, brokers, queue charges), counted by the worker's signals
# (akri_site.celery_metrics): a task that still raised after its retries, and each retry.
TASK_FAILURES = Counter(
    "akri_task_failures_total", "Celery tasks that ended with an exception", ["task"]
)
TASK_RETRIES = Counter("akri_task_retries_total", "Celery task retries", ["task"])
CACHE_BATCH_FALLBACKS = Counter(
    "akri_cache_batch_fallbacks_total",
    "Batches of watched changes that failed as one transaction and were applied one by one",
    ["owner"],
)
