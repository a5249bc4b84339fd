"""Node-local slot reconciliation: free a slot as soon as its pod is gone, never a live pod's.

The kubelet has no Deallocate and never names the pod in Allocate (seed 002), so the agent
keeps its own slot-to-pod map (``SlotPodBinding``, in the database so a restarted agent
resumes) and fills it from three sources:

- ``on_allocated``: the device plugin claimed a slot. The binding starts with no pod; the
  kubelet records the assignment right after Allocate returns, so a PodResources ``List``
  soon names the pod (a learn pass, polled with backoff while any binding is unnamed).
- pod events from a watch on this node's pods: a pod deleted, or terminated (phase Succeeded
  or Failed), releases the slots bound to it at once. Other pods' readiness never matters.
- a periodic sweep (and one at start-up): a level-based pass over every slot this node holds,
  every binding and every device the kubelet reports in use.

Per slot, one pure rule (``decide``) says what to do:

- in use by a live pod (PodResources, and the pod alive in the API): keep it and learn the
  pod; if ``deviceUsage`` shows it free, claim it back (restore); if another node holds it,
  record a conflict and leave it: never steal;
- bound to a pod that is gone: release at once;
- claimed by Allocate but its pod not yet seen: keep for the grace period, then release once
  a ``List`` taken after the grace still lacks it. The grace covers only that window;
- held without a binding (a crash between claim and binding, or an older agent): adopt it,
  starting the grace now.

Work on one Instance is serialized by a lock per Instance, which the device plugins take
around claim + ``on_allocated`` (``serialized``); different Instances proceed in parallel.
That decides seed 002's orderings: a delete handled before the claim frees the slot and the
claim takes it fresh; a claim of a slot still held for the dead pod ("already ours") re-binds
the slot to the new allocation, so the delete that follows finds no binding naming its pod.

Writes to the API server go through the claim store (conditional, with events linked to a
``ReconcileRun``). The map lives in memory and is written to the database behind, in order, by
one thread: on SQLite every writer waits on every other, and a deleted pod's release should
not. Releases triggered by pod events less than a second apart share one run row for the same
reason, and those of one Instance due together go in one write (``ClaimStore.release_many``).
Errors are temporary (the kubelet or API server could not answer: keep the books and retry at
the next pass) or permanent (recorded in the run's detail and counted as errors).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connections,
    transaction,
)
from django.db.models import Q
from django.utils import timezone
from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent import metrics, retention, usage
from agent.dbthreads import close_pool_connections
from agent.domain.naming import cl_resource_name, il_resource_name, slot_index
from agent.domain.slots import InstanceState, UsageKind, format_cl, format_il, parse_usage
from agent.kube import cache
from agent.kube.claims import (
    ClaimStore,
    ClaimStoreError,
    InstanceGone,
    SlotChanged,
    SlotTaken,
    UnknownSlot,
)
from agent.kube.client import AkriApi, CoreApi
from agent.kube.foreground import FOREGROUND
from agent.kube.watch import CacheSync, ResourceWatcher
from agent.models import Instance, ReconcileRun, Slot, SlotEvent, SlotPodBinding
from agent.node.holdings import Publisher, notes_of
from agent.node.podresources import (
    RESOURCE_PREFIX,
    DeviceUse,
    PodResourcesClient,
    PodResourcesUnavailable,
)
from agent.node.view import is_older

log = logging.getLogger(__name__)

TERMINATED_PHASES = frozenset({"Succeeded", "Failed"})
# Learn passes after an Allocate: soon, then backing off while the pod stays unnamed.
LEARN_FIRST_DELAY = 0.02
LEARN_MAX_DELAY = 1.0
PRUNE_INTERVAL = 3600.0  # seconds between prunes of this node's run history
PRUNE_RETRY = 60.0  # after a prune failed (the database was busy or away)
# Tombstones of deleted pods are kept this long (latency metric, GONE without a GET).
TOMBSTONE_SECONDS = 3600.0
DETAIL_LINES = 60
# Event-triggered releases share one run while each comes within this long of the one before,
# for at most EVENT_RUN_MAX_SECONDS. A storm is then one run row per node, not one a second:
# each new row is a write on the release path, and with the database busy behind a storm (the
# cache, the write-behind) it waited seconds for SQLite's write lock.
EVENT_RUN_SECONDS = 1.0
EVENT_RUN_MAX_SECONDS = 30.0
# Write-behind rows per transaction.
WRITE_BATCH = 32
# A batch whose transaction met a database error (locked, restarting) is written again after
# these delays, doubling: the rows are how a restarted agent resumes.
WRITE_RETRY_FIRST = 0.05
TARGET_RETRY_SECONDS = 1.0
WRITE_RETRY_MAX = 5.0
# Pod annotations (agent.node.holdings) are written this long after the change that calls
# for them, so that a burst of admissions is one pass; a pass that could not write them all
# is tried again after a delay that doubles up to the maximum.
PUBLISH_DELAY = 0.02
PUBLISH_RETRY_FIRST = 0.2
PUBLISH_RETRY_MAX = 5.0
# A pass that left assignment records alone while an Allocate was in flight looks again after
# this long (the learn pass that names the pod asks for one itself).
PUBLISH_DEFER = 0.5


# --- facts and the rule ---------------------------------------------------------------------
class PodState(enum.Enum):
    ALIVE = "alive"
    GONE = "gone"  # deleted, replaced by a pod of the same name, or terminated
    UNKNOWN = "unknown"  # cannot tell now: decide nothing that depends on it


@dataclass(frozen=True)
class PodInfo:
    """A pod on this node as the API server last showed it."""

    namespace: str
    name: str
    uid: str
    phase: str = ""
    deleting: bool = False
    # What the holdings publisher (agent.node.holdings) reads and tests its writes against.
    resource_version: str = ""
    created: str = ""
    annotated: bool = False
    notes: tuple[tuple[str, str], ...] = ()

    @property
    def terminated(self) -> bool:
        return self.phase in TERMINATED_PHASES

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> PodInfo:
        meta = obj.get("metadata") or {}
        annotated, notes = notes_of(meta)
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            phase=(obj.get("status") or {}).get("phase") or "",
            deleting=bool(meta.get("deletionTimestamp")),
            resource_version=str(meta.get("resourceVersion") or ""),
            created=str(meta.get("creationTimestamp") or ""),
            annotated=annotated,
            notes=notes,
        )


@dataclass(frozen=True)
class Binding:
    """One row of the slot-to-pod map, as held in memory (the database row mirrors it)."""

    slot: str
    instance: str
    device_id: str
    resource_name: str
    allocated_at: datetime
    pod_namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    container: str = ""
    seen_at: datetime | None = None

    @property
    def pod_known(self) -> bool:
        return bool(self.pod_name)

    @property
    def pod(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}" if self.pod_name else ""


def wanted_value(slot: str, device_id: str, node: str) -> str:
    """The deviceUsage value a device id stands for: IL ids are the slot key, CL ids vdevs."""
    return format_il(node) if device_id == slot else format_cl(device_id, node)


class Act(enum.Enum):
    KEEP = "keep"
    LEARN = "learn"  # bind the slot to the pod PodResources names
    ADOPT = "adopt"  # held without a binding: bind it, grace from now
    RELEASE = "release"
    RESTORE = "restore"  # in use by a live pod but free in deviceUsage: claim it back
    CONFLICT = "conflict"  # in use by a live pod here, held by another holder: report only
    FORGET = "forget"  # binding without a claim to release: drop the binding


@dataclass(frozen=True)
class Decision:
    act: Act
    why: str = ""


KEEP = Decision(Act.KEEP)


def decide(
    *,
    node: str,
    slot: str,
    value: str | None,
    binding: Binding | None,
    use: DeviceUse | None,
    use_state: PodState,
    bound_state: PodState,
    listed_at: datetime | None,
    now: datetime,
    grace: timedelta,
) -> Decision:
    """What to do with one slot. Pure; every input is a fact as of now.

    ``value`` is the slot's deviceUsage value in the cache (None: no such slot there);
    ``use`` the PodResources entry for its device (None: not in use, or no List);
    ``listed_at`` when that List was taken (None: no List this time).
    """
    usage = parse_usage(value) if value is not None else None
    ours = usage is not None and usage.held_by(node)
    # A List older than the binding's allocation says nothing about the new allocation.
    fresh = use is not None and (
        binding is None or listed_at is None or listed_at >= binding.allocated_at
    )
    if fresh and use_state is PodState.UNKNOWN:
        return Decision(Act.KEEP, "in use by a pod the API server cannot confirm now")
    if fresh and use_state is PodState.ALIVE:
        if usage is None:
            return Decision(Act.KEEP, "in use, but the slot is not in the cache")
        if ours:
            same = binding is not None and (
                binding.pod_namespace,
                binding.pod_name,
                binding.container,
            ) == (use.namespace, use.pod, use.container)
            return KEEP if same else Decision(Act.LEARN, f"in use by {use.namespace}/{use.pod}")
        if usage.is_free:
            return Decision(
                Act.RESTORE, f"in use by live pod {use.namespace}/{use.pod}, free in deviceUsage"
            )
        return Decision(
            Act.CONFLICT, f"in use by live pod {use.namespace}/{use.pod}, held by {usage.raw!r}"
        )
    if binding is None:
        return Decision(Act.ADOPT, "held without a binding") if ours else KEEP
    if binding.pod_known:
        if bound_state is not PodState.GONE:
            return KEEP  # a live (or unconfirmed) pod's slot is never freed
        why = f"pod {binding.pod} is gone"
        return Decision(Act.RELEASE, why) if ours else Decision(Act.FORGET, why)
    expires = binding.allocated_at + grace
    if now < expires or listed_at is None or listed_at < expires:
        return KEEP  # Allocate's window: the pod may not show in PodResources yet
    why = f"no pod holds it {grace.total_seconds():g} s after Allocate"
    return Decision(Act.RELEASE, why) if ours else Decision(Act.FORGET, why)


# --- pods on this node --------------------------------------------------------------------
class PodIndex:
    """Pods on this node as the watch shows them, plus tombstones of deleted ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._gone: dict[tuple[str, str, str], float] = {}  # (ns, name, uid) -> monotonic
        self.synced = False

    def apply(self, kind: str, obj: dict[str, Any]) -> PodInfo:
        info = PodInfo.from_object(obj)
        key = (info.namespace, info.name)
        with self._lock:
            # A pod of this name alive again: "gone" by name alone no longer applies.
            if kind != "DELETED" and not info.terminated:
                self._gone.pop((info.namespace, info.name, ""), None)
            if kind == "DELETED":
                current = self._pods.get(key)
                if current is None or current.uid == info.uid:
                    self._pods.pop(key, None)
                self._bury(info)
            else:
                self._pods[key] = info
                if info.terminated:
                    self._bury(info)
        return info

    def replace(self, objects: Iterable[dict[str, Any]]) -> list[PodInfo]:
        """After a (re)list: the listed pods are all there is. Returns the pods that vanished."""
        fresh = {}
        for obj in objects:
            info = PodInfo.from_object(obj)
            fresh[(info.namespace, info.name)] = info
        with self._lock:
            vanished = [p for k, p in self._pods.items() if k not in fresh or fresh[k].uid != p.uid]
            for info in vanished:
                self._bury(info)
            self._pods = fresh
            self.synced = True
        return vanished

    def _bury(self, info: PodInfo) -> None:
        now = time.monotonic()
        self._gone.setdefault((info.namespace, info.name, info.uid), now)
        self._gone.setdefault((info.namespace, info.name, ""), now)  # for bindings without UID
        if len(self._gone) > 4096:
            self._gone = {k: t for k, t in self._gone.items() if now - t < TOMBSTONE_SECONDS}

    def get(self, namespace: str, name: str) -> PodInfo | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def all(self) -> list[PodInfo]:
        with self._lock:
            return list(self._pods.values())

    def refresh(self, obj: dict[str, Any]) -> None:
        """Our own write's answer, ahead of the watch: kept unless the index already has that
        pod at a newer version (or a newer pod of that name)."""
        info = PodInfo.from_object(obj)
        with self._lock:
            current = self._pods.get((info.namespace, info.name))
            if current is None or current.uid != info.uid or current.terminated:
                return
            if cache.is_newer(info.resource_version, current.resource_version):
                self._pods[(info.namespace, info.name)] = info

    def gone_at(self, namespace: str, name: str, uid: str) -> float | None:
        with self._lock:
            return self._gone.get((namespace, name, uid))


# --- one pass's bookkeeping -----------------------------------------------------------------
@dataclass
class RunBook:
    """Counts and detail of one run; its ``ReconcileRun`` row is created on first need."""

    node: str
    trigger: str
    started_at: datetime
    always: bool  # record a row even when nothing happened
    t0: float = field(default_factory=time.perf_counter)
    checked: int = 0
    released: int = 0
    restored: int = 0
    conflicts: int = 0
    errors: int = 0
    lines: list[str] = field(default_factory=list)
    row: ReconcileRun | None = None
    last_used: float = field(default_factory=time.perf_counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Creating the row waits for the database: counting meanwhile must not wait with it.
    _row_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _reported: dict[str, int] = field(default_factory=dict, repr=False)
    _finished: bool = False

    def ensure_row(self) -> ReconcileRun:
        with self._row_lock:
            if self.row is None:
                self.row = ReconcileRun.objects.create(
                    scope=ReconcileRun.Scope.NODE,
                    node=self.node,
                    trigger=self.trigger,
                    started_at=self.started_at,
                )
            return self.row

    def count(self, what: str, line: str = "") -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)
            if line:
                self.lines.append(line)

    def note(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)

    @property
    def eventful(self) -> bool:
        return bool(self.released or self.restored or self.conflicts or self.errors)

    def finish(self) -> ReconcileRun | None:
        """Write the counts to the row. May be called again while a burst run is still
        collecting (see ``NodeReconciler._burst_book``); metrics count only what is new."""
        if not (self.always or self.eventful or self.row is not None):
            return None
        row = self.ensure_row()
        with self._lock:
            fields = {
                "duration_ms": (time.perf_counter() - self.t0) * 1000,
                "checked": self.checked,
                "released": self.released,
                "restored": self.restored,
                "conflicts": self.conflicts,
                "errors": self.errors,
                "detail": ReconcileRun.detail_of(self.lines, DETAIL_LINES),
            }
            new = {
                result: getattr(self, name) - self._reported.get(result, 0)
                for result, name in _RESULTS.items()
            }
            self._reported = {result: getattr(self, name) for result, name in _RESULTS.items()}
            first = not self._finished
            self._finished = True
        ReconcileRun.objects.filter(pk=row.pk).update(**fields)
        for name, value in fields.items():
            setattr(row, name, value)
        if first:
            metrics.RECONCILE_RUNS.labels("node", self.trigger).inc()
        for result, n in new.items():
            if n:
                metrics.RECONCILE_SLOTS.labels("node", result).inc(n)
        return row


_RESULTS = {
    "released": "released",
    "restored": "restored",
    "conflict": "conflicts",
    "error": "errors",
}


@dataclass(frozen=True)
class SlotRow:
    instance: str
    value: str
    shown_pod: str  # Slot.pod_name, as the dashboard shows it


@dataclass(frozen=True)
class Snapshot:
    """One PodResources ``List``, resolved to slots."""

    listed_at: datetime | None  # None: the kubelet did not answer
    by_slot: dict[str, DeviceUse]
    unmapped: list[DeviceUse]


# --- the engine -----------------------------------------------------------------------------
class NodeReconciler:
    """Slot reconciliation for one node and namespace. See the module docstring."""

    def __init__(
        self,
        *,
        node: str,
        namespace: str,
        pod_resources: Any,
        claims: ClaimStore | None = None,
        api_client: client.ApiClient | None = None,
        grace: float | None = None,
        sweep_interval: float | None = None,
        clock: Callable[[], datetime] = timezone.now,
        workers: int = 4,
        watch_pods: bool = True,
        read_pods: bool = True,
        sync: CacheSync | None = None,
        assignments: Any = None,
        fold_releases: bool = True,
    ) -> None:
        """``pod_resources`` has ``list() -> list[DeviceUse]`` (a ``PodResourcesClient``).
        ``claims`` defaults to a claim store on ``api_client``. ``workers=0`` runs every
        handler inline (deterministic tests). ``watch_pods`` starts a pod watch in ``start``;
        without it, feed ``on_pod_event``/``on_pod_relist`` yourself. ``read_pods`` lets the
        reconciler GET a pod the watch has not shown (else the index is taken as complete).
        With ``sync``, Instance changes that take a live pod's slot away trigger a targeted
        pass at once instead of at the next sweep. ``assignments`` (the agent's, when it
        honours the scheduler extender's) says which resources have an Allocate in flight;
        with an ``api_client`` the reconciler publishes what each pod holds on the pod
        (``agent.node.holdings``). ``fold_releases=False`` writes every gone pod's slot on its
        own (the baseline of ``bench release-storm``)."""
        conf = settings.AKRI
        self.node = node
        self.namespace = namespace
        self.pod_resources = pod_resources
        self.api_client = api_client
        if claims is None:
            if api_client is None:
                raise ValueError("a claim store or an api_client is needed")
            claims = ClaimStore(AkriApi(api_client, namespace), f"agent:{node}")
        self.claims = claims
        self.grace = timedelta(seconds=conf["SLOT_GRACE_SECONDS"] if grace is None else grace)
        self.sweep_interval = (
            conf["SWEEP_INTERVAL_SECONDS"] if sweep_interval is None else sweep_interval
        )
        self.clock = clock
        self.fold_releases = fold_releases
        self.watch_pods = watch_pods and api_client is not None
        self.read_pods = read_pods and api_client is not None
        self.pods = PodIndex()
        self._core = CoreApi(api_client) if api_client is not None else None
        self.publisher: Publisher | None = None
        if self._core is not None:
            in_flight = getattr(assignments, "in_flight", None) or (lambda resource: False)
            self.publisher = Publisher(self._core, node, namespace, in_flight=in_flight)
        self._publish_due: float | None = None
        self._publish_retry = PUBLISH_RETRY_FIRST
        self._locks: dict[str, threading.RLock] = {}
        self._locks_guard = threading.Lock()
        self._bindings: dict[str, Binding] = {}
        self._bindings_guard = threading.Lock()
        self._conflicts_reported: set[tuple[str, str, str]] = set()
        # Two pools so that a handler waiting on per-Instance work never starves it: handlers
        # (pod-gone drains, relist releases) go to the first, per-Instance actions to the second.
        self._executor = self._pool(workers, f"reconcile-{node}")
        self._group_pool = self._pool(workers, f"reconcile-{node}-act")
        self._workers = workers
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._targets: set[str] = set()  # slots a targeted pass should look at
        self._gone: list[PodInfo] = []  # pods ended, waiting for _drain_gone
        self._drain_queued = False  # a _drain_gone is submitted and has not taken them yet
        self._gone_guard = threading.Lock()
        # Gone pods' slots waiting for their Instance's next write, and the Instances being
        # written (``_release_due``).
        self._due: dict[str, list[tuple[Binding, list[PodInfo], RunBook]]] = {}
        self._releasing: set[str] = set()
        self._due_guard = threading.Lock()
        self._burst: RunBook | None = None
        self._writes: queue.SimpleQueue | None = queue.SimpleQueue() if workers else None
        self._writer: threading.Thread | None = None
        if self._writes is not None:
            self._writer = threading.Thread(
                target=self._write_behind, name=f"reconcile-{node}-writes", daemon=True
            )
            self._writer.start()
        self._targets_guard = threading.Lock()
        self._learn_delay = LEARN_FIRST_DELAY
        self._learn_due: float | None = None
        self._threads: list[threading.Thread] = []
        self._watcher: ResourceWatcher | None = None
        self.sync = sync
        self.sweeps = 0
        self._load_bindings()

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, *, startup_timeout: float = 10.0) -> NodeReconciler:
        """Watch this node's pods, run the start-up pass, then sweep periodically."""
        if self.watch_pods:
            self._watcher = ResourceWatcher(
                owner=f"reconciler:{self.node}",
                kind=f"pods@{self.node}",
                list_func=self._core.list_pod_for_all_namespaces,
                list_kwargs={"field_selector": f"spec.nodeName={self.node}"},
                on_event=self.on_pod_event,
                on_relist=self.on_pod_relist,
                api_client=self.api_client,
                to_dict=True,
                # Always relist at start: deletions missed while the agent was down show as
                # pods missing from the list, and the index lives in memory.
                persist=False,
            )
            self._spawn(self._watcher.run, "pods")
            self._watcher.synced.wait(startup_timeout)
        if self.sync is not None:
            self.sync.subscribe(self.on_instance_changed)
        self._spawn(self._loop, "loop")
        return self

    def stop(self) -> None:
        """Stop watching and sweeping; idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        if self.sync is not None:
            self.sync.unsubscribe(self.on_instance_changed)
        if self._watcher is not None:
            self._watcher.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        for pool in (self._executor, self._group_pool):
            if pool is not None:
                close_pool_connections(pool, self._workers)
                pool.shutdown(wait=True)
        if self._writes is not None and self._writer is not None:
            self._writes.put(None)  # after everything queued so far
            self._writer.join(timeout=30)
        close = getattr(self.pod_resources, "close", None)
        if close is not None:
            close()

    def _spawn(self, target: Callable[[], None], what: str) -> None:
        thread = threading.Thread(target=target, name=f"reconcile-{self.node}-{what}", daemon=True)
        thread.start()
        self._threads.append(thread)

    @staticmethod
    def _pool(workers: int, name: str) -> ThreadPoolExecutor | None:
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name) if workers else None

    def _loop(self) -> None:
        """Start-up pass, then sweeps on the interval, learn passes and targeted passes."""
        try:
            self._guarded(self.sweep, ReconcileRun.Trigger.STARTUP)
            next_sweep = time.monotonic() + self.sweep_interval
            next_prune = time.monotonic()
            while not self._stopping.is_set():
                now = time.monotonic()
                if now >= next_prune:
                    # This node's own history, in the agent's database; the cluster's Celery
                    # beat prunes the shared one.
                    pruned = self._guarded(self.prune_runs)
                    next_prune = now + (PRUNE_INTERVAL if pruned else PRUNE_RETRY)
                due = [next_sweep] + [
                    d for d in (self._learn_due, self._publish_due) if d is not None
                ]
                self._wake.wait(max(0.0, min(due) - now))
                self._wake.clear()
                if self._stopping.is_set():
                    break
                now = time.monotonic()
                if now >= next_sweep:
                    self._guarded(self.sweep, ReconcileRun.Trigger.SWEEP)
                    next_sweep = time.monotonic() + self.sweep_interval
                with self._targets_guard:
                    targets, self._targets = self._targets, set()
                if targets and not self._guarded(self.reconcile_slots, targets):
                    self._retry_targets(targets)
                learn_due = self._learn_due is not None and time.monotonic() >= self._learn_due
                if learn_due and not self._guarded(self.learn):
                    self._schedule_learn()  # a failed learn pass is tried again, later
                publish_due = self._publish_due
                if publish_due is not None and time.monotonic() >= publish_due:
                    self._run_publish()
        finally:
            connections.close_all()

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run one pass; False when it failed (logged; the loop goes on)."""
        # A pass is PodResources, the API server and the ORM: milliseconds of this process's
        # interpreter lock that an Allocate in flight should not share (agent.kube.foreground).
        FOREGROUND.wait_idle()
        try:
            fn(*args)
        except Exception as exc:  # the loop must outlive any one pass; the next one retries
            log.exception("%s: reconcile step %s failed", self.node, getattr(fn, "__name__", fn))
            if isinstance(exc, DatabaseError):
                connections.close_all()  # a connection the error broke is not reused
            return False
        return True

    # --- serialization ------------------------------------------------------------------------
    def _lock(self, instance: str) -> threading.RLock:
        with self._locks_guard:
            lock = self._locks.get(instance)
            if lock is None:
                lock = self._locks[instance] = threading.RLock()
            return lock

    @contextlib.contextmanager
    def serialized(self, *instances: str) -> Iterator[None]:
        """Hold the per-Instance locks (in name order, so two holders cannot deadlock).

        Device plugins wrap claim + ``on_allocated`` in it; every reconcile action on an
        Instance runs under the same lock.
        """
        with contextlib.ExitStack() as stack:
            for name in sorted(set(instances)):
                stack.enter_context(self._lock(name))
            yield

    # --- the Allocate hook --------------------------------------------------------------------
    def on_allocated(
        self,
        node: str,
        instance: str,
        slot_key: str,
        value: str,
        device_id: str,
        resource_name: str,
    ) -> None:
        """A device plugin claimed ``slot_key`` (or found it already ours) for ``device_id``.

        The slot is bound to this allocation, pod unknown: grace starts now, and whatever
        pod it was bound to before no longer holds it.
        """
        if node != self.node:
            # Never fail an Allocate over our books; say it loudly instead.
            log.error("%s: allocation on node %r reported here; ignored", self.node, node)
            return
        with self._lock(instance):
            binding = Binding(
                slot=slot_key,
                instance=instance,
                device_id=device_id,
                resource_name=resource_name,
                allocated_at=self.clock(),
            )
            self._save_binding(binding)
            self._show_pod(instance, slot_key, None)
        self._schedule_learn(reset=True)

    # --- pod events ---------------------------------------------------------------------------
    def on_pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        """A watch event for a pod on this node."""
        meta = obj.get("metadata") or {}
        before = self.pods.get(meta.get("namespace", ""), meta.get("name", ""))
        info = self.pods.apply(kind, obj)  # tombstones carry the time seen (latency metric)
        if kind != "DELETED" and not info.terminated and self._to_publish(before, info):
            self._publish_soon()
        if kind == "DELETED" or info.terminated:
            # One drain for whatever ends before it runs: in a storm, a submit per pod had the
            # watch threads of 50 agents queue on the pools' shared lock, seconds behind.
            with self._gone_guard:
                self._gone.append(info)
                queued, self._drain_queued = self._drain_queued, True
            if not queued:
                self._submit(self._drain_gone)
        elif self._has_unnamed():
            self._schedule_learn()

    def _drain_gone(self) -> None:
        """Release what every pod gone so far held. Pods tend to end together (a Job, a
        rollout): their releases share one run (see EVENT_RUN_SECONDS), so only the first
        of a burst writes a run row before its API call (SQLite writers queue on each other)."""
        with self._gone_guard:
            pods, self._gone = self._gone, []
            self._drain_queued = False
        if pods:
            book = self._burst_book()
            self.release_pods(pods, book=book, finish=False)
            self._persist(book.finish)

    def _burst_book(self) -> RunBook:
        with self._gone_guard:
            book, now = self._burst, time.perf_counter()
            if (
                book is None
                or now - book.last_used > EVENT_RUN_SECONDS
                or now - book.t0 > EVENT_RUN_MAX_SECONDS
            ):
                book = self._burst = RunBook(
                    self.node, ReconcileRun.Trigger.EVENT, self.clock(), always=True
                )
            book.last_used = now
            return book

    def on_pod_relist(self, objects: list[dict[str, Any]]) -> None:
        """The pod watch (re)listed: pods bound here but absent from the list (deleted while
        nobody watched) or terminated are gone; their slots go in one run."""
        first = not self.pods.synced
        self.pods.replace(objects)
        self._publish_soon()
        trigger = ReconcileRun.Trigger.STARTUP if first else ReconcileRun.Trigger.EVENT
        gone = {
            (b.pod_namespace, b.pod_name, b.pod_uid)
            for b in self.bindings()
            if b.pod_known and self._bound_state(b, allow_read=False) is PodState.GONE
        }
        if gone:
            pods = [PodInfo(ns, name, uid) for ns, name, uid in sorted(gone)]
            self._submit(self.release_pods, pods, trigger)

    def release_pods(
        self,
        pods: list[PodInfo],
        trigger: str = ReconcileRun.Trigger.EVENT,
        book: RunBook | None = None,
        finish: bool = True,
    ) -> ReconcileRun | None:
        """Release every slot bound to these pods (deleted or terminated). A run row is
        written only when they held slots."""
        slots = [b for b in self.bindings() if any(self._names_pod(b, pod) for pod in pods)]
        if not slots:
            return None
        # The run's row is written behind (cache.RunSource), not before the first release.
        book = book or RunBook(self.node, trigger, self.clock(), always=True)
        by_instance: dict[str, list[Binding]] = defaultdict(list)
        for binding in slots:
            by_instance[binding.instance].append(binding)

        if self.fold_releases:
            for instance, bindings in by_instance.items():
                self._release_due(instance, [(b, pods, book) for b in bindings])
            return book.finish() if finish else book.row

        def release(instance: str, bindings: list[Binding]) -> None:
            with self._lock(instance):
                for binding in bindings:
                    self._release_one(book, instance, binding, pods)

        self._run_grouped(by_instance, release)
        return book.finish() if finish else book.row

    def _release_one(
        self, book: RunBook, instance: str, binding: Binding, pods: list[PodInfo]
    ) -> None:
        """One gone pod's slot, on its own (under the Instance's lock)."""
        book.count("checked")
        current = self._binding(binding.slot)
        if current is None or not any(self._names_pod(current, p) for p in pods):
            return  # re-bound by an Allocate that came first: not this pod's now
        # No cache read first: the conditional write is the check, and this is the path a
        # deleted pod's slot waits on.
        expected = wanted_value(current.slot, current.device_id, self.node)
        why = f"pod {current.pod} is gone"
        try:
            self._release(book, instance, current.slot, expected, why, current)
        except Exception as exc:  # one slot's surprise must not stop the others
            log.exception("%s: releasing %s failed", self.node, current.slot)
            book.count("errors", f"{current.slot}: {exc}")

    def _release_due(
        self, instance: str, entries: list[tuple[Binding, list[PodInfo], RunBook]]
    ) -> None:
        """Gone pods' slots on one Instance, by group commit: they join the Instance's queue,
        and when nobody is releasing it, a release loop (``_release_queued``) is started on
        the per-Instance pool. The caller waits for no write: a drain of pods on five
        Instances hands out five loops and is free for the next pods at once."""
        with self._due_guard:
            self._due.setdefault(instance, []).extend(entries)
            if instance in self._releasing:
                return  # the releasing thread takes them with its next write
            self._releasing.add(instance)
        if self._group_pool is None:
            self._release_queued(instance)
        else:
            self._group_pool.submit(self._release_queued, instance).add_done_callback(
                self._report_failure
            )

    def _release_queued(self, instance: str) -> None:
        """The release loop of one Instance: everything due for it in one write, and again for
        whatever came due during that write, until nothing is left. A lone release waits for
        nothing, and a storm's releases of one Instance share writes."""
        while True:
            with self._due_guard:
                taken = self._due.pop(instance, [])
                if not taken:
                    self._releasing.discard(instance)
                    return
            try:
                with self._lock(instance):
                    self._release_taken(instance, taken)
            except Exception as exc:  # the loop must go on: it alone releases this Instance
                log.exception("%s: releasing slots of %s failed", self.node, instance)
                for binding, _, book in taken:
                    book.count("errors", f"{binding.slot}: {exc}")
            # Books of other callers that returned before their slots were written.
            for book in {id(book): book for _, _, book in taken}.values():
                self._persist(book.finish)

    def _release_taken(
        self, instance: str, taken: list[tuple[Binding, list[PodInfo], RunBook]]
    ) -> None:
        due: dict[str, tuple[Binding, RunBook]] = {}
        for binding, pods, book in taken:
            book.count("checked")
            current = self._binding(binding.slot)
            if current is None or not any(self._names_pod(current, p) for p in pods):
                continue  # re-bound by an Allocate that came first: not this pod's now
            due.setdefault(current.slot, (current, book))
        if len(due) == 1:
            ((current, book),) = due.values()
            expected = wanted_value(current.slot, current.device_id, self.node)
            self._release(
                book, instance, current.slot, expected, f"pod {current.pod} is gone", current
            )
        elif due:
            self._release_together(instance, list(due.values()))

    def _release_together(self, instance: str, due: list[tuple[Binding, RunBook]]) -> None:
        """Release the slots of gone pods on one Instance in one conditional write (under the
        Instance's lock). Each slot keeps its own condition, event row and outcome, as
        ``_release`` gives it: a slot that changed meanwhile is left alone, the others freed."""
        expected, attributions = {}, {}
        for binding, book in due:
            expected[binding.slot] = wanted_value(binding.slot, binding.device_id, self.node)
            attributions[binding.slot] = cache.Attribution(
                SlotEvent.Cause.RECONCILE,
                self.claims.actor,
                node=self.node,
                pod=binding.pod,
                detail=f"pod {binding.pod} is gone",
                run=book,
            )
        try:
            outcomes = self.claims.release_many(instance, expected, attributions)
        except ClaimStoreError as exc:  # InstanceGone included: it concerns every slot alike
            outcomes = dict.fromkeys(expected, exc)
        for binding, book in due:
            why = attributions[binding.slot].detail
            self._released(book, binding.slot, outcomes[binding.slot], why, binding)

    def _names_pod(self, binding: Binding, pod: PodInfo) -> bool:
        if (binding.pod_namespace, binding.pod_name) != (pod.namespace, pod.name):
            return False
        if binding.pod_uid:
            return binding.pod_uid == pod.uid
        # No UID recorded: a pod of the same name that is alive now is a newer one.
        current = self.pods.get(pod.namespace, pod.name)
        return current is None or current.uid == pod.uid or current.terminated

    # --- passes -------------------------------------------------------------------------------
    def sweep(self, trigger: str = ReconcileRun.Trigger.SWEEP) -> ReconcileRun:
        """The level-based pass over every held slot, binding and device in use."""
        self.sweeps += 1
        run = self._pass(trigger, None, always=True)
        assert run is not None
        return run

    def reconcile_slots(self, slots: Iterable[str]) -> ReconcileRun | None:
        """A targeted pass (event trigger) over some slots; a row only if it changed something."""
        return self._pass(ReconcileRun.Trigger.EVENT, set(slots), always=False)

    def prune_runs(self) -> int:
        """Drop this node's uneventful runs past their retention (``agent.retention``)."""
        pruned = retention.prune_runs(node=self.node)
        if pruned:
            log.info("%s: pruned %d reconciliation runs past their retention", self.node, pruned)
        return pruned

    def learn(self) -> ReconcileRun | None:
        """Name the pods of unnamed bindings from PodResources (after Allocate)."""
        unnamed = [b for b in self.bindings() if not b.pod_known]
        self._learn_due = None
        if not unnamed:
            return None
        if not self._still_held(unnamed):
            # Every allocation waiting for its pod has lost its slot since (rolled back,
            # released by someone): no pod to name, no List to ask the kubelet for. The
            # bindings go once their grace is over; until then, look again (backing off).
            if any(self.clock() - b.allocated_at < self.grace for b in unnamed):
                self._schedule_learn()
            return None
        book = RunBook(self.node, ReconcileRun.Trigger.EVENT, self.clock(), always=False)
        listed_at = self.clock()
        try:
            uses = self.pod_resources.list()
        except PodResourcesUnavailable as exc:
            book.count("errors", f"kubelet PodResources unavailable: {exc}")
            snapshot = Snapshot(None, {}, [])
        else:
            if self._nothing_to_learn(unnamed, uses, listed_at):
                uses = None
            snapshot = self._resolve(listed_at, uses) if uses is not None else None
        run = None
        if snapshot is not None:
            only = {b.slot for b in unnamed}
            run = self._pass(book.trigger, only, always=False, book=book, snapshot=snapshot)
        still = [
            b
            for b in self.bindings()
            if not b.pod_known and self.clock() - b.allocated_at < self.grace
        ]
        if still:
            self._schedule_learn()
        return run

    def _still_held(self, bindings: list[Binding]) -> bool:
        """Whether the cache shows any of these bindings' slots held by this node."""
        return (
            Slot.objects.filter(
                instance__namespace=self.namespace,
                key__in=[b.slot for b in bindings],
                holder_node=self.node,
            )
            .only("pk")
            .exists()
        )

    def _nothing_to_learn(
        self, unnamed: list[Binding], uses: list[DeviceUse], listed_at: datetime
    ) -> bool:
        """Every unnamed binding is within its grace and the kubelet reports no device of
        their resources in use: the pass would keep them all, so it is skipped (it reads the
        cache, and learn passes poll every few milliseconds after a burst of Allocates)."""
        if any(listed_at >= b.allocated_at + self.grace for b in unnamed):
            return False
        resources = {b.resource_name for b in unnamed}
        return not any(use.resource_name in resources for use in uses)

    def _retry_targets(self, slots: set[str]) -> None:
        """A failed targeted pass is tried again after a pause (not at once: whatever failed
        is likely still failing); the sweep would get to them too, later."""
        timer = threading.Timer(TARGET_RETRY_SECONDS, self.request, args=(slots,))
        timer.daemon = True
        timer.start()

    def request(self, slots: Iterable[str]) -> None:
        """Ask the loop for a targeted pass over ``slots`` (any thread)."""
        with self._targets_guard:
            self._targets.update(slots)
        self._wake.set()

    def _pass(
        self,
        trigger: str,
        only: set[str] | None,
        *,
        always: bool,
        book: RunBook | None = None,
        snapshot: Snapshot | None = None,
    ) -> ReconcileRun | None:
        book = book or RunBook(self.node, trigger, self.clock(), always=always)
        if snapshot is None:
            snapshot = self._snapshot(book)
        rows = self._load_slots(only, snapshot)
        keys = set(rows) | {b.slot for b in self.bindings()} | set(snapshot.by_slot)
        if only is not None:
            keys &= only
        for use in snapshot.unmapped:
            book.note(
                f"{use.resource_name} device {use.device_id} in use by {use.namespace}/{use.pod} "
                "maps to no slot this node knows"
            )
        now = self.clock()
        work: dict[str, list[str]] = defaultdict(list)
        for key in sorted(keys):
            book.checked += 1
            binding = self._binding(key)
            row = rows.get(key)
            instance = binding.instance if binding else (row.instance if row else "")
            if not instance:
                continue
            decision = self._decide(key, row.value if row else None, binding, snapshot, now)
            if decision.act is not Act.KEEP:
                work[instance].append(key)
            elif binding is not None and row is not None and row.shown_pod != binding.pod_name:
                # The cache took a value change after we showed the pod: show it again.
                self._show_pod(instance, key, binding)
        self._run_grouped(work, lambda instance, keys: self._act_on(book, instance, keys, snapshot))
        return book.finish()

    def _run_grouped(
        self, work: dict[str, list[Any]], fn: Callable[[str, list[Any]], None]
    ) -> None:
        """Parallel across Instances (when there is a pool), serialized within one."""
        if self._group_pool is None or len(work) <= 1:
            for instance, keys in work.items():
                fn(instance, keys)
            return
        futures = [self._group_pool.submit(fn, instance, keys) for instance, keys in work.items()]
        for future in futures:
            future.result()

    def _act_on(self, book: RunBook, instance: str, keys: list[str], snapshot: Snapshot) -> None:
        with self._lock(instance):
            # Re-read under the lock: an Allocate may have re-bound a slot meanwhile. One
            # query for the Instance's slots, not one per slot: a sweep that learns every pod
            # acts on thousands of them.
            values = self._cached_values(instance, keys)
            for key in keys:
                binding = self._binding(key)
                value = values[key]
                decision = self._decide(key, value, binding, snapshot, self.clock())
                try:
                    self._act(
                        book, instance, key, value, decision, snapshot.by_slot.get(key), binding
                    )
                except Exception as exc:  # one slot's surprise must not stop the others
                    log.exception("%s: acting on %s failed", self.node, key)
                    book.count("errors", f"{key}: {exc}")

    def _decide(
        self,
        key: str,
        value: str | None,
        binding: Binding | None,
        snapshot: Snapshot,
        now: datetime,
    ) -> Decision:
        use = snapshot.by_slot.get(key)
        use_state = self._use_state(use) if use is not None else PodState.UNKNOWN
        bound_state = (
            self._bound_state(binding)
            if binding is not None and binding.pod_known
            else PodState.UNKNOWN
        )
        return decide(
            node=self.node,
            slot=key,
            value=value,
            binding=binding,
            use=use,
            use_state=use_state,
            bound_state=bound_state,
            listed_at=snapshot.listed_at,
            now=now,
            grace=self.grace,
        )

    # --- acting (under the Instance's lock) -------------------------------------------------
    def _act(
        self,
        book: RunBook,
        instance: str,
        key: str,
        value: str | None,
        decision: Decision,
        use: DeviceUse | None,
        binding: Binding | None,
    ) -> None:
        act = decision.act
        if act is Act.KEEP:
            return
        if act is Act.LEARN:
            self._learn(instance, key, use, binding)
        elif act is Act.ADOPT:
            self._adopt(instance, key, value or "")
        elif act is Act.FORGET:
            self._forget(key)
        elif act is Act.RELEASE:
            self._release(book, instance, key, value or "", decision.why, binding)
        elif act is Act.RESTORE:
            self._restore(book, instance, key, decision.why, use, binding)
        elif act is Act.CONFLICT:
            self._conflict(book, instance, key, value or "", decision.why, use, binding)

    def _release(
        self, book: RunBook, instance: str, key: str, value: str, why: str, binding: Binding | None
    ) -> None:
        pod = binding.pod if binding else ""
        try:
            result = self.claims.release(
                instance,
                key,
                value,
                cause=SlotEvent.Cause.RECONCILE,
                node=self.node,
                pod=pod,
                detail=why,
                run=book,  # its row written behind: see cache.RunSource
            )
        except (SlotChanged, ClaimStoreError) as exc:
            self._released(book, key, exc, why, binding)
            return
        self._released(book, key, result, why, binding)

    def _released(
        self,
        book: RunBook,
        key: str,
        outcome: str | Exception,
        why: str,
        binding: Binding | None,
    ) -> None:
        """The books after one slot's release, alone or in a folded write: "released",
        "already free", or what the claim store refused or failed with."""
        if isinstance(outcome, SlotChanged | InstanceGone):
            book.note(f"{key}: not released, {outcome}")
            self._forget(key)
        elif isinstance(outcome, ClaimStoreError):
            book.count("errors", f"{key}: release failed, will retry: {outcome}")
        else:
            self._forget(key)
            if outcome == "released":
                book.count("released", f"{key}: released ({why})")
                self._observe_latency(binding)

    def _restore(
        self,
        book: RunBook,
        instance: str,
        key: str,
        why: str,
        use: DeviceUse | None,
        binding: Binding | None,
    ) -> None:
        assert use is not None
        wanted = wanted_value(key, use.device_id, self.node)
        try:
            result = self.claims.claim(
                instance,
                key,
                wanted,
                cause=SlotEvent.Cause.RESTORE,
                node=self.node,
                pod=f"{use.namespace}/{use.pod}",
                detail=why,
                run=book.ensure_row(),
            )
        except SlotTaken as exc:
            self._conflict(book, instance, key, exc.holder, why, use, binding)
            return
        except InstanceGone:
            book.note(f"{key}: in use by {use.namespace}/{use.pod} but Instance {instance} is gone")
            return
        except UnknownSlot as exc:
            book.count("errors", f"{key}: cannot restore: {exc}")
            return
        except ClaimStoreError as exc:
            book.count("errors", f"{key}: restore failed, will retry: {exc}")
            return
        self._learn(instance, key, use, binding)
        if result == "claimed":
            book.count("restored", f"{key}: restored for {use.namespace}/{use.pod}")

    def _conflict(
        self,
        book: RunBook,
        instance: str,
        key: str,
        holder: str,
        why: str,
        use: DeviceUse | None,
        binding: Binding | None,
    ) -> None:
        pod = f"{use.namespace}/{use.pod}" if use else (binding.pod if binding else "")
        book.count("conflicts", f"{key}: conflict: {why}")
        if use is not None:
            self._learn(instance, key, use, binding, show=False)
        marker = (key, holder, pod)
        if marker in self._conflicts_reported:
            return  # shown once; counted in every run that still finds it
        self._conflicts_reported.add(marker)
        row = Instance.objects.filter(namespace=self.namespace, name=instance).first()
        if row is None:
            return
        cache.record_change(
            row,
            key,
            holder,
            holder,
            cache.Attribution(
                SlotEvent.Cause.CONFLICT,
                self.claims.actor,
                node=self.node,
                pod=pod,
                detail=f"{why}; left as it is",
                run=book.ensure_row(),
            ),
        )

    def _learn(
        self,
        instance: str,
        key: str,
        use: DeviceUse | None,
        binding: Binding | None,
        show: bool = True,
    ) -> None:
        assert use is not None
        info = self.pods.get(use.namespace, use.pod)
        uid = info.uid if info is not None and not info.terminated else ""
        base = binding or self._fresh_binding(instance, key, use.device_id, use.resource_name)
        learned = replace(
            base,
            device_id=use.device_id,
            resource_name=use.resource_name,
            pod_namespace=use.namespace,
            pod_name=use.pod,
            pod_uid=uid,
            container=use.container,
            seen_at=self.clock(),
        )
        self._save_binding(learned)
        if show:  # ours again: a conflict on this slot, if any, is over
            self._show_pod(instance, key, learned)
            self._conflicts_reported = {m for m in self._conflicts_reported if m[0] != key}

    def _adopt(self, instance: str, key: str, value: str) -> None:
        usage = parse_usage(value)
        if usage.kind is UsageKind.CONFIG:
            config = (
                Instance.objects.filter(namespace=self.namespace, name=instance)
                .values_list("configuration_name", flat=True)
                .first()
            )
            binding = self._fresh_binding(instance, key, usage.vdev, cl_resource_name(config or ""))
        else:
            binding = self._fresh_binding(instance, key, key, il_resource_name(instance))
        self._save_binding(binding)
        self._schedule_learn()

    def _fresh_binding(
        self, instance: str, key: str, device_id: str, resource_name: str
    ) -> Binding:
        return Binding(
            slot=key,
            instance=instance,
            device_id=device_id,
            resource_name=resource_name,
            allocated_at=self.clock(),
        )

    def _observe_latency(self, binding: Binding | None) -> None:
        if binding is None or not binding.pod_known:
            return
        gone = self.pods.gone_at(binding.pod_namespace, binding.pod_name, binding.pod_uid)
        if gone is not None:
            seconds = time.monotonic() - gone
            metrics.RELEASE_LATENCY_SECONDS.observe(seconds)
            # The chart's history (agent.usage), behind: on the release path, under the
            # Instance's lock, each row waited for the database (a storm of 1,000 releases
            # spent most of its time there), and a failed write must not fail the release.
            self._persist(usage.record_release, self.node, seconds, timezone.now())

    # --- facts ----------------------------------------------------------------------------------
    def _snapshot(self, book: RunBook) -> Snapshot:
        listed_at = self.clock()
        try:
            uses = self.pod_resources.list()
        except PodResourcesUnavailable as exc:
            book.count("errors", f"kubelet PodResources unavailable: {exc}")
            return Snapshot(None, {}, [])
        return self._resolve(listed_at, uses)

    def _resolve(self, listed_at: datetime, uses: list[DeviceUse]) -> Snapshot:
        """Map device uses to slot keys: IL ids are slot keys of the Instance the resource
        names; a CL vdev is the slot whose value is ``C:<vdev>:<node>``, else the one bound."""
        instances = dict(
            Instance.objects.filter(namespace=self.namespace).values_list(
                "name", "configuration_name"
            )
        )
        cl_slots: dict[tuple[str, str], str] = {}
        held = Slot.objects.filter(
            instance__namespace=self.namespace, holder_node=self.node, level=Slot.Level.CL
        ).values_list("instance__configuration_name", "vdev", "key")
        for config, vdev, key in held:
            cl_slots.setdefault((config, vdev), key)
        by_device = {(b.resource_name, b.device_id): b.slot for b in self.bindings()}
        by_slot: dict[str, DeviceUse] = {}
        unmapped: list[DeviceUse] = []
        for use in uses:
            target = use.resource_name[len(RESOURCE_PREFIX) :]
            if target in instances and slot_index(target, use.device_id) is not None:
                key = use.device_id
            else:
                key = cl_slots.get((target, use.device_id)) or by_device.get(
                    (use.resource_name, use.device_id)
                )
            if key is None:
                unmapped.append(use)
            else:
                by_slot[key] = use
        return Snapshot(listed_at, by_slot, unmapped)

    def _load_slots(self, only: set[str] | None, snapshot: Snapshot) -> dict[str, SlotRow]:
        """Cached slots this node holds, is bound to, or sees in use; ``only`` narrows it."""
        rows = Slot.objects.filter(instance__namespace=self.namespace)
        if only is not None:
            rows = rows.filter(key__in=only)
        else:
            wanted = {b.slot for b in self.bindings()} | set(snapshot.by_slot)
            rows = rows.filter(Q(holder_node=self.node) | Q(key__in=wanted))
        return {
            key: SlotRow(instance, value, pod)
            for key, value, instance, pod in rows.values_list(
                "key", "value", "instance__name", "pod_name"
            )
        }

    def _cached_values(self, instance: str, keys: list[str]) -> dict[str, str | None]:
        """The slots' values as freshly as this process knows them: the cache, or the claim
        store's answer to our own last write when that is newer (the cache takes it
        asynchronously, behind the watch). None for a slot the cache does not have."""
        rows = {
            key: (value, rv)
            for key, value, rv in Slot.objects.filter(
                instance__namespace=self.namespace, instance__name=instance, key__in=keys
            ).values_list("key", "value", "instance__resource_version")
        }
        seen = getattr(self.claims, "last_seen", {}).get(instance)
        seen_rv = str(((seen or {}).get("metadata") or {}).get("resourceVersion") or "")
        state = InstanceState.from_object(seen) if seen is not None else None
        values: dict[str, str | None] = {}
        for key in keys:
            row = rows.get(key)
            if state is not None and (row is None or is_older(row[1], seen_rv)):
                view = state.view(key)
                values[key] = view.usage.raw if view is not None else None
            else:
                values[key] = row[0] if row is not None else None
        return values

    def _use_state(self, use: DeviceUse) -> PodState:
        info = self.pods.get(use.namespace, use.pod)
        if info is None:
            info = self._read_pod(use.namespace, use.pod)
            if info is _UNREADABLE:
                return PodState.UNKNOWN
            if info is None:
                return PodState.GONE if self.pods.synced or self.read_pods else PodState.UNKNOWN
        return PodState.GONE if info.terminated else PodState.ALIVE

    def _bound_state(self, binding: Binding, allow_read: bool = True) -> PodState:
        info = self.pods.get(binding.pod_namespace, binding.pod_name)
        if info is None:
            if (
                self.pods.gone_at(binding.pod_namespace, binding.pod_name, binding.pod_uid)
                is not None
            ):
                return PodState.GONE
            if not allow_read:
                return PodState.GONE if self.pods.synced else PodState.UNKNOWN
            info = self._read_pod(binding.pod_namespace, binding.pod_name)
            if info is _UNREADABLE:
                return PodState.UNKNOWN
            if info is None:
                return PodState.GONE if self.pods.synced or self.read_pods else PodState.UNKNOWN
        if binding.pod_uid and info.uid and binding.pod_uid != info.uid:
            return PodState.GONE  # a newer pod of the same name
        return PodState.GONE if info.terminated else PodState.ALIVE

    def _read_pod(self, namespace: str, name: str) -> PodInfo | None | object:
        """The pod from the API server: None when it does not exist, _UNREADABLE on errors.
        Without reads the index is taken as complete."""
        if not self.read_pods or self._core is None:
            return None
        try:
            pod = self._core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            return None if exc.status == 404 else _UNREADABLE
        except (HTTPError, OSError):
            return _UNREADABLE
        return PodInfo.from_object(pod)

    # --- bindings (memory mirror of SlotPodBinding) -----------------------------------------
    def _load_bindings(self) -> None:
        rows = SlotPodBinding.objects.filter(node=self.node, namespace=self.namespace)
        with self._bindings_guard:
            self._bindings = {
                row.slot: Binding(
                    slot=row.slot,
                    instance=row.instance,
                    device_id=row.device_id,
                    resource_name=row.resource_name,
                    allocated_at=row.allocated_at,
                    pod_namespace=row.pod_namespace,
                    pod_name=row.pod_name,
                    pod_uid=row.pod_uid,
                    container=row.container,
                    seen_at=row.seen_at,
                )
                for row in rows
            }

    def bindings(self) -> list[Binding]:
        with self._bindings_guard:
            return list(self._bindings.values())

    def _binding(self, slot: str) -> Binding | None:
        with self._bindings_guard:
            return self._bindings.get(slot)

    def _to_publish(self, before: PodInfo | None, after: PodInfo) -> bool:
        """A pod new to the index, or whose annotations the publisher reads changed, that
        carries some of them or that a binding names (most pods have nothing to be told)."""
        if before is not None and (before.uid, before.notes) == (after.uid, after.notes):
            return False
        if after.notes:
            return True
        with self._bindings_guard:
            return any(
                (b.pod_namespace, b.pod_name) == (after.namespace, after.name)
                for b in self._bindings.values()
            )

    def _has_unnamed(self) -> bool:
        with self._bindings_guard:
            return any(not b.pod_known for b in self._bindings.values())

    def _save_binding(self, binding: Binding) -> None:
        with self._bindings_guard:
            before = self._bindings.get(binding.slot)
            self._bindings[binding.slot] = binding
        self._persist(self._write_binding, binding)
        if binding.pod_known or (before is not None and before.pod_known):
            self._publish_soon()

    def _forget(self, slot: str) -> None:
        with self._bindings_guard:
            before = self._bindings.pop(slot, None)
        self._persist(self._delete_binding, slot)
        if before is not None and before.pod_known:
            self._publish_soon()

    def _write_binding(self, binding: Binding) -> None:
        fields = {
            "instance": binding.instance,
            "namespace": self.namespace,
            "device_id": binding.device_id,
            "resource_name": binding.resource_name,
            "pod_namespace": binding.pod_namespace,
            "pod_name": binding.pod_name,
            "pod_uid": binding.pod_uid,
            "container": binding.container,
            "allocated_at": binding.allocated_at,
            "seen_at": binding.seen_at,
        }
        # One statement when the row exists (the usual case: a slot is re-bound); this
        # thread is the map's only writer, so nothing can insert the row in between.
        rows = SlotPodBinding.objects.filter(node=self.node, slot=binding.slot)
        if not rows.update(**fields):
            SlotPodBinding.objects.create(node=self.node, slot=binding.slot, **fields)

    def _delete_binding(self, slot: str) -> None:
        SlotPodBinding.objects.filter(node=self.node, slot=slot).delete()

    def _delete_bindings(self, slots: list[str]) -> None:
        SlotPodBinding.objects.filter(node=self.node, slot__in=slots).delete()

    def _show_pod(self, instance: str, key: str, binding: Binding | None) -> None:
        """Keep the dashboard's Slot.pod_* in step with the map."""
        self._persist(self._write_shown_pod, instance, key, binding)

    def _write_shown_pod(self, instance: str, key: str, binding: Binding | None) -> None:
        Slot.objects.filter(
            instance__namespace=self.namespace, instance__name=instance, key=key
        ).update(
            pod_namespace=binding.pod_namespace if binding else "",
            pod_name=binding.pod_name if binding else "",
            pod_uid=binding.pod_uid if binding else "",
            container=binding.container if binding else "",
        )

    # --- write-behind -----------------------------------------------------------------------------
    def _persist(self, fn: Callable[..., Any], *args: Any) -> None:
        """Database bookkeeping off the release path, in order. The in-memory map decides;
        the rows let a restarted agent resume. A crash before a write lands only leaves a
        binding to a gone pod (released again: "already free") or a claim without one
        (adopted, with grace): both safe."""
        if self._writes is None:
            fn(*args)
        else:
            self._writes.put((fn, args))

    def _write_behind(self) -> None:
        assert self._writes is not None
        try:
            while True:
                batch = [self._writes.get()]
                FOREGROUND.wait_idle()  # rows can wait for an Allocate's answer to leave
                # Whatever queued meanwhile joins them, up to a size that keeps the
                # database's write lock from others (the cache applier) only briefly.
                while batch[-1] is not None and len(batch) < WRITE_BATCH:
                    try:
                        batch.append(self._writes.get_nowait())
                    except queue.Empty:
                        break
                self._write_batch([item for item in batch if item is not None])
                if batch[-1] is None:
                    return
        finally:
            connections.close_all()

    def _write_batch(self, batch: list[tuple[Any, tuple]]) -> None:
        """One transaction for the batch: on SQLite each one queues for the database's
        write lock (behind the cache applier, say) and a busy wait sleeps in whole
        milliseconds. A savepoint per write keeps one bad row from undoing the others; a
        database error (locked, gone) undoes the batch, which is written again with backoff
        until it lands or the reconciler stops. Flush marks are set once it is committed."""
        marks: list[threading.Event] = [args[0] for fn, args in batch if fn is _FLUSH]
        delay = WRITE_RETRY_FIRST
        try:
            while True:
                try:
                    self._rows_first(batch)
                    self._write_once(batch)
                    return
                except (OperationalError, InterfaceError) as exc:
                    log.warning(
                        "%s: persisting %d writes failed (%s); retrying in %.2fs",
                        self.node,
                        len(batch),
                        exc,
                        delay,
                    )
                    connections.close_all()  # a connection the error broke is not reused
                    if self._stopping.wait(delay):
                        return
                    delay = min(WRITE_RETRY_MAX, delay * 2)
        except Exception:  # anything else would end the writer: log it and go on
            log.exception("%s: persisting %d writes failed", self.node, len(batch))
        finally:
            for mark in marks:
                mark.set()

    @staticmethod
    def _rows_first(batch: list[tuple[Any, tuple]]) -> None:
        """The run rows the batch's ``finish`` calls need, written before its transaction: the
        cache applier may be writing one of them (``cache.RunSource``) under the run's lock
        while waiting for the database's write lock, which the transaction would hold while
        waiting for the run's lock."""
        for fn, _ in batch:
            book = getattr(fn, "__self__", None)
            if isinstance(book, RunBook):
                book.ensure_row()

    def _write_once(self, batch: list[tuple[Any, tuple]]) -> None:
        with transaction.atomic():
            for fn, args in self._coalesced(batch):
                try:
                    with transaction.atomic():
                        fn(*args)
                except (OperationalError, InterfaceError):
                    raise  # the database, not this row: the whole batch again, later
                except Exception:
                    # One row's problem (it contradicts another, say): logged, the rest go on.
                    log.exception("%s: persisting %s failed", self.node, fn.__name__)

    def _coalesced(self, batch: list[tuple[Any, tuple]]) -> list[tuple[Any, tuple]]:
        """The batch's writes with the repeated ones folded. Each release queues a binding's
        deletion, its latency's sample and its run's ``finish``: a statement and a savepoint
        each, which in a storm of releases were about a third of the agents' interpreter time.

        - A run's ``finish`` is kept once, where its last one was: it writes the counts as
          they are when it runs, so the earlier ones only wrote what the last writes again.
        - The release latencies of a node's minute go in one ``record_releases``, where the
          last one was (their table has nothing else in the batch to keep order with).
        - Binding deletions that follow each other go in one statement; a binding written in
          between keeps its place, so a slot's rows change in the order they were queued.
        """
        # What each item is, once: ("finish", its run) or ("sample", its node and minute).
        kinds: list[tuple[str, Any] | None] = []
        last: dict[tuple[str, Any], int] = {}  # kind -> index of its last item
        samples: dict[Any, list[float]] = defaultdict(list)
        for i, (fn, args) in enumerate(batch):
            kind = None
            if getattr(fn, "__func__", None) is RunBook.finish:
                kind = ("finish", id(fn.__self__))
            elif fn is usage.record_release and (key := _sample_key(args)) is not None:
                kind = ("sample", key)
                samples[key].append(args[1])
            kinds.append(kind)
            if kind is not None:
                last[kind] = i
        out: list[tuple[Any, tuple]] = []
        deletes: list[str] = []
        for i, ((fn, args), kind) in enumerate(zip(batch, kinds, strict=True)):
            if fn is _FLUSH or (kind is not None and last[kind] != i):
                continue
            if fn == self._delete_binding:
                deletes.append(args[0])
                continue
            if kind is not None and kind[0] == "sample":
                fn, args = usage.record_releases, (args[0], samples[kind[1]], args[2])
            elif fn == self._write_binding and deletes:
                out.append((self._delete_bindings, (deletes,)))
                deletes = []
            out.append((fn, args))
        if deletes:
            out.append((self._delete_bindings, (deletes,)))
        return out

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued database write has landed (tests, benchmarks)."""
        if self._writes is None:
            return True
        done = threading.Event()
        self._writes.put((_FLUSH, (done,)))
        return done.wait(timeout)

    # --- scheduling -----------------------------------------------------------------------------
    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._executor is None:
            fn(*args)
            return
        future = self._executor.submit(fn, *args)
        future.add_done_callback(self._report_failure)

    def _report_failure(self, future: Any) -> None:
        exc = future.exception()
        if exc is not None:
            log.error("%s: reconcile handler failed: %r", self.node, exc, exc_info=exc)

    def _schedule_learn(self, reset: bool = False) -> None:
        """A learn pass soon after an Allocate, then backing off while pods stay unnamed."""
        with self._targets_guard:
            if reset:
                self._learn_delay = LEARN_FIRST_DELAY
            else:
                self._learn_delay = min(self._learn_delay * 2, LEARN_MAX_DELAY)
            due = time.monotonic() + self._learn_delay
            if self._learn_due is None or due < self._learn_due:
                self._learn_due = due
        self._wake.set()

    def _publish_soon(self, delay: float = PUBLISH_DELAY) -> None:
        """A publish pass (``publish``) soon: the books or a pod's annotations changed."""
        if self.publisher is None:
            return
        with self._targets_guard:
            due = time.monotonic() + delay
            if self._publish_due is None or due < self._publish_due:
                self._publish_due = due
        self._wake.set()

    def _run_publish(self) -> None:
        """One publish pass from the loop; one that could not write everything is tried
        again later, backing off (a pod changed meanwhile, the API server away)."""
        with self._targets_guard:
            self._publish_due = None
        outcome: list[bool] = []

        def publish() -> None:
            outcome.append(self.publish())

        self._guarded(publish)
        if outcome and outcome[0]:
            self._publish_retry = PUBLISH_RETRY_FIRST
            if self.publisher is not None and self.publisher.deferred:
                self._publish_soon(PUBLISH_DEFER)
            return
        delay = self._publish_retry
        self._publish_retry = min(delay * 2, PUBLISH_RETRY_MAX)
        self._publish_soon(delay)

    def publish(self) -> bool:
        """Write on this node's pods what each holds (and the extender's assignments as
        admitted), from the bindings; True when every write needed went through."""
        if self.publisher is None:
            return True
        ok = True
        for change in self.publisher.plan(self.pods.all(), self.bindings()):
            try:
                written = self.publisher.write(change)
            except (ApiException, HTTPError, OSError) as exc:
                status = getattr(exc, "status", None)
                log.info(
                    "%s: annotating pod %s/%s failed (%s); trying again",
                    self.node,
                    change.namespace,
                    change.name,
                    status or exc,
                )
                ok = False
                continue
            if written is not None:
                self.pods.refresh(written)
        return ok

    def on_instance_changed(self, kind: str, name: str, obj: dict[str, Any] | None) -> None:
        """Cache-sync subscriber: a slot bound to a live pod here that deviceUsage no longer
        shows as ours gets a targeted pass (restore, or a conflict) without waiting a sweep."""
        if kind != "instance" or not name or obj is None:
            return
        usage = (obj.get("spec") or {}).get("deviceUsage") or {}
        lost = [
            b.slot
            for b in self.bindings()
            if b.instance == name
            and b.pod_known
            and not parse_usage(usage.get(b.slot)).held_by(self.node)
        ]
        if lost:
            self.request(lost)


_UNREADABLE = object()


def _sample_key(args: tuple) -> tuple[str, int] | None:
    """The node and minute of a queued ``usage.record_release(node, seconds, now)``; None for
    one queued without its time (written as it is, not folded)."""
    if len(args) != 3 or not isinstance(args[2], datetime):
        return None
    return args[0], usage.minute_of(args[2])


_FLUSH = object()  # queued by ``flush``: a mark in the write-behind queue, not a write


def reconciler_for(agent: Any) -> NodeReconciler:
    """The ``reconciler_factory`` of ``NodeAgent``: releases go through the agent's claim
    store, so its plugins re-send their device lists the moment a slot frees."""
    socket = agent.pod_resources_socket or settings.AKRI["POD_RESOURCES_SOCKET"]
    return NodeReconciler(
        node=agent.node_name,
        namespace=agent.namespace,
        pod_resources=PodResourcesClient(socket),
        claims=agent.claims,
        api_client=agent.api_client,
        sync=agent.sync,
        assignments=agent.assignments,
    )
