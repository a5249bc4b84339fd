"""Serving the web on every core: uvicorn worker processes behind one listening socket.

Django runs sync views on one thread per process, so one process serves one page at a time
whatever the server in front of it. ``serve`` starts ``workers`` uvicorn processes that share
the listening socket (the kernel spreads connections between them); each serves the whole ASGI
application, HTTP and websockets (Channels) alike. Websockets in different processes reach the
live fan-out only through a channel layer they share, so more than one worker needs Redis:
``REDIS_URL`` in production.

The embedded demo has no Redis of its own configured. ``serve_demo`` starts a private
``redis-server`` on a unix socket when one is installed and points the channel layer alone at it
(Celery keeps running tasks in-process, the database stays the demo's SQLite file); without
``redis-server`` it serves from one process, as before, and says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from django.conf import settings

log = logging.getLogger(__name__)

APP = "akri_site.asgi:application"


def default_workers() -> int:
    """One worker per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def shared_layer() -> bool:
    """Does the channel layer reach across processes?"""
    backend = settings.CHANNEL_LAYERS["default"]["BACKEND"]
    return not backend.endswith("InMemoryChannelLayer")


def serve(
    host: str,
    port: int,
    workers: int,
    *,
    access_log: bool = False,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> None:
    """Serve the ASGI application until SIGINT/SIGTERM; blocks. With a certificate and key,
    over HTTPS (the admission webhook's container in deploy/)."""
    with metrics_directory(workers):
        _run(host, port, workers, access_log, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)


@contextlib.contextmanager
def metrics_directory(workers: int) -> Iterator[None]:
    """Several workers write their Prometheus series to files in one directory, so that
    ``/metrics`` answered by any of them sums them all (prometheus_client's multiprocess
    mode). The workers read ``PROMETHEUS_MULTIPROC_DIR`` when they start."""
    if workers == 1 or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="akri-web-metrics-") as tmp:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tmp
        try:
            yield
        finally:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]


def _run(host: str, port: int, workers: int, access_log: bool, **ssl: str | None) -> None:
    from uvicorn.main import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    config = TcpConfig(
        APP,
        host=host,
        port=port,
        workers=workers,
        http="httptools",
        ws="websockets-sansio",
        # Django and Channels implement no lifespan protocol.
        lifespan="off",
        # Keep Django's logging configuration; uvicorn's own would replace it.
        log_config=None,
        access_log=access_log,
        # X-Forwarded-For/-Proto are believed only from these addresses (the ingress).
        proxy_headers=True,
        forwarded_allow_ips=settings.FORWARDED_ALLOW_IPS,
        timeout_graceful_shutdown=10,
        # The consumer closes frames over its own limit with 4400; this is the hard cap.
        ws_max_size=1024 * 1024,
        **ssl,
    )
    # What uvicorn.run does, with TcpConfig's socket.
    if workers > 1:
        Multiprocess(config, sockets=[config.bind_socket()]).run()
        return
    server = uvicorn.Server(config)
    server.run()
    if not server.started:  # e.g. the port is taken: uvicorn has said why
        sys.exit(STARTUP_FAILURE)


class TcpConfig(uvicorn.Config):
    """uvicorn's settings, with the workers' shared socket made a TCP socket as Python sees it.

    uvicorn creates that socket with proto 0, so the connections the workers accept have proto
    0 too, and asyncio sets TCP_NODELAY only on IPPROTO_TCP sockets: every answer written in two
    parts (headers, body) then waited for the client's delayed ACK, about 40 ms per request
    with more than one worker (bench ``webhook``: p50 44 ms -> well under 1 ms).
    """

    def bind_socket(self) -> socket.socket:
        sock = super().bind_socket()
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return sock
        tcp = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
        tcp.set_inheritable(True)
        return tcp


def serve_demo(host: str, port: int, workers: int | None = None) -> None:
    """The demo's web: every core when a private Redis can carry the live feed, else one."""
    workers = workers or int(os.environ.get("AKRI_WEB_WORKERS") or 0) or default_workers()
    if workers == 1 or shared_layer():
        serve(host, port, workers)
        return
    with private_redis() as url:
        if url is None:
            sys.stderr.write(
                "demo: redis-server not found, so the web runs in one process (one core); "
                "install Redis to serve from every core\n"
            )
            serve(host, port, 1)
            return
        use_channel_redis(url)
        serve(host, port, workers)


def use_channel_redis(url: str) -> None:
    """Point this process's channel layer, and the workers it starts, at ``url``."""
    from channels.layers import channel_layers

    os.environ["AKRI_CHANNEL_REDIS_URL"] = url
    settings.CHANNEL_LAYERS = {"default": redis_layer(url)}
    channel_layers.backends.clear()


def redis_layer(url: str) -> dict:
    return {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [url], "prefix": os.environ.get("AKRI_CHANNEL_PREFIX", "akri")},
    }


@contextlib.contextmanager
def private_redis() -> Iterator[str | None]:
    """A throw-away redis-server on a unix socket in a private directory, or None."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="akri-demo-redis-") as tmp:
        sock = Path(tmp) / "redis.sock"
        proc = subprocess.Popen(
            [
                binary,
                "--port", "0",
                "--unixsocket", str(sock),
                "--unixsocketperm", "700",
                "--save", "",
                "--appendonly", "no",
                "--dir", tmp,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_for_socket(sock, proc)
            yield f"unix://{sock}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_for_socket(sock: Path, proc: subprocess.Popen) -> None:
    import redis

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        if sock.exists():
            with contextlib.suppress(redis.RedisError):
                redis.Redis(unix_socket_path=str(sock)).ping()
                return
        time.sleep(0.05)
    raise RuntimeError("redis-server did not answer within 10 s")
