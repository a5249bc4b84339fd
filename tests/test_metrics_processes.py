"""Every process serves its own ``/metrics``, and between them they export every series the
Grafana dashboard and the alert rules query.

Each process runs on its own, as deploy/ runs it: ``runagent`` with its own SQLite file against
the API server and a kubelet simulator; ``runcontroller``, a prefork Celery worker and
``runweb`` sharing another SQLite file and a private Redis. The test drives real work through
them (an Allocate, a pod deleted and its slot released, a cluster pass and a failing task in a
pool child, a Lease won) and scrapes each over HTTP. No process shares another's memory, so a
series found only because it was recorded in the test's own process cannot pass.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from agent.kube.client import AkriApi
from agent.simulator.kubelet import KubeletSimulator
from agent.simulator.kubelet_pods import PodFinisher

from .deploykit import find, kubelet_env, pod_spec, render
from .servers import PrivateRedis, free_port
from .test_agent_lifecycle import FOO0, allocate, configuration_body, healthy
from .test_faults import ManagedProcess
from .test_grafana import DASHBOARD, exported_series, queried_series

pytestmark = pytest.mark.kube

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "extras" / "prometheus" / "rules.yml"
IL_RESOURCE = f"akri.sh/{FOO0}"
TOKEN = "scrape-token-for-the-test"
POD_IP = "127.0.0.1"  # what the web's pod accepts as Host, by deploy/base/web.yaml's rule

# Who records each series the dashboard or the alert rules query, in a deployment. A counter
# or histogram series must have a sample above 0 in each process named; a gauge must be
# exported by it (the web's are computed from the cache at scrape time). A new panel or rule
# needs its series here.
OWNERS = {
    "akri_allocate_seconds_bucket": ("agent",),
    "akri_claim_write_seconds_bucket": ("agent",),
    "akri_release_latency_seconds_bucket": ("agent",),
    "akri_release_latency_seconds_sum": ("agent",),
    "akri_release_latency_seconds_count": ("agent",),
    "akri_reconcile_runs_total": ("agent", "worker"),
    "akri_reconcile_slots_total": ("agent",),
    "akri_agent_heartbeat_timestamp_seconds": ("agent",),
    "akri_leader": ("controller",),
    "akri_task_failures_total": ("worker",),
    "akri_websocket_clients": ("web",),
    "akri_slots": ("web",),
    "akri_slots_held": ("web",),
    "akri_slots_stuck": ("web",),
    "akri_instance_count": ("web",),
    "akri_cache_sync_age_seconds": ("web",),
    "akri_broker_pod_count": ("web",),
    "akri_queue_charge": ("web",),
    "akri_queue_uncharged": ("web",),
    "akri_queue_claims_owned": ("web",),
    "akri_queue_uses_of_others": ("web",),
}


# --- scraping ----------------------------------------------------------------------------------
def scrape(port: int, token: str = TOKEN, host: str | None = None) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if host:
        request.add_header("Host", host)
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def status_of(port: int, token: str = "", host: str | None = None) -> int:
    try:
        scrape(port, token, host)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


def samples_of(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples ``name``: their values by their labels (sorted pairs)."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def has_sample(text: str, name: str) -> bool:
    return any(s.name == name for f in text_string_to_metric_families(text) for s in f.samples)


# --- the processes -----------------------------------------------------------------------------
def base_env(kube, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "akri_site.settings",
        "KUBECONFIG": kube.kubeconfig,
        "AKRI_NAMESPACE": kube.namespace,
        "AKRI_METRICS_ADDRESS": "127.0.0.1",
        "METRICS_TOKEN": TOKEN,
        "LOG_LEVEL": "INFO",
    }
    for name in ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(name, None)
    env.update(extra)
    return env


def agent_env(kube, database: Path, port: int) -> dict[str, str]:
    """runagent as the DaemonSet runs it: agent-only, its own SQLite file."""
    return base_env(
        kube,
        AKRI_AGENT_ONLY="true",
        AKRI_SQLITE_PATH=str(database),
        SLOT_GRACE_PERIOD="1",
        SLOT_RECLAIM_INTERVAL="0.5",
        METRICS_PORT=str(port),
    )


def agent_command(kubelet: KubeletSimulator, root: Path) -> list[str]:
    return (
        [sys.executable, "manage.py", "runagent", "--node-name", kubelet.node_name]
        + ["--device-plugin-dir", kubelet.plugin_dir]
        + ["--pod-resources-socket", kubelet.pod_resources_socket]
        + ["--registration-socket", str(root / "reg.sock")]
        + ["--debug-echo-availability", str(root / "echo")]
    )


def migrate(*envs: dict[str, str]) -> None:
    """Each database its tables, side by side."""
    runs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env
        )
        for env in envs
    ]
    assert [run.wait(timeout=300) for run in runs] == [0] * len(runs)


class Deployment:
    """The four processes, their databases and Redis, in one short temporary directory."""

    def __init__(self, kube) -> None:
        self.kube = kube
        self.dir = Path(tempfile.mkdtemp(prefix="mtr", dir="/tmp"))  # unix sockets: short paths
        self.redis = PrivateRedis()
        self.kubelet = KubeletSimulator(
            str(self.dir / "dp"), str(self.dir / "pr" / "kubelet.sock"), node_name="node-a"
        )
        self.finisher: PodFinisher | None = None
        self.ports = {name: free_port() for name in ("agent", "controller", "worker", "web")}
        self.processes: dict[str, ManagedProcess] = {}

    def shared_env(self, port: int = 0) -> dict[str, str]:
        """The controller's, the worker's and the web's: one database, one Redis."""
        return base_env(
            self.kube,
            AKRI_SQLITE_PATH=str(self.dir / "site.sqlite3"),
            REDIS_URL=self.redis.url,
            AKRI_CHANNEL_PREFIX=f"mtr-{self.redis.port}",
            METRICS_PORT=str(port),
        )

    def start(self) -> Deployment:
        self.redis.start()
        os.makedirs(self.kubelet.plugin_dir)
        self.kubelet.start()
        self.finisher = PodFinisher(self.kubelet, self.kube.new_client(), self.kube.namespace)
        self.finisher.start()
        agent = agent_env(self.kube, self.dir / "agent.sqlite3", self.ports["agent"])
        migrate(agent, self.shared_env())
        manage = [sys.executable, "manage.py"]
        celery = [sys.executable, "-m", "celery", "-A", "akri_site", "worker"]
        commands = {
            "agent": (agent_command(self.kubelet, self.dir), agent),
            "controller": ([*manage, "runcontroller"], self.shared_env(self.ports["controller"])),
            # Prefork, Celery's default: the tasks run in two children, not in the process
            # that serves /metrics.
            "worker": (
                [*celery, "--concurrency", "2", "-l", "INFO"]
                + ["--without-heartbeat", "--without-gossip", "--without-mingle"],
                self.shared_env(self.ports["worker"]),
            ),
            "web": (
                [*manage, "runweb", "--host", "127.0.0.1", "--port", str(self.ports["web"])]
                + ["--workers", "2"],
                {**self.shared_env(), "ALLOWED_HOSTS": deployed_allowed_hosts()},
            ),
        }
        for name, (args, env) in commands.items():
            self.processes[name] = ManagedProcess(args, env, self.dir / f"{name}.log").start()
        return self

    def scrape(self, name: str) -> str:
        return scrape(self.ports[name])

    def wait_scraped(self, name: str, predicate=lambda text: True, what: str = "") -> str:
        def scraped() -> str | None:
            assert self.processes[name].running, f"{name} exited"
            try:
                text = self.scrape(name)
            except (TimeoutError, urllib.error.URLError, ConnectionError):
                return None
            return text if predicate(text) else None

        return self.kube.wait_for(
            scraped, timeout=120, interval=0.25, message=f"{name}'s /metrics {what}".strip()
        )

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop()
        if self.finisher is not None:
            self.finisher.stop()
        self.kubelet.stop()
        self.redis.remove()

    def logs(self) -> str:
        return "\n".join(
            f"--- {name} ---\n{p.log.read_text()[-6000:]}" for name, p in self.processes.items()
        )

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def deployed_allowed_hosts() -> str:
    """ALLOWED_HOSTS of the web container as the kubelet makes it, on a pod whose IP is
    127.0.0.1: the ConfigMap's list does not have it, the pod's own entry adds it."""
    objects = render("overlays/external")
    config = find(objects, "ConfigMap", "akri-site")["data"]
    assert POD_IP not in config["ALLOWED_HOSTS"].split(",")
    web = pod_spec(find(objects, "Deployment", "akri-site-web"))["containers"][0]
    fields = {"status.podIP": POD_IP, "metadata.namespace": "akri-site"}
    return kubelet_env(web, config, fields)["ALLOWED_HOSTS"]


@pytest.fixture
def deployment(kube):
    deployment = Deployment(kube)
    try:
        yield deployment.start()
    finally:
        deployment.stop()
        print(deployment.logs())  # shown when the test failed
        deployment.remove()


# --- the work --------------------------------------------------------------------------------
def allocate_and_release(deployment: Deployment) -> None:
    """A pod on node-a gets a device through the agent's Allocate; then it is deleted, the
    kubelet (its PodFinisher) stops it, and the agent frees the slot."""
    kube, kubelet = deployment.kube, deployment.kubelet
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_configuration(configuration_body(descriptions=("foo0",)))
    kubelet.wait_devices(IL_RESOURCE, lambda d: len(healthy(d)) == 2, timeout=60)
    core = client.CoreV1Api(kube.api_client)
    limits = {IL_RESOURCE: "1"}
    pod = core.create_namespaced_pod(
        kube.namespace,
        {
            "metadata": {"name": "web-1"},
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "c1", "image": "busybox", "resources": {"limits": limits}}],
            },
        },
    )
    admitted = kubelet.admit_pod(
        kube.namespace,
        "web-1",
        [{"name": "c1", "requests": {IL_RESOURCE: 1}}],
        uid=pod.metadata.uid,
    )
    assert admitted.admitted, admitted.error
    kube.wait_for(
        lambda: agent_knows_pod(deployment.dir / "agent.sqlite3", "web-1"),
        timeout=60,
        interval=0.2,
        message="the agent learning which pod holds the slot",
    )
    core.delete_namespaced_pod("web-1", kube.namespace)
    kube.wait_for(
        lambda: not any((api.get_instance(FOO0)["spec"].get("deviceUsage") or {}).values()),
        timeout=60,
        interval=0.2,
        message="the slot freed after its pod went",
    )


def agent_knows_pod(database: Path, pod: str) -> bool:
    with sqlite3.connect(database, timeout=10) as conn:
        rows = conn.execute("SELECT pod_name FROM agent_slotpodbinding").fetchall()
    return (pod,) in rows


def send_tasks(redis_url: str, namespace: str) -> None:
    """What beat sends (a cluster pass), and a task that fails in the pool child running it."""
    from celery.exceptions import AlwaysEagerIgnored

    from akri_site.celery import app

    with app.connection_for_write(redis_url) as connection, warnings.catch_warnings():
        # The test settings run tasks eagerly; send_task ignores that, which is the point.
        warnings.simplefilter("ignore", AlwaysEagerIgnored)
        app.send_task(
            "agent.tasks.reconcile_cluster",
            kwargs={"namespace": namespace, "trigger": "manual"},
            connection=connection,
        )
        app.send_task(
            "agent.tasks.prune_runs", kwargs={"no_such_argument": 1}, connection=connection
        )


# --- the test ----------------------------------------------------------------------------------
def test_each_process_serves_what_it_records_and_together_all_the_dashboard_and_rules_query(
    deployment,
):
    # Every /metrics answers on its own port, and asks for the token the web asks for.
    for name in ("agent", "controller", "worker"):
        deployment.wait_scraped(name)
        assert status_of(deployment.ports[name]) == 401, name
    deployment.wait_scraped("web")
    assert status_of(deployment.ports["web"]) == 401
    # The worker's task counts start at 0, so that a first failure is a step Prometheus sees.
    failures = samples_of(deployment.scrape("worker"), "akri_task_failures_total")
    assert failures.get((("task", "agent.tasks.prune_runs"),)) == 0
    # Prometheus sends the pod's IP as Host: the web accepts its own, no other.
    assert status_of(deployment.ports["web"], TOKEN, host="10.99.0.1:8000") == 400

    allocate_and_release(deployment)
    send_tasks(deployment.redis.url, deployment.kube.namespace)

    agent = deployment.wait_scraped(
        "agent",
        lambda t: value(t, "akri_release_latency_seconds_count") >= 1,
        "counting the release",
    )
    worker = deployment.wait_scraped(
        "worker",
        lambda t: (
            value(t, "akri_reconcile_runs_total", scope="cluster") >= 1
            and value(t, "akri_task_failures_total", task="agent.tasks.prune_runs") >= 1
        ),
        "counting the cluster pass and the failed task",
    )
    controller = deployment.wait_scraped(
        "controller",
        lambda t: value(t, "akri_leader", lease="akri-site-controller") == 1,
        "saying it leads",
    )
    web = deployment.wait_scraped(
        "web",
        lambda t: value(t, "akri_instance_count") >= 1 and has_sample(t, "akri_slots_stuck"),
        "counting the Instance the controller watched into the cache",
    )
    scraped = {"agent": agent, "controller": controller, "worker": worker, "web": web}

    # Recorded where the work happened: the agent's Allocate, claim and release, its node
    # reconciliation and its heartbeat; a pool child's cluster pass and failure in the worker.
    assert value(agent, "akri_allocate_seconds_count", level="IL") >= 1
    assert value(agent, "akri_claim_write_seconds_count", op="claim") >= 1
    assert value(agent, "akri_reconcile_runs_total", scope="node") >= 1
    assert value(agent, "akri_reconcile_slots_total", scope="node", result="released") >= 1
    beat = value(agent, "akri_agent_heartbeat_timestamp_seconds", node="node-a")
    assert time.time() - 60 < beat <= time.time() + 1
    assert value(worker, "akri_reconcile_runs_total", scope="node") == 0
    assert value(agent, "akri_reconcile_runs_total", scope="cluster") == 0

    queried = queried_series(json.loads(DASHBOARD.read_text())) | rule_series()
    assert not queried - OWNERS.keys(), f"series with no owner process: {queried - OWNERS.keys()}"
    for series in queried:
        for owner in OWNERS[series]:
            assert_recorded(scraped[owner], series, owner)


def assert_recorded(text: str, series: str, process: str) -> None:
    """``process`` exports ``series``, and has counted at least one if it is a count."""
    assert series in exported_series(text), f"{process} does not export {series}"
    if series in counted_series(text):
        assert value(text, series) > 0, f"{process} exports {series} but never recorded one"


def counted_series(text: str) -> set[str]:
    """The series of the counters and histograms in a scrape (the gauges' are left out)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if kind == "counter":
                names |= {name, f"{name}_total"}
            elif kind == "histogram":
                names |= {f"{name}_{part}" for part in ("bucket", "sum", "count")}
    return names


def rule_series() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    exprs = [rule["expr"] for group in groups for rule in group["rules"]]
    return {name for expr in exprs for name in re.findall(r"\bakri_[a-z0-9_]+\b", expr)}


# --- the agent without its port ----------------------------------------------------------------
def test_an_agent_that_cannot_have_its_metrics_port_says_so_once_and_allocates_anyway(kube):
    root = Path(tempfile.mkdtemp(prefix="mtp", dir="/tmp"))
    kubelet = KubeletSimulator(
        str(root / "dp"), str(root / "pr" / "kubelet.sock"), node_name="node-a"
    )
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    env = agent_env(kube, root / "agent.sqlite3", port)
    agent = ManagedProcess(agent_command(kubelet, root), env, root / "agent.log")
    try:
        os.makedirs(kubelet.plugin_dir)
        kubelet.start()
        migrate(env)
        agent.start()
        AkriApi(kube.api_client, kube.namespace).create_configuration(
            configuration_body(descriptions=("foo0",))
        )
        kubelet.wait_devices(IL_RESOURCE, lambda d: len(healthy(d)) == 2, timeout=60)

        answer = allocate(kubelet, IL_RESOURCE, [f"{FOO0}-0"])

        assert not isinstance(answer, Exception), answer
        assert agent.running
        said = [line for line in agent.log.read_text().splitlines() if "/metrics" in line]
        assert len(said) == 1, said
        assert f"cannot listen on 127.0.0.1 port {port}" in said[0]
        assert "ERROR" in said[0] and "METRICS_PORT" in said[0]
    finally:
        agent.stop()
        kubelet.stop()
        taken.close()
        if agent.log.exists():
            print(agent.log.read_text()[-6000:])
        shutil.rmtree(root, ignore_errors=True)
