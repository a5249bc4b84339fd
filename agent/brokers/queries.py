"""What the pages show of brokers, read from the mirror (``Broker``) and the history."""

from __future__ import annotations

from typing import Any

from django.db.models import Count

from agent.brokers.models import Broker, BrokerAction, ConfigurationBrokers
from agent.domain import brokers as rules


def last_actions(namespace: str, names: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """The newest action per (kind, name), one query."""
    if not names:
        return {}
    kinds = {k for k, _ in names}
    rows = BrokerAction.objects.filter(
        namespace=namespace, kind__in=kinds, name__in=[n for _, n in names]
    ).order_by("kind", "name", "-at", "-pk")
    latest: dict[tuple[str, str], Any] = {}
    for row in rows:
        latest.setdefault((row.kind, row.name), row)
    return latest


def instance_brokers(namespace: str, instance: str, configuration: str) -> dict[str, Any]:
    """The Instance's brokers (by node), its Service and its Configuration's Service."""
    rows = list(
        Broker.objects.filter(namespace=namespace, instance=instance).order_by("node", "name")
    )
    conf_svc = Broker.objects.filter(
        namespace=namespace,
        kind=Broker.Kind.SERVICE,
        name=rules.configuration_service_name(configuration),
    ).first()
    services = [r for r in rows if r.kind == Broker.Kind.SERVICE] + ([conf_svc] if conf_svc else [])
    workloads = [r for r in rows if r.kind != Broker.Kind.SERVICE]
    actions = last_actions(namespace, [(r.kind, r.name) for r in workloads + services])
    for row in workloads + services:
        row.last = actions.get((row.kind, row.name))
    for row in workloads:
        # A broker that does not run says why: its conditions and latest events, which only
        # the API server has (read for these few, a few seconds' memory: the block polls).
        row.why = None
        if row.kind == Broker.Kind.POD and row.phase != "Running" and not row.deleting:
            from akri_site.dashboard.podstatus import pod_status

            row.why = pod_status(row.namespace, row.name)
    return {
        "brokers": workloads,
        "services": services,
        "state": ConfigurationBrokers.objects.filter(
            namespace=namespace, configuration=configuration
        ).first(),
    }


def configuration_brokers(namespace: str, configuration: str) -> dict[str, Any]:
    counts = (
        Broker.objects.filter(namespace=namespace, configuration=configuration)
        .values("kind", "phase")
        .annotate(n=Count("pk"))
        .order_by("kind", "phase")
    )
    return {
        "state": ConfigurationBrokers.objects.filter(
            namespace=namespace, configuration=configuration
        ).first(),
        "counts": list(counts),
        "recent": list(
            BrokerAction.objects.filter(namespace=namespace, configuration=configuration)[:10]
        ),
    }


def broker_pod_counts() -> dict[tuple[str, str], int]:
    """Akri's ``akri_broker_pod_count``: broker pods by Configuration and node."""
    rows = (
        Broker.objects.filter(kind=Broker.Kind.POD, deleting=False)
        .values_list("configuration", "node")
        .annotate(n=Count("pk"))
    )
    return {(conf, node): n for conf, node, n in rows}
