"""Faults with real servers and processes: the API server failing, timing out and dropping
watches under running agents; an agent process killed in the middle of an Allocate; a private
PostgreSQL stopped and started under the controller and a Celery worker; a private Redis
stopped and started under the controller and the dashboard.

The machine's shared PostgreSQL and Redis are never touched: the servers stopped here are
started by the test itself, on free ports, in temporary directories (``tests/servers.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path

import grpc
import pytest

from agent.bench.claims import instance_body
from agent.kube.claims import ClaimStore
from agent.kube.client import AkriApi
from agent.protos import deviceplugin_pb2 as dp
from agent.simulator.kubelet import KubeletSimulator

from .servers import PrivatePostgres, postgres_bin
from .test_agent_lifecycle import (
    CONFIG,
    FOO0,
    FOO1,
    AgentCluster,
    allocate,
    configuration_body,
    healthy,
    wait_instances,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

ROOT = Path(__file__).resolve().parents[1]
IL_RESOURCE = f"akri.sh/{FOO0}"


def simulator_only(kube) -> None:
    if kube.simulator is None:
        pytest.skip("fault injection needs the API-server simulator")


# --- the API server answering 500, timing out, dropping watches ----------------------------------
def test_agents_ride_out_an_api_server_that_fails_times_out_and_drops_watches(kube):
    simulator_only(kube)
    cluster = AgentCluster(kube, nodes=("node-a",)).start()
    try:
        cluster.api.create_configuration(configuration_body())
        wait_instances(cluster, {FOO0, FOO1}, nodes=("node-a",))
        kubelet = cluster["node-a"].kubelet
        kubelet.wait_devices(IL_RESOURCE, lambda d: len(healthy(d)) == 2)
        sim = kube.simulator
        # Every list and watch of Instances: five 500s, then two answers 2 s late; and the
        # streams open now are cut.
        sim.inject_fault("GET", r"/instances$", status=500, times=5)
        sim.inject_fault("GET", r"/instances$", status=0, delay=2.0, times=2)
        assert sim.drop_watches() > 0

        # Meanwhile another node claims a slot: node-a must hear of it once the server is back.
        ClaimStore(cluster.api, "agent:node-b").claim(FOO0, f"{FOO0}-1", "node-b")

        kubelet.wait_devices(IL_RESOURCE, lambda d: d.get(f"{FOO0}-1") == "Unhealthy", timeout=30)
        answer = allocate(kubelet, IL_RESOURCE, [f"{FOO0}-0"])
        assert isinstance(answer, dp.AllocateResponse), answer
        assert cluster.usage(FOO0) == {f"{FOO0}-0": "node-a", f"{FOO0}-1": "node-b"}
        taken = allocate(kubelet, IL_RESOURCE, [f"{FOO0}-1"])
        assert isinstance(taken, grpc.RpcError) and "held by node-b" in taken.details()
    finally:
        cluster.stop()


# --- an agent killed in the middle of an Allocate -----------------------------------------------
class ManagedProcess:
    """A command of this project in a process of its own, its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.process: subprocess.Popen | None = None

    def start(self) -> ManagedProcess:
        with self.log.open("a") as out:
            self.process = subprocess.Popen(
                self.args, env=self.env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def said(self, text: str) -> bool:
        return text in self.log.read_text()

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.running:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class AgentProcess(ManagedProcess):
    """``manage.py runagent`` for one node in a process of its own, with its own SQLite file."""

    def __init__(self, kube, root: Path, kubelet: KubeletSimulator) -> None:
        availability = root / "echo"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "akri_site.settings",
            "AKRI_SQLITE_PATH": str(root / "agent.sqlite3"),
            "KUBECONFIG": kube.kubeconfig,
            "AKRI_NAMESPACE": kube.namespace,
            "AKRI_AGENT_ONLY": "true",
            "DEBUG_ECHO_INSTANCES_SHARED": "true",
            "SLOT_GRACE_PERIOD": "1",
            "SLOT_RECLAIM_INTERVAL": "0.5",
            "LOG_LEVEL": "INFO",
        }
        env.pop("DATABASE_URL", None)
        args = [
            sys.executable,
            "manage.py",
            "runagent",
            "--node-name",
            "node-a",
            "--device-plugin-dir",
            kubelet.plugin_dir,
            "--pod-resources-socket",
            kubelet.pod_resources_socket,
            "--registration-socket",
            str(root / "reg.sock"),
            "--debug-echo-availability",
            str(availability),
        ]
        super().__init__(args, env, root / "agent.log")

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            env=self.env,
            cwd=ROOT,
            check=True,
            timeout=300,
        )


@pytest.fixture
def short_dir():
    """A directory with a short path: unix socket paths are limited to 107 characters."""
    path = tempfile.mkdtemp(prefix="flt", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_an_agent_killed_during_an_allocate_loses_and_steals_no_slot(kube, short_dir):
    simulator_only(kube)
    root = short_dir
    kubelet = KubeletSimulator(
        str(root / "dp"), str(root / "pr" / "kubelet.sock"), node_name="node-a"
    )
    os.makedirs(kubelet.plugin_dir, exist_ok=True)
    kubelet.start()
    agent = AgentProcess(kube, root, kubelet)
    try:
        agent.migrate()
        agent.start()
        api = AkriApi(kube.api_client, kube.namespace)
        api.create_configuration(configuration_body(descriptions=("foo0",)))
        kubelet.wait_devices(IL_RESOURCE, lambda d: len(healthy(d)) == 2, timeout=60)
        # node-b holds slot 1: whatever happens to node-a, that stays node-b's.
        ClaimStore(api, "agent:node-b").claim(FOO0, f"{FOO0}-1", "node-b")
        kubelet.wait_devices(IL_RESOURCE, lambda d: d.get(f"{FOO0}-1") == "Unhealthy", timeout=30)
        # The claim's write reaches the API server and waits there 3 s before it is applied.
        kube.simulator.request_log.clear()
        kube.simulator.inject_fault("PATCH", r"/instances/" + FOO0 + "$", status=0, delay=3.0)
        answers: list[object] = []
        caller = threading.Thread(
            target=lambda: answers.append(allocate(kubelet, IL_RESOURCE, [f"{FOO0}-0"]))
        )
        caller.start()
        kube.wait_for(
            lambda: any(r.method == "PATCH" for r in kube.simulator.request_log),
            timeout=10,
            message="the claim's write at the API server",
        )

        agent.kill()

        caller.join(timeout=30)
        assert isinstance(answers[0], grpc.RpcError)  # the kubelet was never told "granted"
        # The write lands after the agent died: the slot is node-a's, with no pod behind it.
        kube.wait_for(lambda: usage(api)[f"{FOO0}-0"] == "node-a", timeout=10)
        restarted = time.monotonic()
        agent.start()
        # The restarted agent adopts the claim it has no binding for and frees it after the
        # grace period (1 s here): no pod ever got it.
        kube.wait_for(
            lambda: usage(api)[f"{FOO0}-0"] == "",
            timeout=60,
            message="the orphaned claim freed by the restarted agent",
        )
        assert usage(api)[f"{FOO0}-1"] == "node-b"
        kubelet.wait_registration(IL_RESOURCE, after=restarted, timeout=60)
        kubelet.wait_devices(IL_RESOURCE, lambda d: d.get(f"{FOO0}-0") == "Healthy", timeout=30)
        again = allocate(kubelet, IL_RESOURCE, [f"{FOO0}-0"])
        assert isinstance(again, dp.AllocateResponse), again
        assert usage(api) == {f"{FOO0}-0": "node-a", f"{FOO0}-1": "node-b"}
    finally:
        agent.stop()
        kubelet.stop()
        print(agent.log.read_text()[-20000:])  # shown when the test failed


def usage(api) -> dict[str, str]:
    return api.get_instance(FOO0)["spec"].get("deviceUsage") or {}


# --- PostgreSQL down under the controller and a Celery worker ----------------------------------
def postgres_rows(url: str, sql: str, *params: object) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, connect_timeout=3) as conn:
        return conn.execute(sql, params).fetchall()


def test_the_controller_and_a_worker_lose_nothing_while_postgresql_is_down(kube, short_dir):
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    pg = PrivatePostgres(bindir).create()
    queue = f"faults-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "akri_site.settings",
        "DATABASE_URL": pg.url,
        "REDIS_URL": os.environ.get("AKRI_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0",
        "AKRI_CHANNEL_PREFIX": queue,
        "KUBECONFIG": kube.kubeconfig,
        "AKRI_NAMESPACE": kube.namespace,
        "AKRI_NODE_GONE_GRACE_SECONDS": "0",
    }
    manage = [sys.executable, "manage.py"]
    controller = ManagedProcess([*manage, "runcontroller"], env, short_dir / "controller.log")
    worker = ManagedProcess(
        [sys.executable, "-m", "celery", "-A", "akri_site", "worker", "--pool", "solo"]
        + [
            "-Q",
            queue,
            "-l",
            "INFO",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        env,
        short_dir / "worker.log",
    )
    api = AkriApi(kube.api_client, kube.namespace)
    usage_sql = "SELECT device_usage FROM agent_instance WHERE name = %s"
    try:
        subprocess.run(
            [*manage, "migrate", "--noinput", "-v", "0"], env=env, cwd=ROOT, check=True, timeout=300
        )
        controller.start()
        worker.start()
        api.create_configuration(configuration_body(descriptions=("foo0",)))
        api.create_instance(instance_body(FOO0, 2, CONFIG, ("node-b",)))
        kube.wait_for(lambda: postgres_rows(pg.url, usage_sql, FOO0), timeout=30, message="the row")

        pg.stop()
        ClaimStore(api, "agent:node-b").claim(FOO0, f"{FOO0}-0", "node-b")
        sent = send_cluster_pass(kube.namespace, queue)
        kube.wait_for(
            # One event ("applying event ...") or a batch of them ("applying 2 changes ...").
            lambda: controller.said("to the cache failed"),
            timeout=30,
            message="the controller meeting the stopped database",
        )
        kube.wait_for(
            lambda: worker.said("Retry in"), timeout=60, message="the worker's task retrying"
        )
        pg.start()

        kube.wait_for(
            lambda: postgres_rows(pg.url, usage_sql, FOO0)[0][0][f"{FOO0}-0"] == "node-b",
            timeout=60,
            message="the claim made while PostgreSQL was down, in the cache",
        )
        run_sql = "SELECT released FROM agent_reconcilerun WHERE task_id = %s AND duration_ms > 0"
        [(released,)] = kube.wait_for(
            lambda: postgres_rows(pg.url, run_sql, sent),
            timeout=120,
            message="the cluster pass the worker retried",
        )
        assert released == 1  # node-b has no Node object: its slot is freed
        assert controller.running and worker.running
    finally:
        controller.stop()
        worker.stop()
        pg.remove()
        forget_queue(queue)
        print(controller.log.read_text()[-10000:], worker.log.read_text()[-10000:])


def send_cluster_pass(namespace: str, queue: str) -> str:
    """One cluster pass sent to ``queue`` on the test Redis, as beat sends it; its task id."""
    from celery.exceptions import AlwaysEagerIgnored

    from akri_site.celery import app

    url = os.environ.get("AKRI_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
    # The test settings run tasks eagerly; send_task says it ignores that, which is the point.
    with app.connection_for_write(url) as connection, warnings.catch_warnings():
        warnings.simplefilter("ignore", AlwaysEagerIgnored)
        sent = app.send_task(
            "agent.tasks.reconcile_cluster",
            kwargs={"namespace": namespace},
            queue=queue,
            connection=connection,
        )
    return sent.id


def forget_queue(queue: str) -> None:
    """Remove what the test's queue left in the test Redis (its list and kombu's bindings)."""
    import redis

    url = os.environ.get("AKRI_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
    redis.Redis.from_url(url).delete(
        queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"
    )
