"""One asyncio event loop in its own thread, plus a bounded pool for blocking work.

Every device-plugin server of an agent runs on this loop (``grpc.aio``), so a hundred plugins
cost a hundred sockets, not a hundred thread pools. Work that blocks (the claim store's HTTP
calls and ORM writes) goes to ``blocking``, a small thread pool, so the loop keeps serving
ListAndWatch streams while an Allocate waits for the API server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agent.dbthreads import close_pool_connections

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread until ``stop()``."""

    def __init__(self, name: str, blocking_workers: int = 8) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.blocking = concurrent.futures.ThreadPoolExecutor(
            max_workers=blocking_workers, thread_name_prefix=f"{name}-work"
        )
        self._workers = blocking_workers
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = threading.Event()

    def start(self) -> LoopThread:
        self._thread.start()
        self._started.wait()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop from any other thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (never call from the loop)."""
        return self.submit(coro).result(timeout)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule a plain callback on the loop, from any thread; a no-op once stopped."""
        # RuntimeError: the loop closed between the check and the call.
        if not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(fn, *args)

    async def in_pool(self, fn: Callable[..., T], *args: Any) -> T:
        """Await ``fn(*args)`` run in the blocking pool."""
        return await asyncio.get_running_loop().run_in_executor(self.blocking, fn, *args)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self._close_pool()

    def _close_pool(self) -> None:
        try:
            close_pool_connections(self.blocking, self._workers)
        except RuntimeError:  # already shut down
            return
        self.blocking.shutdown(wait=True, cancel_futures=False)
