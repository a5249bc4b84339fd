"""``/metrics`` of the Celery worker program (``celery -A akri_site worker``).

The tasks run in the pool's child processes (prefork, Celery's default), and each child keeps
its series in its own memory, out of reach of the process that could serve them. So the worker
uses prometheus_client's multiprocess mode: every process of the worker writes its series to
files in one directory, and the main process serves them summed (``MultiProcessCollector``),
on ``METRICS_PORT`` (``agent.exporter``). A solo or threads pool works the same way.

That mode is chosen once, when prometheus_client is first imported, by
``PROMETHEUS_MULTIPROC_DIR``; and the worker imports its task modules (so prometheus_client)
before it sends its first signal. ``install()`` therefore runs while the worker program loads
the Celery app (``akri_site.celery``): Celery's command line is Click, which knows the
subcommand before it loads the app, so ``worker_program()`` can tell.

- The directory is a fresh private one, removed when the worker exits, unless
  ``PROMETHEUS_MULTIPROC_DIR`` is set (then it is yours, and must start empty).
- The server runs in the main process, from ``worker_init`` to ``worker_shutdown``; the
  children only write their files.
- A child that exits is marked dead, so that its live gauges go with it.
- Tasks that fail and retries are counted (``akri_task_failures_total``,
  ``akri_task_retries_total``), by task name.

Workers inside another process (the tests' ``start_worker``, the demo's eager tasks) are not the
worker program: nothing here happens to them.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from typing import Any

from celery import signals

log = logging.getLogger(__name__)

ENV = "PROMETHEUS_MULTIPROC_DIR"
_state: dict[str, Any] = {}


def worker_program() -> bool:
    """Is this process ``celery ... worker``, loading its app now?"""
    click = sys.modules.get("click")
    if click is None:  # not Celery's command line (nor any Click program): nothing to load
        return False
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.invoked_subcommand == "worker"


def install() -> None:
    """Multiprocess mode for this worker and its children, and the signals that serve it."""
    # Imported already, prometheus_client would stay in single-process mode: said at start.
    _state["late"] = "prometheus_client" in sys.modules and not os.environ.get(ENV)
    if not os.environ.get(ENV):
        directory = tempfile.mkdtemp(prefix="akri-worker-metrics-")
        os.environ[ENV] = directory
        atexit.register(_remove, directory, os.getpid())
    signals.worker_init.connect(_start, weak=False)
    signals.worker_shutdown.connect(_stop, weak=False)
    signals.worker_process_shutdown.connect(_child_exits, weak=False)
    signals.task_failure.connect(_failed, weak=False)
    signals.task_retry.connect(_retried, weak=False)


def _start(sender: Any = None, **_: Any) -> None:
    from prometheus_client import CollectorRegistry, multiprocess

    from agent import exporter, metrics

    if _state["late"]:
        log.error(
            "worker: prometheus_client was loaded before %s was set: /metrics shows this "
            "process only, not the pool's children",
            ENV,
        )
    # Every task's counts start at 0, so that Prometheus sees the first failure as a step
    # (increase() cannot tell a series that appears at 1 from one that was always 1).
    for name in _task_names(sender):
        metrics.TASK_FAILURES.labels(name)
        metrics.TASK_RETRIES.labels(name)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    _state["server"] = exporter.serve("worker", registry)


def _stop(**_: Any) -> None:
    server = _state.pop("server", None)
    if server is not None:
        server.stop()


def _child_exits(pid: int | None = None, **_: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid or os.getpid())


def _failed(sender: Any = None, **_: Any) -> None:
    from agent import metrics

    metrics.TASK_FAILURES.labels(_task_name(sender)).inc()


def _retried(sender: Any = None, **_: Any) -> None:
    from agent import metrics

    metrics.TASK_RETRIES.labels(_task_name(sender)).inc()


def _task_names(worker: Any) -> list[str]:
    tasks = getattr(getattr(worker, "app", None), "tasks", {})
    return sorted(name for name in tasks if not name.startswith("celery."))


def _task_name(task: Any) -> str:
    return str(getattr(task, "name", None) or "unknown")


def _remove(directory: str, owner: int) -> None:
    # Forked children inherit atexit handlers; only the process that made the directory
    # removes it.
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)
