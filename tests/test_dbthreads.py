"""Threads we start close their database connections when they end (agent.dbthreads)."""

from __future__ import annotations

import asyncio
import gc
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from agent.controller import Controller
from agent.dbthreads import close_pool_connections, start_thread
from agent.models import Instance

pytestmark = pytest.mark.django_db(transaction=True)


def query_and_keep(wrappers: list, fail: bool = False) -> None:
    Instance.objects.count()  # opens this thread's connection
    wrappers.append(connections["default"])
    if fail:
        raise RuntimeError("the thread's work failed")


def test_a_thread_closes_its_connection_when_it_ends():
    wrappers: list = []
    start_thread(query_and_keep, "t", wrappers).join(10)
    (wrapper,) = wrappers
    assert wrapper.connection is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_closes_its_connection_when_its_work_raises():
    wrappers: list = []
    thread = start_thread(query_and_keep, "t", wrappers, True)
    thread.join(10)
    assert not thread.is_alive()
    assert wrappers[0].connection is None


def test_every_pool_thread_closes_its_connection():
    pool = ThreadPoolExecutor(max_workers=3)
    wrappers: list = []
    barrier = threading.Barrier(3)

    def work() -> None:
        barrier.wait(5)  # three threads at once: each opens a connection of its own
        query_and_keep(wrappers)

    for future in [pool.submit(work) for _ in range(3)]:
        future.result(10)
    assert len({id(w) for w in wrappers}) == 3
    close_pool_connections(pool, 3)
    pool.shutdown(wait=True)
    assert all(w.connection is None for w in wrappers)


def open_in_dead_threads() -> list[BaseDatabaseWrapper]:
    """Wrappers whose connection is open although their thread has ended: left for the garbage
    collector (not collected here, which would close them and hide the leak)."""
    alive = {t.ident for t in threading.enumerate()}
    return [
        o
        for o in gc.get_objects()
        # type(), not isinstance(): a lazy object left by an earlier request (a CSP nonce)
        # raises when asked its __class__.
        if issubclass(type(o), BaseDatabaseWrapper)
        and o.connection is not None
        and o._thread_ident not in alive
    ]


@pytest.mark.kube
def test_a_stopped_controller_leaves_no_connection_open(kube, monkeypatch):
    # Persistent connections, as the production settings have them on PostgreSQL: with
    # CONN_MAX_AGE 0 the cache's own close_old_connections() hides a thread's leak.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 60)
    gc.collect()  # what earlier tests left behind is closed now, not counted here
    before = {id(w) for w in open_in_dead_threads()}
    ctl = Controller(kube.new_client(), kube.namespace, timeout_seconds=5).start()
    try:
        assert ctl.sync.wait_synced(timeout=30)
        kube.wait_for(lambda: ctl.pods.synced.is_set(), timeout=30, message="pods listed")
    finally:
        ctl.stop()
    left = [w for w in open_in_dead_threads() if id(w) not in before]
    assert left == []


def test_the_suite_remembers_and_closes_a_connection_a_process_wide_thread_keeps():
    """asgiref's thread-sensitive executor lives as long as the process, and its thread's
    connection with it: on PostgreSQL that session kept the test database from being dropped.
    The suite remembers every connection opened (tests/conftest.py) and closes them all, from
    the main thread, before the test databases are torn down."""
    from tests.conftest import _OPENED, close_connections

    def work() -> BaseDatabaseWrapper:
        Instance.objects.count()
        return connections["default"]

    async def in_the_executor() -> BaseDatabaseWrapper:
        return await sync_to_async(work)()

    wrapper = asyncio.run(in_the_executor())
    assert wrapper is not connections["default"]  # another thread's
    assert wrapper.connection is not None  # nothing closed it: the thread lives on
    assert wrapper in _OPENED
    close_connections([wrapper])
    assert wrapper.connection is None
