"""Benchmarks of slot reconciliation.

- ``release``: pods run through a node agent and its kubelet simulator; from each pod's
  deletion in the API server to its slot free there (seen by a watch on the Instances).
  Pods end ten at a time, so releases on different Instances overlap. Akri v0.13's designed
  bound (20 s grace + 10 s reclaim interval) is reported beside it.
- ``sweep``: one level-based sweep on a node holding 500 Instances x 4 slots, every slot in
  use by a live pod that PodResources (real gRPC) reports: the steady state a sweep checks.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from concurrent import futures
from typing import Any

import grpc
from kubernetes import client, watch

from agent.bench import ensure_migrated, percentile
from agent.domain.naming import il_resource_name, slot_key
from agent.kube import cache
from agent.kube.claims import ClaimStore
from agent.kube.client import GROUP, INSTANCES, VERSION, AkriApi, new_api_client
from agent.models import Instance, ReconcileRun, SlotPodBinding
from agent.node.podresources import PodResourcesClient
from agent.node.reconcile import NodeReconciler
from agent.protos import podresources_pb2_grpc as pr_grpc
from agent.simulator.apiserver import ApiServerSimulator
from agent.simulator.cluster import SimulatedCluster, debug_echo_configuration
from agent.simulator.kubelet import ContainerAllocation, PodRecord
from agent.simulator.kubelet_podresources import PodResourcesServicer

AKRI_BOUND_MS = 30000  # Akri v0.13: SLOT_GRACE_PERIOD 20 s + SLOT_RECLAIM_INTERVAL 10 s
BATCH = 10


class FreedWatch:
    """Watches Instances and notes when each slot turns free (monotonic time)."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.freed: dict[str, float] = {}
        self.cond = threading.Condition()
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stopped = False

    def start(self) -> FreedWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._follow()
        except Exception:  # the server went away at the end of the run
            if not self._stopped:
                raise

    def _follow(self) -> None:
        stream = self._watch.stream(
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            INSTANCES,
            timeout_seconds=600,
        )
        for event in stream:
            usage = (event["object"].get("spec") or {}).get("deviceUsage") or {}
            now = time.monotonic()
            with self.cond:
                for key, value in usage.items():
                    if value == "":
                        self.freed.setdefault(key, now)
                    else:
                        self.freed.pop(key, None)
                self.cond.notify_all()

    def wait_free(self, key: str, timeout: float = 60.0) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.freed, timeout):
                raise TimeoutError(f"{key} not freed within {timeout}s")
            return self.freed[key]

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def bench_release(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    ensure_migrated()
    pods = 40 if quick else 200
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    descriptions = [f"dev{i}" for i in range(BATCH)]
    cluster = SimulatedCluster(
        nodes=1,
        namespace=namespace,
        configurations=[debug_echo_configuration("bench-release", descriptions, capacity=2)],
        with_controller=False,
    ).start()
    try:
        node = cluster.sim_nodes[0]
        instances = _wait_instances(cluster, BATCH)
        for name in instances:
            node.kubelet.wait_devices(il_resource_name(name), lambda d: len(d) == 2, timeout=30)
        freed = FreedWatch(new_api_client(cluster.kubeconfig), namespace).start()
        latencies: list[float] = []
        for batch in range(pods // BATCH):
            latencies += _one_batch(cluster, node, instances, freed, batch)
        freed.stop()
    finally:
        cluster.stop()
        _forget(namespace)
    return {
        "pods": len(latencies),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "max_ms": max(latencies),
        "akri_bound_ms": AKRI_BOUND_MS,
    }


def _wait_instances(cluster: SimulatedCluster, count: int) -> list[str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        names = sorted(o["metadata"]["name"] for o in cluster.akri.list_instances()["items"])
        if len(names) == count:
            return names
        time.sleep(0.05)
    raise TimeoutError("the agent did not create the bench Instances")


def _one_batch(
    cluster: SimulatedCluster, node: Any, instances: list[str], freed: FreedWatch, batch: int
) -> list[float]:
    reconciler = node.agent.reconciler
    started: list[tuple[str, str]] = []
    for i, instance in enumerate(instances):
        name = f"b{batch}-{i}"
        resource = il_resource_name(instance)
        assert cluster.run_pod(name, node.name, {resource: 1})
        record = next(r for r in node.kubelet.pods() if r.name == name)
        started.append((name, record.containers[0].devices[resource][0]))
    # Pods run a while before they end: wait until the reconciler knows who holds what.
    deadline = time.monotonic() + 30
    names = {name for name, _ in started}
    while {b.pod_name for b in reconciler.bindings()} & names != names:
        if time.monotonic() > deadline:
            raise TimeoutError("the reconciler did not learn the bench pods")
        time.sleep(0.01)
    with freed.cond:
        for _, key in started:
            freed.freed.pop(key, None)
    deleted: dict[str, float] = {}
    for name, key in started:
        deleted[key] = time.monotonic()
        cluster.end_pod(name, node.name)
    return [(freed.wait_free(key) - deleted[key]) * 1000 for _, key in started]


def bench_sweep(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    ensure_migrated()
    instances = 100 if quick else 500
    capacity = 4
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    root = tempfile.mkdtemp(prefix="akb", dir="/tmp")
    socket = os.path.join(root, "pr.sock")
    with ApiServerSimulator() as sim:
        sim.ensure_namespace(namespace)
        kubeconfig = os.path.join(root, "kubeconfig")
        sim.write_kubeconfig(kubeconfig)
        api_client = new_api_client(kubeconfig)
        api = AkriApi(api_client, namespace)
        names, records = _held_world(api, instances, capacity, namespace)
        server = _serve_pod_resources(socket, records)
        pods = [_pod_object(r) for r in records]

        def reconciler() -> NodeReconciler:
            return NodeReconciler(
                node="node-a",
                namespace=namespace,
                pod_resources=PodResourcesClient(socket),
                claims=ClaimStore(api, "agent:node-a"),
                api_client=api_client,
                watch_pods=False,
                read_pods=False,
            )

        try:
            before = reconciler()
            before.on_pod_relist(pods)
            learn = before.sweep()  # learns every pod: 2000 bindings
            before.flush(timeout=120)  # their rows land
            before.stop()
            # The agent restarts: a new reconciler resumes from the rows, and its first sweep
            # (the start-up pass) is what a restarted node waits for.
            after = reconciler()
            after.on_pod_relist(pods)
            first = after.sweep(ReconcileRun.Trigger.STARTUP)
            runs = [after.sweep() for _ in range(3 if quick else 5)]
            after.flush(timeout=120)
            after.stop()
        finally:
            server.stop(0)
            shutil.rmtree(root, ignore_errors=True)
        bound = SlotPodBinding.objects.filter(namespace=namespace, node="node-a").exclude(
            pod_name=""
        )
        learned = bound.count()
        _forget(namespace)
    steady = runs[-1]
    # The sweeps' work was done: every slot bound to its pod, nothing released or failed.
    for run in (first, *runs):
        if run.released or run.errors or run.checked < instances * capacity:
            raise RuntimeError(f"a sweep did not do its work: {run.detail}")
    if learned != instances * capacity:
        raise RuntimeError(f"{learned} bindings learned, {instances * capacity} expected")
    return {
        "instances": instances,
        "slots": instances * capacity,
        "duration_ms": statistics.median(r.duration_ms for r in runs),
        "first_ms": first.duration_ms,
        "learn_ms": learn.duration_ms,
        "checked": steady.checked,
    }


def _held_world(
    api: AkriApi, instances: int, capacity: int, namespace: str
) -> tuple[list[str], list[PodRecord]]:
    """Instances whose every slot node-a holds, and one pod per Instance using all of them."""
    names, records = [], []
    for i in range(instances):
        name = f"bench-sweep-{i:06x}"
        keys = [slot_key(name, n) for n in range(capacity)]
        body = {
            "apiVersion": "akri.sh/v0",
            "kind": "Instance",
            "metadata": {"name": name},
            "spec": {
                "configurationName": "bench-sweep",
                "cdiName": f"akri.sh/bench-sweep={i:06x}",
                "capacity": capacity,
                "shared": True,
                "nodes": ["node-a"],
                "brokerProperties": {},
                "deviceUsage": {key: "node-a" for key in keys},
            },
        }
        cache.apply_instance(api.create_instance(body))
        container = ContainerAllocation("main", devices={il_resource_name(name): keys})
        records.append(PodRecord(namespace, f"pod-{i}", str(uuid.uuid4()), [container], 0.0))
        names.append(name)
    return names, records


def _serve_pod_resources(socket: str, records: list[PodRecord]) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = PodResourcesServicer(lambda: records, lambda: {}, lambda method: True)
    pr_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server


def _pod_object(record: PodRecord) -> dict[str, Any]:
    return {
        "metadata": {"namespace": record.namespace, "name": record.name, "uid": record.uid},
        "status": {"phase": "Running"},
    }


def _forget(namespace: str) -> None:
    """Bench rows out of the cache (history rows stay, as history does)."""
    Instance.objects.filter(namespace=namespace).delete()
    SlotPodBinding.objects.filter(namespace=namespace).delete()
