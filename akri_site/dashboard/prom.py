"""``/metrics``: this process's series plus gauges computed from the cache at scrape time.

The cache gauges live in their own registry, so that importing this module elsewhere never
makes another process's metrics endpoint query the database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

import agent.metrics  # noqa: F401  (registers the per-process series, websocket clients included)
from agent.brokers.metrics import BrokerCollector
from agent.exporter import bearer_matches
from agent.models import Instance, Slot, SyncState
from agent.queues.metrics import QueueCollector
from akri_site.dashboard.slotmap import STUCK_KINDS, slot_state, stuck_counts

SLOT_STATES = ("free", "held", "foreign", "surplus")


class CacheCollector:
    """Counts from the ORM cache, read when Prometheus scrapes."""

    def describe(self) -> list[Metric]:
        # Describing without collecting: registering must not touch the database.
        return []

    def collect(self) -> Iterator[Metric]:
        instances = GaugeMetricFamily(
            "akri_instance_count",
            "Akri Instances by Configuration and sharing (Akri's metric)",
            labels=["configuration", "is_shared"],
        )
        counts: dict[tuple[str, str], int] = {}
        for conf, shared in Instance.objects.values_list("configuration_name", "shared"):
            key = (conf, "true" if shared else "false")
            counts[key] = counts.get(key, 0) + 1
        for labels, n in sorted(counts.items()):
            instances.add_metric(list(labels), n)
        yield instances
        yield from self._slots()
        yield self._stuck()
        yield self._sync()

    def _slots(self) -> Iterator[Metric]:
        slots = GaugeMetricFamily(
            "akri_slots",
            "deviceUsage slots by Configuration and state; surplus slots (beyond capacity) "
            "are counted as surplus only, so states add up to all slots",
            labels=["configuration", "state"],
        )
        held = GaugeMetricFamily(
            "akri_slots_held",
            "Held slots by Configuration and level (IL: per-Instance plugin, CL: per-Configuration)",
            labels=["configuration", "level"],
        )
        by_state: dict[str, dict[str, int]] = {}
        by_level: dict[str, dict[str, int]] = {}
        rows = Slot.objects.values_list("instance__configuration_name", "level", "surplus")
        for conf, level, surplus in rows:
            state = "surplus" if surplus else slot_state(level)
            states = by_state.setdefault(conf, dict.fromkeys(SLOT_STATES, 0))
            states[state] += 1
            if level in ("IL", "CL"):
                levels = by_level.setdefault(conf, {"IL": 0, "CL": 0})
                levels[level] += 1
        for conf, states in sorted(by_state.items()):
            for state, n in states.items():
                slots.add_metric([conf, state], n)
        for conf, levels in sorted(by_level.items()):
            for level, n in levels.items():
                held.add_metric([conf, level], n)
        return iter((slots, held))

    def _stuck(self) -> Metric:
        # The overview's "Stuck" box, for alerting (deploy/extras/prometheus: slots held too
        # long, or without a pod past the grace period).
        stuck = GaugeMetricFamily(
            "akri_slots_stuck",
            "Slots that need a person, by reason: old (held longer than AKRI_STUCK_AFTER_HOURS),"
            " no-pod (no pod known past the grace period), foreign, conflict (last hour)",
            labels=["reason"],
        )
        for reason, n in stuck_counts().items():
            if reason in STUCK_KINDS:  # not "stuck", their union
                stuck.add_metric([reason], n)
        return stuck

    def _sync(self) -> Metric:
        age = GaugeMetricFamily(
            "akri_cache_sync_age_seconds",
            "Seconds since each watcher last synced the cache",
            labels=["owner", "kind"],
        )
        now = timezone.now()
        for owner, kind, synced_at in SyncState.objects.values_list("owner", "kind", "synced_at"):
            if synced_at is not None:
                age.add_metric([owner, kind], (now - synced_at).total_seconds())
        return age


CACHE_REGISTRY = CollectorRegistry(auto_describe=False)
CACHE_REGISTRY.register(CacheCollector())
# Queue charges (agent/queues): akri_queue_charge{queue,resource} and friends.
CACHE_REGISTRY.register(QueueCollector())
CACHE_REGISTRY.register(BrokerCollector())  # akri_broker_pod_count (agent.brokers)


def authorized(request: HttpRequest) -> bool:
    """With ``METRICS_TOKEN`` set, the scraper must send it as a bearer token (the same rule
    as the other processes' ``/metrics``, agent.exporter)."""
    return bearer_matches(request.headers.get("Authorization", ""), settings.METRICS_TOKEN)


def _process_registry() -> CollectorRegistry:
    """This process's series, or every web worker's summed when runweb runs several."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    if not authorized(request):
        response = HttpResponse(
            "a bearer token is required\n", status=401, content_type="text/plain"
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    # The classic text format (0.0.4): every Prometheus version scrapes it.
    body = generate_latest(_process_registry()) + generate_latest(CACHE_REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
