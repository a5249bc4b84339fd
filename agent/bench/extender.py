"""Benchmarks of the scheduler extender (issue 14).

``extender-filter``: one pod asking for 2 unique devices of a Configuration, filtered over
5,000 nodes that see 20,000 Instances (2 Configurations, two Instances of each per node, a
third of the slots held), as kube-scheduler sends it with ``nodeCacheCapable: true``: a POST of the pod and
5,000 node names, timed from the client, HTTP and JSON included, to ``manage.py runextender``
in a process of its own reading its books from the ORM cache as it does in production.
``cpu_ms`` is that process's CPU time per filter (every thread): on a loaded machine the
wall-clock figures stretch with the load, this one much less. ``passthrough_p95_ms`` is the same call for a pod
that asks for nothing of ours, in the same run: the floor HTTP and JSON set.

``schedule-storm``: 500 pods, each asking for one unique device of a Configuration, against
agents and kubelet simulators with room for 300 (5 nodes seeing 60 shared devices of capacity
5: 300 slots, and each node's Configuration-level plugin can hold 60). One thread plays
kube-scheduler (filter, prioritize, bind, pod after pod, never waiting for the kubelet) and a
pool plays the kubelets admitting bound pods as they see them, so the extender must count
assignments the agents have not claimed yet. ``admission_errors``: bound pods a kubelet
refused; ``overbooked``: admitted pods beyond the room, plus held slots in the API server that
admitted pods do not account for (0 and 0 mean every pod either runs on a slot of its own or
waits Pending with a reason). The scheduler stand-in runs kube-scheduler's resource fit before
the extender. ``rescheduled_s``: once the storm is over, half the running pods are deleted;
seconds until as many Pending pods are admitted in their place (the agents free the slots,
the extender's books and the kubelets' lists follow; target 10 s); ``rescheduled_first_s``
until the first of them is. The Pending pods wait in kube-scheduler's queue as its
unschedulable pods (``QueueRunner``): retried on a deletion, on a node status change (every
10 s), on an update of the pod (the extender asking again), not on a timer of the
benchmark's; ``scheduling_cycles`` counts the attempts, successful or not.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
from django.conf import settings
from kubernetes import client

from agent.bench import ensure_migrated, percentile
from agent.bench.agent import CONFIG, agents, configuration
from agent.kube.client import new_api_client
from agent.models import Configuration, Instance
from agent.simulator.kubelet_pods import PodFinisher
from agent.simulator.scheduler import (
    MiniScheduler,
    QueueRunner,
    filter_args,
    post,
    register_nodes,
)

WARM_UP = 3


# --- extender-filter --------------------------------------------------------------------------
def _fill_cache(namespace: str, nodes: int, configs: int) -> None:
    rng = random.Random(14)
    Configuration.objects.bulk_create(
        Configuration(namespace=namespace, name=f"cfg{c}", capacity=2, unique_devices=True)
        for c in range(configs // 2)
    )
    rows = []
    for n in range(nodes):
        for c in range(configs):
            # Two Configurations of two Instances per node: a pod asking for 2 unique
            # devices of one fits where both have a free slot.
            name = f"cfg{c // 2}-{n:05x}{c % 2}"
            usage = {f"{name}-0": rng.choice(["", "", f"node-{n}"]), f"{name}-1": ""}
            if n % 4 == 0 and c % 2:
                # Every fourth node has one Instance of each Configuration full: a pod asking
                # for 2 unique devices does not fit there (the answer is checked, not only
                # timed).
                usage = {f"{name}-0": f"node-{n}", f"{name}-1": f"node-{n}"}
            rows.append(
                Instance(
                    namespace=namespace,
                    name=name,
                    resource_version=str(n * configs + c + 1),
                    configuration_name=f"cfg{c // 2}",
                    capacity=2,
                    nodes=[f"node-{n}"],
                    device_usage=usage,
                )
            )
    Instance.objects.bulk_create(rows, batch_size=2000)


def _pod(requests: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench", "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": requests}}]
        },
        "status": {"phase": "Pending"},
    }


def _timed_filters(url: str, pod: dict[str, Any], names: list[str], rounds: int) -> list[float]:
    samples = []
    for i in range(rounds + WARM_UP):
        started = time.perf_counter()
        status, result = post(url + "/filter", filter_args(pod, names), timeout=30)
        elapsed = (time.perf_counter() - started) * 1000
        if status != 200 or result["Error"]:
            raise RuntimeError(f"filter failed: {status} {result}")
        if i >= WARM_UP:
            samples.append(elapsed)
    return samples


@contextlib.contextmanager
def _extender_process(namespace: str, kubeconfig: str = "") -> Any:
    """``manage.py runextender`` in a process of its own, as it runs beside kube-scheduler:
    the client's JSON work (and, in schedule-storm, the agents and kubelets of the benchmark's
    process) must not share the extender's interpreter lock. Without ``kubeconfig`` it runs
    ``--without-api`` (filter and prioritize from the cache alone)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "AKRI_NAMESPACE": namespace,
        "LOG_LEVEL": "WARNING",
        "KUBECONFIG": kubeconfig,
        # The database this process uses, whatever its own settings would name.
        **_database_env(),
    }
    args = [] if kubeconfig else ["--without-api"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "runextender",
            "--host=127.0.0.1",
            f"--port={port}",
            *args,
        ],
        cwd=str(settings.BASE_DIR),
        env=env,
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # It serves only once its books are loaded from the cache.
        _wait_for(lambda: _healthy(url) or proc.poll() is not None, 300, "runextender")
        if proc.poll() is not None:
            raise RuntimeError("runextender exited")
        yield url, psutil.Process(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _database_env() -> dict[str, str]:
    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.sqlite3" and not os.environ.get("DATABASE_URL"):
        return {"AKRI_SQLITE_PATH": str(db["NAME"])}
    return {}


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _nodes_with_two_free(namespace: str, configuration: str) -> set[str]:
    """The nodes where two Instances of ``configuration`` have a free slot, counted from the
    cache's rows without the extender's code: what its answer must be."""
    free: dict[str, int] = {}
    rows = Instance.objects.filter(namespace=namespace, configuration_name=configuration)
    for row in rows.values("nodes", "device_usage"):
        if any(value == "" for value in row["device_usage"].values()):
            for node in row["nodes"]:
                free[node] = free.get(node, 0) + 1
    return {node for node, count in free.items() if count >= 2}


def bench_extender_filter(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    ensure_migrated()
    nodes, configs = (500, 4) if quick else (5000, 4)
    rounds = 10 if quick else 100
    namespace = f"bench-ext-{uuid.uuid4().hex[:6]}"
    _fill_cache(namespace, nodes, configs)
    names = [f"node-{n}" for n in range(nodes)]
    try:
        with _extender_process(namespace) as (url, process):
            asking = _pod({"akri.sh/cfg1": "2", "cpu": "1"})
            before = sum(process.cpu_times()[:2])
            samples = _timed_filters(url, asking, names, rounds)
            cpu_ms = (sum(process.cpu_times()[:2]) - before) * 1000 / (rounds + WARM_UP)
            _, result = post(url + "/filter", filter_args(asking, names))
            fits = len(result["NodeNames"])
            wanted = _nodes_with_two_free(namespace, "cfg1")
            if set(result["NodeNames"]) != wanted:
                raise RuntimeError(
                    f"extender-filter: {fits} nodes fit by the extender, {len(wanted)} by the "
                    "cache's slots: the timed answers were wrong"
                )
            plain = _timed_filters(url, _pod({"cpu": "1"}), names, rounds)
    finally:
        Instance.objects.filter(namespace=namespace).delete()
        Configuration.objects.filter(namespace=namespace).delete()
    return {
        "p50_ms": percentile(samples, 50),
        "p95_ms": percentile(samples, 95),
        "passthrough_p95_ms": percentile(plain, 95),
        "cpu_ms": cpu_ms,
        "nodes": nodes,
        "instances": nodes * configs,
        "fits": fits,
        "rounds": rounds,
    }


# --- schedule-storm ---------------------------------------------------------------------------
@contextlib.contextmanager
def _assignments_on():
    previous = settings.AKRI
    settings.AKRI = {**previous, "AGENT_ASSIGNMENTS": True}
    try:
        yield
    finally:
        settings.AKRI = previous


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def bench_schedule_storm(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    ensure_migrated()
    node_count, devices, capacity, pods = (2, 6, 2, 20) if quick else (5, 60, 5, 500)
    room = min(node_count * devices, devices * capacity)
    names = [f"node-{chr(ord('a') + i)}" for i in range(node_count)]
    resource = f"akri.sh/{CONFIG}"
    with _assignments_on(), agents(names, reconcile=True) as (api, nodes, kubeconfig):
        api.create_configuration(configuration([f"d{i}" for i in range(devices)], capacity))
        for node in nodes:
            _wait_for(
                lambda n=node: (
                    len(n.kubelet.resources().get(resource).devices or {}) == devices
                    if n.kubelet.resources().get(resource)
                    else False
                ),
                120,
                f"{node.name}: {devices} devices of {resource}",
            )
        core = client.CoreV1Api(new_api_client(kubeconfig))
        register_nodes(core, names)  # as kubelets do: the extender binds to existing nodes only
        # The kubelets' side of a pod's deletion: stop it, then delete it with grace 0.
        finishers = [
            PodFinisher(node.kubelet, new_api_client(kubeconfig), api.namespace).start()
            for node in nodes
        ]
        try:
            _wait_for(
                lambda: Instance.objects.filter(namespace=api.namespace).count() == devices,
                60,
                "the cache's Instances",
            )
            # As deployed: runextender in a process of its own, with its own settings' feed
            # intervals (sharing this process's interpreter lock with five agents and their
            # kubelets, it was slower than it is anywhere it runs).
            with _extender_process(api.namespace, kubeconfig) as (url, _):
                kubelets = {node.name: node.kubelet for node in nodes}
                scheduler = MiniScheduler(core, api.namespace, url, kubelets)
                figures = _storm(scheduler, resource, pods)
                figures["rescheduled_s"] = _reschedule(scheduler, core, figures)
                held = sum(
                    1
                    for obj in api.list_instances()["items"]
                    for value in (obj["spec"].get("deviceUsage") or {}).values()
                    if value
                )
        finally:
            for finisher in finishers:
                finisher.stop()
    admitted = figures.pop("running")
    figures["overbooked"] = max(0, len(admitted) - room) + abs(held - len(admitted))
    figures["room"] = room
    figures["pods"] = pods
    figures.pop("waiting")
    return {
        "admission_errors": figures.pop("admission_errors"),
        "overbooked": figures.pop("overbooked"),
        "rescheduled_s": figures.pop("rescheduled_s"),
        **figures,
    }


def _storm(scheduler: MiniScheduler, resource: str, count: int) -> dict[str, Any]:
    """One scheduling thread (this one), a pool of kubelets admitting what it binds."""
    errors = 0
    waiting: list[dict[str, Any]] = []
    futures = []
    started = time.perf_counter()
    with ThreadPoolExecutor(4, thread_name_prefix="kubelet") as kubelets:
        snapshot = scheduler.snapshot()  # kube-scheduler's cache: the pods it binds, assumed
        for i in range(count):
            pod = scheduler.create(f"storm-{i:04d}", {resource: 1})
            outcome = scheduler.bind_best(pod, snapshot)
            if outcome.error:
                raise RuntimeError(outcome.error)
            if not outcome.node:
                waiting.append((pod, outcome.plugins()))
                continue
            futures.append((pod, kubelets.submit(scheduler.admit, pod, outcome.node)))
        running = []
        for pod, future in futures:
            ok, _ = future.result()
            errors += not ok
            if ok:
                running.append(pod)
    return {
        "admission_errors": errors,
        "admitted": len(running),
        "pending": len(waiting),
        "seconds": time.perf_counter() - started,
        "running": running,
        "waiting": waiting,
    }


def _reschedule(scheduler: MiniScheduler, core: client.CoreV1Api, figures: dict) -> float:
    """Half the running pods are deleted; seconds until as many Pending pods are admitted in
    their place. The Pending pods sit in kube-scheduler's queue as its unschedulable pods
    (``QueueRunner``): they are tried again only on the cluster events that kube-scheduler
    acts on (an assigned pod's deletion, a node's allocatable in its next status update, an
    update of the pod itself), after its backoff, as it does. A pool of kubelets admits what
    is bound, as in the storm."""
    running, waiting = figures["running"], figures["waiting"]
    gone = running[: len(running) // 2]
    wanted = min(len(gone), len(waiting))
    admitted_at: list[float] = []
    futures = []
    with ThreadPoolExecutor(4, thread_name_prefix="kubelet") as kubelets:

        def admit(pod: dict[str, Any], node: str) -> None:
            futures.append((pod, kubelets.submit(timed_admit, pod, node)))

        def timed_admit(pod: dict[str, Any], node: str) -> tuple[bool, str]:
            result = scheduler.admit(pod, node)
            if result[0]:
                admitted_at.append(time.perf_counter())
            return result

        with QueueRunner(scheduler, on_bound=admit, manage_new=False) as runner:
            for pod, plugins in waiting:
                runner.queue.add_unschedulable(pod, plugins)
            started = time.perf_counter()
            for pod in gone:
                meta = pod["metadata"]
                core.delete_namespaced_pod(meta["name"], meta["namespace"])
            _wait_for(lambda: len(admitted_at) >= wanted, 120, f"{wanted} Pending pods admitted")
            elapsed = sorted(admitted_at)[wanted - 1] - started
            figures["scheduling_cycles"] = runner.cycles
        for pod, future in futures:
            ok, _ = future.result()
            if ok:
                running.append(pod)
            else:
                figures["admission_errors"] += 1
    for pod in gone:
        running.remove(pod)
    figures["rescheduled"] = len(futures)
    # The first one shows how soon a freed slot is usable; the whole figure adds the
    # scheduling of every Pending pod, one after another.
    figures["rescheduled_first_s"] = min(admitted_at, default=started) - started
    return elapsed
