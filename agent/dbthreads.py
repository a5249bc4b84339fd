"""Threads of our own close the database connections they opened when they end.

Django opens a connection per thread on first use and closes it only around the requests it
serves. A thread we start and later stop (a watcher, an applier, a pool worker) would leave its
connection open on the server until the garbage collector finds the dead thread's wrapper: a
controller that gains and loses leadership, or a test run starting agent after agent, piles
them up against PostgreSQL's ``max_connections``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from django.db import connections


def closing_connections(target: Callable[..., Any]) -> Callable[..., Any]:
    """``target``, then this thread's connections closed however it ended."""

    @functools.wraps(target)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return target(*args, **kwargs)
        finally:
            connections.close_all()

    return run


def start_thread(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    """A started daemon thread running ``target(*args)`` that closes its connections."""
    thread = threading.Thread(target=closing_connections(target), args=args, name=name, daemon=True)
    thread.start()
    return thread


def close_pool_connections(pool: Executor, workers: int) -> None:
    """Close each pool thread's connections from that thread. The barrier holds every task
    until all have started, so each of the ``workers`` threads takes exactly one."""
    barrier = threading.Barrier(workers)

    def close() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=2)
        connections.close_all()

    for _ in range(workers):
        pool.submit(close)
