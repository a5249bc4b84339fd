"""Shared helpers of the reconciliation tests: Instances, pods, a PodResources stand-in, a
clock, and the device plugins' claim path (claim + ``on_allocated`` under the Instance lock)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from agent.bench.claims import instance_body
from agent.domain.naming import cl_resource_name, il_resource_name
from agent.domain.slots import format_cl
from agent.kube import cache
from agent.kube.claims import ClaimStore
from agent.kube.client import AkriApi
from agent.node.podresources import DeviceUse, PodResourcesUnavailable
from agent.node.reconcile import NodeReconciler


def configuration_body(name: str, capacity: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": ""},
            "capacity": capacity,
        },
    }


def make_instance(
    api: AkriApi,
    name: str,
    capacity: int = 2,
    nodes: tuple[str, ...] = ("node-a", "node-b"),
    configuration: str = "cams",
) -> dict[str, Any]:
    created = api.create_instance(instance_body(name, capacity, configuration, nodes))
    cache.apply_instance(created)
    return created


def usage(api: AkriApi, name: str) -> dict[str, str]:
    return api.get_instance(name)["spec"].get("deviceUsage") or {}


def pod_object(
    namespace: str, name: str, node: str, *, uid: str | None = None, phase: str = "Running"
) -> dict[str, Any]:
    """A pod as a watch would deliver it (enough for the reconciler)."""
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": uid or str(uuid.uuid4())},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def create_pod(core: client.CoreV1Api, namespace: str, name: str, node: str) -> dict[str, Any]:
    pod = core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    return core.api_client.sanitize_for_serialization(pod)


class FakePodResources:
    """PodResources ``List`` as a kubelet would answer it, set by the test."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uses: dict[tuple[str, str], list[DeviceUse]] = {}
        self.available = True
        self.calls = 0

    def hold(
        self, namespace: str, pod: str, resource: str, device_id: str, container: str = "main"
    ) -> None:
        with self._lock:
            self._uses.setdefault((namespace, pod), []).append(
                DeviceUse(resource, device_id, namespace, pod, container)
            )

    def drop(self, namespace: str, pod: str) -> None:
        with self._lock:
            self._uses.pop((namespace, pod), None)

    def held(self) -> set[str]:
        with self._lock:
            return {u.device_id for uses in self._uses.values() for u in uses}

    def list(self) -> list[DeviceUse]:
        with self._lock:
            self.calls += 1
            if not self.available:
                raise PodResourcesUnavailable("UNAVAILABLE: kubelet restarting")
            return [u for uses in self._uses.values() for u in uses]


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2025, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def allocate_il(reconciler: NodeReconciler, store: ClaimStore, instance: str, key: str) -> str:
    """What the IL plugin's Allocate does: claim, then tell the reconciler, under one lock."""
    node = reconciler.node
    with reconciler.serialized(instance):
        result = store.claim(instance, key, node, node=node)
        reconciler.on_allocated(node, instance, key, node, key, il_resource_name(instance))
    return result


def allocate_cl(
    reconciler: NodeReconciler,
    store: ClaimStore,
    instance: str,
    key: str,
    configuration: str,
    vdev: str,
) -> str:
    node = reconciler.node
    value = format_cl(vdev, node)
    with reconciler.serialized(instance):
        result = store.claim(instance, key, value, node=node)
        reconciler.on_allocated(node, instance, key, value, vdev, cl_resource_name(configuration))
    return result
