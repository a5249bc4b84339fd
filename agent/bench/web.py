"""The ``web`` benchmark: a crowd on the demo's dashboard, served as the demo serves it.

``manage.py demo`` runs in its own process (three simulated nodes, agents, workload and the
web, as ``scripts/demo`` starts it). This process signs in as the viewer, opens 50 websockets
that stay open and take the live feed, and runs 200 clients that fetch the slot map and
``/api/slots/`` in turn, each as fast as answers come, for 20 seconds.

Figures: ``rps``, ``p95_ms`` and ``errors`` (anything but a 200, or no answer) as the clients
saw them; ``cores_busy`` = CPU seconds of the web processes (the uvicorn workers; in one-process
mode the demo process itself, cluster included) / wall seconds of the load, and
``cores_busy_demo`` the same for the demo's whole process tree (cluster, Redis, workers). The same load is
then run against the demo serving from one process (``AKRI_WEB_WORKERS=1``): ``rps_1`` and
``p95_ms_1`` are that baseline, measured in the same run.

Run with ``DATABASE_URL`` naming PostgreSQL, it also runs the crowd against ``runweb`` (two
workers) on a database of its own and prints ``db_connections_peak`` (the web's connections in
``pg_stat_activity``, target <= 4 per worker: each worker's pool is bounded), with
``errors_pg``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.bench import percentile

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "bench-web-password"
PATHS = ("/slots/", "/api/slots/")


def bench_web(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    clients, sockets, seconds = (20, 5, 3.0) if quick else (200, 50, 20.0)
    figures: dict[str, object] = {}
    for label, workers in (("", 0), ("_1", 1)):
        with demo(workers) as (port, proc):
            result = asyncio.run(crowd(port, proc, clients, sockets, seconds))
        if stdout is not None:
            stdout.write(f"web workers={workers or 'all'}: {result}\n")
        if label:
            figures.update({"rps_1": result["rps"], "p95_ms_1": result["p95_ms"]})
        else:
            figures.update(result)
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        figures.update(_postgres_connections(clients, sockets, seconds, stdout))
    return figures


def _postgres_connections(
    clients: int, sockets: int, seconds: float, stdout: Any
) -> dict[str, object]:
    """The same crowd on ``runweb`` (2 workers) over a PostgreSQL database of the bench's own,
    as a deployment runs it: the peak of the web's connections (``pg_stat_activity`` of its
    database, which nothing else uses), in all and per worker, and the errors the crowd saw
    meanwhile."""
    import threading

    from agent.bench.scale import BenchDatabase

    db = BenchDatabase()
    workers = 2
    try:
        env = db.env()
        env.update(
            AKRI_ENV="development",
            SECURE_SSL_REDIRECT="false",
            AKRI_SECURE_COOKIES="false",
            LOG_LEVEL="WARNING",
            AKRI_WEB_WORKERS=str(workers),
        )
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "-v0"], cwd=REPO, env=env, check=True)
        subprocess.run(
            [*manage, "shell", "-c",
             "from django.contrib.auth.models import Group, User; "
             f"u = User.objects.create_user('viewer', password={PASSWORD!r}); "
             "u.groups.add(Group.objects.get(name='viewer'))"],
            cwd=REPO, env=env, check=True,
        )  # fmt: skip
        port = _free_port()
        with tempfile.TemporaryDirectory(prefix="akri-bench-web-pg-") as tmp:
            log_path = Path(tmp) / "runweb.log"
            with open(log_path, "w") as log:
                proc = subprocess.Popen(
                    [*manage, "runweb", "--port", str(port)],
                    cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
                peak = [0]
                done = threading.Event()

                def sample() -> None:
                    # Only runweb uses this database (and this query, left out).
                    sql = (
                        "select count(*) from pg_stat_activity where datname = ? "
                        "and pid <> pg_backend_pid()"
                    )
                    while not done.wait(0.2):
                        with contextlib.suppress(Exception):
                            peak[0] = max(peak[0], db.query(sql, (db.tag,))[0][0])

                sampler = threading.Thread(target=sample, name="pg-connections")
                try:
                    _wait_ready(port, proc, log_path)
                    import psutil

                    sampler.start()
                    result = asyncio.run(
                        crowd(port, psutil.Process(proc.pid), clients, sockets, seconds)
                    )
                finally:
                    done.set()
                    if sampler.is_alive():
                        sampler.join()
                    proc.terminate()
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
    finally:
        db.drop()
    if stdout is not None:
        stdout.write(f"web on PostgreSQL: {result}, connections peak {peak[0]}\n")
    return {
        "db_connections_peak": peak[0],
        "db_connections_per_worker": peak[0] / workers,
        "rps_pg": result["rps"],
        "errors_pg": result["errors"],
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def demo(workers: int) -> Iterator[tuple[int, Any]]:
    """``manage.py demo`` on a free port with its own SQLite file; yields (port, process)."""
    import psutil

    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="akri-bench-web-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update(
            AKRI_SQLITE_PATH=str(Path(tmp) / "demo.sqlite3"),
            AKRI_WEB_WORKERS=str(workers),
            LOG_LEVEL="WARNING",
        )
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "-v0"], cwd=REPO, env=env, check=True)
        log = open(Path(tmp) / "demo.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [*manage, "demo", "--port", str(port), "--password", PASSWORD],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_ready(port, proc, Path(tmp) / "demo.log")
            yield port, psutil.Process(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def _wait_ready(port: int, proc: subprocess.Popen, log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the demo exited: {log.read_text()[-2000:]}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2),
        ):
            # The slot map needs the agents' first Instances: give discovery a moment.
            time.sleep(2)
            return
        time.sleep(0.2)
    raise RuntimeError("the demo did not answer /healthz within 60 s")


def web_processes(demo_proc: Any) -> list[Any]:
    """The uvicorn workers (spawned Python children), else the demo process itself."""
    workers = [
        child
        for child in demo_proc.children(recursive=True)
        if "spawn_main" in " ".join(child.cmdline())
    ]
    return workers or [demo_proc]


def _cpu(processes: list[Any]) -> float:
    total = 0.0
    for proc in processes:
        with contextlib.suppress(Exception):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


async def crowd(
    port: int, demo_proc: Any, clients: int, sockets: int, seconds: float
) -> dict[str, object]:
    import aiohttp

    base = f"http://127.0.0.1:{port}"
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    # unsafe: keep cookies from an IP address (the session and CSRF cookies of 127.0.0.1).
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(
        base, connector=connector, timeout=timeout, cookie_jar=jar
    ) as session:
        await _sign_in(session)
        live = [
            await session.ws_connect("/ws/live/", headers={"Origin": base}) for _ in range(sockets)
        ]
        frames = [0]
        readers = [asyncio.ensure_future(_read(ws, frames)) for ws in live]
        web = web_processes(demo_proc)
        everything = [demo_proc, *demo_proc.children(recursive=True)]
        cpu0, all0, t0 = _cpu(web), _cpu(everything), time.monotonic()
        client0 = time.process_time()
        deadline = t0 + seconds
        results = await asyncio.gather(*(_client(session, i, deadline) for i in range(clients)))
        wall = time.monotonic() - t0
        cpu, cpu_all = _cpu(web) - cpu0, _cpu(everything) - all0
        client = time.process_time() - client0
        for reader in readers:
            reader.cancel()
        for ws in live:
            await ws.close()
    latencies = [ms for ok, _ in results for ms in ok]
    errors = sum(bad for _, bad in results)
    return {
        "rps": len(latencies) / wall,
        "p95_ms": percentile(latencies, 95),
        "p50_ms": percentile(latencies, 50),
        "cores_busy": cpu / wall,
        "cores_busy_demo": cpu_all / wall,
        # The load generator's own share of the same two cores.
        "client_cores": client / wall,
        "errors": errors,
        "workers": len(web),
        "ws_frames": frames[0],
    }


async def _sign_in(session: Any) -> None:
    async with session.get("/accounts/login/") as page:
        html = await page.text()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    if token is None:
        raise RuntimeError("no CSRF token on the login page")
    form = {"username": "viewer", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)}
    async with session.post("/accounts/login/", data=form, allow_redirects=False) as answer:
        if answer.status != 302:
            raise RuntimeError(f"sign-in answered {answer.status}")


async def _read(ws: Any, frames: list[int]) -> None:
    async for _ in ws:
        frames[0] += 1


async def _client(session: Any, n: int, deadline: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    i = n
    while time.monotonic() < deadline:
        path = PATHS[i % 2]
        i += 1
        t = time.perf_counter()
        try:
            async with session.get(path) as answer:
                await answer.read()
                ok = answer.status == 200
        except Exception:  # noqa: BLE001 - counted: the figure is how many failed
            ok = False
        if ok:
            latencies.append((time.perf_counter() - t) * 1000)
        else:
            errors += 1
    return latencies, errors
