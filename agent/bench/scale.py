"""The ``scale`` benchmark: the controller and the slot map of a 1,000-node cluster.

The cluster (N Instances of 4 slots on M nodes, one slot in four held, one bound pod per held
slot) lives in an API-server simulator in a process of its own, seeded straight into its
store: creating 50,000 objects over HTTP would take minutes and time the simulator, not us.
``manage.py runcontroller`` then starts as a process of its own, as in production, on a
database of the benchmark's own (a fresh PostgreSQL database next to ``DATABASE_URL``'s when
that is set, else a fresh SQLite file), so no one's cache is touched. Figures:

- ``sync_s``: controller start -> every Instance and every pod in the cache;
- ``rss_mb``: the controller's peak RSS over the whole run;
- ``lag_p95_ms``: a ``deviceUsage`` write acknowledged by the API server -> the cache row at
  that version, while writes arrive at ``rate`` per second for ``seconds``;
- ``backlog_end``: writes not yet in the cache one second after the last one;
- ``dropped``: writes still not in the cache 30 s after the last one;
- ``slotmap_ms``: server time of the slot map's first page, median of five (Django's test
  client in a process on the same database).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings
from kubernetes import client

from agent.bench import percentile
from agent.domain.naming import slot_key
from agent.kube.client import GROUP, INSTANCES, VERSION, new_api_client

BASE_DIR = Path(__file__).resolve().parents[2]
SLOTS = 4
MERGE_PATCH = "application/merge-patch+json"


# --- the cluster, in the simulator's process ---------------------------------------------------


def _node(i: int) -> str:
    return f"scale-node-{i:04d}"


def _instance(i: int) -> str:
    return f"scale-{i:06x}"


def _serve(conn: Any, namespace: str, instances: int, nodes: int) -> None:
    """Process target: seed the store, serve, report the port, run until told to stop."""
    from agent.simulator.apiserver import ApiServerSimulator

    sim = ApiServerSimulator(history_limit=200_000)
    store = sim.store
    created = 0
    for plural, ns, body in _objects(namespace, instances, nodes):
        rt = store.find(plural)
        try:
            store.create(rt, rt.versions[0], ns, body)
            created += 1
        except Exception as exc:  # a namespace that exists already, say
            if getattr(exc, "code", None) != 409:
                raise
    sim.start()
    conn.send({"port": sim.port, "created": created})
    conn.recv()  # anything means stop
    sim.stop()


def _objects(namespace: str, instances: int, nodes: int):
    yield "v1/namespaces", "", {"metadata": {"name": namespace}}
    for n in range(nodes):
        yield "v1/nodes", "", _node_body(_node(n))
    for i in range(instances):
        node = _node(i % nodes)
        name = _instance(i)
        usage = {slot_key(name, s): "" for s in range(SLOTS)}
        usage[slot_key(name, 0)] = node  # one slot in four held, through the IL plugin
        yield f"{GROUP}/{VERSION}/{INSTANCES}", namespace, _instance_body(name, node, usage)
        yield "v1/pods", namespace, _pod_body(name, node)


def _node_body(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _instance_body(name: str, node: str, usage: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Instance",
        "metadata": {"name": name},
        "spec": {
            "configurationName": "scale",
            "cdiName": f"akri.sh/scale={name[-6:]}",
            "capacity": SLOTS,
            "shared": False,
            "nodes": [node],
            "brokerProperties": {},
            "deviceUsage": usage,
        },
    }


def _pod_body(instance: str, node: str) -> dict[str, Any]:
    resource = f"akri.sh/{instance}"
    return {
        "metadata": {"name": f"{instance}-pod"},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "app",
                    "image": "busybox",
                    "resources": {"requests": {resource: "1"}, "limits": {resource: "1"}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


# --- the benchmark's own database ----------------------------------------------------------------


class BenchDatabase:
    """A fresh database for the controller and the probes, dropped at the end."""

    def __init__(self) -> None:
        default = settings.DATABASES["default"]
        self.postgres = default["ENGINE"].endswith("postgresql")
        self.tag = f"scale_{uuid.uuid4().hex[:8]}"
        self._redis = contextlib.ExitStack()
        self.redis_url = self._redis.enter_context(_private_redis())
        if self.postgres:
            self.admin = dict(default)
            self.url = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + f"/{self.tag}"
            try:
                self._sql(f'CREATE DATABASE "{self.tag}"')
            except Exception:
                self._redis.close()
                raise
        else:
            self.path = Path(tempfile.gettempdir()) / f"{self.tag}.sqlite3"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("REDIS_URL", None)
        # As in production, the controller hands its tasks (queue charges, cluster passes) to
        # a broker instead of running them itself: Redis, in a database of the bench's own.
        if self.redis_url:
            env["REDIS_URL"] = self.redis_url
            env["AKRI_ENV"] = "development"  # no secret key needed for a benchmark
        if self.postgres:
            env["DATABASE_URL"] = self.url
        else:
            env.pop("DATABASE_URL", None)
            env["AKRI_SQLITE_PATH"] = str(self.path)
        return env

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        if self.postgres:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as conn:
                return conn.execute(sql.replace("?", "%s"), params).fetchall()
        with sqlite3.connect(self.path, timeout=30) as conn:
            return conn.execute(sql, params).fetchall()

    def drop(self) -> None:
        self._redis.close()  # the bench's own server, and all it held, gone
        if self.postgres:
            self._sql(f'DROP DATABASE IF EXISTS "{self.tag}" WITH (FORCE)')
        else:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def _sql(self, sql: str) -> None:
        import psycopg

        a = self.admin
        with psycopg.connect(
            host=a.get("HOST") or None,
            port=a.get("PORT") or None,
            user=a.get("USER") or None,
            password=a.get("PASSWORD") or None,
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(sql)


@contextlib.contextmanager
def _private_redis() -> Iterator[str]:
    """A redis-server of the bench's own on a free loopback port (the controller's Celery broker
    needs TCP), stopped at the end; "" when redis-server is not installed. Nobody else's
    Redis is touched, so the bench never flushes a database another process uses."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield ""
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="akri-scale-redis-") as tmp:
        proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
             "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"redis://127.0.0.1:{port}/0"
        try:
            import redis

            deadline = time.monotonic() + 10
            while True:
                try:
                    redis.Redis.from_url(url, socket_timeout=1).ping()
                    break
                except redis.RedisError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the bench's redis-server did not start") from None
                    time.sleep(0.05)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


# --- probes ----------------------------------------------------------------------------------------


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.peak = 0
        self.cpu = 0.0
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
                times = self.process.cpu_times()
                self.cpu = times.user + times.system
            except psutil.Error:
                return

    def stop(self) -> None:
        self._stop.set()


def _count(db: BenchDatabase, namespace: str) -> tuple[int, int]:
    from agent.models import Instance, Pod

    inst = Instance._meta.db_table
    pods = Pod._meta.db_table
    try:
        (i,) = db.query(f"SELECT COUNT(*) FROM {inst} WHERE namespace = ?", (namespace,))[0]
        (p,) = db.query(f"SELECT COUNT(*) FROM {pods} WHERE namespace = ?", (namespace,))[0]
    except Exception:  # tables not there yet, or a lock: ask again
        return 0, 0
    return i, p


def _cached_versions(db: BenchDatabase, namespace: str, names: list[str]) -> dict[str, str]:
    from agent.models import Instance

    if not names:
        return {}
    marks = ",".join("?" for _ in names)
    rows = db.query(
        f"SELECT name, resource_version FROM {Instance._meta.db_table} "
        f"WHERE namespace = ? AND name IN ({marks})",
        (namespace, *names),
    )
    return dict(rows)


def _newer_or_same(cached: str | None, written: str) -> bool:
    if not cached:
        return False
    if cached.isdigit() and written.isdigit():
        return int(cached) >= int(written)
    return cached == written


class ChangeDriver:
    """Writes ``rate`` deviceUsage changes a second and times each one into the cache."""

    def __init__(self, kubeconfig: Path, namespace: str, instances: int, nodes: int) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.instances = instances
        self.nodes = nodes
        self.pending: dict[str, tuple[str, float]] = {}  # name -> (rv, acknowledged at)
        self.lags: list[float] = []
        self.lock = threading.Lock()
        self.written = 0
        self.errors = 0

    def write(self, rate: float, seconds: float, writers: int = 4) -> None:
        interval = writers / rate
        start = time.monotonic()
        threads = [
            threading.Thread(target=self._writer, args=(w, start + w / rate, interval, seconds))
            for w in range(writers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _writer(self, w: int, first: float, interval: float, seconds: float) -> None:
        custom = client.CustomObjectsApi(new_api_client(str(self.kubeconfig)))
        rng = random.Random(w)
        at = first
        end = first + seconds
        while at < end:
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            i = rng.randrange(self.instances)
            name = _instance(i)
            value = _node(i % self.nodes) if rng.random() < 0.5 else ""
            body = {"spec": {"deviceUsage": {slot_key(name, SLOTS - 1): value}}}
            try:
                obj = custom.patch_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, INSTANCES, name, body
                )
            except Exception:
                with self.lock:
                    self.errors += 1
            else:
                now = time.monotonic()
                with self.lock:
                    self.pending[name] = (obj["metadata"]["resourceVersion"], now)
                    self.written += 1
            at += interval

    def poll(self, db: BenchDatabase) -> int:
        """Take what the cache caught up with; the number still pending."""
        with self.lock:
            waiting = dict(self.pending)
        cached = _cached_versions(db, self.namespace, list(waiting))
        now = time.monotonic()
        with self.lock:
            for name, (rv, at) in waiting.items():
                if self.pending.get(name) == (rv, at) and _newer_or_same(cached.get(name), rv):
                    self.lags.append((now - at) * 1000)
                    del self.pending[name]
            return len(self.pending)


def _poll_until(driver: ChangeDriver, db: BenchDatabase, stop: threading.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(Exception):  # a busy database: ask again
            driver.poll(db)
        stop.wait(0.01)


SLOTMAP_PROBE = """
import sys, time, django
django.setup()
from django.contrib.auth.models import User
from django.test import Client
user, _ = User.objects.get_or_create(username="scale-bench", defaults={"is_superuser": True})
user.is_superuser = True
user.save()
client = Client()
client.force_login(user)
times = []
for _ in range(5):
    start = time.perf_counter()
    answer = client.get("/slots/")
    times.append((time.perf_counter() - start) * 1000)
    assert answer.status_code == 200, answer.status_code
times.sort()
print(f"{times[2]:.1f} {len(answer.content)}")
"""


def _slotmap_ms(db: BenchDatabase) -> tuple[float, int]:
    env = db.env() | {"DJANGO_SETTINGS_MODULE": "akri_site.settings"}
    out = subprocess.run(
        [sys.executable, "-c", SLOTMAP_PROBE],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout.split()
    return float(out[0]), int(out[1])


# --- the benchmark ---------------------------------------------------------------------------------


def bench_scale(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    instances, nodes = (2000, 50) if quick else (40000, 1000)
    rate, seconds = (50.0, 3.0) if quick else (200.0, 30.0)
    namespace = f"scale-{uuid.uuid4().hex[:6]}"
    db = BenchDatabase()
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(child, namespace, instances, nodes), daemon=True)
    controller = None
    try:
        env = db.env()
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity=0"],
            cwd=BASE_DIR,
            env=env,
            check=True,
        )
        server.start()
        port = _wait_port(parent, server)
        kubeconfig = Path(tempfile.gettempdir()) / f"{db.tag}.kubeconfig"
        kubeconfig.write_text(json.dumps(_kubeconfig(port)))
        started = time.monotonic()
        controller = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runcontroller",
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                namespace,
            ],  # fmt: skip
            cwd=BASE_DIR,
            env=env | {"LOG_LEVEL": "WARNING"},
            stdout=subprocess.DEVNULL,
        )
        sampler = RssSampler(controller.pid)
        sampler.start()
        sync_s = _wait_synced(db, namespace, instances, started, controller)
        sync_cpu_s = sampler.cpu
        driver = ChangeDriver(kubeconfig, namespace, instances, nodes)
        stop = threading.Event()
        poller = threading.Thread(target=_poll_until, args=(driver, db, stop), daemon=True)
        poller.start()
        driver.write(rate, seconds)
        time.sleep(1.0)
        backlog_end = len(driver.pending)
        deadline = time.monotonic() + 30
        while driver.pending and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        poller.join()
        dropped = driver.poll(db)
        slotmap_ms, page_bytes = _slotmap_ms(db)
        sampler.stop()
        if driver.written < rate * seconds * 0.9:
            raise RuntimeError(f"only {driver.written} of {rate * seconds:.0f} writes went out")
        return {
            "instances": instances,
            "nodes": nodes,
            "sync_s": sync_s,
            "sync_cpu_s": sync_cpu_s,
            "rss_mb": sampler.peak / 2**20,
            "lag_p50_ms": percentile(driver.lags, 50),
            "lag_p95_ms": percentile(driver.lags, 95),
            "rate": rate,
            "writes": driver.written,
            "write_errors": driver.errors,
            "backlog_end": backlog_end,
            "dropped": dropped,
            "slotmap_ms": slotmap_ms,
            "slotmap_bytes": page_bytes,
            "database": "postgresql" if db.postgres else "sqlite",
            "broker": "redis" if db.redis_url else "in-process",
        }
    finally:
        if controller is not None:
            controller.terminate()
            try:
                controller.wait(timeout=15)
            except subprocess.TimeoutExpired:
                controller.kill()
        if server.is_alive():
            parent.send("stop")
            server.join(timeout=10)
            if server.is_alive():
                server.kill()
        db.drop()


def _wait_port(conn: Any, server: Any) -> int:
    # Seeding 50,000 objects takes a while; a child that died says so instead of hanging.
    while not conn.poll(1.0):
        if not server.is_alive():
            raise RuntimeError(f"the API-server process exited with {server.exitcode}")
    return conn.recv()["port"]


def _wait_synced(
    db: BenchDatabase, namespace: str, instances: int, started: float, proc: subprocess.Popen
) -> float:
    deadline = started + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the controller exited with {proc.returncode} before syncing")
        if _count(db, namespace) == (instances, instances):
            return time.monotonic() - started
        time.sleep(0.2)
    raise RuntimeError(f"the controller did not sync {instances} Instances in 900 s")


def _kubeconfig(port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "sim", "user": {}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
        "current-context": "sim",
    }
