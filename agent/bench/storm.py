"""The ``release-storm`` benchmark: pods on shared Instances across many nodes deleted at once.

The world (defaults from issue 32 §5): 50 nodes in racks of 5; each rack shares 5 Instances, so
every Instance has slots held by 5 nodes; 5,000 pods (100 a node) are deleted by one
``deletecollection`` while 500 live pods (10 a node) on the same Instances keep running. The
API-server simulator runs in a process of its own, as a real API server would, and so do the
nodes' kubelets (a ``PodFinisher`` each: the kubelet's side of pod deletion). The agents run in
processes of their own, ``AGENTS_PER_PROCESS`` nodes to a process: each node's
``NodeReconciler`` (the release path: pod watch, bindings, claim store) over a PodResources
stand-in, the process's nodes sharing one ``CacheSync`` and one SQLite file of the process's own,
as each agent of the DaemonSet has its own. On a cluster every agent has an interpreter of its
own; 50 in one measured its interpreter lock, not the agents (see ``AGENTS_PER_PROCESS``).

Figures, for the reconcilers as the agent runs them (releases of one Instance due together
folded into one conditional write):

- ``writes_per_slot``: Instance PATCH requests the agents sent (conflicts included) per freed
  slot, counted at their API clients;
- ``free_p95_s``: from each pod's disappearance from the API server (its DELETED event, seen by
  a watch) to its slot free there (seen by a watch on the Instances);
- ``live_touched``: live pods' slots that changed at any moment (must be 0);
- ``delete_s``: the ``deletecollection`` call, and ``gone_s`` until every pod is gone;
- ``agents_cpu_ms_per_slot``: the CPU time the agents' processes spent from the deletion until
  their books were written (``check``), per freed slot, and ``stand_ins_cpu_ms_per_slot`` the
  same for the API-server simulator and the kubelets: on this 2-core machine the three share
  the cores, so what the agents spend the stand-ins wait for, and the pods go later;
- the same storm with every slot released on its own (``fold_releases=False``), in the same run,
  as the baseline: ``unfolded_writes_per_slot``, ``unfolded_free_p95_s`` and the ratios.

Each run checks its own answers against the API server and fails loudly: every storm slot
free, every live slot still held by its node, every pod gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from kubernetes import client, watch

from agent.bench import percentile
from agent.domain.holdings import HOLDS
from agent.domain.naming import il_resource_name, slot_key
from agent.kube.claims import ClaimStore
from agent.kube.client import GROUP, INSTANCES, VERSION, AkriApi, new_api_client
from agent.kube.watch import CacheSync
from agent.models import ReconcileRun
from agent.node.podresources import DeviceUse
from agent.node.reconcile import NodeReconciler
from agent.simulator.kubelet_pods import PodFinisher

RACK = 5  # nodes sharing the same Instances
PER_NODE_INSTANCES = 5
TIMEOUT = 300.0
QUICK = {"nodes": 5, "pods": 100, "live": 20}
DEFAULT = {"nodes": 50, "pods": 5000, "live": 500}
STORM_LABEL = "akri-bench/storm"
# Agents (nodes) to a process. All 50 in one interpreter, their hundreds of threads queued on
# its lock: a submit to a thread pool took 0.7 s at p95, a deleted pod reached its agent's
# watch up to 2 s after the bench's, and free_p95_s was 3.2-5.1 s (writes_per_slot 0.29, as
# the agents fell behind and their backlog went out in few writes). Measured side by side on
# this 2-core machine: 10 to a process, 2.39 s (five caches' work took the kubelets' CPU:
# the pods took 19 s to go); 25 to a process, 1.41-1.60 s (1.16-2.62 s over nine later runs);
# 17, the same as 25. (All measured while the stand-in kubelets removed four pods at a time.)
AGENTS_PER_PROCESS = 25


def bench_release_storm(
    quick: bool = False,
    stdout: Any = None,
    nodes: int | None = None,
    pods: int | None = None,
    live: int | None = None,
) -> dict[str, object]:
    size = dict(QUICK if quick else DEFAULT)
    for key, value in (("nodes", nodes), ("pods", pods), ("live", live)):
        if value is not None:
            size[key] = value
    if size["nodes"] < 1 or size["pods"] < size["nodes"] or size["live"] < 0:
        raise ValueError(f"a storm needs nodes >= 1 and pods >= nodes: {size}")
    # The baseline first, so that the figure that counts does not run on a warmer machine.
    unfolded = Storm(fold=False, **size).run(stdout)
    folded = Storm(fold=True, **size).run(stdout)
    return {
        **size,
        "writes_per_slot": folded.writes_per_slot,
        "free_p95_s": folded.free_p95,
        "free_p50_s": folded.free_p50,
        "live_touched": folded.live_touched,
        "delete_s": folded.delete_s,
        "gone_s": folded.gone_s,
        "agents_cpu_ms_per_slot": folded.agents_cpu_ms,
        "stand_ins_cpu_ms_per_slot": folded.stand_ins_cpu_ms,
        "unfolded_writes_per_slot": unfolded.writes_per_slot,
        "unfolded_free_p95_s": unfolded.free_p95,
        "unfolded_live_touched": unfolded.live_touched,
        "unfolded_agents_cpu_ms_per_slot": unfolded.agents_cpu_ms,
        "writes_ratio": folded.writes_per_slot / unfolded.writes_per_slot,
        "free_p95_ratio": folded.free_p95 / unfolded.free_p95 if unfolded.free_p95 else 0.0,
    }


# --- the kubelet's side --------------------------------------------------------------------------
class StormKubelet:
    """What a node's kubelet reports through PodResources, for the reconciler, and what its
    ``PodFinisher`` removes when it stops a pod: the two calls the agent and the finisher make."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._uses: dict[tuple[str, str], list[DeviceUse]] = {}
        self._lock = threading.Lock()

    def hold(self, use: DeviceUse) -> None:
        with self._lock:
            self._uses.setdefault((use.namespace, use.pod), []).append(use)

    def list(self) -> list[DeviceUse]:
        with self._lock:
            return [use for uses in self._uses.values() for use in uses]

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._uses.pop((namespace, name), None)


class CountingApi(AkriApi):
    """The agents' Instance API, counting the PATCH requests they send (conflicts included)."""

    def __init__(self, api_client: client.ApiClient, namespace: str, counter: Counter) -> None:
        super().__init__(api_client, namespace)
        self.counter = counter

    def patch_instance(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self.counter.add()
        return super().patch_instance(name, ops)


class Counter:
    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.value += 1


# --- one storm -----------------------------------------------------------------------------------
@dataclass
class Result:
    writes_per_slot: float
    free_p95: float
    free_p50: float
    live_touched: int
    delete_s: float
    gone_s: float
    agents_cpu_ms: float = 0.0
    stand_ins_cpu_ms: float = 0.0


@dataclass
class Storm:
    fold: bool
    nodes: int
    pods: int
    live: int
    seed: int = 32
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def __post_init__(self) -> None:
        self.namespace = f"storm-{self.tag}"
        self.node_names = [f"{self.tag}-node-{i:02d}" for i in range(self.nodes)]
        self.storm_keys: dict[str, str] = {}  # slot -> pod name
        self.live_keys: dict[str, str] = {}  # slot -> holder node
        self.instances: dict[str, dict[str, str]] = {}  # name -> deviceUsage
        # node -> (pod, Instance, slot, live?)
        self.holds: dict[str, list[tuple[str, str, str, bool]]] = defaultdict(list)

    @property
    def _name(self) -> str:
        return "folded" if self.fold else "unfolded"

    def run(self, stdout: Any = None) -> Result:
        root = tempfile.mkdtemp(prefix="akstorm", dir="/tmp")
        server = _start_simulator(root, self.namespace)
        agents: list[AgentsProcess] = []
        finishers = watches = None
        try:
            kubeconfig = os.path.join(root, "kubeconfig")
            api_client = new_api_client(kubeconfig)
            self._plan()
            self._create(api_client)
            agents = self._start_agents(root, kubeconfig)
            self._wait_published(api_client)
            finishers = _start_kubelets(kubeconfig, self.namespace, self.node_names)
            process_of = {
                pod: agents[i // AGENTS_PER_PROCESS]
                for i, node in enumerate(self.node_names)
                for pod, *_ in self.holds[node]
            }

            def stopped(pod: str) -> None:  # the kubelet stopped it: PodResources lists it no more
                process_of[pod].tell(f"gone {pod}")

            watches = Watches(
                new_api_client(kubeconfig), self.namespace, self.live_keys, stopped
            ).start()
            if stdout is not None:
                stdout.write(f"  {self._name}: world ready, deleting\n")
                stdout.flush()
            stand_ins = [server.pid, finishers.pid]
            stand_ins_before = sum(_cpu_seconds(pid) for pid in stand_ins)
            result, agents_before = self._storm(api_client, watches, agents)
            agents_cpu = self._check(api_client, agents) - agents_before
            stand_ins_cpu = sum(_cpu_seconds(pid) for pid in stand_ins) - stand_ins_before
            slots = len(self.storm_keys)
            result.agents_cpu_ms = round(agents_cpu * 1000 / slots, 3)
            result.stand_ins_cpu_ms = round(stand_ins_cpu * 1000 / slots, 3)
            if stdout is not None:
                stdout.write(f"  {self._name}: {result}\n")
            return result
        finally:
            if watches is not None:
                watches.stop()
            if finishers is not None:
                _stop(finishers)
            for process in agents:
                _stop(process.process)
            server.terminate()
            server.wait(30)
            shutil.rmtree(root, ignore_errors=True)

    # --- the world ------------------------------------------------------------------------------
    def _plan(self) -> None:
        """Which pod holds which slot: each rack of nodes shares its Instances, and each node's
        live and storm pods are mixed over them, so a folded write always has live slots of
        the same node beside it."""
        rng = random.Random(self.seed)
        storm_at = _spread(self.pods, self.nodes)
        live_at = _spread(self.live, self.nodes)
        for i, node in enumerate(self.node_names):
            rack = i // RACK
            names = [f"storm-{self.tag}-{rack:02d}{k}" for k in range(PER_NODE_INSTANCES)]
            kinds = [True] * live_at[i] + [False] * storm_at[i]
            rng.shuffle(kinds)
            for j, is_live in enumerate(kinds):
                instance = names[j % len(names)]
                usage = self.instances.setdefault(instance, {})
                key = slot_key(instance, len(usage))
                usage[key] = node
                pod = f"{'live' if is_live else 'gone'}-{i:02d}-{j:04d}"
                self.holds[node].append((pod, instance, key, is_live))
                if is_live:
                    self.live_keys[key] = node
                else:
                    self.storm_keys[key] = pod

    def _create(self, api_client: client.ApiClient) -> None:
        akri = AkriApi(api_client, self.namespace)
        core = client.CoreV1Api(api_client)
        for node in self.node_names:
            core.create_node({"metadata": {"name": node}})
        for name, usage in self.instances.items():
            akri.create_instance(_instance_body(name, usage))
        bodies = []
        for node, held in self.holds.items():
            for pod, instance, _, is_live in held:
                bodies.append(_pod_body(pod, node, il_resource_name(instance), is_live))
        _in_parallel(lambda body: core.create_namespaced_pod(self.namespace, body), bodies)

    def _start_agents(self, root: str, kubeconfig: str) -> list[AgentsProcess]:
        """The agents' processes (``agents_main``), each on a SQLite file of its own migrated
        from one template; returns once every agent has learned its pods and written its
        books."""
        template = os.path.join(root, "template.sqlite3")
        subprocess.run(
            [sys.executable, str(settings.BASE_DIR / "manage.py"), "migrate", "-v", "0"],
            env={**os.environ, "AKRI_SQLITE_PATH": template, "DATABASE_URL": ""},
            check=True,
        )
        agents = []
        for i in range(0, len(self.node_names), AGENTS_PER_PROCESS):
            nodes = self.node_names[i : i + AGENTS_PER_PROCESS]
            database = os.path.join(root, f"agents-{i:03d}.sqlite3")
            shutil.copy(template, database)
            plan = os.path.join(root, f"agents-{i:03d}.json")
            held = {node: [[pod, instance, key] for pod, instance, key, _ in self.holds[node]]
                    for node in nodes}  # fmt: skip
            Path(plan).write_text(json.dumps(held))
            agents.append(
                AgentsProcess.start(kubeconfig, self.namespace, self.fold, plan, database)
            )
        for process in agents:  # they start side by side
            process.wait_ready()
        return agents

    def _wait_published(self, api_client: client.ApiClient) -> None:
        """Pods run a while before they end: the agents have written on each pod what it
        holds (``agent.node.holdings``), so that this work is not in the storm's figures."""
        core = client.CoreV1Api(api_client)
        deadline = time.monotonic() + TIMEOUT
        while True:
            pods = core.list_namespaced_pod(self.namespace).items
            if all(HOLDS in (p.metadata.annotations or {}) for p in pods):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the agents did not annotate their pods in time")
            time.sleep(0.5)

    # --- the storm ------------------------------------------------------------------------------
    def _storm(
        self, api_client: client.ApiClient, watches: Watches, agents: list[AgentsProcess]
    ) -> tuple[Result, float]:
        """The storm's figures, and the agents' processes' CPU seconds before it."""
        core = client.CoreV1Api(api_client)
        before = [process.ask("count") for process in agents]
        writes_before = sum(answer["patches"] for answer in before)
        started = time.monotonic()
        core.delete_collection_namespaced_pod(self.namespace, label_selector=f"{STORM_LABEL}=yes")
        delete_s = time.monotonic() - started
        watches.wait(set(self.storm_keys), set(self.storm_keys.values()), TIMEOUT)
        writes = sum(process.ask("count")["patches"] for process in agents) - writes_before
        latencies = [watches.freed[key] - watches.gone[pod] for key, pod in self.storm_keys.items()]
        result = Result(
            writes_per_slot=round(writes / len(self.storm_keys), 3),
            free_p95=round(percentile(latencies, 95), 3),
            free_p50=round(percentile(latencies, 50), 3),
            live_touched=len(watches.touched),
            delete_s=round(delete_s, 2),
            gone_s=round(max(watches.gone.values()) - started, 2),
        )
        return result, sum(answer["cpu_s"] for answer in before)

    def _check(self, api_client: client.ApiClient, agents: list[AgentsProcess]) -> float:
        """The answers, from the API server: loudly wrong rather than quietly fast. Returns
        the agents' processes' CPU seconds so far, their books written."""
        akri = AkriApi(api_client, self.namespace)
        usage: dict[str, str] = {}
        for obj in akri.list_instances()["items"]:
            usage.update(obj["spec"].get("deviceUsage") or {})
        held = [key for key in self.storm_keys if usage.get(key) != ""]
        moved = [key for key, node in self.live_keys.items() if usage.get(key) != node]
        pods = client.CoreV1Api(api_client).list_namespaced_pod(self.namespace).items
        left = [p.metadata.name for p in pods if p.metadata.name.startswith("gone-")]
        if held or moved or left or len(pods) != len(self.live_keys):
            raise RuntimeError(
                f"release-storm answers wrong: {len(held)} storm slots still held {held[:5]},"
                f" {len(moved)} live slots changed {moved[:5]}, {len(left)} storm pods left,"
                f" {len(pods)} pods in all for {len(self.live_keys)} live"
            )
        answers = [process.ask("check") for process in agents]
        errors = sum(answer["errors"] for answer in answers)
        if errors:
            raise RuntimeError(f"{errors} reconcile runs counted errors during the storm")
        return sum(answer["cpu_s"] for answer in answers)


class Watches:
    """When each pod left the API server and each slot turned free there, and whether a live
    pod's slot ever changed, from two watches of the bench's own."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        live_keys: dict[str, str],
        on_gone: Any = None,
    ) -> None:
        self.api_client = api_client
        self.on_gone = on_gone
        self.namespace = namespace
        self.live_keys = live_keys
        self.gone: dict[str, float] = {}
        self.freed: dict[str, float] = {}
        self.touched: set[str] = set()
        self.cond = threading.Condition()
        self._watches = [watch.Watch(), watch.Watch()]
        self._threads = [
            threading.Thread(target=self._guarded, args=(self._follow_pods,), daemon=True),
            threading.Thread(target=self._guarded, args=(self._follow_instances,), daemon=True),
        ]
        self._stopped = False
        self._started = threading.Barrier(3)

    def start(self) -> Watches:
        for thread in self._threads:
            thread.start()
        self._started.wait(60)
        return self

    def stop(self) -> None:
        self._stopped = True
        for w in self._watches:
            w.stop()

    def _guarded(self, follow: Any) -> None:
        try:
            follow()
        except Exception:  # the simulator went away at the end of the run
            if not self._stopped:
                raise

    def _follow_pods(self) -> None:
        core = client.CoreV1Api(self.api_client)
        # Listed first, so that the watch starts after the world and misses nothing after it.
        rv = core.list_namespaced_pod(self.namespace).metadata.resource_version
        self._started.wait(60)
        # Events as plain dicts (deserialize=False), here and below: typed models cost this
        # process, which the agents share, more CPU than a storm's releases.
        stream = self._watches[0].stream(
            core.list_namespaced_pod,
            self.namespace,
            resource_version=rv,
            timeout_seconds=900,
            deserialize=False,
        )
        for event in stream:
            if event["type"] == "DELETED":
                name = event["object"]["metadata"]["name"]
                with self.cond:
                    self.gone.setdefault(name, time.monotonic())
                    self.cond.notify_all()
                if self.on_gone is not None:
                    self.on_gone(name)

    def _follow_instances(self) -> None:
        custom = client.CustomObjectsApi(self.api_client)
        args = (GROUP, VERSION, self.namespace, INSTANCES)
        rv = custom.list_namespaced_custom_object(*args)["metadata"]["resourceVersion"]
        self._started.wait(60)
        stream = self._watches[1].stream(
            custom.list_namespaced_custom_object,
            *args,
            resource_version=rv,
            timeout_seconds=900,
            deserialize=False,
        )
        for event in stream:
            usage = (event["object"].get("spec") or {}).get("deviceUsage") or {}
            now = time.monotonic()
            with self.cond:
                for key, value in usage.items():
                    if key in self.live_keys:
                        if value != self.live_keys[key]:
                            self.touched.add(key)
                    elif value == "":
                        self.freed.setdefault(key, now)
                self.cond.notify_all()

    def wait(self, keys: set[str], pods: set[str], timeout: float) -> None:
        with self.cond:
            done = self.cond.wait_for(
                lambda: keys <= self.freed.keys() and pods <= self.gone.keys(), timeout
            )
            if not done:
                raise RuntimeError(
                    f"release-storm: after {timeout:.0f} s, {len(keys - self.freed.keys())} slots"
                    f" not free and {len(pods - self.gone.keys())} pods not gone"
                )


# --- helpers -------------------------------------------------------------------------------------
def _spread(total: int, nodes: int) -> list[int]:
    return [total // nodes + (1 if i < total % nodes else 0) for i in range(nodes)]


def _instance_body(name: str, usage: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": name},
        "spec": {
            "configurationName": "storm",
            "cdiName": f"akri.sh/storm={name[-6:]}",
            "capacity": len(usage),
            "shared": True,
            "nodes": sorted(set(usage.values())),
            "brokerProperties": {},
            "deviceUsage": dict(usage),
        },
    }


def _pod_body(name: str, node: str, resource: str, live: bool) -> dict[str, Any]:
    limits = {resource: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {STORM_LABEL: "no" if live else "yes"}},
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


def _in_parallel(fn: Any, items: list[Any], threads: int = 8) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(fn, items):
            pass


def _start_simulator(root: str, namespace: str) -> subprocess.Popen:
    """The API-server simulator in a process of its own; returns once it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = os.path.join(root, "kubeconfig")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.simulator.apiserver",
            "--port",
            str(port),
            "--kubeconfig",
            kubeconfig,
            "--namespace",
            namespace,
        ],  # fmt: skip
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("AKRI_BENCH_VERBOSE") else subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(kubeconfig):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the API-server simulator did not start")
        time.sleep(0.05)
    core = client.CoreV1Api(new_api_client(kubeconfig))
    core.create_namespace({"metadata": {"name": namespace}})
    return process


def _start_kubelets(kubeconfig: str, namespace: str, nodes: list[str]) -> subprocess.Popen:
    """The nodes' kubelets, their side of pod deletion (``PodFinisher``), in a process of their
    own, as on a cluster where they run on other machines: in the agents' process, 50 of them
    took its interpreter lock, and the agents saw each deletion seconds late. Returns once
    every one has listed its pods; it ends when its stdin closes."""
    process = _bench_process("kubelets_main", [kubeconfig, namespace, *nodes])
    if process.stdout.readline().strip() != "synced":
        _stop(process)
        raise RuntimeError("the kubelets' process did not start")
    return process


def _bench_process(main: str, args: list[str], **env: str) -> subprocess.Popen:
    """``storm.<main>()`` in a process of its own, Django set up, ``args`` as its argv, talked
    to over its stdin and stdout (its log shown only with AKRI_BENCH_VERBOSE)."""
    code = f"import django; django.setup(); from agent.bench import storm; storm.{main}()"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=settings.BASE_DIR,
        env={"DJANGO_SETTINGS_MODULE": "akri_site.settings", **os.environ, **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None if os.environ.get("AKRI_BENCH_VERBOSE") else subprocess.DEVNULL,
        text=True,
    )


def kubelets_main() -> None:
    """The kubelets' process (``_start_kubelets``): argv is kubeconfig, namespace, nodes."""
    kubeconfig, namespace, *nodes = sys.argv[1:]
    finishers = [
        PodFinisher(StormKubelet(node), new_api_client(kubeconfig), namespace).start()
        for node in nodes
    ]
    for finisher in finishers:
        if not finisher.wait_synced(60):
            raise SystemExit(f"kubelet {finisher.node} did not list its pods")
    print("synced", flush=True)
    sys.stdin.read()  # until the bench closes it
    for finisher in finishers:
        finisher.stop()


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process of ours so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        process.stdin.close()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


# --- the agents' side ----------------------------------------------------------------------------
class AgentsProcess:
    """Some nodes' agents in a process of their own (``agents_main``), told over its stdin
    which pods their kubelets stopped (``gone <pod>``, from the bench's pod watch: one watch
    for all, not one more per process) and asked ``count`` (the Instance PATCH requests sent
    so far) and ``check`` (books written, and the reconcile runs that counted errors), each
    answered with the process's CPU time so far; it ends
    when its stdin closes."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self._writing = threading.Lock()  # the bench's pod watch tells, its main thread asks

    @classmethod
    def start(
        cls, kubeconfig: str, namespace: str, fold: bool, plan: str, database: str
    ) -> AgentsProcess:
        args = [kubeconfig, namespace, "1" if fold else "0", plan]
        process = _bench_process("agents_main", args, AKRI_SQLITE_PATH=database, DATABASE_URL="")
        return cls(process)

    def wait_ready(self) -> None:
        if self.process.stdout.readline().strip() != "ready":
            _stop(self.process)
            raise RuntimeError("an agents' process did not start (AKRI_BENCH_VERBOSE=1 shows why)")

    def tell(self, line: str) -> None:
        """A line with no answer: ``gone <pod>``, its kubelet stopped the pod."""
        with self._writing:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()

    def ask(self, command: str) -> dict[str, int]:
        self.tell(command)
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"an agents' process ended before answering {command!r}")
        return json.loads(answer)


def agents_main() -> None:
    """An agents' process (``AgentsProcess``): argv is kubeconfig, namespace, fold (1 or 0) and
    the plan, a JSON file of node -> [pod, Instance, slot] held there."""
    kubeconfig, namespace, fold, plan_path = sys.argv[1:]
    plan: dict[str, list[list[str]]] = json.loads(Path(plan_path).read_text())
    kubelets = {node: StormKubelet(node) for node in plan}
    node_of = {}
    for node, held in plan.items():
        for pod, instance, key in held:
            kubelets[node].hold(DeviceUse(il_resource_name(instance), key, namespace, pod, "main"))
            node_of[pod] = node
    patches = Counter()
    sync = CacheSync(new_api_client(kubeconfig), namespace, owner="storm").start()
    reconcilers: list[NodeReconciler] = []
    try:
        sync.wait_synced()
        for node in plan:
            api_client = new_api_client(kubeconfig)
            reconcilers.append(
                NodeReconciler(
                    node=node,
                    namespace=namespace,
                    pod_resources=kubelets[node],
                    claims=ClaimStore(
                        CountingApi(api_client, namespace, patches), f"agent:{node}", sync=sync
                    ),
                    api_client=api_client,
                    sync=sync,
                    sweep_interval=3600,
                    fold_releases=fold == "1",
                ).start(startup_timeout=60)
            )
        _wait_learned(reconcilers, plan)
        for reconciler in reconcilers:
            if not reconciler.flush(timeout=TIMEOUT):
                raise SystemExit(f"{reconciler.node} did not write its books in time")

        print("ready", flush=True)
        for line in sys.stdin:  # until the bench closes it
            command, _, pod = line.strip().partition(" ")
            if command == "gone":  # its kubelet stopped it: PodResources lists it no more
                kubelets[node_of[pod]].remove_pod(namespace, pod)
                continue
            if command == "count":
                answer = {"patches": patches.value, "cpu_s": time.process_time()}
            elif command == "check":
                for reconciler in reconcilers:
                    reconciler.flush(timeout=60)
                errors = ReconcileRun.objects.filter(node__in=list(plan), errors__gt=0).count()
                answer = {"errors": errors, "cpu_s": time.process_time()}
            else:  # the bench's own mistake: said, not taken for another command
                answer = {"error": f"unknown command {command!r}"}
            print(json.dumps(answer), flush=True)
    finally:
        for reconciler in reconcilers:
            reconciler.stop()
        sync.stop()


def _wait_learned(reconcilers: list[NodeReconciler], plan: dict[str, list[list[str]]]) -> None:
    """The start-up sweeps adopt every held slot and learn its pod from PodResources."""
    deadline = time.monotonic() + TIMEOUT
    for reconciler in reconcilers:
        wanted = {pod for pod, _, _ in plan[reconciler.node]}
        while {b.pod_name for b in reconciler.bindings()} != wanted:
            if time.monotonic() > deadline:
                raise SystemExit(f"{reconciler.node} did not learn its pods in time")
            time.sleep(0.05)
