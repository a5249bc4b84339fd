"""Running the extender: its books, feeds, verdict recorder and HTTP server, wired from
settings, in a thread of its own (tests, benchmarks) or as the process's main loop
(``manage.py runextender``)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from django.conf import settings
from kubernetes import client

from agent.extender.binder import Binder
from agent.extender.feed import CacheFeed, FeedThread, KubeFeed
from agent.extender.server import Extender, make_app
from agent.extender.state import SchedulerState
from agent.scheduling.recorder import VerdictRecorder
from agent.sharing.registry import enabled


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
    url: str = field(init=False, default="")

    def __post_init__(self) -> None:
        conf = settings.AKRI
        self.namespace = self.namespace or conf["NAMESPACE"]
        names = self.policies if self.policies is not None else conf["SHARING_POLICIES"]
        assume = self.assume_seconds or conf["ASSIGNMENT_TIMEOUT_SECONDS"]
        pack = self.pack if self.pack is not None else conf["EXTENDER_PRIORITY"] == "pack"
        self.state = SchedulerState(enabled(names), assume_seconds=assume)
        self.recorder = VerdictRecorder() if self.record else None
        binder = Binder(self.api_client) if self.api_client is not None else None
        self.extender = Extender(self.state, binder, self.recorder, pack=pack)
        kube = KubeFeed(self.state, self.api_client) if self.api_client is not None else None
        self.feed = FeedThread(
            CacheFeed(self.state, self.namespace),
            kube,
            interval=self.feed_interval,
            kube_interval=self.kube_interval,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    async def serve(self) -> None:
        """Start serving on the running loop; sets ``url``."""
        self._runner = web.AppRunner(make_app(self.extender, self.prefix), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = site._server.sockets if site._server else []  # the port chosen for port 0
        port = sockets[0].getsockname()[1] if sockets else self.port
        prefix = "/" + self.prefix.strip("/") if self.prefix.strip("/") else ""
        self.url = f"http://{self.host}:{port}{prefix}"

    async def shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def start_feeds(self) -> None:
        if self.recorder is not None:
            self.recorder.start()
        self.feed.start()

    def stop_feeds(self) -> None:
        self.feed.stop()
        if self.recorder is not None:
            self.recorder.stop()

    # --- in a thread ------------------------------------------------------------------------
    def start(self) -> ExtenderService:
        self.start_feeds()
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self.serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="extender-http", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the extender's HTTP server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            future = asyncio.run_coroutine_threadsafe(self.shutdown(), self._loop)
            future.result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
            self._loop = None
        self.stop_feeds()

    def __enter__(self) -> ExtenderService:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
