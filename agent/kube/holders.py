"""``Slot.pod_*`` of the cluster cache, from what each pod says it holds.

Agents keep their slot-to-pod map in their node's own database; what the rest of the system
needs of it (the queue charges, the webhook, the slot map and pod pages) reaches the API
server as the ``akri-site.io/holds`` annotation each agent writes on its node's pods once
PodResources names them (``agent.node.holdings``). The controller's pod watch keeps each pod's
word in ``Pod.holds`` and hands it here, and this module writes the slot rows:

- a slot names the pod that claims it while the slot is held by that pod's node and the pod
  has not ended; of two live claimants (one of them not yet rewritten by its agent) the one
  heard from last wins;
- a slot naming a pod that was seen going, has ended, or says it no longer holds the slot is
  cleared; a pod that has said nothing, or that the watch has not shown yet, is left shown
  (an agent sharing this database, as in the one-process demo, shows its pods itself);
- the cache clears a slot's pod whenever its value changes (someone new holds it), so every
  Instance change re-fills its slots from the index: the order in which the Instance and the
  pod watches deliver does not matter.

The index lives in memory, loaded from the ``Pod`` rows when the thread starts (a controller
that resumes its pod watch without a relist keeps what it knew), kept by the pod events, and
rebuilt by a relist, after which every slot is checked. One thread does the database work, in
order; a database error keeps the work and retries it with backoff, so no update is dropped.
Each write is conditional on the row as read (a value changed meanwhile is re-filled by the
Instance change that changed it). Touched Instances go to ``on_changed`` (charges, live map).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from django.db import DatabaseError, close_old_connections
from django.db.models import Q

from agent.dbthreads import start_thread
from agent.domain.holdings import instance_of, split_key
from agent.models import Pod, Slot

log = logging.getLogger(__name__)

ENDED = frozenset({"Succeeded", "Failed"})
RETRY_FIRST = 0.05
RETRY_MAX = 5.0
BATCH = 500
PodKey = tuple[str, str]
SlotKey = tuple[str, str]  # (Instance namespace, slot key)


@dataclass(frozen=True)
class Word:
    """What one pod says, as the index keeps it."""

    uid: str
    node: str
    ended: bool
    holds: Mapping[SlotKey, str] | None  # slot -> container; None: it has said nothing
    seq: int  # when it was heard (a larger one is newer)


def _same(a: Word, b: Word) -> bool:
    return (a.uid, a.node, a.ended, a.holds) == (b.uid, b.node, b.ended, b.holds)


def word_of(fields: Mapping[str, Any], seq: int = 0) -> Word:
    """A ``Word`` from a pod cache row's columns (``agent.controller.pod_fields``)."""
    raw = fields.get("holds")
    holds = None
    if isinstance(raw, dict):
        holds = {split_key(k): str(v) for k, v in raw.items() if all(split_key(k))}
    return Word(
        uid=fields.get("uid") or "",
        node=fields.get("node_name") or "",
        ended=(fields.get("phase") or "") in ENDED,
        holds=holds,
        seq=seq,
    )


class Index:
    """Pods that use Akri resources and the slots they claim. Not thread-safe: ``Holders``'
    thread alone uses it."""

    def __init__(self) -> None:
        self.pods: dict[PodKey, Word] = {}
        self.claims: dict[SlotKey, set[PodKey]] = defaultdict(set)
        self.by_instance: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._seq = itertools.count(1)

    def next_seq(self) -> int:
        return next(self._seq)

    def put(self, key: PodKey, word: Word | None) -> set[SlotKey] | None:
        """Record what one pod says (None: it is gone). The slots whose claimants may have
        changed; None when nothing that matters did (a pod's status moving on)."""
        old = self.pods.pop(key, None)
        if old is not None and word is not None and _same(old, word):
            self.pods[key] = old  # heard again, saying the same: not newer than the others
            return None
        touched = set(old.holds or ()) if old is not None else set()
        for slot in touched:
            self._unclaim(slot, key)
        if word is None:
            return touched
        self.pods[key] = word
        for slot in word.holds or ():
            self.claims[slot].add(key)
            self.by_instance[(slot[0], instance_of(slot[1]))].add(slot[1])
        return touched | set(word.holds or ())

    def _unclaim(self, slot: SlotKey, key: PodKey) -> None:
        holders = self.claims.get(slot)
        if holders is None:
            return
        holders.discard(key)
        if not holders:
            del self.claims[slot]
            keys = self.by_instance.get((slot[0], instance_of(slot[1])))
            if keys is not None:
                keys.discard(slot[1])
                if not keys:
                    del self.by_instance[(slot[0], instance_of(slot[1]))]

    def slots_of(self, namespace: str, instance: str) -> set[SlotKey]:
        return {(namespace, k) for k in self.by_instance.get((namespace, instance), ())}

    def claimant(self, slot: SlotKey, node: str) -> tuple[PodKey, Word] | None:
        """The live pod on ``node`` that claims ``slot`` and was heard from last."""
        found = [
            (self.pods[k].seq, k)
            for k in self.claims.get(slot, ())
            if self.pods[k].node == node and not self.pods[k].ended
        ]
        if not found:
            return None
        _, key = max(found)
        return key, self.pods[key]

    def disowns(self, slot: SlotKey, pod: PodKey, uid: str, gone: set[PodKey]) -> bool:
        """Whether the pod a slot row names is known not to hold it: seen going (``gone``),
        replaced by a pod of the same name, ended, or saying it holds other slots. A pod the
        watch has not shown yet is not known to be anything (a row an agent sharing this
        database wrote first)."""
        word = self.pods.get(pod)
        if word is None:
            return pod in gone
        if word.ended:
            return True
        if uid and word.uid and uid != word.uid:
            return True
        return word.holds is not None and slot not in word.holds


# The columns a decision reads of a slot row.
_COLUMNS = (
    "pk",
    "instance__namespace",
    "instance__name",
    "key",
    "value",
    "holder_node",
    "pod_namespace",
    "pod_name",
    "pod_uid",
    "container",
)


class Holders:
    """Keeps ``Slot.pod_*`` in step with the pods' words, in a thread of its own.

    Feed it ``pod(namespace, name, fields)`` for every pod event (``fields`` None: the pod is
    gone or uses no Akri resource), ``relist(wanted)`` after a pod relist, and
    ``instance(namespace, name)`` after the cache applied an Instance change (name "": all).
    """

    def __init__(self, on_changed: Callable[[set[tuple[str, str]]], None] | None = None) -> None:
        self.on_changed = on_changed
        self.index = Index()
        self._inbox: list[tuple[Any, ...]] = []
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loaded = False
        # Work taken from the inbox and not written yet (kept across a failed attempt).
        self._slots: set[SlotKey] = set()
        self._named: set[PodKey] = set()
        self._gone: set[PodKey] = set()  # of those, the pods seen going
        self._full = False
        # Instances whose rows changed and whom nobody was told of yet (an attempt that wrote
        # some rows and then failed must still tell of those: the retry finds them right).
        self._touched: set[tuple[str, str]] = set()

    # --- feeding (any thread) -----------------------------------------------------------
    def pod(self, namespace: str, name: str, fields: Mapping[str, Any] | None) -> None:
        self._put(("pod", (namespace, name), word_of(fields) if fields is not None else None))

    def relist(self, wanted: Mapping[PodKey, Mapping[str, Any]]) -> None:
        # Only the few columns the index keeps: a relist of a large cluster is 10,000 pods.
        self._put(("relist", {key: word_of(fields) for key, fields in wanted.items()}))

    def instance(self, namespace: str, name: str) -> None:
        self._put(("instance", namespace, name))

    def _put(self, item: tuple[Any, ...]) -> None:
        with self._wake:
            self._inbox.append(item)
            self._wake.notify()

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> Holders:
        self._thread = start_thread(self._run, "controller-holders")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        with self._wake:
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Until everything fed so far is written (tests)."""
        done = threading.Event()
        self._put(("mark", done))
        return done.wait(timeout)

    def _run(self) -> None:
        delay = RETRY_FIRST
        marks: list[threading.Event] = []
        try:
            while not self._stopping.is_set():
                with self._wake:
                    if not self._inbox and not self._pending() and not marks:
                        self._wake.wait(1.0)
                    items, self._inbox = self._inbox, []
                try:
                    if not self._loaded:
                        self._load()
                    for item in items:
                        if item[0] == "mark":
                            marks.append(item[1])
                        else:
                            self._take(item)
                    if self._pending():
                        self._write()
                except DatabaseError as exc:
                    # Nothing is lost: the items are in the index or still waiting, the slots
                    # still due; the same work is tried again after the pause.
                    log.warning("holders: database error (%s); retrying in %.2fs", exc, delay)
                    close_old_connections()
                    if not self._loaded:  # failed before taking any item: all wait again
                        with self._wake:
                            self._inbox[:0] = items
                    self._stopping.wait(delay)
                    delay = min(delay * 2, RETRY_MAX)
                    continue
                delay = RETRY_FIRST
                touched, self._touched = self._touched, set()
                if touched and self.on_changed is not None:
                    try:
                        self.on_changed(touched)
                    except Exception:
                        log.exception("holders: telling the others failed")
                for mark in marks:
                    mark.set()
                marks = []
        finally:
            for mark in marks:
                mark.set()
            close_old_connections()

    def _pending(self) -> bool:
        return self._full or bool(self._slots) or bool(self._named)

    def _load(self) -> None:
        """The index from the pod cache rows, oldest first (a controller resuming its watch)."""
        rows = Pod.objects.order_by("updated_at", "pk").values_list(
            "namespace", "name", "uid", "node_name", "phase", "holds"
        )
        index = Index()
        for ns, name, uid, node, phase, holds in rows.iterator(BATCH):
            fields = {"uid": uid, "node_name": node, "phase": phase, "holds": holds}
            index.put((ns, name), word_of(fields, index.next_seq()))
        self.index = index
        self._loaded = True
        self._full = True  # whatever happened while nobody watched: check every slot

    def _take(self, item: tuple[Any, ...]) -> None:
        what = item[0]
        if what == "pod":
            _, key, word = item
            if word is not None:
                word = replace(word, seq=self.index.next_seq())
            touched = self.index.put(key, word)
            if touched is not None:
                self._slots |= touched
                self._named.add(key)  # rows naming it may have to be cleared
                if word is None:
                    self._gone.add(key)
                else:
                    self._gone.discard(key)
        elif what == "relist":
            index = Index()
            for key, word in item[1].items():
                index.put(key, replace(word, seq=index.next_seq()))
            vanished = set(self.index.pods) - set(index.pods)  # deleted while nobody watched
            self.index = index
            self._named |= vanished
            self._gone = (self._gone | vanished) - set(index.pods)
            self._full = True
        elif what == "instance":
            _, namespace, name = item
            if name:
                self._slots |= self.index.slots_of(namespace, name)
            else:
                self._full = True

    # --- writing --------------------------------------------------------------------------
    def _write(self) -> None:
        """Bring the due slot rows in line, noting the Instances whose rows changed."""
        full, slots, named = self._full, set(self._slots), set(self._named)
        gone = set(self._gone)
        for row in self._rows(full, slots, named):
            if self._apply(row, gone):
                self._touched.add((row[1], row[2]))
        # Only now: an error above keeps all of it due.
        self._full = False
        self._slots -= slots
        self._named -= named
        self._gone -= gone

    def _rows(self, full: bool, slots: set[SlotKey], named: set[PodKey]) -> Iterable[tuple]:
        if full:
            query = ~Q(value="") | ~Q(pod_name="")
        else:
            by_ns: dict[str, list[str]] = defaultdict(list)
            for namespace, key in slots:
                by_ns[namespace].append(key)
            query = Q(pk__in=[])
            for namespace, keys in by_ns.items():
                query |= Q(instance__namespace=namespace, key__in=sorted(keys))
            for namespace, name in named:
                query |= Q(pod_namespace=namespace, pod_name=name)
        rows = Slot.objects.filter(query).order_by("pk").values_list(*_COLUMNS)
        return list(rows.iterator(BATCH))

    def _apply(self, row: tuple, gone: set[PodKey]) -> bool:
        """Write one slot row's pod if it is not what the index says; True when written."""
        pk, namespace, _instance, key, value, node, pod_ns, pod_name, pod_uid, container = row
        slot = (namespace, key)
        shown = (pod_ns, pod_name, pod_uid, container)
        found = self.index.claimant(slot, node) if value and node else None
        if found is not None:
            (ns, name), word = found
            wanted = (ns, name, word.uid, (word.holds or {}).get(slot, ""))
        elif pod_name and self.index.disowns(slot, (pod_ns, pod_name), pod_uid, gone):
            wanted = ("", "", "", "")
        else:
            return False
        if wanted == shown:
            return False
        # Conditional on the row as read: a value changed meanwhile (the cache cleared the
        # pod) is re-filled by the Instance change that changed it.
        updated = Slot.objects.filter(
            pk=pk,
            value=value,
            pod_namespace=pod_ns,
            pod_name=pod_name,
            pod_uid=pod_uid,
            container=container,
        ).update(
            pod_namespace=wanted[0], pod_name=wanted[1], pod_uid=wanted[2], container=wanted[3]
        )
        return bool(updated)
