"""Prometheus metrics recorded by the agent, the reconciler and the live fan-out.

Per-process series live in prometheus_client's default registry; the web process adds
gauges computed from the cache (see the dashboard's ``/metrics`` view).
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
