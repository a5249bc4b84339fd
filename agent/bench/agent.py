"""Benchmarks of the node agent against the API-server and kubelet simulators.

- ``allocate``: the Allocate RPC as the kubelet calls it (gRPC over the plugin's socket), next
  to a bare conditional write (JSON patch with a ``test``) by the same kind of client, the
  two interleaved in one run so both see the same background load; with them, the Allocate of
  ``agent.bench.floor``'s plugin, which does nothing but the one write (``floor_*``);
  ``over_floor_p50`` is the agent's p50 over the floor's. Between calls everything settles.
  Every other round's Allocate runs with the agent's device-list updates not held until the
  answer (``no_hold_*``: the A/B of ``NodeAgent.defer_notifications`` in the same run).
  Then the bad day (``sustained_*``): Allocates back to back, nothing settled, while ``Churn``
  keeps the watch, the cache applier, the device lists and the reconciler busy (a pod every
  100 ms, and another node's claims across 20 Instances).
  Last, ``webhook_*`` (``agent.bench.admission``): the floor's write on an Instance with the
  queue owner label, with deploy/'s admission webhook registered in the simulator's admission
  chain and without, alternating; ``webhook_over_floor_p50`` is the first over the second.
- ``health-propagation``: from a ``deviceUsage`` change in the API server to the new device
  list reaching the kubelet simulator of a node that did not make the change.
- ``agent-memory``: ``manage.py runagent`` as its DaemonSet runs it, in a process of its own:
  its own SQLite, ``AKRI_AGENT_ONLY=true`` (no web stack), ``-OO -X no_debug_ranges`` from
  bytecode compiled with those flags as in the image (into a cache of the bench's own),
  in-cluster configuration over TLS (``TlsFront``), slot reconciler on; serving 100 Instances
  (100 IL plugins and one CL plugin). ``rss_mb`` once every plugin the API server's Instances
  call for is registered and lists its devices healthy (checked one by one), ``peak_rss_mb``
  the process's high-water mark after a kubelet restart had them all register anew. Before
  it, the baseline: the same agent started plainly (``plain_rss_mb``, ``flags_saved_mb``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings
from kubernetes import client

from agent.bench import ensure_migrated, percentile
from agent.bench.admission import webhook_rounds
from agent.bench.floor import FloorPlugin
from agent.bench.kubelet import KubeletProcess
from agent.discovery.base import HandlerRegistry
from agent.discovery.debugecho import DebugEchoHandler
from agent.kube.client import JSON_PATCH, AkriApi, new_api_client
from agent.kube.watch import CacheSync
from agent.node.agent import NodeAgent
from agent.node.loop import LoopThread
from agent.queues.served import make_tls
from agent.simulator.apiserver import ApiServerSimulator
from agent.simulator.cluster import ensure_namespace
from agent.simulator.kubelet import KubeletSimulator

CONFIG = "bench-echo"


def configuration(descriptions: list[str], capacity: int = 2) -> dict[str, Any]:
    details = "descriptions:\n" + "".join(f"- {d}\n" for d in descriptions)
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": CONFIG},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": details},
            "capacity": capacity,
        },
    }


@dataclass
class BenchNode:
    name: str
    kubelet: KubeletSimulator | KubeletProcess
    agent: NodeAgent


@contextmanager
def apiserver_process(root: str) -> Iterator[str]:
    """The API-server simulator in a process of its own, as a real API server is, so its
    work does not share the agent's interpreter lock; yields a kubeconfig for it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = os.path.join(root, "kubeconfig")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.simulator.apiserver",
            f"--port={port}",
            f"--kubeconfig={kubeconfig}",
        ],
        cwd=str(settings.BASE_DIR),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the API-server simulator did not start")
            time.sleep(0.05)
        while not os.path.exists(kubeconfig):
            time.sleep(0.02)
        time.sleep(0.1)  # the file is written in one go, but give it a moment to close
        yield kubeconfig
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@contextmanager
def agents(
    nodes: list[str], *, reconcile: bool = False, kubelet_process: bool = False
) -> Iterator[tuple[AkriApi, list[BenchNode], str]]:
    """An API-server simulator (own process), one CacheSync, and per node a kubelet simulator
    and an agent (in this process, as the one-process demo runs them). With
    ``kubelet_process`` each kubelet runs in a process of its own (``agent.bench.kubelet``),
    as on a node."""
    root = tempfile.mkdtemp(prefix="bn", dir="/tmp")
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    started: list[BenchNode] = []
    with apiserver_process(root) as kubeconfig:
        ensure_namespace(client.CoreV1Api(new_api_client(kubeconfig)), namespace)
        sync = CacheSync(new_api_client(kubeconfig), namespace, owner=f"bench-{namespace}")
        sync.start()
        sync.wait_synced()
        try:
            for name in nodes:
                base = os.path.join(root, name[-1])
                handlers = HandlerRegistry()
                handlers.register(DebugEchoHandler(availability_path=os.path.join(base, "echo")))
                kubelet: KubeletSimulator | KubeletProcess
                plugin_dir, pod_resources = os.path.join(base, "dp"), os.path.join(base, "pr.sock")
                if kubelet_process:
                    os.makedirs(plugin_dir, exist_ok=True)
                    kubelet = KubeletProcess(plugin_dir, pod_resources, name)
                else:
                    kubelet = KubeletSimulator(plugin_dir, pod_resources, name)
                    kubelet.start()
                agent = NodeAgent(
                    name,
                    new_api_client(kubeconfig),
                    namespace,
                    kubelet.plugin_dir,
                    kubelet.pod_resources_socket,
                    None,
                    handlers=handlers,
                    sync=sync,
                    reconcile=reconcile,
                ).start()
                started.append(BenchNode(name, kubelet, agent))
            yield AkriApi(new_api_client(kubeconfig), namespace), started, kubeconfig
        finally:
            for node in started:
                node.agent.stop()
                node.kubelet.stop()
            sync.stop()
            shutil.rmtree(root, ignore_errors=True)


def _instance(api: AkriApi) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        items = api.list_instances()["items"]
        if items:
            return items[0]["metadata"]["name"]
        time.sleep(0.02)
    raise TimeoutError("no Instance appeared")


def _healthy(kubelet: KubeletSimulator | KubeletProcess, resource: str, count: int) -> None:
    if isinstance(kubelet, KubeletProcess):
        kubelet.wait_healthy(resource, count)
        return
    kubelet.wait_devices(
        resource, lambda d: sum(h == "Healthy" for h in d.values()) == count, timeout=20
    )


def _settle(agent: NodeAgent, *written: tuple[str, str]) -> None:
    """Let the previous call's background work finish, so each timed call measures itself
    rather than the tail of the one before: the watch's echo of each ``(instance,
    resourceVersion)`` written since (its parsing and cache write would otherwise land in the
    middle of the next call), everything queued for the cache, and the reconciler's
    write-behind."""
    for instance, rv in written:
        agent.sync.wait_watched(instance, rv)
    agent.sync.drain()
    flush = getattr(agent.reconciler, "flush", None)
    if flush is not None:
        flush()


def _version(obj: dict[str, Any] | None) -> str:
    return (obj or {}).get("metadata", {}).get("resourceVersion", "")


@dataclass
class _AllocateSamples:
    allocate: list[float]
    bare: list[float]
    floor: list[float]  # Allocates of agent.bench.floor's plugin (empty if not measured)
    # Allocates with the agent's device-list updates not held (NodeAgent.defer_notifications),
    # every other round of the same run (empty if not measured).
    unheld: list[float] = field(default_factory=list)


def _allocate_rounds(
    rounds: int, reconcile: bool, floor: bool, hold_ab: bool = False
) -> _AllocateSamples:
    """Allocate ms, bare write ms and (with ``floor``) floor-plugin Allocate ms, interleaved,
    after 20 untimed warm-up rounds. The kubelet, and so the Allocates, run in a process of
    their own, as on a node (``agent.bench.kubelet``); the bare writes come from this one, the
    agent's, with the agent's background work around them. The three write different slots
    of one Instance (capacity 3): the agent slot 0, the bare writes 1, the floor plugin 2.
    With ``hold_ab``, every other round's Allocate runs with the agent's device-list updates
    not held (``unheld``): ``rounds`` rounds each way."""
    with agents(["node-a"], reconcile=reconcile, kubelet_process=True) as (
        api,
        [node],
        kubeconfig,
    ):
        api.create_configuration(configuration(["foo0"], capacity=3))
        name = _instance(api)
        resource = f"akri.sh/{name}"
        kubelet = node.kubelet
        assert isinstance(kubelet, KubeletProcess)
        _healthy(kubelet, resource, 3)
        bare = AkriApi(new_api_client(kubeconfig), api.namespace)
        bare_key, bare_value = f"{name}-1", ""
        agent = node.agent
        plugin = None
        if floor:
            plugin = FloorPlugin.beside(agent, kubeconfig, {f"{name}-2": name}).start()
        samples = _AllocateSamples([], [], [])
        written: list[tuple[str, str]] = []
        try:
            for i in range(rounds * (2 if hold_ab else 1) + 20):
                _settle(agent, *written)
                unheld = hold_ab and i % 2 == 1
                agent.hold_notifications = not unheld
                elapsed = kubelet.allocate(resource, [[f"{name}-0"]])
                agent.hold_notifications = True
                # Untimed: free the slot again through the claim store, as the reconciler would.
                _release_checked(agent, name, f"{name}-0")
                _settle(agent, (name, _version(agent.claims.last_seen.get(name))))
                new = "" if bare_value else "node-x"
                ops = [
                    {"op": "test", "path": f"/spec/deviceUsage/{bare_key}", "value": bare_value},
                    {"op": "replace", "path": f"/spec/deviceUsage/{bare_key}", "value": new},
                ]
                bare_started = time.perf_counter()
                answer = bare.custom.patch_namespaced_custom_object(
                    "akri.sh", "v0", api.namespace, "instances", name, ops, _content_type=JSON_PATCH
                )
                bare_elapsed = time.perf_counter() - bare_started
                written = [(name, _version(answer))]
                bare_value = new
                floor_elapsed = 0.0
                if plugin is not None:
                    _settle(agent, *written)
                    floor_elapsed = kubelet.allocate(resource, [[f"{name}-2"]], plugin.socket_path)
                    written = list(plugin.versions.items())
                if i >= 20 and unheld:
                    samples.unheld.append(elapsed)
                elif i >= 20:
                    samples.allocate.append(elapsed)
                    samples.bare.append(bare_elapsed * 1000)
                    if plugin is not None:
                        samples.floor.append(floor_elapsed)
        finally:
            if plugin is not None:
                plugin.stop()
    return samples


CHURN = "bench-churn"
CHURN_INSTANCES = 20
CHURN_EVERY = 0.1  # seconds
CHURN_PODS = 5  # pods of the churn alive at a time


class Churn:
    """Background work for the sustained benches, in a thread of its own: every
    ``CHURN_EVERY`` a pod starts on ``node`` (and an older one is deleted), and another node
    claims or frees a slot of one of ``CHURN_INSTANCES`` Instances of a Configuration of
    their own. The agent's watch, cache applier, plugins (device lists to the kubelet) and
    reconciler (pod events, learn passes) all get work while the timed calls run."""

    def __init__(self, kubeconfig: str, namespace: str, node: str) -> None:
        self.api = AkriApi(new_api_client(kubeconfig), namespace)
        self.core = client.CoreV1Api(self.api.api_client)
        self.namespace, self.node = namespace, node
        self.values: dict[str, str] = {}
        self.writes = 0
        self.pods = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-churn", daemon=True)

    def start(self) -> Churn:
        descriptions = [f"churn{i:02d}" for i in range(CHURN_INSTANCES)]
        body = configuration(descriptions)
        body["metadata"]["name"] = CHURN
        self.api.create_configuration(body)
        deadline = time.monotonic() + 30
        while len(self.values) < CHURN_INSTANCES:
            if time.monotonic() > deadline:
                raise TimeoutError("the churn's Instances did not appear")
            items = self.api.list_instances()["items"]
            self.values = {
                o["metadata"]["name"]: "" for o in items if o["spec"]["configurationName"] == CHURN
            }
            time.sleep(0.05)
        self._thread.start()
        return self

    def wait_running(self, writes: int = 10, timeout: float = 30.0) -> None:
        """Until the churn has made ``writes`` writes (its pods and claims are flowing)."""
        deadline = time.monotonic() + timeout
        while self.writes < writes:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the churn made only {self.writes} writes")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        names = sorted(self.values)
        i = 0
        while not self._stop.wait(CHURN_EVERY):
            self._pod(i)
            self._claim(names[i % len(names)])
            i += 1

    def _claim(self, name: str) -> None:
        key, old = f"{name}-1", self.values[name]
        new = "" if old else "node-b"
        path = f"/spec/deviceUsage/{key}"
        ops = [
            {"op": "test", "path": path, "value": old},
            {"op": "replace", "path": path, "value": new},
        ]
        self.api.patch_instance(name, ops)
        self.values[name] = new
        self.writes += 1

    def _pod(self, i: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"churn-{i}"},
            "spec": {"nodeName": self.node, "containers": [{"name": "c", "image": "busybox"}]},
        }
        self.core.create_namespaced_pod(self.namespace, body)
        self.pods += 1
        if i >= CHURN_PODS:
            old = f"churn-{i - CHURN_PODS}"
            self.core.delete_namespaced_pod(old, self.namespace, grace_period_seconds=0)


def _sustained_rounds(rounds: int) -> tuple[_AllocateSamples, Churn]:
    """Allocate ms and floor-plugin Allocate ms, interleaved, back to back (nothing settled
    between calls), with ``Churn`` running; the slot reconciler on, as runagent runs."""
    with agents(["node-a"], reconcile=True, kubelet_process=True) as (api, [node], kubeconfig):
        api.create_configuration(configuration(["foo0"], capacity=3))
        name = _instance(api)
        resource, key = f"akri.sh/{name}", f"{name}-0"
        kubelet, agent = node.kubelet, node.agent
        assert isinstance(kubelet, KubeletProcess)
        _healthy(kubelet, resource, 3)
        plugin = FloorPlugin.beside(agent, kubeconfig, {f"{name}-2": name}).start()
        churn = Churn(kubeconfig, api.namespace, "node-a").start()
        samples = _AllocateSamples([], [], [])
        try:
            churn.wait_running()
            started, writes = time.monotonic(), churn.writes
            for i in range(rounds + 20):
                # Each goes first every other round: the one that follows meets the tail of
                # the other's background work (its echo, its cache write, the churn's too).
                floor_first = i % 2 == 1
                if floor_first:
                    floor_elapsed = kubelet.allocate(resource, [[f"{name}-2"]], plugin.socket_path)
                elapsed = kubelet.allocate(resource, [[key]])
                _release_checked(agent, name, key)
                if not floor_first:
                    floor_elapsed = kubelet.allocate(resource, [[f"{name}-2"]], plugin.socket_path)
                if i >= 20:
                    samples.allocate.append(elapsed)
                    samples.floor.append(floor_elapsed)
            # The load ran all along: about one write per CHURN_EVERY of the timed calls.
            expected = (time.monotonic() - started) / CHURN_EVERY
            if churn.writes - writes < expected / 2:
                raise RuntimeError(
                    f"the churn made {churn.writes - writes} writes in the timed calls, "
                    f"about {expected:.0f} expected: the load was not there"
                )
        finally:
            churn.stop()
            plugin.stop()
    return samples, churn


def _release_checked(agent: NodeAgent, name: str, key: str) -> None:
    """Free the slot the timed Allocate claimed, as the reconciler would; the release proves
    the claim was written (a bench whose calls wrote nothing would measure nothing)."""
    result = agent.claims.release(name, key, agent.node_name, current=agent.view.instance(name))
    if result != "released":
        raise RuntimeError(f"Allocate of {key} left nothing to release ({result!r})")


def bench_allocate(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    """As runagent runs (slot reconciler on, its Allocate hook included), then without the
    reconciler, each with its own bare baseline from the same run. The first run also times
    ``agent.bench.floor``'s plugin, whose Allocate is nothing but the one conditional write:
    ``floor_ratio_p50`` is the ratio an agent that added nothing to its write would print."""
    ensure_migrated()
    rounds = 100 if quick else 1000
    on = _allocate_rounds(rounds, reconcile=True, floor=True, hold_ab=True)
    off = _allocate_rounds(rounds, reconcile=False, floor=False)
    busy, churn = _sustained_rounds(rounds)
    webhook = webhook_rounds(rounds // 2)
    p50, bare_p50 = percentile(on.allocate, 50), percentile(on.bare, 50)
    floor_p50 = percentile(on.floor, 50)
    plain_p50, plain_bare_p50 = percentile(off.allocate, 50), percentile(off.bare, 50)
    busy_p50, busy_floor_p50 = percentile(busy.allocate, 50), percentile(busy.floor, 50)
    return {
        "p50_ms": p50,
        "p99_ms": percentile(on.allocate, 99),
        "floor_p50_ms": floor_p50,
        "over_floor_p50": p50 / floor_p50,
        "no_hold_p50_ms": percentile(on.unheld, 50),
        "no_hold_over_floor_p50": percentile(on.unheld, 50) / floor_p50,
        "bare_p50_ms": bare_p50,
        "ratio_p50": p50 / bare_p50,
        "floor_ratio_p50": floor_p50 / bare_p50,
        "no_reconciler_p50_ms": plain_p50,
        "no_reconciler_p99_ms": percentile(off.allocate, 99),
        "no_reconciler_ratio_p50": plain_p50 / plain_bare_p50,
        "sustained_p50_ms": busy_p50,
        "sustained_p99_ms": percentile(busy.allocate, 99),
        "sustained_floor_p50_ms": busy_floor_p50,
        "sustained_over_floor_p50": busy_p50 / busy_floor_p50,
        "sustained_churn_writes": churn.writes,
        **webhook,
        "rounds": rounds,
    }


def bench_health_propagation(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    ensure_migrated()
    rounds = 40 if quick else 200
    with agents(["node-a", "node-b"]) as (api, nodes, _):
        api.create_configuration(configuration(["foo0"]))
        name = _instance(api)
        resource = f"akri.sh/{name}"
        for node in nodes:
            _healthy(node.kubelet, resource, 2)
        watcher = nodes[1].kubelet
        key = f"{name}-0"
        value, samples = "", []
        for _ in range(rounds):
            new = "" if value else "node-a"
            health = "Healthy" if not new else "Unhealthy"
            ops = [
                {"op": "test", "path": f"/spec/deviceUsage/{key}", "value": value},
                {"op": "replace", "path": f"/spec/deviceUsage/{key}", "value": new},
            ]
            started = time.perf_counter()
            api.patch_instance(name, ops)
            watcher.wait_devices(resource, lambda d, h=health: d.get(key) == h, timeout=10)
            samples.append((time.perf_counter() - started) * 1000)
            value = new
    return {
        "p50_ms": percentile(samples, 50),
        "p95_ms": percentile(samples, 95),
        "max_ms": max(samples),
        "changes": rounds,
    }


# As the agent's DaemonSet runs it (deploy/base/agent.yaml): -OO (no docstrings, no asserts) and
# -X no_debug_ranges (no column tables in code objects), from bytecode compiled with the same
# flags when the image was built (deploy/Containerfile).
OPTIMIZED = {"PYTHONOPTIMIZE": "2", "PYTHONNODEBUGRANGES": "1"}
FLAGS = ("-OO", "-X", "no_debug_ranges")
# Left out of the processes the bench starts, whatever its own environment holds.
PYTHON_ENV = (*OPTIMIZED, "PYTHONPYCACHEPREFIX")


def bench_agent_memory(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    """``rss_mb`` once the 100 Instances' plugins are registered and listing their devices,
    ``peak_rss_mb`` the most the process ever held (its VmHWM) after a kubelet restart has had
    every plugin serve and register anew. The agent is configured as in its pod: in-cluster,
    over TLS with a service-account token (``TlsFront``), not from a kubeconfig, and runs with
    its DaemonSet's ``OPTIMIZED`` flags from bytecode compiled with them. The baseline, from
    the same run: the same agent started plainly (``plain_rss_mb``); ``flags_saved_mb`` is
    that minus ``rss_mb``."""
    ensure_migrated()
    # The plain agent reads the bytecode compiled beside the sources, as the image's other
    # processes do; compiling its modules at start-up instead would leave some 2 MB more in
    # the heap, and a figure that depends on the working tree.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "agent", "akri_site"],
        cwd=str(settings.BASE_DIR),
        check=True,
    )
    cache = _optimized_bytecode()
    # Empty is unset: a module the optimized agent compiles at start-up leaves its .pyc in
    # the cache, where the bench looks for it (the image sets PYTHONDONTWRITEBYTECODE).
    optimized = {**OPTIMIZED, "PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": ""}
    _check_optimized(optimized)
    plain = _agent_memory({})
    for key in ("exit_code", "sockets_left"):
        if plain[key]:
            raise RuntimeError(f"the plain agent's {key} was {plain[key]}")
    before = _files(cache)
    figures = _agent_memory(optimized)
    # Every module the agent imported was found compiled: one compiled at start-up instead
    # (its .pyc then written into the cache) leaves the compiler's garbage in the figure.
    compiled = sorted(_files(cache) - before)
    if compiled:
        raise RuntimeError(f"the agent compiled {len(compiled)} modules at start: {compiled[:3]}")
    return {
        "rss_mb": figures["rss_mb"],
        "plain_rss_mb": plain["rss_mb"],
        "flags_saved_mb": plain["rss_mb"] - figures["rss_mb"],
        **figures,
    }


def _optimized_bytecode() -> Path:
    """Everything the agent may import (the standard library, the venv's site-packages, the
    project) compiled with ``FLAGS`` into a cache of the bench's own, through
    PYTHONPYCACHEPREFIX: nothing is written into the Python installation or the venv, and
    no .pyc compiled otherwise is ever read. compileall skips what is up to date: the first
    run compiles for a minute or two, later ones take seconds."""
    cache = (
        Path(settings.VAR_DIR)
        / "bench-pycache"
        / f"OO-no_debug_ranges-{sys.implementation.cache_tag}"
    )
    paths = sysconfig.get_paths()
    stdlib = paths["stdlib"]
    sources = [stdlib, paths["purelib"], paths["platlib"]]
    sources += [str(settings.BASE_DIR / "agent"), str(settings.BASE_DIR / "akri_site")]
    subprocess.run(
        [sys.executable, *FLAGS, "-m", "compileall", "-q", "-j0"]
        # The standard library's own tests hold files that are not Python on purpose.
        + ["-x", f"^{re.escape(stdlib)}/(test|lib2to3/tests)/", *dict.fromkeys(sources)],
        env={**_python_env(), "PYTHONPYCACHEPREFIX": str(cache)},
        check=True,
    )
    return cache


def _check_optimized(env: dict[str, str]) -> None:
    """A process started with ``env`` runs optimized: ``json``'s docstring gone, its code
    without column positions, its bytecode looked for in the bench's cache."""
    code = (
        "import json, sys\n"
        "print(json.dumps([sys.flags.optimize, json.__doc__, json.__cached__,\n"
        "    sorted({p[2:] for p in json.dumps.__code__.co_positions()})]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**_python_env(), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    optimize, doc, cached, columns = json.loads(done.stdout)
    cache = env["PYTHONPYCACHEPREFIX"]
    if (optimize, doc, columns) != (2, None, [[None, None]]) or not cached.startswith(cache):
        raise RuntimeError(f"a process with {env} did not run as the DaemonSet's: {done.stdout}")


def _python_env() -> dict[str, str]:
    """This process's environment without ``PYTHON_ENV``."""
    return {k: v for k, v in os.environ.items() if k not in PYTHON_ENV}


def _files(root: Path) -> set[str]:
    return {os.path.join(d, name) for d, _, names in os.walk(root) for name in names}


def _agent_memory(python: dict[str, str]) -> dict[str, Any]:
    """One ``manage.py runagent`` serving 100 Instances, its interpreter started with the
    environment ``python`` adds; its figures once every plugin is checked served."""
    count = 100
    root = tempfile.mkdtemp(prefix="bm", dir="/tmp")
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    log_path = os.path.join(root, "agent.log")
    manage = str(settings.BASE_DIR / "manage.py")
    proc: subprocess.Popen | None = None
    kubelet = KubeletSimulator(os.path.join(root, "dp"), os.path.join(root, "pr.sock"), "node-a")
    try:
        with ApiServerSimulator() as sim, TlsFront(sim.port, Path(root) / "tls") as front:
            sim.ensure_namespace(namespace)
            kubeconfig = str(sim.write_kubeconfig(os.path.join(root, "kubeconfig")))
            metrics_port = _free_port()
            account = Path(root) / "serviceaccount"
            account.mkdir()
            (account / "token").write_text("bench-token")
            shutil.copy(front.ca, account / "ca.crt")
            env = dict(
                _python_env(),
                AKRI_SQLITE_PATH=os.path.join(root, "agent.sqlite3"),
                KUBECONFIG="",
                KUBERNETES_SERVICE_HOST="127.0.0.1",
                KUBERNETES_SERVICE_PORT=str(front.port),
                AKRI_SERVICE_ACCOUNT_DIR=str(account),
                AKRI_NAMESPACE=namespace,
                DATABASE_URL="",
                LOG_LEVEL="WARNING",
                # /metrics served, as in the DaemonSet, on a port of its own.
                METRICS_PORT=str(metrics_port),
                AKRI_METRICS_ADDRESS="127.0.0.1",
                METRICS_TOKEN=METRICS_TOKEN,
                # As the agent's DaemonSet runs it: no web stack loaded (see settings), and
                # glibc's malloc arenas bounded.
                AKRI_AGENT_ONLY="true",
                MALLOC_ARENA_MAX="2",
            )
            # Plain, as the DaemonSet's init container runs it.
            subprocess.run([sys.executable, manage, "migrate", "-v", "0"], env=env, check=True)
            kubelet.start()
            with open(log_path, "w") as log:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        manage,
                        "runagent",
                        "--node-name=node-a",
                        f"--device-plugin-dir={kubelet.plugin_dir}",
                        f"--pod-resources-socket={kubelet.pod_resources_socket}",
                        f"--registration-socket={os.path.join(root, 'reg.sock')}",
                        f"--debug-echo-availability={os.path.join(root, 'echo')}",
                    ],
                    env={**env, **python},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            api = AkriApi(new_api_client(kubeconfig), namespace)
            started = time.monotonic()
            api.create_configuration(configuration([f"dev-{i:03d}" for i in range(count)]))
            _wait_registered(kubelet, count + 1, proc, log_path)
            ready_s = time.monotonic() - started
            expected = _expected_resources(api, count)
            _check_served(kubelet, expected)
            _check_metrics(metrics_port)
            process = psutil.Process(proc.pid)
            rss = process.memory_info().rss / (1024 * 1024)
            threads = process.num_threads()
            # And a kubelet restart with all of them: every plugin serves and registers anew.
            restarted = time.monotonic()
            kubelet.restart()
            _wait_registered(kubelet, count + 1, proc, log_path, after=restarted)
            reregister_s = time.monotonic() - restarted
            _check_served(kubelet, expected, after=restarted)
            peak = _peak_rss_mb(proc.pid)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
            leftover = [n for n in os.listdir(kubelet.plugin_dir) if n != "kubelet.sock"]
            if not front.connections:
                raise RuntimeError("the agent never reached the API server through TLS")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "rss_mb": rss,
        "peak_rss_mb": peak,
        "plugins": count + 1,
        "threads": threads,
        "ready_s": ready_s,
        "reregister_s": reregister_s,
        "exit_code": code,
        "sockets_left": len(leftover),
    }


METRICS_TOKEN = "bench-metrics-token"


def _check_metrics(port: int) -> None:
    """The agent's /metrics answers, as its DaemonSet's scrape would have it."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        if answer.status != 200 or b"# TYPE" not in answer.read():
            raise RuntimeError(f"the agent's /metrics answered {answer.status} without metrics")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _expected_resources(api: AkriApi, count: int) -> dict[str, int]:
    """Resource name -> healthy devices, from the API server: one IL plugin per Instance of
    the Configuration (its capacity, all free), and the Configuration's CL plugin (unique
    devices, Akri's default: one per Instance)."""
    items = [o for o in api.list_instances()["items"] if o["spec"]["configurationName"] == CONFIG]
    if len(items) != count:
        raise RuntimeError(f"{len(items)} Instances in the API server, {count} expected")
    expected = {f"akri.sh/{o['metadata']['name']}": o["spec"]["capacity"] for o in items}
    expected[f"akri.sh/{CONFIG}"] = len(items)
    return expected


def _check_served(kubelet: KubeletSimulator, expected: dict[str, int], after: float = 0.0) -> None:
    """Every expected plugin registered (after ``after``) and lists all its devices, healthy:
    the figure is of an agent that served them all."""
    registered = {e.resource for e in kubelet.registrations if e.time > after}
    resources = kubelet.resources()
    wrong = sorted(
        name
        for name, devices in expected.items()
        if name not in registered
        or not resources[name].connected
        or len(resources[name].healthy()) != devices
    )
    if wrong:
        raise RuntimeError(f"{len(wrong)} plugins not served as expected, e.g. {wrong[:3]}")


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


class TlsFront:
    """The API-server simulator behind TLS, so that the agent connects as in a pod: in-cluster
    configuration, ``https://KUBERNETES_SERVICE_HOST:PORT`` checked against the service
    account's CA (the simulator itself speaks plain HTTP). Bytes pass both ways as they come,
    so watches stream. Its own event loop in a thread; ``connections`` counts the clients."""

    def __init__(self, upstream_port: int, directory: Path) -> None:
        tls = make_tls(directory, names=("127.0.0.1",))
        self.ca = tls.ca
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(tls.cert, tls.key)
        self._upstream = upstream_port
        self._loop = LoopThread("tls-front", blocking_workers=1)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0
        self.connections = 0

    def __enter__(self) -> TlsFront:
        self._loop.start()
        self._server = self._loop.run(self._listen(), timeout=30)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.run(self._close(), timeout=30)
        self._loop.stop()

    async def _listen(self) -> asyncio.base_events.Server:
        return await asyncio.start_server(self._client, "127.0.0.1", 0, ssl=self._context)

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


def _wait_registered(
    kubelet: KubeletSimulator,
    wanted: int,
    proc: subprocess.Popen,
    log_path: str,
    after: float = 0.0,
) -> None:
    """Until ``wanted`` resources registered (after ``after``, monotonic) and listed devices."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        registered = {e.resource for e in kubelet.registrations if e.time > after}
        resources = kubelet.resources()
        listed = [r for n, r in resources.items() if r.connected and r.devices and n in registered]
        if len(listed) >= wanted:
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    with open(log_path) as log:
        tail = log.read()[-3000:]
    raise RuntimeError(f"agent did not register {wanted} plugins; its log ends:\n{tail}")
