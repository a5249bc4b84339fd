"""Cluster-wide reconciliation, run by Celery: what no node agent can clean up itself.

- A node deleted, or NotReady for longer than ``NODE_GONE_GRACE_SECONDS``, has its slots freed
  (conditional writes, cause ``node_gone``) and leaves every Instance's ``spec.nodes``; on an
  Instance being deleted, its finalizer for that node goes too (no agent is left to remove it).
  Akri's controller does the same on NotReady at once; a grace rides out a kubelet hiccup. If
  the node comes back with pods running, its agent claims their slots back (or reports a
  conflict): nothing here steals from a live node.
- Instances whose Configuration is gone are deleted (with a resourceVersion precondition).
  Instances are listed before Configurations, so an Instance cannot look orphaned because its
  Configuration was created after the list.
- ``deviceUsage`` values in no format we know, and keys that are not slot keys, are reported in
  the run's detail, never touched.

Every write is conditional and every step re-reads on conflict, so a pass may run twice or
after a crash. Overlapping passes are prevented by a lock (Redis when the broker is Redis, a
process lock in the embedded default); a pass that finds the lock taken does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent import metrics
from agent.domain.jsonpatch import pointer
from agent.domain.slots import InstanceState, UsageKind, stray_keys
from agent.kube import cache
from agent.kube.claims import ClaimStore, ClaimStoreError, InstanceGone, SlotChanged
from agent.kube.client import AkriApi, new_api_client, status_of
from agent.models import Node, ReconcileRun, SlotEvent

log = logging.getLogger(__name__)

ACTOR = "cluster-reconciler"
LOCK_SECONDS = 300  # a crashed pass holds the lock at most this long
ATTEMPTS = 5
DETAIL_LINES = 80

_local_locks: dict[str, threading.Lock] = {}
_local_guard = threading.Lock()


@dataclass(frozen=True)
class NodeFacts:
    name: str
    ready: bool
    since: datetime | None  # when the Ready condition last changed


NEVER_A_NODE = "was never a node of this cluster"


def node_gone(
    facts: NodeFacts | None, now: datetime, grace: timedelta, *, known: bool = True
) -> str:
    """Why a node counts as gone, or "" when it does not. Pure.

    Deleted (absent from the Node list) counts at once; NotReady only beyond the grace, and a
    NotReady without a transition time is never old enough to count. A name absent from the
    Node list that the cluster never knew (no Node seen, in no Instance's ``spec.nodes``) was
    not deleted: it is a value someone wrote, and the history must not say otherwise.
    """
    if facts is None:
        return "deleted" if known else NEVER_A_NODE
    if facts.ready or facts.since is None:
        return ""
    if now - facts.since >= grace:
        return f"NotReady since {facts.since:%Y-%m-%d %H:%M:%S}"
    return ""


@dataclass
class ClusterBook:
    """Counts and detail of one cluster pass."""

    row: ReconcileRun
    t0: float = field(default_factory=time.perf_counter)
    checked: int = 0
    released: int = 0
    conflicts: int = 0
    errors: int = 0
    foreign: int = 0
    lines: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.lines.append(line)

    def finish(self) -> ReconcileRun:
        if self.foreign:
            self.lines.insert(0, f"{self.foreign} foreign deviceUsage entries reported")
        fields = {
            "duration_ms": (time.perf_counter() - self.t0) * 1000,
            "checked": self.checked,
            "released": self.released,
            "conflicts": self.conflicts,
            "errors": self.errors,
            "detail": ReconcileRun.detail_of(self.lines, DETAIL_LINES),
        }
        ReconcileRun.objects.filter(pk=self.row.pk).update(**fields)
        for name, value in fields.items():
            setattr(self.row, name, value)
        metrics.RECONCILE_RUNS.labels("cluster", self.row.trigger).inc()
        for result, n in (
            ("released", self.released),
            ("conflict", self.conflicts),
            ("error", self.errors),
        ):
            if n:
                metrics.RECONCILE_SLOTS.labels("cluster", result).inc(n)
        return self.row


# --- locking ----------------------------------------------------------------------------------
@contextlib.contextmanager
def pass_lock(name: str, redis_url: str = "") -> Iterator[bool]:
    """Yield True when this caller holds the lock ``name``, False when another pass does."""
    if redis_url.startswith(("redis://", "rediss://", "unix://")):
        import redis

        conn = redis.Redis.from_url(redis_url)
        lock = conn.lock(f"akri-site:lock:{name}", timeout=LOCK_SECONDS, blocking=False)
        got = lock.acquire()
        try:
            yield bool(got)
        finally:
            if got:
                with contextlib.suppress(Exception):  # expired meanwhile: nothing to release
                    lock.release()
            conn.close()
        return
    with _local_guard:
        lock = _local_locks.setdefault(name, threading.Lock())
    got = lock.acquire(blocking=False)
    try:
        yield got
    finally:
        if got:
            lock.release()


# --- the pass -------------------------------------------------------------------------------
def run_cluster_pass(
    namespace: str | None = None,
    *,
    trigger: str = ReconcileRun.Trigger.SCHEDULE,
    api_client: client.ApiClient | None = None,
    lock_url: str = "",
    task_id: str = "",
    now: datetime | None = None,
    grace: float | None = None,
) -> ReconcileRun | None:
    """One cluster-wide pass over ``namespace``; None when another pass holds the lock."""
    namespace = namespace or settings.AKRI["NAMESPACE"]
    with pass_lock(f"reconcile-cluster:{namespace}", lock_url) as got:
        if not got:
            log.info("cluster reconciliation of %s already running; skipped", namespace)
            return None
        own_client = api_client is None
        api_client = api_client or new_api_client()
        try:
            return _run(namespace, trigger, api_client, task_id, now, grace)
        finally:
            if own_client:
                api_client.close()


def _run(
    namespace: str,
    trigger: str,
    api_client: client.ApiClient,
    task_id: str,
    now: datetime | None,
    grace: float | None,
) -> ReconcileRun:
    now = now or timezone.now()
    grace_td = timedelta(
        seconds=settings.AKRI["NODE_GONE_GRACE_SECONDS"] if grace is None else grace
    )
    row = ReconcileRun.objects.create(
        scope=ReconcileRun.Scope.CLUSTER, trigger=trigger, started_at=now, task_id=task_id
    )
    book = ClusterBook(row)
    api = AkriApi(api_client, namespace)
    try:
        # Instances first: see the module docstring.
        instances = api.list_instances().get("items") or []
        configurations = {
            c["metadata"]["name"] for c in api.list_configurations().get("items") or []
        }
        nodes = list_nodes(api_client, now)
    except (ApiException, HTTPError, OSError) as exc:
        book.errors += 1
        book.note(f"cannot read the cluster now, will retry: {_describe(exc)}")
        return book.finish()
    store = ClaimStore(api, ACTOR)
    named = set(nodes).union(*(_nodes_named(obj) for obj in instances))
    known = known_nodes(instances, named)
    gone = {
        name: why
        for name in named
        if (why := node_gone(nodes.get(name), now, grace_td, known=name in known))
    }
    for name, why in sorted(gone.items()):
        book.note(f"node {name} gone ({why})" if why != NEVER_A_NODE else f"{name!r} {why}")
    for obj in instances:
        try:
            _reconcile_instance(api, store, book, obj, configurations, gone)
        except (ApiException, HTTPError, OSError, ClaimStoreError) as exc:
            book.errors += 1
            book.note(f"{obj['metadata']['name']}: {_describe(exc)}; will retry")
    return book.finish()


def known_nodes(instances: list[dict[str, Any]], names: set[str]) -> set[str]:
    """Which of ``names`` the cluster has known as nodes: a Node mirrored in the cache (deleted
    ones too) or a node an agent put in some Instance's ``spec.nodes``."""
    known = set(Node.objects.filter(name__in=names).values_list("name", flat=True))
    for obj in instances:
        known.update(InstanceState.from_object(obj).nodes)
    return known & names


def list_nodes(api_client: client.ApiClient, now: datetime) -> dict[str, NodeFacts]:
    """Every Node's readiness from the API server; a NotReady node without a transition time
    gets one from the cache (first seen NotReady), so its grace can run out."""
    answer = client.CoreV1Api(api_client).list_node()
    facts: dict[str, NodeFacts] = {}
    for node in api_client.sanitize_for_serialization(answer).get("items") or []:
        name = node["metadata"]["name"]
        ready = next(
            (
                c
                for c in (node.get("status") or {}).get("conditions") or []
                if c.get("type") == "Ready"
            ),
            None,
        )
        is_ready = bool(ready and ready.get("status") == "True")
        since = (
            parse_datetime(ready["lastTransitionTime"])
            if ready and ready.get("lastTransitionTime")
            else None
        )
        if not is_ready and since is None:
            since = _first_seen_not_ready(name, now)
        facts[name] = NodeFacts(name, is_ready, since)
    return facts


def _first_seen_not_ready(name: str, now: datetime) -> datetime:
    row, _ = Node.objects.get_or_create(name=name)
    if row.not_ready_since is None:
        Node.objects.filter(pk=row.pk, not_ready_since__isnull=True).update(
            not_ready_since=now, ready=False
        )
        row.refresh_from_db()
    return row.not_ready_since or now


def _nodes_named(obj: dict[str, Any]) -> set[str]:
    """Nodes an Instance names in spec.nodes or as slot holders. Finalizers are not read as
    node names: only a finalizer equal to a node known to be gone is ever removed."""
    state = InstanceState.from_object(obj)
    names = set(state.nodes)
    names.update(
        v.usage.node for v in state.views() if v.usage.kind in (UsageKind.NODE, UsageKind.CONFIG)
    )
    return names


def _reconcile_instance(
    api: AkriApi,
    store: ClaimStore,
    book: ClusterBook,
    obj: dict[str, Any],
    configurations: set[str],
    gone: dict[str, str],
) -> None:
    name = obj["metadata"]["name"]
    state = InstanceState.from_object(obj)
    book.checked += len(state.views())
    _report_foreign(book, name, state)
    if state.configuration not in configurations:
        _delete_orphan(api, book, obj)
        return
    for view in state.views():
        holder = view.usage.node
        if view.usage.kind in (UsageKind.NODE, UsageKind.CONFIG) and holder in gone:
            _free(store, book, name, view.key, view.usage.raw, holder, gone[holder], obj)
    finalizers = (
        set(obj["metadata"].get("finalizers") or [])
        if obj["metadata"].get("deletionTimestamp")
        else set()
    )
    for node in sorted(n for n in _nodes_named(obj) | finalizers if n in gone):
        _leave(api, book, name, node)


def _free(
    store: ClaimStore,
    book: ClusterBook,
    instance: str,
    key: str,
    value: str,
    node: str,
    why: str,
    obj: dict[str, Any],
) -> None:
    try:
        result = store.release(
            instance,
            key,
            value,
            cause=SlotEvent.Cause.NODE_GONE,
            node=node,
            detail=f"node {node} {why}",
            run=book.row,
            current=obj,
        )
    except SlotChanged as exc:
        book.note(f"{instance}/{key}: not freed, {exc}")  # someone else moved first: fine
        return
    except InstanceGone:
        return
    if result == "released":
        book.released += 1
        book.note(f"{instance}/{key}: freed from {node}")


def _leave(api: AkriApi, book: ClusterBook, instance: str, node: str) -> None:
    """Take ``node`` out of spec.nodes and (when deleting) metadata.finalizers, conditionally."""
    for _ in range(ATTEMPTS):
        try:
            obj = api.get_instance(instance)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        ops = _leave_ops(obj, node)
        if not ops:
            return
        try:
            answer = api.patch_instance(instance, ops)
        except ApiException as exc:
            if exc.status in (409, 422):
                continue  # changed under us: re-read and decide again
            if exc.status == 404:
                return
            raise
        with contextlib.suppress(Exception):  # the write stands; the watch brings the cache
            cache.apply_instance(answer, direct=True)
        book.note(f"{instance}: node {node} removed")
        return
    book.errors += 1
    book.note(f"{instance}: removing node {node} kept conflicting; will retry")


def _leave_ops(obj: dict[str, Any], node: str) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    nodes = (obj.get("spec") or {}).get("nodes")
    if nodes and node in nodes:
        path = pointer("spec", "nodes")
        ops += [
            {"op": "test", "path": path, "value": nodes},
            {"op": "replace", "path": path, "value": [n for n in nodes if n != node]},
        ]
    meta = obj["metadata"]
    finalizers = meta.get("finalizers") or []
    if meta.get("deletionTimestamp") and node in finalizers:
        path = pointer("metadata", "finalizers")
        ops += [
            {"op": "test", "path": path, "value": finalizers},
            {"op": "replace", "path": path, "value": [f for f in finalizers if f != node]},
        ]
    return ops


def _delete_orphan(api: AkriApi, book: ClusterBook, obj: dict[str, Any]) -> None:
    name = obj["metadata"]["name"]
    if obj["metadata"].get("deletionTimestamp"):
        return  # already going; its finalizers are for the agents (or _leave) to remove
    try:
        api.delete_instance(name, resource_version=obj["metadata"].get("resourceVersion"))
    except ApiException as exc:
        if exc.status in (404, 409):
            return  # gone already, or changed: the next pass decides again
        raise
    cache.remove_instance(api.namespace, name)
    config = obj.get("spec", {}).get("configurationName", "")
    book.note(f"{name}: deleted, its Configuration {config} is gone")


def _report_foreign(book: ClusterBook, name: str, state: InstanceState) -> None:
    foreign = [
        f"{v.key}={v.usage.raw!r}" for v in state.views() if v.usage.kind is UsageKind.FOREIGN
    ]
    stray = [f"{k}={v!r}" for k, v in stray_keys(name, state.device_usage).items()]
    if foreign:
        book.note(f"{name}: foreign deviceUsage values, left alone: {', '.join(foreign)}")
    if stray:
        book.note(f"{name}: keys that are not slots, left alone: {', '.join(stray)}")
    book.foreign += len(foreign) + len(stray)
    if foreign or stray:
        metrics.RECONCILE_SLOTS.labels("cluster", "foreign").inc(len(foreign) + len(stray))


def _describe(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        code, reason, message = status_of(exc)
        return f"{code} {reason} {message}".strip()
    return str(exc) or type(exc).__name__
