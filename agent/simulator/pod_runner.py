"""Broker pods brought to life in a simulated cluster: the scheduler's and kubelet's part.

The controller creates broker pods (label ``akri.sh/configuration``); with no scheduler or
kubelet they would stay Pending. ``PodRunner`` watches them and does what the real pair would:

- with kubelet simulators (the demo): a pod goes to the node its required affinity names
  (Configuration-level replicas: any node whose kubelet has the devices free), is bound there
  (``pods/binding``), admitted by that node's kubelet (which calls the agent's Allocate and
  claims the slot) and reported Running, or Failed when admission fails. A pod whose devices
  are not free stays Pending, as the scheduler would leave it. A pod being deleted is removed
  from its kubelet and deleted with grace 0, as the kubelet finishes a deletion;
- without kubelets (benchmarks): each new broker pod is reported Running at once.

A development and test tool, like the rest of ``agent.simulator``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from agent.controller import pod_resources
from agent.kube.watch import ResourceWatcher

log = logging.getLogger(__name__)

SELECTOR = "akri.sh/configuration"
RETRY_SECONDS = 2.0  # Pending pods are looked at again this often (devices may free up)


class PodRunner:
    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        kubelets: dict[str, Any] | None = None,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.kubelets = kubelets
        self.core = client.CoreV1Api(api_client)
        self.pending: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.watcher = ResourceWatcher(
            owner="pod-runner",
            kind=f"{namespace}/broker-pods",
            list_func=self.core.list_namespaced_pod,
            list_args=(namespace,),
            list_kwargs={"label_selector": SELECTOR},
            on_event=self._event,
            on_relist=lambda items: [self._event("ADDED", o) for o in items],
            api_client=api_client,
            to_dict=True,
            persist=False,
        )
        self._threads: list[threading.Thread] = []

    def start(self) -> PodRunner:
        for target in (self.watcher.run, self._retry_loop):
            thread = threading.Thread(target=target, name="pod-runner", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.watcher.stop()
        for thread in self._threads:
            thread.join(timeout=5)

    # --- events ---------------------------------------------------------------------------
    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            with self._lock:
                self.pending.pop(name, None)
            self._kubelet_forget(pod)
            return
        if pod["metadata"].get("deletionTimestamp"):
            self._finish_deletion(pod)
            return
        if (pod.get("status") or {}).get("phase") in (None, "", "Pending") and not (
            pod.get("spec") or {}
        ).get("nodeName"):
            with self._lock:
                self.pending[name] = pod
            self._try(pod)

    def _retry_loop(self) -> None:
        while not self._stop.wait(RETRY_SECONDS):
            with self._lock:
                pods = list(self.pending.values())
            for pod in pods:
                try:
                    self._try(pod)
                except Exception:
                    log.exception("pod runner: %s", pod["metadata"]["name"])

    # --- the scheduler and kubelet's part -------------------------------------------------
    def _try(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if self.kubelets is None:
            self._report(name, "Running")
            self._done(name)
            return
        node = self._pick_node(pod)
        if node is None:
            return  # unschedulable for now: stays Pending
        try:
            self.core.create_namespaced_pod_binding(
                name,
                self.namespace,
                {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}},
                _preload_content=False,
            )
        except client.ApiException as exc:
            if exc.status in (404, 409):
                self._done(name)  # gone, or bound already
                return
            raise
        requests = pod_resources(pod)
        result = self.kubelets[node].admit_pod(
            self.namespace,
            name,
            [{"name": "broker", "requests": requests}],
            uid=pod["metadata"].get("uid"),
        )
        self._done(name)
        if result.admitted:
            self._report(name, "Running")
        else:
            self._report(name, "Failed", reason=result.reason or "UnexpectedAdmissionError")

    def _pick_node(self, pod: dict[str, Any]) -> str | None:
        wanted = pod_resources(pod)
        candidates = _affinity_nodes(pod) or sorted(self.kubelets or {})
        for node in candidates:
            kubelet = (self.kubelets or {}).get(node)
            if kubelet and all(kubelet.free(r) >= n for r, n in wanted.items()):
                return node
        return None

    def _report(self, name: str, phase: str, reason: str = "") -> None:
        status: dict[str, Any] = {"phase": phase, "startTime": _now()}
        if reason:
            status["reason"] = reason
        with contextlib.suppress(client.ApiException):  # deleted meanwhile
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def _done(self, name: str) -> None:
        with self._lock:
            self.pending.pop(name, None)

    def _finish_deletion(self, pod: dict[str, Any]) -> None:
        self._kubelet_forget(pod)
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespaced_pod(
                pod["metadata"]["name"], self.namespace, grace_period_seconds=0
            )

    def _kubelet_forget(self, pod: dict[str, Any]) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if self.kubelets and node in self.kubelets:
            self.kubelets[node].remove_pod(self.namespace, pod["metadata"]["name"])


def _affinity_nodes(pod: dict[str, Any]) -> list[str]:
    """Nodes a required ``metadata.name In`` affinity term allows (the broker's own term)."""
    required = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    nodes: list[str] = []
    for term in required.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                nodes += field.get("values") or []
    return nodes


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
