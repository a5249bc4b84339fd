"""Shared helpers of the broker tests: Nodes, Configurations with brokers, Instances, and the
kubelet's part (a pod reported Running) done by hand, as on a server without a kubelet."""

from __future__ import annotations

import contextlib
from typing import Any

from kubernetes import client

from agent.bench.claims import instance_body
from agent.brokers.specs import with_brokers
from agent.kube.client import AkriApi
from tests.reconcile_world import configuration_body


class BrokerWorld:
    """Objects of one test in its namespace; Nodes named after the namespace (they are
    cluster-scoped, and a real server is shared), deleted at the end."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube
        self.namespace = kube.namespace
        self.akri = AkriApi(kube.api_client, kube.namespace)
        self.core = client.CoreV1Api(kube.api_client)
        self.batch = client.BatchV1Api(kube.api_client)
        self.nodes: list[str] = []

    def node(self, suffix: str) -> str:
        name = f"{self.namespace}-{suffix}"
        self.core.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
        self.nodes.append(name)
        return name

    def delete_node(self, name: str) -> None:
        self.core.delete_node(name)
        self.nodes.remove(name)

    def configuration(self, name: str = "cams", **spec: Any) -> dict[str, Any]:
        body = with_brokers(configuration_body(name))
        body["spec"].update(spec)
        return self.akri.create_configuration(body)

    def instance(self, name: str, nodes: tuple[str, ...], configuration: str = "cams") -> dict:
        return self.akri.create_instance(instance_body(name, 2, configuration, nodes))

    def pods(self) -> dict[str, dict[str, Any]]:
        answer = self.core.list_namespaced_pod(self.namespace)
        plain = self.kube.api_client.sanitize_for_serialization(answer)
        return {p["metadata"]["name"]: p for p in plain["items"]}

    def pod_names(self) -> set[str]:
        return {n for n, p in self.pods().items() if not p["metadata"].get("deletionTimestamp")}

    def services(self) -> set[str]:
        answer = self.core.list_namespaced_service(self.namespace)
        return {s.metadata.name for s in answer.items}

    def run(self, pod: str) -> None:
        """What a kubelet reports once the pod's containers started."""
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": {"phase": "Running"}})

    def cleanup(self) -> None:
        for name in list(self.nodes):
            with contextlib.suppress(client.ApiException):
                self.delete_node(name)
        if self.kube.real:
            # No garbage collector and no kubelet there: what we made goes with grace 0.
            for name in self.pods():
                with contextlib.suppress(client.ApiException):
                    self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
