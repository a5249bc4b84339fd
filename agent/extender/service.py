"""Running the extender: its books, feeds, verdict recorder and HTTP server, wired from
settings, in a thread of its own (tests, benchmarks) or as the process's main loop
(``manage.py runextender``).

With ``tls`` the protocol is served over HTTPS to clients with a certificate the client CA
signed (``agent.extender.tls``), and ``health_port`` serves ``/healthz`` alone in plain HTTP
for the kubelet's probes. Without it, plain HTTP: for a loopback address, tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from django.conf import settings
from kubernetes import client

from agent.extender.binder import Binder
from agent.extender.feed import CacheFeed, FeedThread, KubeFeed, PodFeed
from agent.extender.retry import Retrier
from agent.extender.server import make_app, make_health_app
from agent.extender.state import SchedulerState
from agent.extender.tls import Reloader, ServerTls
from agent.extender.verbs import Extender
from agent.scheduling.recorder import VerdictRecorder
from agent.sharing.registry import enabled

# How often the TLS files are looked at for a renewal.
RELOAD_SECONDS = 60.0
LINGER_SECONDS = 2.0


@dataclass
class ExtenderService:
    api_client: client.ApiClient | None
    namespace: str = ""
    host: str = "127.0.0.1"
    port: int = 0
    prefix: str = ""
    policies: list[str] | None = None
    pack: bool | None = None
    assume_seconds: float | None = None
    feed_interval: float = 0.5
    kube_interval: float = 5.0
    record: bool = True
    tls: ServerTls | None = None
    health_port: int | None = None  # /healthz alone, plain HTTP (with tls: for the probes)
    url: str = field(init=False, default="")
    health_url: str = field(init=False, default="")

    def __post_init__(self) -> None:
        conf = settings.AKRI
        self.namespace = self.namespace or conf["NAMESPACE"]
        names = self.policies if self.policies is not None else conf["SHARING_POLICIES"]
        assume = self.assume_seconds or conf["ASSIGNMENT_TIMEOUT_SECONDS"]
        pack = self.pack if self.pack is not None else conf["EXTENDER_PRIORITY"] == "pack"
        self.state = SchedulerState(enabled(names), assume_seconds=assume)
        self.recorder = VerdictRecorder() if self.record else None
        binder = Binder(self.api_client) if self.api_client is not None else None
        # Without the API nothing can be asked again (nor bound): no pods to remember.
        self.retrier = Retrier(self.state, self.api_client) if self.api_client is not None else None
        self.extender = Extender(self.state, binder, self.recorder, pack=pack, retrier=self.retrier)
        kube = KubeFeed(self.state, self.api_client) if self.api_client is not None else None
        self.pods = PodFeed(self.state, self.api_client) if self.api_client is not None else None
        self.feed = FeedThread(
            CacheFeed(self.state, self.namespace),
            kube,
            interval=self.feed_interval,
            kube_interval=self.kube_interval,
        )
        self.feed.pods_watched = self.pods is not None
        # Read now: a missing or wrong file stops the process at start, in words.
        self.ssl_context: ssl.SSLContext | None = self.tls.context() if self.tls else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runners: list[web.AppRunner] = []
        self._reload: asyncio.Task | None = None
        self._thread: threading.Thread | None = None

    async def serve(self) -> None:
        """Start serving on the running loop; sets ``url`` (and ``health_url``)."""
        names = self.tls.client_names if self.tls else ()
        app = make_app(self.extender, self.prefix, client_names=names)
        port = await self._site(app, self.port, self.ssl_context)
        prefix = "/" + self.prefix.strip("/") if self.prefix.strip("/") else ""
        scheme = "https" if self.ssl_context else "http"
        self.url = f"{scheme}://{self.host}:{port}{prefix}"
        if self.health_port is not None:
            health = await self._site(make_health_app(), self.health_port, None)
            self.health_url = f"http://{self.host}:{health}"
        if self.tls is not None and self.ssl_context is not None:
            self._reload = asyncio.get_running_loop().create_task(
                self._reload_tls(Reloader(self.tls, self.ssl_context))
            )

    async def _site(self, app: web.Application, port: int, context: ssl.SSLContext | None) -> int:
        # lingering_time: the rest of a body refused unread (over MAX_BODY) is read and thrown
        # away for at most this long after the answer, so that the client reads the answer
        # before its connection closes; aiohttp's 10 s would hold a shutdown that long.
        runner = web.AppRunner(app, access_log=None, lingering_time=LINGER_SECONDS)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, self.host, port, ssl_context=context)
        await site.start()
        sockets = site._server.sockets if site._server else []  # the port chosen for port 0
        return sockets[0].getsockname()[1] if sockets else port

    @staticmethod
    async def _reload_tls(reloader: Reloader) -> None:
        while True:
            await asyncio.sleep(RELOAD_SECONDS)
            reloader.check()

    async def shutdown(self) -> None:
        if self._reload is not None:
            self._reload.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reload
            self._reload = None
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    def start_feeds(self) -> None:
        if self.recorder is not None:
            self.recorder.start()
        if self.pods is not None:
            self.pods.start()
        self.feed.start()
        if self.retrier is not None:
            self.retrier.start()

    def stop_feeds(self) -> None:
        if self.retrier is not None:
            self.retrier.stop()
        self.feed.stop()
        if self.pods is not None:
            self.pods.stop()
        if self.recorder is not None:
            self.recorder.stop()

    # --- in a thread ------------------------------------------------------------------------
    def start(self) -> ExtenderService:
        self.start_feeds()
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        failed: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self.serve())
            except BaseException as exc:  # told to start(), in the caller's thread
                failed.append(exc)
                return
            finally:
                ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="extender-http", daemon=True)
        self._thread.start()
        if not ready.wait(10) or failed:
            self.stop()
            raise RuntimeError(f"the extender's HTTP server did not start: {failed}")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        try:
            if loop is not None and thread is not None:
                if thread.is_alive():
                    asyncio.run_coroutine_threadsafe(self.shutdown(), loop).result(timeout=30)
                    loop.call_soon_threadsafe(loop.stop)
                    thread.join(timeout=10)
                else:  # it never started serving: close what it opened, here
                    loop.run_until_complete(self.shutdown())
                loop.close()
                self._loop = None
        finally:
            self.stop_feeds()

    def __enter__(self) -> ExtenderService:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
