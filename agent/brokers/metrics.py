"""``akri_broker_pod_count{configuration,node}`` (Akri's controller metric), from the mirror."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from agent.brokers.queries import broker_pod_counts


class BrokerCollector:
    def describe(self) -> list[Metric]:
        return []  # registering must not touch the database

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "akri_broker_pod_count",
            "Broker pods by Configuration and node (Akri's metric)",
            labels=["configuration", "node"],
        )
        for (configuration, node), n in sorted(broker_pod_counts().items()):
            gauge.add_metric([configuration, node], n)
        yield gauge
