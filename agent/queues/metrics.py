"""``/metrics`` gauges of queue charges, computed from the charge cache at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric


class QueueCollector:
    def describe(self) -> list[Metric]:
        return []  # registering must not touch the database

    def collect(self) -> Iterator[Metric]:
        from agent.queues import history
        from agent.queues.models import Charge

        totals = history.queue_totals()
        charge = GaugeMetricFamily(
            "akri_queue_charge",
            "Devices a queue is charged for (it owns them), by resource",
            labels=["queue", "resource"],
        )
        owned = GaugeMetricFamily(
            "akri_queue_claims_owned", "Claims a queue owns", labels=["queue"]
        )
        uses = GaugeMetricFamily(
            "akri_queue_uses_of_others",
            "Claims of other owners a queue's pods use",
            labels=["queue"],
        )
        lent = GaugeMetricFamily(
            "akri_queue_used_by_others",
            "A queue's claims that other queues' pods use",
            labels=["queue"],
        )
        for queue, row in totals.items():
            for resource, n in row["charged"].items():
                charge.add_metric([queue, resource], n)
            owned.add_metric([queue], row["owned"])
            uses.add_metric([queue], row["uses_of_others"])
            lent.add_metric([queue], row["used_by_others"])
        uncharged = GaugeMetricFamily(
            "akri_queue_uncharged",
            "Accounted devices in use that no queue pays for (orphans deducted, unknown owners)",
            labels=["resource"],
        )
        for resource, n in history.uncharged_by_resource().items():
            uncharged.add_metric([resource], n)
        by_source = GaugeMetricFamily(
            "akri_queue_claims", "Claims by how their owner was decided", labels=["source"]
        )
        counts: dict[str, int] = {}
        for source in Charge.objects.values_list("source", flat=True):
            counts[source] = counts.get(source, 0) + 1
        for source, n in sorted(counts.items()):
            by_source.add_metric([source], n)
        yield from (charge, owned, uses, lent, uncharged, by_source)
