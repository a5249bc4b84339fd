"""How broker work reaches a worker, one run per object at a time.

A unit of work is keyed by what it covers: ``instance:<ns>/<configuration>/<instance>``,
``configuration:<ns>/<configuration>`` or ``level:<ns>``.

- With Celery on Redis: an event enqueues a task unless one for that key is already waiting
  (a short-lived Redis key, cleared by the task as it starts: an event after the start enqueues
  again, so none is lost, and a burst of events costs one run). The task holds a Redis lock on
  its key while it runs; a second run of the same key waits its turn by retrying.
- Embedded (tasks run in-process, no broker): one background thread works through a queue of
  keys, each waiting at most once; it never blocks the watch that enqueued. A run that hit an
  API error is queued again after a backoff.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from agent.brokers import engine
from agent.dbthreads import closing_connections
from agent.kube.client import new_api_client
from agent.reconcile_cluster import pass_lock

log = logging.getLogger(__name__)

PENDING_SECONDS = 60  # a lost message frees its key after this long; beat covers the rest
BACKOFF_MAX = 60.0


class Busy(Exception):
    """Another run of the same key holds its lock."""


def instance_key(namespace: str, configuration: str, instance: str) -> str:
    return f"instance:{namespace}/{configuration}/{instance}"


def configuration_key(namespace: str, configuration: str) -> str:
    return f"configuration:{namespace}/{configuration}"


def level_key(namespace: str) -> str:
    return f"level:{namespace}"


def backoff(retries: int) -> float:
    """Seconds before retry number ``retries`` (0-based): doubling, capped, jittered."""
    return min(BACKOFF_MAX, 0.5 * 2**retries) * random.uniform(0.5, 1.0)


# --- running one key ------------------------------------------------------------------------
_clients: dict[str, Any] = {}
_clients_guard = threading.Lock()


def api_client() -> Any:
    """One API client per kubeconfig for the whole worker process (its pool is shared)."""
    path = settings.AKRI["KUBECONFIG"]
    with _clients_guard:
        if path not in _clients:
            _clients[path] = new_api_client(path)
        return _clients[path]


def run_key(key: str, lock_url: str = "", client: Any = None) -> engine.Outcome:
    """Run the work ``key`` names under its lock; Busy when another run holds it."""
    with pass_lock(f"brokers:{key}", lock_url) as got:
        if not got:
            raise Busy(key)
        scope, _, rest = key.partition(":")
        parts = rest.split("/")
        api = engine.BrokerApi(client or api_client(), parts[0])
        if scope == "instance":
            outcome = engine.reconcile_instance(api, parts[1], parts[2])
        elif scope == "configuration":
            outcome = engine.reconcile_configuration(api, parts[1])
        else:
            outcome = engine.level_pass(api)
    if outcome.needs_configuration:
        Dispatcher().configuration(parts[0], parts[1])
    return outcome


# --- enqueueing -----------------------------------------------------------------------------
class Dispatcher:
    """Sends keys to Celery, or to the in-process runner when tasks run eagerly."""

    def __init__(self, app: Any = None, client: Any = None) -> None:
        if app is None:
            from akri_site.celery import app
        self.app = app
        self.client = client  # for runs in this process (embedded); Celery workers use settings

    def instance(self, namespace: str, configuration: str, instance: str) -> None:
        self.send(instance_key(namespace, configuration, instance))

    def configuration(self, namespace: str, configuration: str) -> None:
        self.send(configuration_key(namespace, configuration))

    def level(self, namespace: str) -> None:
        self.send(level_key(namespace))

    def send(self, key: str) -> None:
        if self.app.conf.task_always_eager:
            self.local().put(key)
            return
        try:
            if not self._claim_pending(key):
                return
            from agent.brokers import tasks

            tasks.run_brokers.apply_async(kwargs={"key": key})
        except Exception:
            # The beat's level pass repairs whatever this event would have done.
            log.exception("brokers: could not enqueue %s", key)

    def _claim_pending(self, key: str) -> bool:
        conn = _redis(str(self.app.conf.broker_url))
        return bool(conn.set(pending_name(key), "1", nx=True, ex=PENDING_SECONDS))

    def local(self) -> LocalRunner:
        return local_runner(self.client)

    def stop(self) -> None:
        """Stop the embedded runner (it starts again on the next key)."""
        global _local
        with _local_guard:
            runner, _local = _local, None
        if runner is not None:
            runner.stop()


_local: LocalRunner | None = None
_local_guard = threading.Lock()


def local_runner(client: Any = None) -> LocalRunner:
    """The process's embedded runner (one per process: serialization needs a single queue).
    ``client``: the API client its runs use (the controller's), else the settings' one."""
    global _local
    with _local_guard:
        if _local is None:
            _local = LocalRunner(run_key).start()
        if client is not None:
            _local.client = client
        return _local


_redis_clients: dict[str, Any] = {}


def _redis(url: str) -> Any:
    """One client (and connection pool) per URL for the process: a connection per key sent
    made a burst of events wait on TCP set-ups."""
    import redis

    with _clients_guard:
        if url not in _redis_clients:
            _redis_clients[url] = redis.Redis.from_url(url)
        return _redis_clients[url]


def pending_name(key: str) -> str:
    return f"akri-site:brokers:pending:{key}"


def clear_pending(redis_url: str, key: str) -> None:
    if not redis_url.startswith(("redis://", "rediss://", "unix://")):
        return
    import redis

    conn = redis.Redis.from_url(redis_url)
    try:
        conn.delete(pending_name(key))
    finally:
        conn.close()


class LocalRunner:
    """The embedded default's worker: one thread, a queue of distinct keys."""

    def __init__(self, run: Callable[..., engine.Outcome]) -> None:
        self.run = run
        self.client: Any = None
        self._queue: OrderedDict[str, None] = OrderedDict()
        self._retries: dict[str, int] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(
            target=closing_connections(self._work), name="brokers-local", daemon=True
        )
        self.busy = False

    def start(self) -> LocalRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def put(self, key: str) -> None:
        with self._cond:
            self._queue[key] = None
            self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return not self._queue and not self.busy

    def _next(self) -> str | None:
        with self._cond:
            while not self._queue and not self._stop:
                self._cond.wait()
            if self._stop:
                return None
            key, _ = self._queue.popitem(last=False)
            self.busy = True
            return key

    def _work(self) -> None:
        while (key := self._next()) is not None:
            try:
                self.run(key, client=self.client)
                self._retries.pop(key, None)
            except (engine.Retry, Busy) as exc:
                self._later(key, str(exc))
            except Exception:
                log.exception("brokers: %s failed", key)
                self._later(key, "unexpected error")
            finally:
                with self._cond:
                    self.busy = False
                close_old_connections()

    def _later(self, key: str, why: str) -> None:
        tries = self._retries.get(key, 0)
        self._retries[key] = tries + 1
        delay = backoff(tries)
        log.warning("brokers: %s: %s; again in %.1f s", key, why, delay)
        timer = threading.Timer(delay, self.put, args=(key,))
        timer.daemon = True
        with contextlib.suppress(RuntimeError):  # interpreter shutting down
            timer.start()
