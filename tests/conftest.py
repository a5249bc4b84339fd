import os
import sys

# Playwright's sync API runs an event loop in the test thread; Django must allow ORM calls there.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytest_plugins = ["tests.kubeenv"]


import contextlib  # noqa: E402
import time  # noqa: E402
import weakref  # noqa: E402

import pytest  # noqa: E402
from django.db.backends.signals import connection_created  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_reused_counts():
    """The dashboard keeps a costly count for a while (CostlyReuse); on a loaded machine even a
    test's small count can be costly enough to be kept, and then the next test, on another
    database, would read it. Every test starts without kept answers."""
    from akri_site.dashboard.slotmap import CostlyReuse

    CostlyReuse.forget_all()
    yield


# Threads a library starts once for the whole process and keeps (a pool it reuses): not a leak.
PROCESS_POOLS = (
    "asyncio_",  # asyncio's default executor (asgiref, Channels)
    "ThreadPoolExecutor-",  # asgiref's sync_to_async executor, kept for the process
    "Dummy-",  # a thread Python did not start (gRPC's C core) seen from threading
    "pydevd",
    "webhook-refusals",  # the web's one writer of webhook refusals (agent.queues.fastpath)
)
# The session's API server simulator serves each kept-alive connection in a thread of its own
# until the client closes it; the web keeps its API clients for the process on purpose
# (agent.kube.claims, the pod status page), so their connections stay open between tests. The
# server, and these threads with it, stop at the end of the session. A test's own server is
# still caught by its serving thread.
SERVER_CONNECTIONS = "(process_request_thread)"
THREAD_CHECK = os.environ.get("AKRI_THREAD_CHECK", "fail")  # fail | warn | off
# Taken now: a test may move the time module's clock by hand until its own teardown.
_monotonic, _sleep = time.monotonic, time.sleep


@pytest.fixture(autouse=True)
def _no_thread_outlives_its_test(request):
    """A test that starts a thread, a server or a timer stops and joins it before it ends
    (issue 30 §5): threads left running log into later tests ("Database access not allowed",
    "I/O operation on closed file") and made a CI run on PostgreSQL fail without naming a test.
    Set up first among the test's fixtures, so torn down last: the threads its fixtures stop are
    gone by then. A thread that is still ending gets two seconds."""
    import gc
    import threading

    if THREAD_CHECK == "off":
        yield
        return
    before = set(threading.enumerate())
    yield
    live = sys.modules.get("agent.queues.live")
    if live is not None:
        live.cancel_pending()  # a trailing totals update (a timer of up to 5 s): not the test's

    def outliving() -> list[threading.Thread]:
        return [
            t
            for t in threading.enumerate()
            if t not in before
            and t.is_alive()
            and not t.name.startswith(PROCESS_POOLS)
            and not t.name.endswith(SERVER_CONNECTIONS)
        ]

    left = outliving()
    if left:
        gc.collect()  # what only the collector frees (gRPC's aio poller ends with its last user)
        deadline = _monotonic() + 2.0
        while left and _monotonic() < deadline:
            _sleep(0.02)
            left = outliving()
    if left:
        names = ", ".join(
            sorted(f"{t.name} ({'daemon' if t.daemon else 'non-daemon'})" for t in left)
        )
        message = f"{request.node.nodeid}: threads outlived the test: {names}"
        if THREAD_CHECK == "fail":
            pytest.fail(message, pytrace=False)
        report = os.environ.get("AKRI_THREAD_REPORT")
        if report:
            with open(report, "a") as fh:
                fh.write(message + "\n")
        else:
            print(f"\n[threads] {message}")


# --- database connections ----------------------------------------------------------------------

# Every connection the run opened, in any thread: ``connections.close_all()`` closes the
# calling thread's only, and a thread a library keeps for the process (asgiref's
# thread-sensitive executor, a server's pool) keeps its own open until the process ends.
_OPENED: weakref.WeakSet = weakref.WeakSet()


def _remember_connection(sender, connection, **kwargs) -> None:
    _OPENED.add(connection)


connection_created.connect(_remember_connection, weak=False)


def close_every_connection() -> None:
    """Close the database connections of every thread. The threads are done with them: this
    runs after the last test."""
    import gc

    from django.db import connections

    connections.close_all()
    gc.collect()  # a wrapper only the collector would free closes its connection now
    close_connections(list(_OPENED))


def close_connections(wrappers: list) -> None:
    """Close each wrapper's connection from this thread (Django's ``close`` refuses another
    thread's connection)."""
    for wrapper in wrappers:
        raw = wrapper.connection
        if raw is not None:
            with contextlib.suppress(Exception):  # already broken: nothing left to close
                raw.close()
            wrapper.connection = None


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's, and before it drops the test databases, every connection closed (issue
    30 §6): PostgreSQL refuses to drop a database a session is still open on, pytest-django
    only warns, and the run left ``test_<name>`` behind for the next one to trip over."""
    yield
    close_every_connection()


def pytest_configure(config: pytest.Config) -> None:
    # A test database that could not be dropped is an error of the run, not a warning.
    config.addinivalue_line(
        "filterwarnings", "error:Error when trying to teardown test databases:pytest.PytestWarning"
    )
