"""The live fan-out: cache changes -> channel layer -> every dashboard websocket.

Writers (the controller, the claim store, reconciliation) call ``publish_instances``,
``publish_removed`` or ``publish_run`` after their database commit, or hand ids to a
``Coalescer`` that turns a burst of changes into one message per window
(``AKRI["LIVE_COALESCE_MS"]``). A message carries the *current* rows of the changed Instances,
read from the cache when it is sent, never the writer's idea of them: a late or repeated
message can only make the browser more right.

Message on the channel layer (group ``LIVE_GROUP``)::

    {"type": "live.delta", "instances": [instance, ...], "removed": ["ns/name", ...],
     "runs": [run, ...], "summary": {...}, "sync": {...}, "at": "2026-11-22T05:03:12Z"}

A window with more changed Instances than RELOAD_OVER (a relist, a start-up sync, a node's
thousands of slots at once) is not sent row by row: one message with ``"reload": true``, the
totals and no rows, and each socket reads its own page again (``consumers.LiveConsumer``). A
relist of 10,000 Instances was 10,000 rows read, serialized and sent to every socket, each of
which kept the hundred on its page; now it is a summary per RELOAD_SECONDS at most.

``instance`` and ``run`` are the dicts of ``slotmap.serialize`` and ``queries.run_dict``; each
websocket narrows ``instances`` to its own filters (``consumers.LiveConsumer``). Publishing never
raises into the writer: a dashboard that cannot be told must not stop reconciliation.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from agent.models import Instance, ReconcileRun
from akri_site.dashboard import queries
from akri_site.dashboard.slotmap import (
    instance_key,
    iso,
    parse_instance_refs,
    refs_query,
    serialize,
    summary,
)

log = logging.getLogger(__name__)

LIVE_GROUP = "akri.live"
# Instances per channel-layer message: keeps each message small (Redis, browsers).
CHUNK = 200
# Instances looked up per query when building messages (SQLite allows 32,766 parameters).
LOOKUP_CHUNK = 2000
# Past this many changed Instances in one window, a reload (the totals; each socket reads its
# page) instead of their rows; reloads at most one per RELOAD_SECONDS, as each costs every
# open socket a read of its page. A change or a few after that go out as rows, at once.
RELOAD_OVER = CHUNK
RELOAD_SECONDS = 2.0

InstanceRef = int | str


def build_messages(
    instances: Iterable[InstanceRef] = (),
    removed: Iterable[str] = (),
    runs: Iterable[int] = (),
    audit: bool = False,
    reload: bool = False,
) -> list[dict[str, Any]]:
    """The ``live.delta`` messages describing the current state of what changed."""
    return list(iter_messages(instances, removed, runs, audit, reload))


def iter_messages(
    instances: Iterable[InstanceRef] = (),
    removed: Iterable[str] = (),
    runs: Iterable[int] = (),
    audit: bool = False,
    reload: bool = False,
) -> Iterator[dict[str, Any]]:
    """``build_messages`` one message at a time: after a relist of a large cluster the
    changed Instances are tens of thousands, read and sent a chunk at a time rather than
    held all at once. Removed keys, runs and the audit flag (an audit entry was written: the
    audit log refetches its list) ride on the last message. ``reload``: one message without
    rows, telling every socket to read its page again (``instances`` and ``removed`` unread)."""
    if reload:
        run_rows = queries.runs(
            ReconcileRun.objects.filter(pk__in=list(runs)).order_by("started_at")
        )
        message = {"type": "live.delta", "instances": [], "removed": [], "runs": run_rows}
        yield message | {"reload": True, **({"audit": True} if audit else {})} | _common()
        return
    ids, keys = parse_instance_refs(instances)
    _, removed_keys = parse_instance_refs(removed)
    run_rows = queries.runs(ReconcileRun.objects.filter(pk__in=list(runs)).order_by("started_at"))
    found: set[str] = set()
    common: dict[str, Any] = {}
    held: dict[str, Any] | None = None
    for rows in _rows_in_chunks(ids, keys, found):
        if not common:
            common = _common()
        if held is not None:
            yield held
        held = {"type": "live.delta", "instances": rows, "removed": [], "runs": []} | common
    gone = {instance_key(ns, name) for ns, name in keys | removed_keys} - found
    if held is None:
        if not (gone or run_rows or audit):
            return
        held = {"type": "live.delta", "instances": [], "removed": [], "runs": []} | _common()
    held["removed"] = sorted(gone)
    held["runs"] = run_rows
    if audit:
        held["audit"] = True
    yield held


def _common() -> dict[str, Any]:
    return {"summary": summary(), "sync": queries.sync_status(), "at": iso(timezone.now())}


def _rows_in_chunks(
    ids: set[int], keys: set[tuple[str, str]], found: set[str]
) -> Iterator[list[dict[str, Any]]]:
    """Serialized rows, at most CHUNK a list, each Instance once; ``found`` collects keys.
    Lookups are bounded so each query's parameters stay within every backend's limit."""
    ordered_ids, ordered_keys = sorted(ids), sorted(keys)
    pending: list[dict[str, Any]] = []
    for i in range(0, max(len(ordered_ids), len(ordered_keys)), LOOKUP_CHUNK):
        part_ids = set(ordered_ids[i : i + LOOKUP_CHUNK])
        part_keys = set(ordered_keys[i : i + LOOKUP_CHUNK])
        for row in serialize(Instance.objects.filter(refs_query(part_ids, part_keys))):
            if row["key"] in found:  # named both by id and by key
                continue
            found.add(row["key"])
            pending.append(row)
            if len(pending) == CHUNK:
                yield pending
                pending = []
    if pending:
        yield pending


def send_now(
    instances: Iterable[InstanceRef] = (),
    removed: Iterable[str] = (),
    runs: Iterable[int] = (),
    audit: bool = False,
    reload: bool = False,
) -> int:
    """Read and send at once; the number of messages sent. Logs, never raises."""
    layer = get_channel_layer()
    if layer is None:
        return 0
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _send(layer, instances, removed, runs, audit, reload)
    # An event loop runs in this thread (async code, or Playwright's sync API in a test):
    # async_to_sync cannot run here, so read and send from a short-lived worker thread.
    with ThreadPoolExecutor(1, thread_name_prefix="live-send") as pool:
        return pool.submit(_send_closing, layer, instances, removed, runs, audit, reload).result()


def _send(
    layer: Any,
    instances: Iterable[InstanceRef],
    removed: Iterable[str],
    runs: Iterable[int],
    audit: bool = False,
    reload: bool = False,
) -> int:
    sent = 0
    try:
        for message in iter_messages(instances, removed, runs, audit, reload):
            async_to_sync(layer.group_send)(LIVE_GROUP, message)
            sent += 1
    except Exception:
        log.exception("live: could not publish a delta")
    return sent


def _send_closing(*args: Any) -> int:
    try:
        return _send(*args)
    finally:
        connection.close()  # the worker thread's own connection


def publish(
    instances: Iterable[InstanceRef] = (),
    removed: Iterable[str] = (),
    runs: Iterable[int] = (),
    audit: bool = False,
) -> None:
    """Send one delta after the current transaction commits (at once outside a transaction)."""
    instances, removed, runs = list(instances), list(removed), list(runs)
    transaction.on_commit(lambda: send_now(instances, removed, runs, audit), robust=True)


def publish_instances(refs: Iterable[InstanceRef]) -> None:
    """The Instances changed: ids, or ``"namespace/name"`` (a bare name: the watched namespace).

    A key whose Instance no longer exists is sent as removed.
    """
    publish(instances=refs)


def publish_removed(keys: Iterable[str]) -> None:
    """The Instances ``"namespace/name"`` are gone from the cache."""
    publish(removed=keys)


def publish_run(run_id: int) -> None:
    """A reconciliation run was recorded (or finished)."""
    publish(runs=[run_id])


def audit_entry_saved(sender: Any, instance: Any, created: bool = False, **kwargs: Any) -> None:
    """``post_save`` of ``AuditEntry`` (connected in ``apps``): open audit logs refetch. Entries
    are written in several places (admin, claim store, evictions); one receiver covers all."""
    if created:
        publish(audit=True)


def _listed(items: Any) -> list[Any]:
    # A lone "ns/name" is one reference, not its characters.
    return [items] if isinstance(items, str | int) else list(items)


class Coalescer:
    """Collects changes from any thread and publishes one delta per window from its own thread.

    After a quiet spell the first change goes out at once (an operator sees it now); changes
    that follow within ``window_ms`` of a delivery wait for the window to end and go out
    together, so a burst or a steady stream costs one message per window. The window does not
    slide. A window of more than RELOAD_OVER Instances goes out as a reload, and then the next
    such window waits RELOAD_SECONDS (a relist costs the feed a summary a few times, not a
    row per Instance). Call ``add`` after your commit.

        live = Coalescer().start()
        live.add([instance.pk]); live.add_removed(["default/cam-1a2b3c"]); live.add_run(run.pk)
        live.stop()   # flushes what is pending
    """

    def __init__(
        self,
        window_ms: int | None = None,
        send: Callable[..., Any] = send_now,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_ms is None:
            window_ms = int(settings.AKRI.get("LIVE_COALESCE_MS", 100))
        self.window = max(window_ms, 0) / 1000.0
        self._send = send
        # Every decision reads this clock; the tests give one they move by hand (``nudge``).
        self._clock = clock
        self._cond = threading.Condition()
        self._instances: set[InstanceRef] = set()
        self._removed: set[str] = set()
        self._runs: set[int] = set()
        self._first_at: float | None = None
        self._last_sent = float("-inf")
        self._last_reload = float("-inf")
        # What the last delivery took: the next starts at least three times that after the
        # last one started, so that reading and counting a large cluster for the feed
        # (hundreds of milliseconds at 40,000 Instances) takes at most a third of the time
        # from the cache writes it reads.
        self._cost = 0.0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.flushes = 0

    def add(self, refs: Iterable[InstanceRef] | InstanceRef) -> None:
        refs = _listed(refs)
        parse_instance_refs(refs)  # a bad reference fails here, in the caller, not the batch
        self._put(self._instances, refs)

    def add_removed(self, keys: Iterable[str] | str) -> None:
        keys = _listed(keys)
        parse_instance_refs(keys)
        self._put(self._removed, keys)

    def add_run(self, run_id: int) -> None:
        self._put(self._runs, [run_id])

    def _put(self, target: set, items: Iterable[Any]) -> None:
        with self._cond:
            before = len(target)
            target.update(items)
            if len(target) != before and self._first_at is None:
                self._first_at = self._clock()
                self._cond.notify_all()

    def nudge(self) -> None:
        """Have the delivery thread look at the clock again (a clock moved by hand)."""
        with self._cond:
            self._cond.notify_all()

    def pending(self) -> bool:
        with self._cond:
            return bool(self._instances or self._removed or self._runs)

    def _large(self) -> bool:
        return len(self._instances) + len(self._removed) > RELOAD_OVER

    def _take(self) -> dict[str, Any]:
        batch: dict[str, Any] = {"runs": sorted(self._runs)}
        if self._large():
            batch.update(instances=[], removed=[], reload=True)
            self._last_reload = self._clock()
        else:
            batch.update(instances=list(self._instances), removed=sorted(self._removed))
        self._instances, self._removed, self._runs = set(), set(), set()
        self._first_at = None
        return batch

    def flush(self) -> bool:
        """Publish what is pending now, from the calling thread. Whether anything was sent."""
        with self._cond:
            if not (self._instances or self._removed or self._runs):
                return False
            batch = self._take()
        self._deliver(batch)
        return True

    def _deliver(self, batch: dict[str, Any]) -> None:
        try:
            self._send(**batch)
        except Exception:
            log.exception("live: coalesced publish failed")
        self.flushes += 1

    def start(self) -> Coalescer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="live-coalescer", daemon=True)
            self._thread.start()
        return self

    def stop(self, flush: bool = True, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            if not flush:
                self._take()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Coalescer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while self._first_at is None and not self._stopping:
                        self._cond.wait()
                    if self._first_at is None:  # stopping, nothing pending
                        return
                    while not self._stopping:
                        gap = max(self.window, 3 * self._cost)
                        due = max(self._first_at, self._last_sent + gap)
                        if self._large():
                            due = max(due, self._last_reload + RELOAD_SECONDS)
                        left = due - self._clock()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    batch = self._take()
                    self._last_sent = self._clock()
                close_old_connections()
                started = self._clock()
                self._deliver(batch)
                self._cost = self._clock() - started
        finally:
            # This thread's own database connection.
            connection.close()
