"""DRA objects, queue-system objects, pods and Instance labels watched into the queue cache.

Started by the controller next to its own watches. Kinds whose API group or CRD is not served
(a cluster without ``resource.k8s.io/v1``, without KAI, Kueue or Volcano) are probed again every
``CRD_RECHECK_SECONDS``; a kind that disappears (404 on its list) drops its rows and goes back
to being probed. Every applied change marks the claims whose charge it may move, and the
``Debouncer`` hands them to the recompute once per window, so a burst of binds costs one pass.

Both threads outlive an outage of the database or the API server (``agent.retrying.Backoff``):
the probe thread tries a failed pass again, backing off, rather than dying (a CRD installed
later would never be watched); the debouncer keeps the keys of a recompute that failed to start
and tries them again, so an update is never dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone
from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent.charges.facts import AKRI, claim_key
from agent.dbthreads import closing_connections, start_thread
from agent.kube.watch import ResourceWatcher
from agent.queues import cache
from agent.queues.kinds import ALL_KINDS, DEVICE_CLASSES, RESOURCE_CLAIMS, Watched
from agent.queues.models import QueueSystem
from agent.retrying import Backoff, api_away

log = logging.getLogger(__name__)
OWNER = "queues"
Keys = set[str] | None
# A recompute that could not start is tried again after this, doubling up to the cap.
RETRY_MAX_SECONDS = 30.0
# A probe pass that failed is tried again after this, doubling up to CRD_RECHECK_SECONDS.
PROBE_RETRY_SECONDS = 0.5


class Debouncer:
    """Collects claim keys (None: everything) and calls ``fire(keys)`` once per window.

    A full recompute reads every claim and pod: a burst of relists at start-up asks for one
    per watched kind. At most one runs per ``full_every`` seconds; one asked for sooner waits
    on a timer of its own, while marked keys keep their short window.

    Keys stay pending until ``fire`` has returned. When it raises (the database away, the API
    server failing, no broker to take the task) they are put back with whatever was marked
    meanwhile and fired again after ``retry`` (a backoff); marks made during it wait for it.
    """

    def __init__(
        self,
        fire: Callable[[list[str] | None], None],
        seconds: float,
        full_every: float = 0.0,
        retry: Backoff | None = None,
    ) -> None:
        self.fire, self.seconds, self.full_every = fire, seconds, full_every
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._full = False
        self._timer: threading.Timer | None = None
        self._full_timer: threading.Timer | None = None
        self._last_full = float("-inf")
        self._retry = retry or Backoff(first=max(seconds, 0.05), cap=RETRY_MAX_SECONDS)
        self._retry_at = float("-inf")  # after a failure, no fire before this (monotonic)
        self._timers: list[threading.Timer] = []  # every timer started, for stop() to join
        self._stopped = False
        self.failures = 0  # fires that raised

    def mark(self, keys: Keys) -> None:
        with self._lock:
            if self._stopped:
                return
            if keys is None:
                wait = self._last_full + self.full_every - time.monotonic()
                if wait > 0:
                    if self._full_timer is None:
                        self._full_timer = self._start_timer(wait, self._full_due)
                    return
                self._full = True
            else:
                self._keys |= keys
            self._arm()

    def _full_due(self) -> None:
        with self._lock:
            self._full_timer = None
            self._full = True
            self._arm()

    def _arm(self) -> None:
        """Under the lock."""
        if self._timer is None and (self._full or self._keys) and not self._stopped:
            wait = max(self.seconds, self._retry_at - time.monotonic())
            self._timer = self._start_timer(wait, closing_connections(self._flush))

    def _start_timer(self, wait: float, target: Callable[[], None]) -> threading.Timer:
        """Under the lock."""
        timer = threading.Timer(wait, target)
        timer.daemon = True
        self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()
        return timer

    def flush(self) -> None:
        """Fire now whatever is pending (tests, shutdown)."""
        with self._lock:
            timers = [self._timer, self._full_timer]
            self._full = self._full or self._full_timer is not None
            self._timer = self._full_timer = None
        for timer in timers:
            if timer is not None:
                timer.cancel()
        self._flush()

    def stop(self, timeout: float = 5.0) -> None:
        """Fire what is pending one last time, then stop: no timer is left running. What that
        last try could not do is left to the next full recompute (beat's every
        ``AKRI_QUEUE_RECOMPUTE_SECONDS``, or the next controller's relists)."""
        with self._lock:
            self._stopped = True
        self.flush()
        with self._lock:
            timers, self._timers = self._timers, []
            self._timer = self._full_timer = None
        for timer in timers:
            timer.cancel()
        for timer in timers:
            if timer is not threading.current_thread():
                timer.join(timeout)

    def _flush(self) -> None:
        with self._lock:
            keys = None if self._full else sorted(self._keys)
            if self._full:
                self._last_full = time.monotonic()
            self._keys, self._full, self._timer = set(), False, None
        if keys is not None and not keys:
            return
        try:
            self.fire(keys)
        except Exception as exc:
            self._put_back(keys, exc)
        else:
            with self._lock:
                self._retry.succeeded()
                self._retry_at = float("-inf")
        finally:
            close_old_connections()

    def _put_back(self, keys: list[str] | None, exc: Exception) -> None:
        """``fire(keys)`` raised: the keys are pending again, to be fired after the backoff."""
        with self._lock:
            if keys is None:
                self._full = True
            else:
                self._keys.update(keys)
            self.failures += 1
            delay = self._retry.failed()
            self._retry_at = time.monotonic() + delay
            if self._timer is not None:
                # Armed by a mark while fire ran: the retry waits out the backoff instead.
                self._timer.cancel()
                self._timer = None
            self._arm()
            stopped = self._stopped
        what = "every claim" if keys is None else f"{len(keys)} claim(s)"
        passing = isinstance(exc, DatabaseError) or api_away(exc)
        if isinstance(exc, DatabaseError):
            connections.close_all()  # a connection the error broke must not be reused
        if stopped:
            log.warning(
                "queue charges: recompute of %s failed while stopping (%s); "
                "left to the next full recompute",
                what,
                exc,
                exc_info=not passing,
            )
        else:
            log.warning(
                "queue charges: recompute of %s failed (%s); again in %.1f s",
                what,
                exc,
                delay,
                exc_info=not passing,
            )


class QueueWatch:
    """The queue-charge watches. ``start()``/``stop()``; ``pod_event``/``pod_relist`` and
    ``instance_changed`` are fed by the controller's own pod watch and cache sync."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        fire: Callable[[list[str] | None], None] | None = None,
        timeout_seconds: int | None = None,
    ) -> None:
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        conf = settings.AKRI_QUEUES
        self.recheck = float(conf["CRD_RECHECK_SECONDS"])
        self._fire = fire or enqueue_recompute
        self.debouncer = Debouncer(
            self._flush_then_fire,
            float(conf["DEBOUNCE_SECONDS"]),
            full_every=float(conf["FULL_MIN_SECONDS"]),
        )
        # Instance labels seen since the last flush: written in bulk off the cache's applier
        # thread (a relist of 40,000 Instances must not mean 40,000 row writes inline).
        self._labels: dict[tuple[str, str], dict[str, str] | None] = {}
        self._listed_pods: cache.PodRows = {}  # the controller's pod relist so far (columns)
        self._labels_lock = threading.Lock()
        self.timeout_seconds = timeout_seconds
        self._watchers: dict[str, ResourceWatcher] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._wake = threading.Event()  # the probe thread's: stop, or a kind to forget
        self._probed = threading.Event()
        # Kinds whose CRD went away, for the probe thread to drop from the cache: it retries
        # database errors, and it probes a kind again only once its old rows are gone.
        self._forget: dict[str, Watched] = {}

    def start(self) -> QueueWatch:
        self._threads.append(start_thread(self._supervise, "queues-probe"))
        return self

    def stop(self) -> None:
        # Under the lock that _start_watcher takes: a probe that finds a CRD while we stop
        # either registers its watcher before this (and it is stopped below) or starts none.
        with self._lock:
            self._stopping.set()
            watchers = list(self._watchers.values())
        self._wake.set()
        for watcher in watchers:
            watcher.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self.debouncer.stop()
        from agent.queues.live import cancel_pending

        cancel_pending()

    def wait_probed(self, timeout: float = 10.0) -> bool:
        """Until every kind has been probed once (tests that record the calls made)."""
        return self._probed.wait(timeout)

    def present(self, kind: str) -> bool:
        with self._lock:
            return kind in self._watchers

    def wait_synced(self, kinds: tuple[str, ...], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                watchers = [self._watchers.get(k) for k in kinds]
            if all(w is not None and w.synced.is_set() for w in watchers):
                return True
            self._stopping.wait(0.02)
        return False

    # --- feeds from the controller ----------------------------------------------------------
    def pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.debouncer.mark(cache.apply_pod(kind, obj))

    def pod_relist(self, items: list[dict[str, Any]]) -> None:
        self.debouncer.mark(cache.replace_pods(items))

    def pod_page(self, items: list[dict[str, Any]]) -> None:
        """A page of the controller's pod relist: its rows, kept until ``pod_relist_end``."""
        self._listed_pods.update(cache.pod_rows(items))

    def pod_relist_end(self) -> None:
        rows, self._listed_pods = self._listed_pods, {}
        self.debouncer.mark(cache.replace_pod_rows(rows))

    def instance_changed(self, namespace: str, name: str, obj: dict[str, Any] | None) -> None:
        if not name:
            self.debouncer.mark(None)  # a relist: every Instance may have changed
            return
        labels = None if obj is None else ((obj.get("metadata") or {}).get("labels") or {})
        with self._labels_lock:
            self._labels[(namespace, name)] = labels
        self.debouncer.mark({claim_key(AKRI, namespace, name)})

    def _flush_then_fire(self, keys: list[str] | None) -> None:
        with self._labels_lock:
            labels, self._labels = self._labels, {}
        if labels:
            try:
                cache.store_instance_labels(labels)
            except Exception:
                # Kept for the retry (the debouncer keeps the keys); what came in meanwhile
                # is newer and wins.
                with self._labels_lock:
                    self._labels = {**labels, **self._labels}
                raise
        self._fire(keys)

    # --- probing and watching ---------------------------------------------------------------
    def _supervise(self) -> None:
        """Probe passes every ``recheck`` seconds until stopped. A pass that fails (the database
        away, the API server not answering a probe) is tried again after a backoff that starts
        short and grows to ``recheck``; nothing but ``stop()`` ends this thread."""
        backoff = Backoff(first=min(PROBE_RETRY_SECONDS, self.recheck), cap=self.recheck)
        while not self._stopping.is_set():
            try:
                failed = self._probe_pass()
            except DatabaseError as exc:
                failed = f"database: {exc}"
                connections.close_all()  # a connection the error broke must not be reused
            except Exception as exc:
                log.exception("queues: probe pass failed")
                failed = repr(exc)
            else:
                self._probed.set()
            finally:
                close_old_connections()
            if failed:
                delay = backoff.failed()
                log.warning("queues: probe pass failed (%s); again in %.1f s", failed, delay)
            else:
                backoff.succeeded()
                delay = self.recheck
            self._wake.wait(delay)
            self._wake.clear()

    def _probe_pass(self) -> str:
        """Drop the rows of kinds gone, then probe every kind not watched; what failed ("" when
        all went through). Database errors propagate: the whole pass is tried again."""
        with self._lock:
            gone = list(self._forget.values())
        for watched in gone:
            cache.forget_kind(watched)
            self._record(watched, present=False)
            with self._lock:
                self._forget.pop(watched.kind, None)
            self.debouncer.mark(None)
        failed = []
        for watched in ALL_KINDS:
            with self._lock:
                waiting = watched.kind in self._watchers or watched.kind in self._forget
            if not waiting and not self._stopping.is_set() and not self._probe(watched):
                failed.append(watched.plural)
        return f"API server: {', '.join(failed)}" if failed else ""

    def _probe(self, watched: Watched) -> bool:
        """Is the kind served? Its watcher started if so; False when the API server did not
        say (the next pass asks again)."""
        try:
            self.custom.list_cluster_custom_object(
                watched.group, watched.version, watched.plural, limit=1
            )
        except ApiException as exc:
            if exc.status == 404:
                self._record(watched, present=False)
                return True
            log.warning("queues: probing %s failed (%s); will retry", watched.plural, exc.status)
            return False
        except (HTTPError, OSError) as exc:
            log.warning("queues: probing %s failed (%s); will retry", watched.plural, exc)
            return False
        self._record(watched, present=True)
        self._start_watcher(watched)
        return True

    def _record(self, watched: Watched, *, present: bool) -> None:
        QueueSystem.objects.update_or_create(
            kind=watched.kind, defaults={"present": present, "checked_at": timezone.now()}
        )

    def _start_watcher(self, watched: Watched) -> None:
        watcher = ResourceWatcher(
            owner=OWNER,
            kind=watched.kind,
            list_func=self._guarded(watched),
            list_args=(watched.group, watched.version, watched.plural),
            on_event=lambda kind, obj: self.debouncer.mark(_apply(watched, kind, obj)),
            on_relist=lambda items: self.debouncer.mark(_replace(watched, items)),
            api_client=self.api_client,
            timeout_seconds=self.timeout_seconds,
            # A kind that comes and goes with its CRD relists when it comes back.
            persist=False,
        )
        with self._lock:
            if self._stopping.is_set():
                return  # a watcher started now would outlive stop() and watch on for ever
            self._watchers[watched.kind] = watcher
            self._threads.append(start_thread(watcher.run, f"queues-{watched.kind}"))

    def _guarded(self, watched: Watched) -> Callable[..., Any]:
        def list_func(*args: Any, **kwargs: Any) -> Any:
            try:
                return self.custom.list_cluster_custom_object(*args, **kwargs)
            except ApiException as exc:
                if exc.status == 404:
                    self._gone(watched)
                raise

        list_func.__doc__ = self.custom.list_cluster_custom_object.__doc__
        return list_func

    def _gone(self, watched: Watched) -> None:
        """On the kind's own watcher thread, which ends: the probe thread drops its rows."""
        log.info("queues: %s is no longer served; probing again later", watched.plural)
        with self._lock:
            watcher = self._watchers.pop(watched.kind, None)
            self._forget[watched.kind] = watched
        if watcher is not None:
            watcher.stop()
        self._wake.set()


def _apply(watched: Watched, kind: str, obj: dict[str, Any]) -> Keys:
    if watched is RESOURCE_CLAIMS:
        return cache.apply_claim(kind, obj)
    if watched is DEVICE_CLASSES:
        return cache.apply_device_class(kind, obj)
    return cache.apply_queue_object(watched, kind, obj)


def _replace(watched: Watched, items: list[dict[str, Any]]) -> Keys:
    if watched is RESOURCE_CLAIMS:
        return cache.replace_claims(items)
    if watched is DEVICE_CLASSES:
        return cache.replace_device_classes(items)
    return cache.replace_queue_objects(watched, items)


def enqueue_recompute(keys: list[str] | None) -> None:
    """Hand the marked claims to the Celery task (in-process when there is no broker)."""
    from agent.queues import tasks

    tasks.recompute_charges.delay(keys=keys, trigger="event")
