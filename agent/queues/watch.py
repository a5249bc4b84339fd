"""DRA objects, queue-system objects, pods and Instance labels watched into the queue cache.

Started by the controller next to its own watches. Kinds whose API group or CRD is not served
(a cluster without ``resource.k8s.io/v1``, without KAI, Kueue or Volcano) are probed again every
``CRD_RECHECK_SECONDS``; a kind that disappears (404 on its list) drops its rows and goes back
to being probed. Every applied change marks the claims whose charge it may move, and the
``Debouncer`` hands them to the recompute once per window, so a burst of binds costs one pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import close_old_connections
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

log = logging.getLogger(__name__)
OWNER = "queues"
Keys = set[str] | None


class Debouncer:
    """Collects claim keys (None: everything) and calls ``fire(keys)`` once per window.

    A full recompute reads every claim and pod: a burst of relists at start-up asks for one
    per watched kind. At most one runs per ``full_every`` seconds; one asked for sooner waits
    on a timer of its own, while marked keys keep their short window.
    """

    def __init__(
        self, fire: Callable[[list[str] | None], None], seconds: float, full_every: float = 0.0
    ) -> None:
        self.fire, self.seconds, self.full_every = fire, seconds, full_every
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._full = False
        self._timer: threading.Timer | None = None
        self._full_timer: threading.Timer | None = None
        self._last_full = float("-inf")

    def mark(self, keys: Keys) -> None:
        with self._lock:
            if keys is None:
                wait = self._last_full + self.full_every - time.monotonic()
                if wait > 0:
                    if self._full_timer is None:
                        self._full_timer = threading.Timer(wait, self._full_due)
                        self._full_timer.daemon = True
                        self._full_timer.start()
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
        if self._timer is None and (self._full or self._keys):
            self._timer = threading.Timer(self.seconds, closing_connections(self._flush))
            self._timer.daemon = True
            self._timer.start()

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

    def _flush(self) -> None:
        with self._lock:
            keys = None if self._full else sorted(self._keys)
            if self._full:
                self._last_full = time.monotonic()
            self._keys, self._full, self._timer = set(), False, None
        if keys is None or keys:
            try:
                self.fire(keys)
            except Exception:
                log.exception("queue charges: recompute could not be started")
            finally:
                close_old_connections()


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
        self._listed_pods: list[Any] = []  # the controller's pod relist so far (unsaved rows)
        self._labels_lock = threading.Lock()
        self.timeout_seconds = timeout_seconds
        self._watchers: dict[str, ResourceWatcher] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._probed = threading.Event()

    def start(self) -> QueueWatch:
        self._threads.append(start_thread(self._supervise, "queues-probe"))
        return self

    def stop(self) -> None:
        # Under the lock that _start_watcher takes: a probe that finds a CRD while we stop
        # either registers its watcher before this (and it is stopped below) or starts none.
        with self._lock:
            self._stopping.set()
            watchers = list(self._watchers.values())
        for watcher in watchers:
            watcher.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self.debouncer.flush()
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
        self._listed_pods.extend(cache.pod_rows(items))

    def pod_relist_end(self) -> None:
        rows, self._listed_pods = self._listed_pods, []
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
            cache.store_instance_labels(labels)
        self._fire(keys)

    # --- probing and watching ---------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._stopping.is_set():
            for watched in ALL_KINDS:
                if not self.present(watched.kind) and not self._stopping.is_set():
                    self._probe(watched)
            self._probed.set()
            close_old_connections()
            self._stopping.wait(self.recheck)

    def _probe(self, watched: Watched) -> None:
        try:
            self.custom.list_cluster_custom_object(
                watched.group, watched.version, watched.plural, limit=1
            )
        except ApiException as exc:
            if exc.status == 404:
                self._record(watched, present=False)
            else:
                log.warning(
                    "queues: probing %s failed (%s); will retry", watched.plural, exc.status
                )
            return
        except (HTTPError, OSError) as exc:
            log.warning("queues: probing %s failed (%s); will retry", watched.plural, exc)
            return
        self._record(watched, present=True)
        self._start_watcher(watched)

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
        log.info("queues: %s is no longer served; probing again later", watched.plural)
        with self._lock:
            watcher = self._watchers.pop(watched.kind, None)
        if watcher is not None:
            watcher.stop()
        cache.forget_kind(watched)
        self._record(watched, present=False)
        self.debouncer.mark(None)


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
