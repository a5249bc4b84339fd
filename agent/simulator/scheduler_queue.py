"""kube-scheduler's scheduling queue, for the stand-in scheduler (``agent.simulator.scheduler``).

It retries a refused pod only when kube-scheduler would (pkg/scheduler/backend/queue, as of
1.30-1.37 with their default feature gates, SchedulerQueueingHints and
SchedulerPopFromBackoffQ):

- activeQ: pods to try now, oldest first (PrioritySort with equal priorities orders by the time
  a pod last entered the queue);
- backoffQ: pods that may be tried again once their backoff ends: 1 s after the first attempt,
  doubling with each attempt up to 10 s, counted from the last failure. When activeQ is empty
  the earliest of them is popped anyway (SchedulerPopFromBackoffQ);
- unschedulable pods: tried and refused. They leave the pool only on a cluster event that a
  plugin which refused them registered for (to backoffQ, or activeQ once the backoff is over),
  or after 5 minutes in it (flushUnschedulablePodsLeftover). A pod an extender refused carries
  the plugin ``Extender``, which every event moves (an extender cannot say which events
  matter); one NodeResourcesFit refused moves on an assigned pod's deletion or a node's
  allocatable change. An update of the unscheduled pod itself (not of its status) moves only
  that pod.
- An event that arrives while a pod is being scheduled, and would have moved it, sends it to
  backoffQ if the attempt fails, instead of the pool.

A stand-in that retried refused pods on a timer would hide the one thing an extender must get
right: after a refusal, nothing asks again until the cluster changes.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EXTENDER = "Extender"
FIT = "NodeResourcesFit"

# Cluster events the stand-in produces.
ASSIGNED_POD_DELETE = "AssignedPodDelete"
NODE_ALLOCATABLE_CHANGE = "NodeAllocatableChange"
UNSCHEDULED_POD_UPDATE = "UnscheduledPodUpdate"

# The events NodeResourcesFit registers for (with queueing hints that say Queue for these).
FIT_EVENTS = frozenset({ASSIGNED_POD_DELETE, NODE_ALLOCATABLE_CHANGE})

INITIAL_BACKOFF = 1.0  # DefaultPodInitialBackoffDuration
MAX_BACKOFF = 10.0  # DefaultPodMaxBackoffDuration
MAX_UNSCHEDULABLE = 300.0  # DefaultPodMaxInUnschedulablePodsDuration
LEFTOVER_EVERY = 30.0  # how often flushUnschedulablePodsLeftover runs


@dataclass
class QueuedPod:
    uid: str
    pod: dict[str, Any]
    timestamp: float
    attempts: int = 0
    # Plugins that refused it last time; empty after an error (any event moves it).
    plugins: frozenset[str] = frozenset()
    events: list[tuple[str, str]] = field(default_factory=list)  # seen while in flight


def moves(plugins: frozenset[str], event: str, target: str, uid: str) -> bool:
    """Whether ``event`` (about pod ``target`` for an unscheduled pod's update) requeues the
    pod ``uid`` that ``plugins`` refused."""
    if event == UNSCHEDULED_POD_UPDATE:
        return target == uid and (not plugins or EXTENDER in plugins)
    if not plugins or EXTENDER in plugins:
        return True
    return FIT in plugins and event in FIT_EVENTS


class SchedulingQueue:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        initial_backoff: float = INITIAL_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        max_unschedulable: float = MAX_UNSCHEDULABLE,
    ) -> None:
        self.clock = clock
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.max_unschedulable = max_unschedulable
        self.cond = threading.Condition()
        self._seq = itertools.count()
        self._active: list[tuple[float, int, str]] = []
        self._backoff: list[tuple[float, int, str]] = []
        self._pods: dict[str, QueuedPod] = {}
        self._where: dict[str, str] = {}  # uid -> "active", "backoff", "unschedulable", "flight"
        self._leftover_at = clock()

    # --- what is where (tests, figures) ------------------------------------------------------
    def where(self, uid: str) -> str:
        with self.cond:
            return self._where.get(uid, "")

    def counts(self) -> dict[str, int]:
        with self.cond:
            found: dict[str, int] = {}
            for place in self._where.values():
                found[place] = found.get(place, 0) + 1
            return found

    # --- in ------------------------------------------------------------------------------------
    def add(self, pod: dict[str, Any]) -> None:
        """A new pending pod: straight to activeQ."""
        uid = pod["metadata"]["uid"]
        with self.cond:
            if uid in self._where:
                return
            self._pods[uid] = QueuedPod(uid, pod, self.clock())
            self._to_active(uid)

    def add_unschedulable(
        self, pod: dict[str, Any], plugins: frozenset[str], attempts: int = 1
    ) -> None:
        """A pod already tried ``attempts`` times and refused by ``plugins`` just now."""
        uid = pod["metadata"]["uid"]
        with self.cond:
            self._pods[uid] = QueuedPod(uid, pod, self.clock(), attempts, plugins)
            self._where[uid] = "unschedulable"

    def forget(self, uid: str) -> None:
        """The pod was bound or deleted."""
        with self.cond:
            self._pods.pop(uid, None)
            self._where.pop(uid, None)

    # --- out -----------------------------------------------------------------------------------
    def pop(self) -> QueuedPod | None:
        """The next pod to try (activeQ, else the backoffQ's earliest), now in flight; None
        when both are empty."""
        with self.cond:
            self._flush()
            for heap, place in ((self._active, "active"), (self._backoff, "backoff")):
                while heap:
                    _, _, uid = heapq.heappop(heap)
                    if self._where.get(uid) == place:
                        info = self._pods[uid]
                        info.attempts += 1
                        info.events = []
                        self._where[uid] = "flight"
                        return info
            return None

    def wait(self, timeout: float) -> None:
        """Until something may be ready (an add, a move) or ``timeout``."""
        with self.cond:
            if not self._active and not self._backoff:
                self.cond.wait(timeout)

    def failed(self, info: QueuedPod, plugins: frozenset[str]) -> None:
        """The attempt found no node (``plugins`` refused it; empty for an error)."""
        with self.cond:
            if self._where.get(info.uid) != "flight":
                return  # deleted meanwhile
            info.plugins = plugins
            info.timestamp = self.clock()
            if not plugins or any(moves(plugins, e, t, info.uid) for e, t in info.events):
                self._to_backoff(info.uid)
            else:
                self._where[info.uid] = "unschedulable"

    # --- cluster events ------------------------------------------------------------------------
    def event(self, kind: str, target: str = "") -> int:
        """A cluster event; how many unschedulable pods it moved."""
        moved = 0
        with self.cond:
            for uid, place in list(self._where.items()):
                info = self._pods[uid]
                if place == "flight":
                    info.events.append((kind, target))
                elif place == "unschedulable" and moves(info.plugins, kind, target, uid):
                    self._requeue(uid)
                    moved += 1
        return moved

    # --- timing ------------------------------------------------------------------------------
    def backoff(self, info: QueuedPod) -> float:
        """calculateBackoffDuration: 1 s for the first attempt, doubling, at most 10 s."""
        if info.attempts <= 0:
            return 0.0
        return min(self.max_backoff, self.initial_backoff * 2 ** (info.attempts - 1))

    def _expiry(self, uid: str) -> float:
        info = self._pods[uid]
        return info.timestamp + self.backoff(info)

    def _requeue(self, uid: str) -> None:
        if self._expiry(uid) > self.clock():
            self._to_backoff(uid)
        else:
            self._to_active(uid)

    def _to_active(self, uid: str) -> None:
        self._where[uid] = "active"
        heapq.heappush(self._active, (self._pods[uid].timestamp, next(self._seq), uid))
        self.cond.notify_all()

    def _to_backoff(self, uid: str) -> None:
        self._where[uid] = "backoff"
        heapq.heappush(self._backoff, (self._expiry(uid), next(self._seq), uid))
        self.cond.notify_all()

    def _flush(self) -> None:
        """flushBackoffQCompleted (every second in kube-scheduler; here at every pop) and,
        every 30 s, flushUnschedulablePodsLeftover."""
        now = self.clock()
        while self._backoff and self._backoff[0][0] <= now:
            _, _, uid = heapq.heappop(self._backoff)
            if self._where.get(uid) == "backoff":
                self._to_active(uid)
        if now - self._leftover_at >= LEFTOVER_EVERY:
            self._leftover_at = now
            for uid, place in list(self._where.items()):
                if place == "unschedulable" and now - self._pods[uid].timestamp > (
                    self.max_unschedulable
                ):
                    self._requeue(uid)
