"""List-then-watch loops that keep the ORM cache converging on the API server.

One ``ResourceWatcher`` per kind: it resumes from the last resourceVersion it stored, relists
when the API server answers 410 Gone (and reconciles against the relist, because deletions in
the gap were never seen), and loops on clean stream ends, which real servers produce every
30-60 minutes. Handlers are idempotent, so replaying an event is harmless.

``CacheSync`` wires watchers for Configurations and Instances to the cache and lets agents
and the controller subscribe to applied changes. Exactly one ``CacheSync`` per database and
namespace should write the cache; agents in one process share it (``shared_sync``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    transaction,
)
from django.utils import timezone
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent import metrics
from agent.dbthreads import start_thread
from agent.kube import cache
from agent.kube.client import AkriApi
from agent.kube.foreground import FOREGROUND
from agent.models import SyncState

log = logging.getLogger(__name__)

ListFunc = Callable[..., Any]
STORE_RV_EVERY = 1.0  # seconds between writes of a watcher's resourceVersion
LIST_PAGE = 500  # objects per page of a relist
# An announced write's change arrives within seconds; one this old came in some other way.
EXPECTED_SECONDS = 60.0
EXPECTED_MAX = 1024  # announcements kept before expired ones are looked for
# A cache write that met a database error ("database is locked", a PostgreSQL restart) is
# tried again after these delays, doubling: an update dropped would leave the cache wrong
# (a freed slot shown held) until the next relist.
APPLY_RETRY_FIRST = 0.05
APPLY_RETRY_MAX = 5.0
# Watch events and direct answers waiting in the queue are applied together, in one
# transaction of a few statements (``cache.InstanceBatch``): a commit per change capped the
# controller at 160-200 changes/s on PostgreSQL. A batch ends at this many items, which bounds
# how long it holds the transaction, or when an Allocate is in flight (SQLite has one writer:
# a long batch would keep a claim's binding out). Not at a time limit: the batch's rows are
# read before its changes are applied, and under load a limit met after a few changes had the
# rest read again and again (four reads for each change applied, at load 30).
APPLY_BATCH = 256
RELIST_PAGES_AHEAD = 2
Event = tuple[str, dict[str, Any]]
BATCHED = ("event", "direct")  # queue items the applier applies in batches


class ResourceWatcher:
    """Lists, then watches, one kind of object; feeds events to ``on_event`` and relists to
    ``on_relist``. Run ``run()`` in a thread; ``stop()`` ends it promptly."""

    def __init__(
        self,
        *,
        owner: str,
        kind: str,
        list_func: ListFunc,
        list_args: tuple = (),
        list_kwargs: dict[str, Any] | None = None,
        on_event: Callable[[str, dict[str, Any]], None],
        on_relist: Callable[[list[dict[str, Any]]], None],
        api_client: client.ApiClient,
        to_dict: bool = False,
        timeout_seconds: int | None = None,
        persist: bool = True,
        on_page: Callable[[list[dict[str, Any]]], None] | None = None,
        on_relist_end: Callable[[set[str], str], None] | None = None,
    ) -> None:
        """``on_page`` and ``on_relist_end`` together replace ``on_relist`` for kinds too
        large to hold in one list: each page goes to ``on_page`` as it arrives, then
        ``on_relist_end`` gets the names listed and the list's resourceVersion (what is not
        among them and not newer is gone)."""
        self.owner, self.kind = owner, kind
        self.on_page, self.on_relist_end = on_page, on_relist_end
        # Whether the handler, not the end of the list, says when the relist is in the cache
        # (``mark_listed``): a handler that queues pages applies them after the watch is done.
        self.listed_by_handler = False
        self.list_func, self.list_args = list_func, list_args
        self.list_kwargs = list_kwargs or {}
        self.on_event, self.on_relist = on_event, on_relist
        self.api_client = api_client
        # Handlers get plain dicts either way. With ``to_dict`` they are the JSON as sent: no
        # typed models (pods, nodes) and no second parse (the client decodes each custom
        # object event twice), which is most of a watch thread's cost at a thousand nodes.
        self.to_dict = to_dict
        # Streams end every so often (the server's own cap, or ours); each end records progress.
        self.timeout_seconds = timeout_seconds or int(settings.AKRI["WATCH_TIMEOUT_SECONDS"])
        self.persist = persist
        self.resource_version = ""
        self.synced = threading.Event()
        self.relists = 0
        self._stopping = threading.Event()
        self._relist_wanted = threading.Event()
        self._watch: watch.Watch | None = None
        self._stored_at = 0.0

    # --- lifecycle ------------------------------------------------------------------------
    def run(self) -> None:
        if self.persist:
            self.resource_version = self._stored_rv()
        failures = 0
        while not self._stopping.is_set():
            try:
                if not self.resource_version or self._relist_wanted.is_set():
                    self._relist_wanted.clear()
                    self.relist()
                self.watch_once()
                failures = 0
            except ApiException as exc:
                if exc.status == 410:
                    log.info(
                        "%s/%s: resourceVersion %s expired; relisting",
                        self.owner,
                        self.kind,
                        self.resource_version,
                    )
                    self.resource_version = ""
                    continue
                failures += 1
                log.warning(
                    "%s/%s watch failed (%s %s); retrying",
                    self.owner,
                    self.kind,
                    exc.status,
                    exc.reason,
                )
            except (HTTPError, OSError, ValueError) as exc:
                if self._stopping.is_set():
                    break
                failures += 1
                log.warning(
                    "%s/%s watch connection failed (%s); retrying", self.owner, self.kind, exc
                )
            except Exception:
                if self._stopping.is_set():
                    break
                failures += 1
                log.exception("%s/%s watch handler failed; retrying", self.owner, self.kind)
                # A database error may have broken this thread's connection: drop it if so,
                # the replayed events get a fresh one.
                close_old_connections()
            if failures:
                self._stopping.wait(min(5.0, 0.05 * 2**failures) * random.uniform(0.5, 1.0))
        close_old_connections()

    def stop(self) -> None:
        self._stopping.set()
        self._end_stream()

    def relist_soon(self) -> None:
        """List afresh now (the cache lost track of some change): the stream ends and the
        loop relists, which replaces what the handlers built."""
        self._relist_wanted.set()
        self._end_stream()

    def _end_stream(self) -> None:
        current = self._watch
        if current is not None:
            current.stop()
            resp = getattr(current, "_resp", None)
            if resp is not None:
                # Unblock the read in the watcher thread now rather than at the next event;
                # best effort on a socket that may already be torn down.
                with contextlib.suppress(Exception):
                    resp.shutdown()

    # --- steps ----------------------------------------------------------------------------
    def relist(self) -> None:
        # In pages: one unpaginated list of a large cluster holds every object twice over
        # (the typed models and their dicts) and ties up the API server for seconds. Pages
        # after the first continue the first one's snapshot; an expired token is a 410,
        # which relists from the start.
        items: list[dict[str, Any]] = []
        names: set[str] = set()
        token = ""
        self._mark_listing()
        while True:
            kwargs = dict(self.list_kwargs, limit=LIST_PAGE)
            if token:
                kwargs["_continue"] = token
            if self.to_dict:
                # The JSON as sent: typed models for 10,000 pods cost seconds and hundreds
                # of megabytes, only to be turned back into these dicts.
                response = self.list_func(*self.list_args, _preload_content=False, **kwargs)
                answer = json.loads(response.data)
            else:
                answer = self.list_func(*self.list_args, **kwargs)
            page = answer.get("items") or []
            if self.on_page is not None:
                names.update(obj["metadata"]["name"] for obj in page)
                self.on_page(page)
            else:
                items.extend(page)
            meta = answer.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                break
        if self.on_relist_end is not None:
            self.on_relist_end(names, meta.get("resourceVersion", ""))
        else:
            self.on_relist(items)
        self.resource_version = meta.get("resourceVersion", "")
        self.relists += 1
        self._store_rv(relisted=True)
        self.synced.set()

    def watch_once(self) -> None:
        if self._stopping.is_set() or self._relist_wanted.is_set():
            return  # stopped (or told to relist) while listing: open no stream
        current = self._watch = _Watch(raw=self.to_dict)

        @functools.wraps(self.list_func)  # the official Watch reads its signature and doc
        def open_stream(*args: Any, **kwargs: Any) -> Any:
            # A stop() between the check above and this answer found no response to shut
            # down, and Watch.stream() clears the stop flag it set: the stream would block
            # until its first event or timeoutSeconds (55 s), outliving stop()'s join. So the
            # response is published first, then the flags are read: whichever of the two
            # threads comes second shuts it down.
            resp = self.list_func(*args, **kwargs)
            current._resp = resp
            if self._stopping.is_set() or self._relist_wanted.is_set():
                with contextlib.suppress(Exception):
                    resp.shutdown()
            return resp

        try:
            stream = current.stream(
                open_stream,
                *self.list_args,
                resource_version=self.resource_version,
                timeout_seconds=self.timeout_seconds,
                allow_watch_bookmarks=True,
                **self.list_kwargs,
            )
            self.synced.set()
            for event in stream:
                if self._stopping.is_set() or self._relist_wanted.is_set():
                    break
                kind = event["type"]
                obj = event["raw_object"] if self.to_dict else event["object"]
                rv = (obj.get("metadata") or {}).get("resourceVersion", "")
                if kind != "BOOKMARK":
                    self.on_event(kind, obj)
                if rv:
                    self.resource_version = rv
                    self._store_rv_throttled()
        finally:
            self._watch = None
            self._store_rv()

    def _mark_listing(self) -> None:
        if self.persist:
            SyncState.objects.update_or_create(
                owner=self.owner, kind=self.kind, defaults={"listing_since": timezone.now()}
            )

    def _store_rv_throttled(self) -> None:
        # One row write per event would slow the stream down; resuming from a version a
        # second old only replays a few events, and handlers are idempotent.
        now = time.monotonic()
        if now - self._stored_at >= STORE_RV_EVERY:
            self._store_rv()

    def _stored_rv(self) -> str:
        row = SyncState.objects.filter(owner=self.owner, kind=self.kind).first()
        return row.resource_version if row else ""

    def _store_rv(self, relisted: bool = False) -> None:
        if not self.persist or not self.resource_version:
            return
        self._stored_at = time.monotonic()
        defaults: dict[str, Any] = {
            "resource_version": self.resource_version,
            "synced_at": timezone.now(),
        }
        row, created = SyncState.objects.update_or_create(
            owner=self.owner, kind=self.kind, defaults=defaults
        )
        if relisted:
            done = {} if self.listed_by_handler else {"listing_since": None}
            SyncState.objects.filter(pk=row.pk).update(relists=row.relists + 1, **done)

    def mark_listed(self) -> None:
        """The relist's last page is in the cache: no longer syncing. Called by the handler
        when ``listed_by_handler`` (it applies pages after the watch has listed them)."""
        if self.persist:
            SyncState.objects.filter(owner=self.owner, kind=self.kind).update(listing_since=None)


class _Watch(watch.Watch):
    """Decodes each event only once no Allocate is in flight (``foreground``): the echo of an
    Allocate's own claim arrives while its answer is on the way out, and decoding it (the
    official client parses every event twice) would take the interpreter from the threads
    carrying that answer."""

    def __init__(self, raw: bool = False) -> None:
        super().__init__()
        self._raw = raw

    def get_return_type(self, func: Any) -> Any:
        # Raw watchers read only ``raw_object``: no typed model is built for each event.
        return None if self._raw else super().get_return_type(func)

    def unmarshal_event(self, data: str, return_type: Any) -> Any:
        FOREGROUND.wait_idle()
        return super().unmarshal_event(data, return_type)


Subscriber = Callable[[str, str, dict[str, Any] | None], None]


class CacheSync:
    """Configurations and Instances of one namespace, watched into the cache.

    Subscribers are called as ``fn(kind, name, obj)`` after the cache applied a change;
    ``obj`` is None when the object was deleted, and ``name`` is "" after a relist (re-read
    everything). ``kind`` is "configuration" or "instance".

    Instance events and the answers to our own writes (``submit_direct``) go through one
    queue and one applier thread, in order. That is what makes the cache exact: a direct
    answer the watch has already passed is dropped, and watch events older than a direct
    answer are skipped until its echo (see ``cache.apply_instance``). It also keeps the
    cache write off the claim's path: a claim returns once the API server said yes.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        owner: str,
        *,
        timeout_seconds: int | None = None,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.owner = owner
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.apply_failures = 0  # cache writes that met an error (each retried or relisted)
        self.batch_fallbacks = 0  # batches applied one by one after failing as one
        self._threads: list[threading.Thread] = []
        self._queue: queue.Queue[tuple[str, Any, Any] | None] = queue.Queue()
        # Items taken from the queue and not applied yet (the rest of a batch cut short).
        self._carry: deque[tuple[str, Any, Any] | None] = deque()
        # While the applier holds a batch's transaction, its notifications wait here: a
        # subscriber reading the cache must see the rows it is told about.
        self._held_notes: list[tuple[str, str, dict[str, Any] | None]] | None = None
        self._applier: threading.Thread | None = None
        # Relist pages queued and not applied yet, at most RELIST_PAGES_AHEAD: the watch
        # waits for the applier rather than holding the whole list in memory.
        self._pages_ahead = threading.Semaphore(RELIST_PAGES_AHEAD)
        # resourceVersions the watch delivered lately, per Instance (bounded).
        # The latest resourceVersion the watch delivered per Instance: one string each (a
        # thousand-node cluster has tens of thousands of Instances).
        self._watched: dict[str, str] = {}
        self._watched_grew = threading.Condition()  # for wait_watched
        # The last version per Instance that submit_direct applied and announced.
        self._direct_rv: dict[str, str] = {}
        # Attributions of our writes in flight, oldest first per (instance, slot, value), with
        # when each was announced: whichever path applies the change first (the watch or the
        # direct answer) takes the oldest. A slot claimed, released and claimed again faster
        # than the cache follows makes two writes of one value; each keeps its own.
        self._expected: dict[tuple[str, str, str], deque[tuple[Any, float]]] = {}
        self._expected_lock = threading.Lock()
        # When expired announcements are next looked for: not at every announcement while more
        # than EXPECTED_MAX are in flight, which a release storm keeps for seconds (5,000 slots
        # of 50 agents), each scan of all of them under the lock every announcement waits on.
        self._expiry_due = 0.0
        # Announcements the applier took in its current attempt, put back if the attempt
        # rolls back: a retried change keeps its cause instead of turning "unknown".
        self._taken: list[tuple[tuple[str, str, str], Any, float]] = []
        akri = AkriApi(api_client, namespace)
        self.configurations = ResourceWatcher(
            owner=owner,
            kind=f"{namespace}/configurations",
            list_func=akri.list_configurations,
            on_event=self._configuration_event,
            on_relist=self._configuration_relist,
            api_client=api_client,
            to_dict=True,
            timeout_seconds=timeout_seconds,
        )
        self.instances = ResourceWatcher(
            owner=owner,
            kind=f"{namespace}/instances",
            list_func=akri.list_instances,
            on_event=lambda kind, obj: self._queue.put(("event", kind, obj)),
            on_relist=lambda items: self._queue.put(("relist", items, None)),
            on_page=self._queue_page,
            on_relist_end=lambda names, rv: self._queue.put(("relist-end", names, rv)),
            api_client=api_client,
            to_dict=True,
            timeout_seconds=timeout_seconds,
        )
        self.instances.listed_by_handler = True  # its pages are applied later, in order

    def subscribe(self, fn: Subscriber) -> None:
        with self._lock:
            self._subscribers.append(fn)

    def unsubscribe(self, fn: Subscriber) -> None:
        with self._lock:
            if fn in self._subscribers:
                self._subscribers.remove(fn)

    def start(self) -> CacheSync:
        self._applier = start_thread(self._apply_loop, "sync-apply")
        self._threads.append(self._applier)
        for watcher in (self.configurations, self.instances):
            self._threads.append(start_thread(watcher.run, f"sync-{watcher.kind}"))
        return self

    def wait_synced(self, timeout: float = 10.0) -> bool:
        synced = self.configurations.synced.wait(timeout) and self.instances.synced.wait(timeout)
        return synced and self.drain(timeout)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is in the cache."""
        done = threading.Event()
        self._queue.put(("mark", done, None))
        return done.wait(timeout)

    def backlog(self) -> int:
        """Changes queued for the cache and not applied yet (background work defers to them)."""
        return self._queue.qsize() + len(self._carry)

    def wait_watched(self, name: str, rv: str, timeout: float = 10.0) -> bool:
        """Wait until the watch has brought version ``rv`` (or a newer one) of Instance
        ``name`` and the applier is done with it: the echo of a write has passed. For
        benchmarks and tests that must not time the tail of an earlier write."""
        deadline = time.monotonic() + timeout
        if rv:
            with self._watched_grew:
                while not self._has_watched(name, rv):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._watched_grew.wait(remaining)
        return self.drain(max(0.0, deadline - time.monotonic()))

    def _has_watched(self, name: str, rv: str) -> bool:
        return cache.not_newer(rv, self._watched.get(name, ""))

    def stop(self) -> None:
        self._stopping.set()
        self.configurations.stop()
        self.instances.stop()
        self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=5)

    def applied_directly(self, obj: dict[str, Any]) -> None:
        """Tell subscribers now about an object whose cache rows the caller wrote itself."""
        self._notify("instance", obj["metadata"]["name"], obj)

    def expect(self, instance: str, key: str, value: str, attribution: Any) -> None:
        """A write of ``value`` to ``key`` is about to go out: attribute it when it arrives."""
        now = time.monotonic()
        with self._expected_lock:
            if len(self._expected) > EXPECTED_MAX and now >= self._expiry_due:
                self._drop_expired(now)
                self._expiry_due = now + 1.0
            self._expected.setdefault((instance, key, value), deque()).append((attribution, now))

    def forget(self, instance: str, key: str, value: str) -> None:
        """The write announced with ``expect`` did not happen (the newest announcement of
        that change is the caller's own)."""
        with self._expected_lock:
            pending = self._expected.get((instance, key, value))
            if pending:
                pending.pop()
                if not pending:
                    del self._expected[(instance, key, value)]

    def _take_expected(self, instance: str, key: str, value: str) -> Any:
        """The oldest live attribution announced for this change, taken (used once)."""
        now = time.monotonic()
        with self._expected_lock:
            pending = self._expected.get((instance, key, value))
            found = None
            while pending and found is None:
                attribution, at = pending.popleft()
                if now - at < EXPECTED_SECONDS:
                    found = attribution
                    if threading.current_thread() is self._applier:
                        self._taken.append(((instance, key, value), attribution, at))
            if pending is not None and not pending:
                del self._expected[(instance, key, value)]
        return found

    def _put_back_taken(self) -> None:
        """The attempt that took these announcements rolled back: they are due again."""
        with self._expected_lock:
            for change, attribution, at in reversed(self._taken):
                self._expected.setdefault(change, deque()).appendleft((attribution, at))
        self._taken.clear()

    def _drop_expired(self, now: float) -> None:
        """Under the lock. Announcements whose change came in some other way (a relist)."""
        for change, pending in list(self._expected.items()):
            while pending and now - pending[0][1] >= EXPECTED_SECONDS:
                pending.popleft()
            if not pending:
                del self._expected[change]

    def _queue_page(self, page: list[dict[str, Any]]) -> None:
        """The watch thread: one page of a relist, once the applier is near enough."""
        while not self._pages_ahead.acquire(timeout=0.5):
            if self._stopping.is_set():
                raise InterruptedError("sync stopping")
        self._queue.put(("relist-page", page, None))

    def submit_direct(self, obj: dict[str, Any], attributions: dict[str, Any]) -> None:
        """Our own write's answer: into the cache in order with the watch, off the caller's path."""
        self._queue.put(("direct", obj, attributions))

    # --- the applier ----------------------------------------------------------------------
    def _apply_loop(self) -> None:
        while True:
            item = self._carry.popleft() if self._carry else self._dequeue(block=True)
            if item is None:
                break
            # Cache rows and subscribers' work (health updates, the reconciler's checks) can
            # wait for an Allocate's answer to leave; the order of the queue stays as it is.
            FOREGROUND.wait_idle()
            if item[0] in BATCHED:
                batch = self._take_batch(item)
                self._resolve_runs(batch)
                self._apply_batch(batch)
            else:
                self._resolve_runs([item])
                self._apply_until_done(item)
        close_old_connections()

    def _resolve_runs(self, items: list[tuple[str, Any, Any]]) -> None:
        """The run rows the items' events will name (``cache.RunSource``), written before
        their transaction: our own answers' attributions, and those announced for the watch."""
        named = [a for what, _, second in items if what == "direct" for a in second.values()]
        with self._expected_lock:
            named += [a for pending in self._expected.values() for a, _ in pending]
        try:
            cache.resolve_runs(named)
        except DatabaseError:  # written inside the transaction instead, at the event
            log.warning("%s: writing run rows ahead failed", self.owner, exc_info=True)
            connections.close_all()

    def _dequeue(self, block: bool) -> tuple[str, Any, Any] | None:
        item = self._queue.get(block)
        if item is not None and item[0] == "relist-page":
            self._pages_ahead.release()  # off the queue: the watch may list the next page
        return item

    def _take_batch(self, first: tuple[str, Any, Any]) -> list[tuple[str, Any, Any]]:
        """``first`` and the watch events and direct answers queued right behind it."""
        batch = [first]
        while len(batch) < APPLY_BATCH:
            if self._carry:
                item = self._carry.popleft()
            else:
                try:
                    item = self._dequeue(block=False)
                except queue.Empty:
                    break
            if item is None or item[0] not in BATCHED:
                self._carry.appendleft(item)  # applied after the batch, in order
                break
            batch.append(item)
        return batch

    def _apply_batch(self, batch: list[tuple[str, Any, Any]]) -> None:
        """Apply a batch in one transaction, then tell subscribers. A batch cut short (an
        Allocate in flight) leaves the rest for the next one, first in line. A database
        error retries the batch as ``_apply_until_done`` does one item; any other error
        rolls the batch back and applies its items one by one, so only the bad one is
        left to a relist."""
        if len(batch) == 1:
            self._apply_until_done(batch[0])
            return
        delay = APPLY_RETRY_FIRST
        while True:
            self._held_notes = []
            self._taken.clear()
            try:
                with transaction.atomic():
                    done = self._apply_some(batch)
                notes, self._held_notes = self._held_notes, None
                break
            except (OperationalError, InterfaceError) as exc:
                self._held_notes = None
                self._put_back_taken()
                self.apply_failures += 1
                log.warning(
                    "%s: applying %d changes to the cache failed (%s); retrying in %.2fs",
                    self.owner,
                    len(batch),
                    exc,
                    delay,
                )
                connections.close_all()
                if self._stopping.wait(delay):
                    return
                delay = min(APPLY_RETRY_MAX, delay * 2)
            except Exception:
                # One change the batch could not take (a row the database refuses, a fault in
                # its handler): the others must not wait on it, so each goes on its own, and
                # the one at fault is relisted there. Said out loud: a fallback taken every
                # time is a bug, and it costs a transaction per change.
                self._held_notes = None
                self._put_back_taken()
                self.batch_fallbacks += 1
                metrics.CACHE_BATCH_FALLBACKS.labels(self.owner).inc()
                log.exception(
                    "%s: a batch of %d changes failed as one transaction; applying them one by one",
                    self.owner,
                    len(batch),
                )
                for item in batch:
                    self._apply_until_done(item)
                return
        self._carry.extendleft(reversed(batch[done:]))
        for note in notes:
            self._notify(*note)

    def _apply_some(self, batch: list[tuple[str, Any, Any]]) -> int:
        """Inside the batch's transaction: apply items until an Allocate waits; how many were
        applied (at least one). The rows are read, changed and written for the whole batch
        at once (``cache.InstanceBatch``)."""
        writes = cache.InstanceBatch(self._names(batch))
        done = 0
        for what, first, second in batch:
            if what == "event":
                self._instance_event(first, second, writes)
            else:
                self._direct(first, second, writes)
            done += 1
            if FOREGROUND.busy:
                break
        writes.flush()
        return done

    def _names(self, batch: list[tuple[str, Any, Any]]) -> set[tuple[str, str]]:
        """The Instances a batch of events and direct answers names, (namespace, name)."""
        names = set()
        for what, first, second in batch:
            obj = second if what == "event" else first
            meta = obj.get("metadata") or {}
            if what == "event" and first == "DELETED":
                names.add((self.namespace, meta.get("name", "")))
            else:
                names.add((meta.get("namespace", ""), meta.get("name", "")))
        return names

    def _apply_until_done(self, item: tuple[str, Any, Any]) -> None:
        """Apply one queued item. The database being locked or away is retried, with
        backoff, until the item goes through or the sync stops: the items behind it wait, so
        the order holds. Any other error (a row the database refuses, a fault in handling
        this item) would fail again: the cache is rebuilt from a relist instead."""
        what = item[0]
        delay = APPLY_RETRY_FIRST
        while True:
            self._taken.clear()
            try:
                self._apply(*item)
                return
            except (OperationalError, InterfaceError) as exc:
                self._put_back_taken()
                self.apply_failures += 1
                log.warning(
                    "%s: applying %s to the cache failed (%s); retrying in %.2fs",
                    self.owner,
                    what,
                    exc,
                    delay,
                )
                # A connection the error broke (a database restart) must not be reused.
                connections.close_all()
                if self._stopping.wait(delay):
                    return
                delay = min(APPLY_RETRY_MAX, delay * 2)
            except Exception:
                self.apply_failures += 1
                log.exception("%s: applying %s to the cache failed; relisting", self.owner, what)
                self.instances.relist_soon()
                return

    def _apply(self, what: str, first: Any, second: Any) -> None:
        if what == "event":
            self._instance_event(first, second)
        elif what == "relist":
            self._instance_relist(first)
        elif what == "relist-page":
            self._instance_page(first)
        elif what == "relist-end":
            self._instance_relist_end(first, second)
        elif what == "direct":
            self._direct(first, second)
        else:
            first.set()

    def _remember(self, name: str, rv: str) -> None:
        with self._watched_grew:
            self._watched[name] = rv
            self._watched_grew.notify_all()

    def _direct(
        self,
        obj: dict[str, Any],
        attributions: dict[str, Any],
        writes: cache.InstanceBatch | None = None,
    ) -> None:
        name = obj["metadata"]["name"]
        rv = obj["metadata"].get("resourceVersion", "")
        if self._has_watched(name, rv):
            return  # the watch already brought this version (or a newer one) in
        apply = cache.apply_instance if writes is None else writes.apply
        apply(obj, _Attributions(self, obj, attributions), direct=True)
        self._direct_rv[name] = rv
        self._notify("instance", name, obj)

    # --- handlers ---------------------------------------------------------------------------
    def _configuration_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            cache.remove_configuration(self.namespace, name)
            self._notify("configuration", name, None)
        else:
            cache.apply_configuration(obj)
            self._notify("configuration", name, obj)

    def _configuration_relist(self, items: list[dict[str, Any]]) -> None:
        cache.replace_all_configurations(self.namespace, items)
        for obj in items:
            self._notify("configuration", obj["metadata"]["name"], obj)
        self._notify("configuration", "", None)

    def _instance_event(
        self, kind: str, obj: dict[str, Any], writes: cache.InstanceBatch | None = None
    ) -> None:
        """One watch event; into ``writes`` when it is part of a batch, else written now."""
        name = obj["metadata"]["name"]
        self._remember(name, obj["metadata"].get("resourceVersion", ""))
        if kind == "DELETED":
            if writes is None:
                cache.remove_instance(self.namespace, name)
            else:
                writes.remove(self.namespace, name)
            self._watched.pop(name, None)
            self._notify("instance", name, None)
            return
        apply = cache.apply_instance if writes is None else writes.apply
        row, applied = apply(obj, _Attributions(self, obj, {}))
        # The echo of a write some other claim store applied inline (one without this sync:
        # the admin's manual release in the one-process demo, a test) changes no row, but
        # subscribers have not heard of that write: tell them now. (Writes that came through
        # submit_direct were announced when applied.)
        rv = obj["metadata"].get("resourceVersion")
        echo = row.resource_version == rv and self._direct_rv.get(name) != rv
        if applied or echo:
            self._notify("instance", name, obj)

    def _instance_relist(self, items: list[dict[str, Any]]) -> None:
        cache.replace_all_instances(self.namespace, items)
        self._watched.clear()
        for obj in items:
            self._remember(obj["metadata"]["name"], obj["metadata"].get("resourceVersion", ""))
            self._notify("instance", obj["metadata"]["name"], obj)
        self._notify("instance", "", None)

    def _instance_page(self, items: list[dict[str, Any]]) -> None:
        # Subscribers hear of the Instances written, not of those the cache had as listed: a
        # restart on a warm database relists 40,000 unchanged Instances, and each one told
        # was a live delta and a charge recompute. The relist's end tells them all the same.
        written = cache.apply_listed(self.namespace, items)
        for obj in items:
            name = obj["metadata"]["name"]
            self._remember(name, obj["metadata"].get("resourceVersion", ""))
            if name in written:
                self._notify("instance", name, obj)

    def _instance_relist_end(self, names: set[str], listed_rv: str) -> None:
        # Our own writes' answers (``submit_direct``) may have been applied while the pages
        # came in: an Instance this node created after the list's snapshot is not listed,
        # and is not gone. Subscribers get the snapshot's version for the same reason.
        for name in cache.remove_unlisted(self.namespace, names, listed_rv):
            self._watched.pop(name, None)
        self.instances.mark_listed()
        self._notify("instance", "", {"metadata": {"resourceVersion": listed_rv}})

    def _notify(self, kind: str, name: str, obj: dict[str, Any] | None) -> None:
        if self._held_notes is not None and threading.current_thread() is self._applier:
            self._held_notes.append((kind, name, obj))
            return
        with self._lock:
            subscribers = list(self._subscribers)
        for fn in subscribers:
            try:
                fn(kind, name, obj)
            except Exception:
                log.exception("subscriber %r failed on %s %s", fn, kind, name)


class _Attributions:
    """What ``cache.apply_instance`` asks for, slot by slot, as it records changes: the
    write's own attribution when the caller knows it, else the oldest announced for that
    change. An announcement is taken only for a change actually applied, so one that is not
    (an echo, a version the cache already has) stays for the write it belongs to; a direct
    answer takes its own announcement too, so that none is left for a later write."""

    def __init__(self, sync: CacheSync, obj: dict[str, Any], own: dict[str, Any]) -> None:
        self._sync = sync
        self._own = own
        self._name = obj["metadata"]["name"]
        self._usage = (obj.get("spec") or {}).get("deviceUsage") or {}

    def get(self, key: str, default: Any = None) -> Any:
        expected = self._sync._take_expected(self._name, key, self._usage.get(key, ""))
        return self._own.get(key) or expected or default
