"""Cache rows and Node objects for the extender tests; the HTTP side is
``agent.simulator.scheduler``'s."""

from __future__ import annotations

from typing import Any

from agent.kube.cache import apply_configuration, apply_instance
from agent.simulator.scheduler import filter_args, post

__all__ = ["filter_args", "post", "node_object", "put_configuration", "put_instance"]


def node_object(name: str, **capacity: str) -> dict[str, Any]:
    """A Node as the scheduler's cache holds it (trimmed of what no policy reads)."""
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110", **capacity},
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110", **capacity},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def put_configuration(namespace: str, name: str, capacity: int = 1, unique: bool = True) -> None:
    apply_configuration(
        {
            "apiVersion": "akri.sh/v0",
            "kind": "Configuration",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {
                "discoveryHandler": {"name": "debugEcho", "discoveryDetails": ""},
                "capacity": capacity,
                "uniqueDevices": unique,
            },
        }
    )


def put_instance(
    namespace: str,
    name: str,
    nodes: list[str],
    capacity: int = 1,
    usage: dict[str, str] | None = None,
    rv: str = "1",
) -> None:
    configuration = name.rpartition("-")[0]
    device_usage = {f"{name}-{i}": "" for i in range(capacity)}
    device_usage.update(usage or {})
    apply_instance(
        {
            "apiVersion": "akri.sh/v0",
            "kind": "Instance",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv},
            "spec": {
                "configurationName": configuration,
                "capacity": capacity,
                "nodes": nodes,
                "shared": False,
                "deviceUsage": device_usage,
                "brokerProperties": {},
            },
        },
        relist=True,
    )
