"""The ``live`` benchmark: from a ``deviceUsage`` change in the API server to a dashboard
websocket client receiving the delta, with 1 and with 200 connected clients.

Real pieces throughout: the API-server simulator, the controller (watch -> cache -> coalesced
publish) in this process, the Redis channel layer, and Daphne in its own process serving the
ASGI application to aiohttp websocket clients.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
import time
import uuid
from typing import Any

from agent.bench import ensure_migrated, percentile, start_daphne
from agent.bench.claims import instance_body


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"daphne did not listen on {port} within {timeout} s")


def bench_live(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    from django.conf import settings

    redis_url = (
        os.environ.get("AKRI_TEST_REDIS_URL") or settings.REDIS_URL or "redis://127.0.0.1:6379/0"
    )
    prefix = f"akri-bench-{uuid.uuid4().hex[:6]}"
    # This process publishes through the same Redis layer the Daphne process listens on.
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [redis_url], "prefix": prefix},
        }
    }
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    ensure_migrated()

    from django.contrib.auth.models import Group, User
    from django.test import Client

    from agent.controller import Controller
    from agent.kube.client import AkriApi, new_api_client
    from agent.simulator.apiserver import ApiServerSimulator

    user, _ = User.objects.get_or_create(username="bench-viewer")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value

    changes = 20 if quick else 60
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    port = _free_port()
    env = {
        **os.environ,
        # The channel layer alone: REDIS_URL would make Daphne's settings production's.
        "AKRI_CHANNEL_REDIS_URL": redis_url,
        "AKRI_CHANNEL_PREFIX": prefix,
        "AKRI_SQLITE_PATH": settings.DATABASES["default"]["NAME"]
        if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
        else os.environ.get("AKRI_SQLITE_PATH", ""),
        "AKRI_NAMESPACE": namespace,
    }
    with ApiServerSimulator() as sim:
        sim.ensure_namespace(namespace)
        kubeconfig = tempfile.mkstemp(prefix="akri-live-", suffix=".yaml")[1]
        sim.write_kubeconfig(kubeconfig)
        api = AkriApi(new_api_client(kubeconfig), namespace)
        name = "bench-live-8120fe"
        api.create_instance(instance_body(name, 2))
        controller = Controller(new_api_client(kubeconfig), namespace).start()
        controller.sync.wait_synced()
        daphne = start_daphne(port, env)
        try:
            _wait_port(port)
            figures: dict[str, object] = {}
            for clients in (1, 200):
                lat = asyncio.run(_measure(api, name, port, session, clients, changes))
                figures[f"p50_ms_{clients}"] = percentile(lat, 50)
                figures[f"p95_ms_{clients}"] = percentile(lat, 95)
            figures["changes"] = changes
            figures["coalesce_ms"] = settings.AKRI["LIVE_COALESCE_MS"]
            return figures
        finally:
            daphne.terminate()
            daphne.wait(timeout=10)
            controller.stop()


async def _measure(
    api, name: str, port: int, session: str, clients: int, changes: int
) -> list[float]:
    import aiohttp

    url = f"ws://127.0.0.1:{port}/ws/live/?view=slots"
    headers = {"Cookie": f"sessionid={session}", "Origin": f"http://127.0.0.1:{port}"}
    key = f"{name}-0"
    latencies: list[float] = []
    # aiohttp allows 100 connections per session unless told otherwise.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        sockets = []
        for _ in range(clients):
            ws = await http.ws_connect(url, headers=headers, max_msg_size=0)
            _trace("connected")
            await ws.receive_json(timeout=30)  # the snapshot
            _trace("snapshot")
            sockets.append(ws)
        value = ""
        for _ in range(changes):
            new = "" if value else "node-a"
            waiters = [asyncio.create_task(_wait_value(ws, key, new)) for ws in sockets]
            started = time.monotonic()
            await asyncio.to_thread(
                api.patch_instance,
                name,
                [
                    {"op": "test", "path": f"/spec/deviceUsage/{key}", "value": value},
                    {"op": "replace", "path": f"/spec/deviceUsage/{key}", "value": new},
                ],
            )
            _trace("patched")
            for arrived in await asyncio.gather(*waiters):
                latencies.append((arrived - started) * 1000)
            value = new
        for ws in sockets:
            await ws.close()
    return latencies


async def _wait_value(ws, key: str, value: str) -> float:
    while True:
        message = await ws.receive_json(timeout=30)
        if message.get("type") != "delta":
            continue
        for instance in message.get("instances", []):
            for slot in instance.get("slots", []):
                if slot.get("key") == key and slot.get("value") == value:
                    return time.monotonic()


def _trace(what: str) -> None:
    if os.environ.get("AKRI_BENCH_VERBOSE"):
        print(f"live: {time.monotonic():.3f} {what}", file=sys.stderr, flush=True)
