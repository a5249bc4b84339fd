"""Cache rows, Node objects and certificates for the extender tests; the HTTP side is
``agent.simulator.scheduler``'s."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.extender.tls import ServerTls
from agent.kube.cache import apply_configuration, apply_instance
from agent.simulator.scheduler import SchedulerTls, filter_args, post

__all__ = [
    "Certs",
    "filter_args",
    "make_certs",
    "node_object",
    "post",
    "put_configuration",
    "put_instance",
]

CERT_SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "extender-certs"


@dataclass(frozen=True)
class Certs:
    """What deploy/extender-certs writes, as the extender and kube-scheduler use it."""

    dir: Path

    def server(self, *client_names: str) -> ServerTls:
        d = self.dir
        return ServerTls(str(d / "tls.crt"), str(d / "tls.key"), str(d / "ca.crt"), client_names)

    def scheduler(self) -> SchedulerTls:
        d = self.dir
        return SchedulerTls(str(d / "scheduler.crt"), str(d / "scheduler.key"), str(d / "ca.crt"))


def make_certs(directory: Path) -> Certs:
    """The shipped script, run as the README says, with 127.0.0.1 added for a local server."""
    subprocess.run(
        [str(CERT_SCRIPT), str(directory), "IP:127.0.0.1"], check=True, capture_output=True
    )
    return Certs(directory)


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
