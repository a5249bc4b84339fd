"""The ``scale`` benchmark: the controller and the slot map of a 1,000-node cluster.

The cluster (N Instances of 4 slots on M nodes, one slot in four held, one bound pod per held
slot) lives in an API-server simulator in a process of its own, seeded straight into its
store: creating 50,000 objects over HTTP would take minutes and time the simulator, not us.
``manage.py runcontroller`` then starts as a process of its own, as in production, on a
database of the benchmark's own (a fresh PostgreSQL database next to ``DATABASE_URL``'s when
that is set, else a fresh SQLite file), so no one's cache is touched. Figures:

- ``sync_s``: controller start -> every Instance, pod and node in the cache and every
  watcher's list done, on an empty database; the cache is then checked against the API server;
- ``resync_s``: the controller restarted on that warm database, its stored resourceVersions
  dropped (as after a restart the API server's history has moved past) so that every watcher
  lists again, -> listed and in the cache, checked again; ``resync_rss_mb`` its peak RSS;
- ``rss_mb``: the first controller's peak RSS over the whole run (before the restart);
- change rate: a writer process of its own sends ``rate`` writes a second for ``seconds``, open
  loop, each a real change (a JSON patch that tests a slot's value and flips it between free
  and held). ``offered_per_s``: writes the API server accepted, per second of writing;
  ``changes_per_s``: changes that reached the cache (their SlotEvent row readable), per second
  from the first write's due time to the last arrival; ``lag_p50_ms``/``lag_p95_ms``: the API
  server's answer -> that change's SlotEvent row; ``backlog_end``: changes not in the cache one
  second after the last write; ``late``: arrived more than 30 s after the last write; ``lost``:
  never arrived. Then the whole cache is compared with the API server (a difference fails the
  bench). ``*_cpu_ms_per_change``: the CPU the controller, its PostgreSQL backends, the API
  server (the simulator: the writes and their watch) and the writer spent per change, which
  says which of them sets the pace when ``changes_per_s`` falls short of ``offered_per_s``;
- pages (``akri_site.dashboard.pagebench``), after the change rate, on the same database:
  the overview, the slot map's first page, a search and each list page, each through Django's
  test client in a fresh process (warmed up as ``runweb`` warms up): ``<page>_cold_ms`` its
  first request, ``<page>_expired_ms`` once the kept counts are due, ``<page>_warm_ms`` the
  median of five more, ``<page>_bytes`` and ``<page>_queries``; ``pages_over`` names those over
  their target; ``slotmap_ms``/``slotmap_bytes`` the slot map's warm figures, as before.
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

from agent.bench import percentile, summary
from agent.domain.naming import slot_key
from agent.kube.client import GROUP, INSTANCES, VERSION, new_api_client

BASE_DIR = Path(__file__).resolve().parents[2]
SLOTS = 4
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


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
                cursor = conn.execute(sql.replace("?", "%s"), params)
                return cursor.fetchall() if cursor.description else []  # [] after an UPDATE
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


def _controller_states(db: BenchDatabase) -> dict[str, tuple[int, bool]]:
    """The controller's watchers: kind -> (relists, still listing)."""
    from agent.models import SyncState

    try:
        rows = db.query(
            f"SELECT kind, relists, listing_since FROM {SyncState._meta.db_table} "
            "WHERE owner = 'controller'"
        )
    except Exception:  # tables not there yet, or a lock: ask again
        return {}
    return {kind: (relists, since is not None) for kind, relists, since in rows}


def _listed(states: dict[str, tuple[int, bool]], kinds: list[str], after: dict) -> bool:
    """Each of ``kinds`` has listed more often than in ``after`` and is not listing now."""
    for kind in kinds:
        relists, listing = states.get(kind, (0, True))
        if listing or relists <= after.get(kind, (0, False))[0]:
            return False
    return True


def _api_items(list_func: Any, *args: Any) -> Iterator[dict[str, Any]]:
    """Every object ``list_func`` lists, page by page, as the JSON the API server sent."""
    token = ""
    while True:
        page = {"limit": 500, "_continue": token} if token else {"limit": 500}
        answer = json.loads(list_func(*args, _preload_content=False, **page).data)
        yield from answer.get("items") or []
        token = (answer.get("metadata") or {}).get("continue") or ""
        if not token:
            return


def _check_cache(db: BenchDatabase, kubeconfig: Path, namespace: str) -> None:
    """The cache against the API server, read apart from the controller: every Instance at the
    listed resourceVersion with each slot's value, every pod (the controller's and the queue
    charges' copies) and every node. Call when no writes are in flight; differences raise."""
    from agent.models import Instance, Node, Pod, Slot
    from agent.queues.models import QueuePod

    api = new_api_client(str(kubeconfig))
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    listed = _api_items(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, INSTANCES)
    want_rv, want_slots, want_usage = {}, {}, {}
    for obj in listed:
        name = obj["metadata"]["name"]
        want_rv[name] = obj["metadata"]["resourceVersion"]
        want_usage[name] = _usage_text(obj["spec"].get("deviceUsage") or {})
        for key, value in (obj["spec"].get("deviceUsage") or {}).items():
            want_slots[(name, key)] = value
    pods = {
        o["metadata"]["name"]: o["spec"].get("nodeName") or ""
        for o in _api_items(core.list_namespaced_pod, namespace)
    }
    nodes = {o["metadata"]["name"] for o in _api_items(core.list_node)}
    api.close()
    inst, slot = Instance._meta.db_table, Slot._meta.db_table
    have_rv = dict(
        db.query(f"SELECT name, resource_version FROM {inst} WHERE namespace = ?", (namespace,))
    )
    have_usage = {
        name: _usage_text(usage)
        for name, usage in db.query(
            f"SELECT name, device_usage FROM {inst} WHERE namespace = ?", (namespace,)
        )
    }
    have_slots = {
        (name, key): value
        for name, key, value in db.query(
            f"SELECT i.name, s.key, s.value FROM {slot} s JOIN {inst} i ON s.instance_id = i.id "
            "WHERE i.namespace = ?",
            (namespace,),
        )
    }
    have_pods = dict(
        db.query(
            f"SELECT name, node_name FROM {Pod._meta.db_table} WHERE namespace = ?", (namespace,)
        )
    )
    queue_pods = dict(
        db.query(
            f"SELECT name, node_name FROM {QueuePod._meta.db_table} WHERE namespace = ?",
            (namespace,),
        )
    )
    have_nodes = {
        n for (n,) in db.query(f"SELECT name FROM {Node._meta.db_table} WHERE NOT deleted")
    }
    wrong = [
        f"{what}: {len(set(want.items()) ^ set(have.items()))} differ, e.g. "
        f"{sorted(set(want.items()) ^ set(have.items()))[:3]}"
        for what, want, have in (
            ("instance versions", want_rv, have_rv),
            ("slot values", want_slots, have_slots),
            ("Instance rows' deviceUsage", want_usage, have_usage),
            ("pods", pods, have_pods),
            ("queue pods", pods, queue_pods),
            ("nodes", dict.fromkeys(nodes), dict.fromkeys(have_nodes)),
        )
        if want != have
    ]
    if wrong:
        raise RuntimeError("the cache does not match the API server: " + "; ".join(wrong))


def _usage_text(usage: dict[str, str] | str) -> str:
    """A deviceUsage as comparable text (PostgreSQL's driver reads JSON, SQLite's a string)."""
    return json.dumps(json.loads(usage) if isinstance(usage, str) else usage, sort_keys=True)


# --- the change driver -----------------------------------------------------------------------------

# The slot the driver writes: free in every seeded Instance and written by no one else, so the
# writer knows its value and each write can be made a real change (tested by the API server).
DRIVEN_SLOT = SLOTS - 1
WRITERS = 32  # connections in the writer process; each owns its share of the Instances
# A change that reaches the cache later than this after the last write is ``late``; one that
# has not arrived once arrivals stop for ``SETTLE_QUIET_S`` is ``lost``.
LATE_AFTER_S = 30.0
SETTLE_QUIET_S = 15.0
POLL_S = 0.005


def _write_changes(
    conn: Any, port: int, namespace: str, instances: int, nodes: int, rate: float, seconds: float
) -> None:
    """Process target: the writer, open loop. Write ``k`` is due at ``start + k / rate``
    whatever became of the ones before; each flips the driven slot of an Instance between free
    and held with a JSON patch that tests the value first, so the API server itself refuses a
    write that would change nothing. Sends back (name, resourceVersion, acknowledged at) per
    write, with ``time.monotonic`` (one clock for every process of the machine)."""
    start = conn.recv()
    acks: list[list[tuple[str, str, float]]] = [[] for _ in range(WRITERS)]
    errors = [0] * WRITERS
    threads = [
        threading.Thread(
            target=_writer,
            args=(w, port, namespace, instances, nodes, rate, start, seconds, acks[w], errors),
        )
        for w in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    conn.send({"acks": [a for part in acks for a in part], "errors": sum(errors)})


def _writer(
    w: int,
    port: int,
    namespace: str,
    instances: int,
    nodes: int,
    rate: float,
    start: float,
    seconds: float,
    acks: list[tuple[str, str, float]],
    errors: list[int],
) -> None:
    import http.client

    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{INSTANCES}/"
    mine = range(w, instances, WRITERS)  # no two connections write one Instance
    values: dict[int, str] = {}  # the driven slot's value, as the API server last said
    rng = random.Random(w)
    api = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    k = w
    while True:
        due = start + k / rate
        if due >= start + seconds:
            break
        k += WRITERS
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        i = rng.choice(mine)
        name, key = _instance(i), slot_key(_instance(i), DRIVEN_SLOT)
        old = values.get(i, "")
        new = "" if old else _node(i % nodes)
        pointer = f"/spec/deviceUsage/{key}"
        body = json.dumps(
            [
                {"op": "test", "path": pointer, "value": old},
                {"op": "replace", "path": pointer, "value": new},
            ]
        )
        try:
            api.request("PATCH", path + name, body, {"Content-Type": JSON_PATCH})
            answer = api.getresponse()
            acked = time.monotonic()
            data = answer.read()
            obj = json.loads(data)
            if answer.status != 200 or obj["spec"]["deviceUsage"].get(key) != new:
                raise RuntimeError(f"{answer.status} {data[:200]!r}")
        except Exception:
            errors[w] += 1
            api.close()
            values[i] = _read_slot(api, path + name, key)  # what it is now, whatever happened
            continue
        values[i] = new
        acks.append((name, obj["metadata"]["resourceVersion"], acked))
    api.close()


def _read_slot(api: Any, path: str, key: str) -> str:
    api.request("GET", path)
    return json.loads(api.getresponse().read())["spec"]["deviceUsage"].get(key, "")


class ChangeDriver:
    """Real ``deviceUsage`` changes at ``rate`` a second from a writer process of its own, each
    timed from the API server's answer until its SlotEvent row (written in the transaction
    that writes the cache row) can be read."""

    def __init__(self, db: BenchDatabase, port: int, namespace: str, instances: int, nodes: int):
        from agent.models import SlotEvent

        self.db, self.port, self.namespace = db, port, namespace
        self.instances, self.nodes = instances, nodes
        self.events = SlotEvent._meta.db_table
        self.seen: dict[tuple[str, str], float] = {}  # (instance, rv) -> first read at
        self.duplicates = 0  # events of one write recorded twice
        self.acks: list[tuple[str, str, float]] = []
        self.errors = 0
        self._conn = None
        (self._last_id,) = self._query(f"SELECT COALESCE(MAX(id), 0) FROM {self.events}")[0]
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, daemon=True)

    def run(self, rate: float, seconds: float) -> tuple[float, float]:
        """Write for ``seconds``; returns (first due, writer process CPU seconds)."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        args = (child, self.port, self.namespace, self.instances, self.nodes, rate, seconds)
        writer = ctx.Process(target=_write_changes, args=args, daemon=True)
        writer.start()
        self._poller.start()
        start = time.monotonic() + 1.0  # past the child's imports
        parent.send(start)
        cpu = 0.0
        while not parent.poll(0.2):
            if not writer.is_alive():
                raise RuntimeError(f"the writer process exited with {writer.exitcode}")
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(writer.pid).cpu_times()
                cpu = times.user + times.system
        answer = parent.recv()
        writer.join(timeout=10)
        self.acks, self.errors = answer["acks"], answer["errors"]
        return start, cpu

    def missing(self) -> int:
        return sum(1 for name, rv, _ in self.acks if (name, rv) not in self.seen)

    def settle(self, last_write: float) -> tuple[int, int]:
        """Wait for every write's change; (late, lost): arrived more than ``LATE_AFTER_S`` after
        the last write, never arrived (nothing new for ``SETTLE_QUIET_S``)."""
        count, moved = len(self.seen), time.monotonic()
        while self.missing() and time.monotonic() - moved < SETTLE_QUIET_S:
            time.sleep(0.1)
            if len(self.seen) != count:
                count, moved = len(self.seen), time.monotonic()
        self._stop.set()
        self._poller.join()
        self._take()  # anything the last poll missed (timed late, never early)
        deadline = last_write + LATE_AFTER_S
        late = sum(1 for name, rv, _ in self.acks if self.seen.get((name, rv), 0) > deadline)
        return late, self.missing()

    def lags_ms(self) -> list[float]:
        # A change read before its writer noted the answer (the writer process not scheduled
        # for a moment) counts as no lag, not as a negative one.
        return [
            max(0.0, self.seen[(name, rv)] - at) * 1000
            for name, rv, at in self.acks
            if (name, rv) in self.seen
        ]

    def last_arrival(self) -> float:
        arrived = [self.seen[(name, rv)] for name, rv, _ in self.acks if (name, rv) in self.seen]
        return max(arrived, default=0.0)

    def _poll_loop(self) -> None:
        while not self._stop.wait(POLL_S):
            with contextlib.suppress(Exception):  # a busy database: ask again
                self._take()

    def _take(self) -> None:
        # Only the controller's applier writes these rows, one transaction after another, so
        # ids become visible in order and "above the last one read" misses none.
        rows = self._query(
            f"SELECT id, instance, slot, resource_version FROM {self.events} "
            "WHERE id > ? AND namespace = ? ORDER BY id",
            (self._last_id, self.namespace),
        )
        now = time.monotonic()
        for event_id, instance, slot, rv in rows:
            self._last_id = event_id
            if slot != slot_key(instance, DRIVEN_SLOT):
                continue
            if (instance, rv) in self.seen:
                self.duplicates += 1
            else:
                self.seen[(instance, rv)] = now

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """On one connection kept open (a connection per poll costs PostgreSQL a process)."""
        if self._conn is None:
            if self.db.postgres:
                import psycopg

                self._conn = psycopg.connect(self.db.url, autocommit=True)
            else:
                self._conn = sqlite3.connect(self.db.path, timeout=30, check_same_thread=False)
        if self.db.postgres:
            sql = sql.replace("?", "%s")
        return self._conn.execute(sql, params).fetchall()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _batch_fallbacks(metrics_port: int) -> int:
    """The controller's batches of changes applied one by one after failing as one (its
    ``/metrics``): each is a bug, and costs a transaction per change."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("akri_cache_batch_fallbacks_total{")
        )
    )


def _database_cpu(db: BenchDatabase) -> dict[int, float]:
    """CPU seconds of each PostgreSQL process serving the bench's database (none on SQLite)."""
    if not db.postgres:
        return {}
    found = {}
    for (pid,) in db.query("SELECT pid FROM pg_stat_activity WHERE datname = ?", (db.tag,)):
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            found[pid] = times.user + times.system
    return found


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _drive_changes(
    db: BenchDatabase,
    port: int,
    namespace: str,
    sizes: tuple[int, int],
    rate: float,
    seconds: float,
    pids: tuple[int, int],
) -> dict[str, object]:
    """The change-rate figures: ``rate`` real changes a second for ``seconds`` against the
    controller (``pids``: the controller's, the simulator's), each timed into the cache."""
    driver = ChangeDriver(db, port, namespace, *sizes)
    controller, simulator = pids
    cpu = (_cpu(controller), _cpu(simulator), _database_cpu(db))
    try:
        start, writer_cpu = driver.run(rate, seconds)
        last_write = max((at for _, _, at in driver.acks), default=start)
        time.sleep(max(0.0, last_write + 1.0 - time.monotonic()))
        backlog_end = driver.missing()
        late, lost = driver.settle(last_write)
    finally:
        driver.close()
    end = max(driver.last_arrival(), last_write)
    spent = (_cpu(controller) - cpu[0], _cpu(simulator) - cpu[1])
    database = _database_cpu(db)
    spent_db = sum(t - cpu[2][pid] for pid, t in database.items() if pid in cpu[2])
    changes = len(driver.acks)
    if changes < rate * seconds * 0.99:
        raise RuntimeError(f"only {changes} of {rate * seconds:.0f} writes went through")
    if driver.duplicates:
        raise RuntimeError(f"{driver.duplicates} changes were recorded twice")
    arrived = changes - lost
    lags = driver.lags_ms()
    return {
        "rate": rate,
        "offered_per_s": changes / max(last_write - start, 1e-9),
        "changes": changes,
        "changes_per_s": arrived / max(end - start, 1e-9),
        "lag_p50_ms": percentile(lags, 50),
        "lag_p95_ms": percentile(lags, 95),
        "lag_max_ms": max(lags, default=0.0),
        "backlog_end": backlog_end,
        "late": late,
        "lost": lost,
        "write_errors": driver.errors,
        "controller_cpu_ms_per_change": spent[0] * 1000 / max(arrived, 1),
        "db_cpu_ms_per_change": spent_db * 1000 / max(arrived, 1),
        "simulator_cpu_ms_per_change": spent[1] * 1000 / max(changes, 1),
        "writer_cpu_ms_per_change": writer_cpu * 1000 / max(changes, 1),
    }


def _page_figures(db: BenchDatabase, stdout: Any, quick: bool) -> dict[str, object]:
    """Every page's figures on the controller's database, each page checked against it."""
    from akri_site.dashboard.pagebench import time_pages

    figures = time_pages(db.env(), db.query, rounds=2 if quick else 5, stdout=stdout)
    return {
        "slotmap_ms": figures["slotmap_warm_ms"],
        "slotmap_bytes": figures["slotmap_bytes"],
        **figures,
    }


# --- the benchmark ---------------------------------------------------------------------------------


def bench_scale(
    quick: bool = False, stdout: Any = None, rate: int | None = None
) -> dict[str, object]:
    instances, nodes = (2000, 50) if quick else (40000, 1000)
    seconds = 3.0 if quick else 30.0
    rate = float(rate or (100 if quick else 1000))
    namespace = f"scale-{uuid.uuid4().hex[:6]}"
    db = BenchDatabase()
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(child, namespace, instances, nodes), daemon=True)
    controller = None
    from agent.models import SyncState

    try:
        env = db.env() | {"METRICS_PORT": str(_free_port())}  # for its fallback counter
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
        controller = _start_controller(env, kubeconfig, namespace)
        sampler = RssSampler(controller.pid)
        sampler.start()
        sync_s = _wait_synced(db, namespace, (instances, instances, nodes), {}, started, controller)
        sync_cpu_s = sampler.cpu
        _check_cache(db, kubeconfig, namespace)
        pids = (controller.pid, server.pid)
        changes = _drive_changes(db, port, namespace, (instances, nodes), rate, seconds, pids)
        changes["batch_fallbacks"] = _batch_fallbacks(int(env["METRICS_PORT"]))
        _check_cache(db, kubeconfig, namespace)  # every change in, none of them wrong
        if stdout is not None:  # said now: the steps after this one take minutes
            stdout.write(summary("changes", changes))
        pages = _page_figures(db, stdout, quick)
        sampler.stop()
        # A restart on the warm database, every watcher listing again: what is listed is
        # compared with what the cache holds, and only what differs is written.
        controller.terminate()
        controller.wait(timeout=60)
        before = _controller_states(db)
        db.query(
            f"UPDATE {SyncState._meta.db_table} SET resource_version = '' WHERE owner = 'controller'"
        )
        started = time.monotonic()
        controller = _start_controller(env, kubeconfig, namespace)
        resampler = RssSampler(controller.pid)
        resampler.start()
        counts = (instances, instances, nodes)
        resync_s = _wait_synced(db, namespace, counts, before, started, controller)
        resync_cpu_s = resampler.cpu
        resampler.stop()
        _check_cache(db, kubeconfig, namespace)
        return {
            "instances": instances,
            "nodes": nodes,
            "sync_s": sync_s,
            "sync_cpu_s": sync_cpu_s,
            "rss_mb": sampler.peak / 2**20,
            "resync_s": resync_s,
            "resync_cpu_s": resync_cpu_s,
            "resync_rss_mb": resampler.peak / 2**20,
            **changes,
            **pages,
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


def _start_controller(env: dict[str, str], kubeconfig: Path, namespace: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "runcontroller", "--kubeconfig", str(kubeconfig),
         "--namespace", namespace],
        cwd=BASE_DIR,
        env=env | {"LOG_LEVEL": "WARNING"},
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


# The controller's watchers whose lists make up its sync.
SYNC_KINDS = ("{}/configurations", "{}/instances", "pods", "nodes")


def _wait_synced(
    db: BenchDatabase,
    namespace: str,
    counts: tuple[int, int, int],
    before: dict[str, tuple[int, bool]],
    started: float,
    proc: subprocess.Popen,
) -> float:
    """Seconds from ``started`` until the cache holds ``counts`` (Instances, pods, nodes) and
    each of the sync's watchers has listed once more than in ``before`` and is done."""
    from agent.models import Node

    kinds = [kind.format(namespace) for kind in SYNC_KINDS]
    deadline = started + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the controller exited with {proc.returncode} before syncing")
        if _listed(_controller_states(db), kinds, before):
            nodes = db.query(f"SELECT COUNT(*) FROM {Node._meta.db_table} WHERE NOT deleted")
            if (*_count(db, namespace), nodes[0][0]) == counts:
                return time.monotonic() - started
        time.sleep(0.1)
    raise RuntimeError(f"the controller did not sync {counts} (Instances, pods, nodes) in 900 s")


def _kubeconfig(port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "sim", "user": {}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
        "current-context": "sim",
    }
