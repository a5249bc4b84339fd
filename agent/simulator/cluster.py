"""A cluster in a box: the API-server simulator, N nodes each with a kubelet simulator and a
node agent, the controller, and a workload generator that starts and ends pods at a steady
pace. The demo runs on it, and so do the browser tests and some benchmarks.

The workload generator plays the scheduler and the kubelet's pod lifecycle: it creates a Pod in
the API server bound to a node whose kubelet shows enough allocatable devices, has that
kubelet admit it (which calls the agent's Allocate), marks it Running, and after a while
deletes it from the API server. As on a real cluster that only marks the pod Terminating: each
node's `PodFinisher` (the kubelet's side) then removes it from its kubelet and deletes it with
grace period 0.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from agent.kube.client import AkriApi, new_api_client
from agent.kube.watch import CacheSync
from agent.simulator.apiserver import ApiServerSimulator
from agent.simulator.kubelet import KubeletSimulator
from agent.simulator.kubelet_pods import PodFinisher

log = logging.getLogger(__name__)


def debug_echo_configuration(
    name: str, descriptions: list[str], *, capacity: int = 2, unique: bool = True
) -> dict[str, Any]:
    details = "descriptions:\n" + "".join(f"- {d}\n" for d in descriptions)
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": details},
            "capacity": capacity,
            "uniqueDevices": unique,
            "brokerProperties": {"SITE": "demo"},
        },
    }


def ensure_namespace(core: client.CoreV1Api, name: str) -> None:
    """Create namespace `name` unless it exists: objects need their namespace."""
    try:
        core.create_namespace({"metadata": {"name": name}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise


def node_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


@dataclass
class SimNode:
    name: str
    kubelet: KubeletSimulator
    agent: Any
    directory: str
    finisher: PodFinisher | None = None


@dataclass
class SimulatedCluster:
    """Start with ``start()``; everything runs in background threads until ``stop()``."""

    nodes: int = 3
    namespace: str = "default"
    configurations: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    with_controller: bool = True
    offline_grace: float = 30.0

    def __post_init__(self) -> None:
        self.apiserver = ApiServerSimulator(port=self.port)
        self.root = tempfile.mkdtemp(prefix="akc", dir="/tmp")
        self.kubeconfig = os.path.join(self.root, "kubeconfig.yaml")
        self.sim_nodes: list[SimNode] = []
        self.sync: CacheSync | None = None
        self.controller: Any = None
        self.pod_runner: Any = None
        self._stopped = False

    def start(self) -> SimulatedCluster:
        from agent.node.agent import NodeAgent

        self.apiserver.start()
        self.apiserver.write_kubeconfig(self.kubeconfig, namespace=self.namespace)
        self.api_client = new_api_client(self.kubeconfig)
        self.akri = AkriApi(self.api_client, self.namespace)
        self.core = client.CoreV1Api(self.api_client)
        ensure_namespace(self.core, self.namespace)
        self.sync = CacheSync(
            new_api_client(self.kubeconfig), self.namespace, owner="cluster"
        ).start()
        self.sync.wait_synced()
        if self.with_controller:
            from agent.controller import Controller

            self.controller = Controller(
                new_api_client(self.kubeconfig), self.namespace, sync=self.sync
            ).start()
        for i in range(self.nodes):
            name = f"node-{'abcdefghij'[i]}"
            self.core.create_node(node_body(name))
            directory = os.path.join(self.root, name[-1])
            plugin_dir = os.path.join(directory, "dp")
            os.makedirs(plugin_dir)
            kubelet = KubeletSimulator(
                plugin_dir, os.path.join(directory, "pr", "kubelet.sock"), node_name=name
            )
            kubelet.start()
            agent = NodeAgent(
                node_name=name,
                api_client=new_api_client(self.kubeconfig),
                namespace=self.namespace,
                plugin_dir=plugin_dir,
                pod_resources_socket=kubelet.pod_resources_socket,
                registration_socket=os.path.join(directory, "agent-registration.sock"),
                sync=self.sync,
                offline_grace=self.offline_grace,
            )
            agent.start()
            finisher = PodFinisher(kubelet, new_api_client(self.kubeconfig), self.namespace)
            self.sim_nodes.append(SimNode(name, kubelet, agent, directory, finisher.start()))
        # Broker pods the controller makes get scheduled and run by the nodes' kubelets.
        from agent.simulator.pod_runner import PodRunner

        kubelets = {n.name: n.kubelet for n in self.sim_nodes}
        self.pod_runner = PodRunner(new_api_client(self.kubeconfig), self.namespace, kubelets)
        self.pod_runner.start()
        for body in self.configurations:
            self.akri.create_configuration(body)
        return self

    def stop(self) -> None:
        """Stop everything; calling it again does nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self.pod_runner is not None:
            self.pod_runner.stop()
        for node in self.sim_nodes:
            if node.finisher is not None:
                node.finisher.stop()
            node.agent.stop()
            node.kubelet.stop()
        if self.controller is not None:
            self.controller.stop()
        if self.sync is not None:
            self.sync.stop()
        self.apiserver.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def node(self, name: str) -> SimNode:
        return next(n for n in self.sim_nodes if n.name == name)

    # --- pods ---------------------------------------------------------------------------
    def run_pod(
        self,
        name: str,
        node: str,
        requests: dict[str, int],
        namespace: str | None = None,
        *,
        labels: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> bool:
        """Create a pod bound to ``node`` and have its kubelet admit it; True when admitted
        (False too when the API server refused it: an admission webhook said no).
        ``labels`` and ``priority`` go into the pod (the queue demo names queues with them)."""
        namespace = namespace or self.namespace
        sim = self.node(node)
        limits = {k: str(v) for k, v in requests.items()}
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "akri-workload", **(labels or {})}},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"requests": limits, "limits": limits},
                    }
                ],
            },
        }
        if priority is not None:
            body["spec"]["priority"] = priority
        try:
            pod = self.core.create_namespaced_pod(namespace, body)
        except client.ApiException as exc:
            if exc.status != 403:
                raise
            # Refused by an admission webhook (the queue demo registers deploy/'s): never run.
            log.info("pod %s/%s refused: %s", namespace, name, exc.body)
            return False
        result = sim.kubelet.admit_pod(
            namespace, name, [{"name": "main", "requests": requests}], uid=pod.metadata.uid
        )
        phase = "Running" if result.admitted else "Failed"
        status: dict[str, Any] = {"phase": phase}
        if not result.admitted:
            status.update(reason=result.reason or "UnexpectedAdmissionError", message=result.error)
        self.core.patch_namespaced_pod_status(name, namespace, {"status": status})
        return result.admitted

    def end_pod(self, name: str, node: str, namespace: str | None = None) -> None:
        """The pod is deleted; the node's PodFinisher takes it off the kubelet and the API
        server. `node` is kept for callers; the finisher watching that node does the rest."""
        namespace = namespace or self.namespace
        try:
            self.core.delete_namespaced_pod(name, namespace)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


class WorkloadGenerator:
    """Starts and ends pods at a steady pace so the dashboard has something to show."""

    def __init__(
        self,
        cluster: SimulatedCluster,
        *,
        interval: float = 1.5,
        lifetime: tuple[float, float] = (6, 20),
        seed: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.interval = interval
        self.lifetime = lifetime
        self.random = random.Random(seed)
        self.running: dict[str, tuple[str, float]] = {}  # pod -> (node, ends at)
        self.started = self.refused = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counter = 0

    def start(self) -> WorkloadGenerator:
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval * self.random.uniform(0.5, 1.5)):
            try:
                self.step()
            except Exception:
                log.exception("workload generator step failed")

    def step(self) -> None:
        now = time.monotonic()
        for name, (node, ends) in list(self.running.items()):
            if ends <= now:
                self.cluster.end_pod(name, node)
                del self.running[name]
        choice = self._pick()
        if choice is None:
            return
        node, resource, count = choice
        self._counter += 1
        name = f"workload-{self._counter:05d}"
        if self.cluster.run_pod(name, node, {resource: count}):
            self.started += 1
            self.running[name] = (node, now + self.random.uniform(*self.lifetime))
        else:
            self.refused += 1
            # A refused pod stays Failed a moment (as UnexpectedAdmissionError pods do), then goes.
            self.running[name] = (node, now + 3)

    def _pick(self) -> tuple[str, str, int] | None:
        options = []
        for sim in self.cluster.sim_nodes:
            for resource in sim.kubelet.resources():
                free = sim.kubelet.free(resource)
                if free > 0:
                    options.append((sim.name, resource, free))
        if not options:
            return None
        node, resource, free = self.random.choice(options)
        count = 1
        if free > 1 and self.random.random() < 0.3:
            count = 2
        return node, resource, count
