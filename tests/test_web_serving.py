"""``manage.py runweb``: several worker processes, one port, websockets fed through Redis."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("AKRI_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
CLEARED = ("DATABASE_URL", "REDIS_URL", "AKRI_CHANNEL_REDIS_URL", "AKRI_WEB_WORKERS")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(AKRI_SQLITE_PATH=str(tmp_path / "web.sqlite3"), LOG_LEVEL="WARNING", **extra)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_several_workers_without_a_shared_channel_layer_are_refused(tmp_path):
    done = manage(environment(tmp_path), "runweb", "--workers", "2", "--port", str(free_port()))

    assert done.returncode == 1
    assert "set REDIS_URL, or use --workers 1" in done.stderr


@pytest.fixture
def runweb(tmp_path):
    """runweb with two workers on a free port, its channel layer on the test Redis."""
    prefix = f"akri-test-web-{uuid.uuid4().hex[:8]}"
    env = environment(tmp_path, AKRI_CHANNEL_REDIS_URL=REDIS_URL, AKRI_CHANNEL_PREFIX=prefix)
    assert manage(env, "migrate", "-v0").returncode == 0
    made = manage(
        env,
        "shell",
        "-c",
        "from django.contrib.auth.models import User, Group; "
        "u = User.objects.create_user('vic', password='pw-for-tests-1'); "
        "u.groups.add(Group.objects.get(name='viewer'))",
    )
    assert made.returncode == 0, made.stderr
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runweb", "--workers", "2", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                break
        except OSError:
            assert time.monotonic() < deadline, "runweb did not answer within 60 s"
            time.sleep(0.2)
    yield port, proc, prefix
    proc.terminate()
    proc.wait(timeout=30)


def test_two_workers_serve_one_port(runweb):
    port, proc, _ = runweb

    workers = psutil.Process(proc.pid).children(recursive=True)

    spawned = [p for p in workers if "spawn_main" in " ".join(p.cmdline())]
    assert len(spawned) == 2
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
        assert answer.status == 200


def test_every_socket_gets_the_live_feed_whichever_worker_holds_it(runweb):
    port, _, prefix = runweb
    asyncio.run(_sockets_get_a_delta(port, prefix))


async def _sockets_get_a_delta(port: int, prefix: str) -> None:
    import aiohttp
    from channels_redis.core import RedisChannelLayer

    from akri_site.dashboard.live import LIVE_GROUP

    base = f"http://127.0.0.1:{port}"
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(base, cookie_jar=jar) as session:
        async with session.get("/accounts/login/") as page:
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', await page.text())
        form = {"username": "vic", "password": "pw-for-tests-1"}
        form["csrfmiddlewaretoken"] = token.group(1)
        async with session.post("/accounts/login/", data=form, allow_redirects=False) as answer:
            assert answer.status == 302
        # Eight sockets: the kernel spreads them over both workers.
        sockets = [
            await session.ws_connect("/ws/live/", headers={"Origin": base}) for _ in range(8)
        ]
        for ws in sockets:
            assert (await ws.receive_json(timeout=10))["type"] == "snapshot"
        # Whichever worker answers, /metrics counts the sockets of both.
        async with session.get("/metrics") as answer:
            assert "\nakri_websocket_clients 8.0\n" in await answer.text()
        layer = RedisChannelLayer(hosts=[REDIS_URL], prefix=prefix)
        delta = {"type": "live.delta", "instances": [], "removed": ["ns/gone"], "runs": []}
        await layer.group_send(LIVE_GROUP, delta)
        for ws in sockets:
            got = await ws.receive_json(timeout=10)
            assert got["type"] == "delta" and got["removed"] == ["ns/gone"]
            await ws.close()
        await layer.close_pools()
