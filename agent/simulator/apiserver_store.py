"""Object store, event log and watch fan-out of the API-server simulator.

The store knows nothing about HTTP: the server module parses requests and calls `Store` methods,
which either return objects or raise `ApiError` carrying the Status the real server would send.

Concurrency: one lock (`Store.lock`) guards every object, the resourceVersion counter, the event
log and the watcher registry. Stored objects are treated as immutable once committed (writes
build a new dict and share unchanged subtrees), so readers can serialize them after the lock is
released without copying. Each watcher has its own unbounded queue, filled under the lock by the
writer, so a slow watcher never loses events; it drains its queue and writes to its socket
outside the lock. Draining does not take the store lock: at 50 nodes each pod event used to wake
a hundred node-filtered watches (agents, kubelets) that all queued on that one lock, competing
with the writers, to learn that the event was not theirs. A watch with a selector hands the
store its filter, so only the watches an event concerns are woken; a pod watch of one node is
indexed by that node (``node_trigger``), so the others' filters are not even tried.

The event log is one global deque of the last `history_limit` events. Every committed write
takes exactly one resourceVersion and appends exactly one event, so the retained versions are
contiguous and a resume point maps to a deque index.
"""

from __future__ import annotations

import base64
import bisect
import copy
import itertools
import json
import random
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.simulator import quantity
from agent.simulator.apiserver_schema import CrdSchema
from agent.simulator.apiserver_select import (
    FieldRequirement,
    Requirement,
    field_value,
    fields_match,
    labels_match,
)

CRD_GROUP = "apiextensions.k8s.io"
CRD_KEY = (CRD_GROUP, "customresourcedefinitions")
PODS_KEY = ("", "pods")
NAMESPACES_KEY = ("", "namespaces")
NAME_LABEL = "kubernetes.io/metadata.name"
# The namespaces a real API server creates for itself at start-up.
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
# A pod's grace period when neither the delete nor spec.terminationGracePeriodSeconds sets one.
DEFAULT_POD_GRACE_SECONDS = 30

OPTIMISTIC_LOCK_MSG = (
    "the object has been modified; please apply your changes to the latest version and try again"
)

_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_1123_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_1035_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

# Pod spec fields a real API server lets an update change (PodSpec validation).
_POD_MUTABLE_SPEC = (
    "activeDeadlineSeconds",
    "tolerations",
    "schedulingGates",
    "terminationGracePeriodSeconds",
)


class ApiError(Exception):
    """An error response: HTTP `code` with a Kubernetes Status body."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


@dataclass
class ResourceType:
    """One served resource (a built-in type or a CRD's kind)."""

    group: str
    versions: tuple[str, ...]
    plural: str
    kind: str
    namespaced: bool
    status: bool = False
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    builtin: bool = True
    field_paths: frozenset[str] = frozenset()
    # What create does with a body's .status: keep it, drop it, or set a fixed initial status.
    create_status: Any = "keep"
    delete_returns_object: bool = False
    name_rule: str = "subdomain"
    list_kind: str = ""
    # Custom resources: the structural schema of each served version.
    schemas: dict[str, CrdSchema] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.singular = self.singular or self.kind.lower()
        self.list_kind = self.list_kind or self.kind + "List"

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    def api_version(self, version: str | None = None) -> str:
        version = version or self.versions[0]
        return f"{self.group}/{version}" if self.group else version

    @property
    def qualified(self) -> str:
        """`pods` or `instances.akri.sh`, as in NotFound/Conflict messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """`Pod` or `Instance.akri.sh`, as in Invalid messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def details(self, name: str, kind: str | None = None) -> dict[str, Any]:
        details: dict[str, Any] = {"name": name}
        if self.group:
            details["group"] = self.group
        details["kind"] = kind or self.plural
        return details

    def field_allowed(self, path: str) -> bool:
        return path in ("metadata.name", "metadata.namespace") or path in self.field_paths


def builtin_types() -> list[ResourceType]:
    """The built-in types the simulator stores (plain storage, no controllers)."""
    pod_fields = frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    )
    core, batch, resource = "", "batch", "resource.k8s.io"
    return [
        ResourceType(core, ("v1",), "pods", "Pod", True, status=True, short_names=("po",),
                     categories=("all",), field_paths=pod_fields,
                     create_status={"phase": "Pending"}, delete_returns_object=True),
        ResourceType(core, ("v1",), "nodes", "Node", False, status=True, short_names=("no",),
                     field_paths=frozenset({"spec.unschedulable"})),
        ResourceType(core, ("v1",), "services", "Service", True, status=True,
                     short_names=("svc",), categories=("all",), create_status="drop",
                     delete_returns_object=True, name_rule="label1035"),
        ResourceType(core, ("v1",), "configmaps", "ConfigMap", True, short_names=("cm",)),
        ResourceType(core, ("v1",), "secrets", "Secret", True, field_paths=frozenset({"type"})),
        ResourceType(core, ("v1",), "namespaces", "Namespace", False, status=True,
                     short_names=("ns",), field_paths=frozenset({"status.phase"}),
                     create_status={"phase": "Active"}, delete_returns_object=True,
                     name_rule="label"),
        ResourceType(core, ("v1",), "events", "Event", True, short_names=("ev",),
                     field_paths=frozenset({"involvedObject.kind", "involvedObject.name",
                                            "involvedObject.namespace", "involvedObject.uid",
                                            "reason", "type", "source"})),
        ResourceType(core, ("v1",), "serviceaccounts", "ServiceAccount", True,
                     short_names=("sa",), delete_returns_object=True),
        ResourceType(batch, ("v1",), "jobs", "Job", True, status=True, categories=("all",),
                     field_paths=frozenset({"status.successful"}), create_status="drop"),
        ResourceType("apps", ("v1",), "deployments", "Deployment", True, status=True,
                     short_names=("deploy",), categories=("all",), create_status="drop"),
        ResourceType("apps", ("v1",), "daemonsets", "DaemonSet", True, status=True,
                     short_names=("ds",), categories=("all",), create_status="drop"),
        ResourceType("coordination.k8s.io", ("v1",), "leases", "Lease", True),
        ResourceType("policy", ("v1",), "poddisruptionbudgets", "PodDisruptionBudget", True,
                     status=True, short_names=("pdb",), create_status="drop"),
        ResourceType(resource, ("v1",), "resourceclaims", "ResourceClaim", True, status=True,
                     create_status="drop", delete_returns_object=True),
        ResourceType(resource, ("v1",), "resourceclaimtemplates", "ResourceClaimTemplate", True,
                     delete_returns_object=True),
        ResourceType(resource, ("v1",), "resourceslices", "ResourceSlice", False,
                     field_paths=frozenset({"spec.nodeName", "spec.driver"}),
                     delete_returns_object=True),
        ResourceType(resource, ("v1",), "deviceclasses", "DeviceClass", False,
                     delete_returns_object=True),
        ResourceType(CRD_GROUP, ("v1",), "customresourcedefinitions", "CustomResourceDefinition",
                     False, status=True, short_names=("crd", "crds"), create_status="drop",
                     delete_returns_object=True),
        # Read by the admission chain (apiserver_admission) at every write.
        ResourceType("admissionregistration.k8s.io", ("v1",), "validatingwebhookconfigurations",
                     "ValidatingWebhookConfiguration", False, categories=("api-extensions",)),
    ]  # fmt: skip


def types_from_crd(crd: dict[str, Any]) -> ResourceType:
    """The resource a CustomResourceDefinition serves; raises ApiError(422) when malformed."""
    name = (crd.get("metadata") or {}).get("name", "")
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    served = [v for v in spec.get("versions") or [] if v.get("served", True) and v.get("name")]
    problem = None
    if not group or not plural or not kind:
        problem = "spec.group, spec.names.plural and spec.names.kind are required"
    elif name != f"{plural}.{group}":
        problem = (
            f'metadata.name: Invalid value: "{name}": must be spec.names.plural+"."+spec.group'
        )
    elif not served:
        problem = "spec.versions: Invalid value: must have at least one served version"
    elif spec.get("scope") not in ("Namespaced", "Cluster"):
        problem = f'spec.scope: Unsupported value: "{spec.get("scope")}"'
    if problem:
        raise ApiError(
            422,
            "Invalid",
            f'CustomResourceDefinition.{CRD_GROUP} "{name}" is invalid: {problem}',
            {"name": name, "group": CRD_GROUP, "kind": "CustomResourceDefinition"},
        )
    served.sort(key=lambda v: not v.get("storage", False))
    selectable = set()
    for version in served:
        for selectable_field in version.get("selectableFields") or []:
            selectable.add(str(selectable_field.get("jsonPath", "")).lstrip("."))
    status = any("status" in (v.get("subresources") or {}) for v in served)
    schemas = {v["name"]: CrdSchema((v.get("schema") or {}).get("openAPIV3Schema")) for v in served}
    return ResourceType(
        group,
        tuple(v["name"] for v in served),
        plural,
        kind,
        spec["scope"] == "Namespaced",
        status=status,
        singular=names.get("singular", ""),
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        builtin=False,
        field_paths=frozenset(selectable),
        create_status="drop" if status else "keep",
        delete_returns_object=True,
        list_kind=names.get("listKind", ""),
        schemas=schemas,
    )


class Event:
    """One committed change. `obj` is the new state (DELETED: last state with a new rv)."""

    __slots__ = ("rv", "key", "namespace", "type", "obj", "old", "line")

    def __init__(self, rv: int, key: tuple[str, str], etype: str, obj: dict, old: dict | None):
        self.rv = rv
        self.key = key
        self.namespace = obj["metadata"].get("namespace")
        self.type = etype
        self.obj = obj
        self.old = old
        self.line: bytes | None = None  # cached wire form, shared by every watcher

    def wire(self) -> bytes:
        line = self.line
        if line is None:
            line = _dumps({"type": self.type, "object": self.obj}) + b"\n"
            self.line = line
        return line


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


@dataclass(eq=False)
class Watcher:
    """A registered watch: the writer fills `queue` under the store lock and sets `wake`."""

    key: tuple[str, str]
    namespace: str | None
    queue: deque = field(default_factory=deque)
    wake: threading.Event = field(default_factory=threading.Event)
    ended: str | None = None  # "drop" or "clean" once the server ends the stream
    # The stream's selector (obj -> bool), or None: an event neither whose new nor whose old
    # state it matches is not queued (the stream would drop it anyway).
    accepts: Callable[[dict], bool] | None = None
    # The node a pod watch's field selector names (``node_trigger``): only events of pods on
    # that node (now or before) are offered to it.
    trigger: str | None = None

    def wants(self, event: Event) -> bool:
        if self.namespace is not None and self.namespace != event.namespace:
            return False
        accepts = self.accepts
        if accepts is None:
            return True
        if event.type != "DELETED" and accepts(event.obj):
            return True
        return event.old is not None and accepts(event.old)


def node_trigger(rt: ResourceType, fields: list[FieldRequirement]) -> str | None:
    """The node a pod watch is about, from its field selector's ``spec.nodeName=X``.

    kube-apiserver's watch cache indexes pod watchers by it (the pod registry's
    ``NodeNameTriggerFunc``), so that an event is offered only to the watchers of its node, not
    tested against every kubelet's and agent's selector: at 50 nodes that test, a hundred times
    per pod event, was most of a 5,000-pod ``deletecollection``."""
    if rt.key != PODS_KEY:
        return None
    for path, op, value in fields:
        if path == "spec.nodeName" and op == "=":
            return value
    return None


def _node_of(pod: dict) -> str:
    """``spec.nodeName`` as a field selector reads it (``field_value``), quickly."""
    spec = pod.get("spec")
    value = spec.get("nodeName") if isinstance(spec, dict) else None
    if value is None or isinstance(value, str):
        return value or ""
    return field_value(pod, "spec.nodeName")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _content_without(obj: dict, skip: tuple[str, ...]) -> dict:
    return {k: v for k, v in obj.items() if k not in skip}


class Store:
    """All objects of all types, the rv counter, the event log and the watchers."""

    def __init__(self, history_limit: int = 10000) -> None:
        self.lock = threading.Lock()
        self.rv = 0
        self.emitted = 0  # the rv of the last event handed to the watchers
        # Type key -> fn(obj) -> [(field, problem)]: validation another module owns (the
        # admission chain validates its ValidatingWebhookConfigurations).
        self.validators: dict[tuple[str, str], Callable[[dict], list[tuple[str, str]]]] = {}
        self.types: dict[tuple[str, str], ResourceType] = {}
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}
        self._sorted: dict[tuple[str, str], list[tuple[str, str]] | None] = {}
        self.log: deque[Event] = deque(maxlen=max(history_limit, 0))
        self.watchers: dict[tuple[str, str], set[Watcher]] = {}  # those without a trigger
        # Pod watchers by the node they are about (``node_trigger``).
        self.triggered: dict[str, set[Watcher]] = {}
        for rt in builtin_types():
            self._register(rt)
        self._create_system_namespaces()

    # -- registry ---------------------------------------------------------------------------

    def _register(self, rt: ResourceType) -> None:
        self.types[rt.key] = rt
        self.objects.setdefault(rt.key, {})
        self._sorted[rt.key] = None
        self.watchers.setdefault(rt.key, set())

    def resolve(self, group: str, version: str, plural: str) -> ResourceType | None:
        # Without the lock: one dict read is atomic, and every request starts here, so under
        # load they queued on the writers' lock only to find their type.
        rt = self.types.get((group, plural))
        if rt is None or version not in rt.versions:
            return None
        return rt

    def find(self, group_version_plural: str) -> ResourceType:
        """Look up `akri.sh/v0/instances`, `v1/pods` or just `pods`."""
        parts = group_version_plural.strip("/").split("/")
        with self.lock:
            if len(parts) == 1:
                found = [rt for rt in self.types.values() if rt.plural == parts[0]]
                if len(found) == 1:
                    return found[0]
            else:
                group = parts[0] if len(parts) == 3 else ""
                rt = self.types.get((group, parts[-1]))
                if rt is not None:
                    return rt
        raise KeyError(group_version_plural)

    def all_types(self) -> list[ResourceType]:
        with self.lock:
            return list(self.types.values())

    # -- event log --------------------------------------------------------------------------

    def set_history_limit(self, limit: int) -> None:
        with self.lock:
            self.log = deque(self.log, maxlen=max(limit, 0))

    def _oldest_retained(self) -> int:
        return self.log[0].rv if self.log else self.rv + 1

    def _emit(self, rt: ResourceType, etype: str, obj: dict, old: dict | None) -> None:
        event = Event(self.rv, rt.key, etype, obj, old)
        if self.log.maxlen:
            self.log.append(event)
        for watcher in self._candidates(rt.key, obj, old):
            if watcher.wants(event):
                watcher.queue.append(event)
                watcher.wake.set()
        self.emitted = self.rv  # every event up to here is in its watchers' queues

    def _candidates(self, key: tuple[str, str], obj: dict, old: dict | None) -> Iterable[Watcher]:
        """The watchers an event of ``key`` may concern: every one without a trigger, and for a
        pod those of its node before and after (a pod bound, or its node changed)."""
        plain = self.watchers.get(key, ())
        if key != PODS_KEY or not self.triggered:
            return plain
        node = _node_of(obj)
        found = [*plain, *self.triggered.get(node, ())]
        if old is not None and (before := _node_of(old)) != node:
            found.extend(self.triggered.get(before, ()))
        return found

    def _commit(self, rt: ResourceType, obj: dict, old: dict | None, etype: str) -> dict:
        """Store `obj` (a fresh dict with a fresh metadata dict) under a new resourceVersion."""
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        bucket = self.objects[rt.key]
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key not in bucket:
            self._sorted[rt.key] = None
        bucket[key] = obj
        self._emit(rt, etype, obj, old)
        if rt.key == CRD_KEY:
            self._crd_changed(obj)
        return obj

    def _remove(self, rt: ResourceType, stored: dict) -> dict:
        self.rv += 1
        final = dict(stored)
        final["metadata"] = dict(stored["metadata"], resourceVersion=str(self.rv))
        meta = stored["metadata"]
        del self.objects[rt.key][(meta.get("namespace", ""), meta["name"])]
        self._sorted[rt.key] = None
        self._emit(rt, "DELETED", final, stored)
        if rt.key == CRD_KEY:
            self._crd_removed(stored)
        return final

    def _crd_changed(self, crd: dict) -> None:
        rt = types_from_crd(crd)
        previous = self.types.get(rt.key)
        if previous is not None and previous.builtin:
            return
        self._register(rt)

    def _crd_removed(self, crd: dict) -> None:
        spec = crd.get("spec") or {}
        key = (spec.get("group"), (spec.get("names") or {}).get("plural"))
        rt = self.types.get(key)
        if rt is None or rt.builtin:
            return
        # A real server deletes every custom resource before the CRD goes; watches end.
        del self.types[key]
        self.objects.pop(key, None)
        self._sorted.pop(key, None)
        for watcher in self.watchers.pop(key, set()):
            watcher.ended = "clean"
            watcher.wake.set()

    # -- watchers ---------------------------------------------------------------------------

    def start_watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        since: int | None,
        accepts: Callable[[dict], bool] | None = None,
        trigger: str | None = None,
    ) -> tuple[Watcher, list[dict], int]:
        """Register a watcher. `since=None` returns the current objects (for synthetic ADDED);
        otherwise the retained events after `since` are queued. Raises ApiError(410) when
        `since` is older than the log. `accepts` is the stream's selector, `trigger` the node
        it selects (see `Watcher`). Returns (watcher, initial objects, current rv)."""
        if trigger is not None and rt.key != PODS_KEY:
            raise ValueError("only pod watches are indexed by node")
        watcher = Watcher(rt.key, namespace, accepts=accepts, trigger=trigger)
        with self.lock:
            initial: list[dict] = []
            if since is None:
                initial = [obj for (ns, _), obj in self._sorted_items(rt, namespace)]
            else:
                oldest = self._oldest_retained()
                if since < oldest - 1:
                    raise ApiError(
                        410, "Expired", f"too old resource version: {since} ({oldest - 1})"
                    )
                start = max(since + 1 - oldest, 0)
                for event in itertools.islice(self.log, start, None):
                    if event.key == rt.key and (namespace is None or event.namespace == namespace):
                        watcher.queue.append(event)
            if trigger is None:
                self.watchers.setdefault(rt.key, set()).add(watcher)
            else:
                self.triggered.setdefault(trigger, set()).add(watcher)
            return watcher, initial, self.rv

    def take(self, watcher: Watcher) -> tuple[list[Event], int]:
        """Drain a watcher's queue; returns the events and the rv it is up to date with.

        Without the store lock (see the module docstring): ``emitted`` is read before the
        queue is drained, so every event up to it is among those taken (or taken before), and
        a bookmark at that rv never runs ahead of an event still to come. A wake-up set after
        the clear is kept for the next wait."""
        watcher.wake.clear()
        rv = self.emitted
        events = []
        queue = watcher.queue
        while queue:
            events.append(queue.popleft())  # deque pops are atomic against the writer's append
        return events, max(rv, events[-1].rv) if events else rv

    def stop_watch(self, watcher: Watcher) -> None:
        with self.lock:
            if watcher.trigger is None:
                self.watchers.get(watcher.key, set()).discard(watcher)
                return
            same_node = self.triggered.get(watcher.trigger)
            if same_node is not None:
                same_node.discard(watcher)
                if not same_node:
                    del self.triggered[watcher.trigger]

    def end_watches(self, how: str) -> int:
        """End every open watch stream: how="drop" (connection cut) or "clean" (stream end)."""
        with self.lock:
            count = 0
            for watchers in [*self.watchers.values(), *self.triggered.values()]:
                for watcher in watchers:
                    watcher.ended = how
                    watcher.wake.set()
                    count += 1
                watchers.clear()
            self.triggered.clear()
            return count

    # -- reads ------------------------------------------------------------------------------

    def _sorted_items(self, rt: ResourceType, namespace: str | None) -> list[tuple[tuple, dict]]:
        bucket = self.objects[rt.key]
        keys = self._sorted.get(rt.key)
        if keys is None:
            keys = sorted(bucket)
            self._sorted[rt.key] = keys
        if namespace is None:
            return [(k, bucket[k]) for k in keys]
        start = bisect.bisect_left(keys, (namespace, ""))
        items = []
        for k in itertools.islice(keys, start, None):
            if k[0] != namespace:
                break
            items.append((k, bucket[k]))
        return items

    def get(self, rt: ResourceType, namespace: str, name: str) -> dict:
        with self.lock:
            obj = self.objects.get(rt.key, {}).get((namespace, name))
        if obj is None:
            raise not_found(rt, name)
        return obj

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: list[Requirement],
        fields: list[FieldRequirement],
        limit: int = 0,
        continue_token: str | None = None,
    ) -> tuple[list[dict], int, str | None, int | None]:
        """Returns (items, list rv, continue token, remaining item count)."""
        list_rv, after = None, None
        if continue_token:
            list_rv, after = _decode_continue(continue_token)
        selective = bool(labels or fields)
        page: list[tuple[tuple, dict]] = []
        with self.lock:
            keys, start, end = self._key_range(rt, namespace, after)
            bucket = self.objects[rt.key]
            # Only what this page needs (and one more, to know whether a next page exists):
            # a relist of 40,000 objects in pages of 500 must not copy all 40,000 per page.
            for k in itertools.islice(keys, start, end):
                obj = bucket[k]
                if selective and not (
                    labels_match(labels, obj["metadata"].get("labels"))
                    and fields_match(fields, obj)
                ):
                    continue
                page.append((k, obj))
                if limit and len(page) > limit:
                    break
            current_rv = self.rv
        rv = list_rv if list_rv is not None else current_rv
        if limit and len(page) > limit:
            page = page[:limit]
            token = _encode_continue(rv, page[-1][0])
            remaining = None if selective else end - start - limit
            return [o for _, o in page], rv, token, remaining
        return [o for _, o in page], rv, None, None

    def _key_range(
        self, rt: ResourceType, namespace: str | None, after: tuple | None
    ) -> tuple[list[tuple[str, str]], int, int]:
        """Under the lock: the sorted keys, and the slice of them a list reads (the namespace's,
        past ``after``)."""
        keys = self._sorted.get(rt.key)
        if keys is None:
            keys = sorted(self.objects[rt.key])
            self._sorted[rt.key] = keys
        start, end = 0, len(keys)
        if namespace is not None:
            start = bisect.bisect_left(keys, (namespace, ""))
            end = bisect.bisect_left(keys, (namespace + "\x00",))
        if after is not None:
            start = max(start, bisect.bisect_right(keys, after))
        return keys, start, min(max(start, end), len(keys))

    def snapshot(self) -> dict[tuple[str, str], list[dict]]:
        with self.lock:
            return {key: list(bucket.values()) for key, bucket in self.objects.items()}

    # -- writes -----------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        version: str,
        namespace: str,
        body: Any,
        dry_run: bool = False,
        admit: Any = None,
    ) -> dict:
        """Create; ``admit(obj, None)`` (the admission chain) is called once the object is
        final, outside the lock, and may refuse it by raising; the name is checked after."""
        obj = self._check_body(rt, version, body)
        meta = obj["metadata"] = dict(obj.get("metadata") or {})
        if not rt.namespaced:
            meta.pop("namespace", None)
        elif meta.get("namespace") and meta["namespace"] != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        else:
            meta["namespace"] = namespace
        if meta.get("resourceVersion"):
            raise ApiError(
                500, "InternalError", "resourceVersion should not be set on objects to be created"
            )
        if not meta.get("name") and not meta.get("generateName"):
            raise invalid(
                rt,
                "",
                "metadata.name: Required value: name or generateName is required",
                "metadata.name",
            )
        for drop in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                     "managedFields", "selfLink"):  # fmt: skip
            meta.pop(drop, None)
        if rt.create_status == "drop":
            obj.pop("status", None)
        elif isinstance(rt.create_status, dict):
            obj["status"] = dict(rt.create_status)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        if rt.key == CRD_KEY:
            obj["status"] = _crd_status(obj)
        with self.lock:
            if rt.namespaced:
                self._require_namespace(namespace)
            if not meta.get("name"):
                meta["name"] = self._generate_name(rt, namespace, meta["generateName"])
            obj = self._conform(rt, version, obj)
            self._validate(rt, obj, None)
            if admit is None:
                return self._store_new(rt, obj, dry_run)
        # As kube-apiserver: validating admission after validation, before storage (which is
        # where a name already taken shows).
        admit(obj, None)
        with self.lock:
            if rt.namespaced:
                self._require_namespace(namespace)
            return self._store_new(rt, obj, dry_run)

    def _store_new(self, rt: ResourceType, obj: dict, dry_run: bool) -> dict:
        """Under the lock: the created object stored, unless its name is taken."""
        name = obj["metadata"]["name"]
        if (obj["metadata"].get("namespace", ""), name) in self.objects[rt.key]:
            raise ApiError(
                409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', rt.details(name)
            )
        if rt.key == CRD_KEY:
            types_from_crd(obj)
        if dry_run:
            return obj
        return self._commit(rt, obj, None, "ADDED")

    def _generate_name(self, rt: ResourceType, namespace: str, prefix: str) -> str:
        bucket = self.objects[rt.key]
        ns = namespace if rt.namespaced else ""
        for _ in range(100):
            name = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
            if (ns, name) not in bucket:
                return name
        raise ApiError(500, "InternalError", "could not generate a unique name")

    def _require_namespace(self, namespace: str) -> None:
        if ("", namespace) not in self.objects[NAMESPACES_KEY]:
            raise ApiError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )

    def _create_system_namespaces(self) -> None:
        rt = self.types[NAMESPACES_KEY]
        for name in SYSTEM_NAMESPACES:
            if ("", name) not in self.objects[NAMESPACES_KEY]:
                self.create(rt, "v1", "", {"metadata": {"name": name}})

    @staticmethod
    def _conform(rt: ResourceType, version: str, obj: dict) -> dict:
        """A custom resource pruned, defaulted and validated against its version's schema."""
        if rt.key == NAMESPACES_KEY:
            # As the namespace strategy does on every write: a Namespace is labelled with its
            # own name, which is what webhooks' namespaceSelectors name namespaces by.
            meta = obj["metadata"]
            labels = {**(meta.get("labels") or {}), NAME_LABEL: meta.get("name", "")}
            obj = dict(obj, metadata=dict(meta, labels=labels))
        if rt.key in _QUANTITY_CHECKS:
            # Quantities are stored canonical (1000 -> 1k) and validated as the pod and node
            # strategies do; copies first, so that a refused write leaves the stored object be.
            part, check = _QUANTITY_CHECKS[rt.key]
            if isinstance(obj.get(part), dict):
                obj = dict(obj, **{part: deepcopy(obj[part])})
                problems = check(obj)
                if problems:
                    raise schema_invalid(rt, obj["metadata"].get("name", ""), problems)
        schema = rt.schemas.get(version) or rt.schemas.get(rt.versions[0])
        if schema is None:
            return obj
        obj = schema.normalize(obj)
        problems = schema.errors(obj)
        if problems:
            raise schema_invalid(rt, obj["metadata"].get("name", ""), problems)
        return obj

    def update(
        self,
        rt: ResourceType,
        version: str,
        namespace: str,
        name: str,
        body: Any,
        subresource: str | None = None,
        dry_run: bool = False,
        require_rv: bool = True,
        patcher: Any = None,
        admit: Any = None,
    ) -> dict:
        """PUT (body given) or PATCH (`patcher(stored) -> new body`) of an object or its status.

        ``admit(new, stored)`` (the admission chain) is called outside the lock once the new
        object is final, as kube-apiserver calls it inside its storage's optimistic update
        loop: when the object changed meanwhile, the update is computed again from the new
        state (a patch re-applied, a stale resourceVersion a 409) and admitted again."""
        while True:
            with self.lock:
                stored, new = self._updated(
                    rt, version, namespace, name, body, subresource, require_rv, patcher
                )
                deleting = stored["metadata"].get("deletionTimestamp")
                if admit is None or deleting and not new["metadata"].get("finalizers"):
                    return self._store_update(rt, stored, new, dry_run)
            admit(new, stored)
            with self.lock:
                key = (namespace if rt.namespaced else "", name)
                if self.objects[rt.key].get(key) is stored:
                    return self._store_update(rt, stored, new, dry_run)

    def _updated(
        self,
        rt: ResourceType,
        version: str,
        namespace: str,
        name: str,
        body: Any,
        subresource: str | None,
        require_rv: bool,
        patcher: Any,
    ) -> tuple[dict, dict]:
        """Under the lock: (stored, the object the update would store), or the error."""
        stored = self.objects[rt.key].get((namespace if rt.namespaced else "", name))
        if stored is None:
            raise not_found(rt, name)
        if patcher is not None:
            body = patcher(stored)
        new = self._check_body(rt, version, body)
        meta = new["metadata"] = dict(new.get("metadata") or {})
        if meta.get("name") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on "
                f"the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        old_meta = stored["metadata"]
        body_rv = meta.get("resourceVersion")
        if not body_rv and require_rv and not rt.builtin:
            raise ApiError(
                422,
                "Invalid",
                f'{rt.qualified} "{name}" is invalid: metadata.resourceVersion: Invalid value: '
                f"0x0: must be specified for an update",
                dict(
                    rt.details(name),
                    causes=[
                        {
                            "reason": "FieldValueInvalid",
                            "message": "Invalid value: 0x0: must be specified for an update",
                            "field": "metadata.resourceVersion",
                        }
                    ],
                ),
            )
        if body_rv and body_rv != old_meta["resourceVersion"]:
            raise conflict(rt, name, OPTIMISTIC_LOCK_MSG)
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object "
                f"meta: {old_meta['uid']}",
            )
        if subresource == "status":
            # Only .status changes through /status; spec and metadata stay as stored.
            new = dict(stored, metadata=dict(old_meta))
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
            new = self._conform(rt, version, new)
        else:
            new = self._merge_server_fields(rt, stored, self._conform(rt, version, new))
        self._validate(rt, new, stored)
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        return stored, new

    def _store_update(self, rt: ResourceType, stored: dict, new: dict, dry_run: bool) -> dict:
        """Under the lock: the update stored (nothing when it changes nothing)."""
        if new == stored or dry_run:
            return new if dry_run else stored
        if stored["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return self._remove(rt, new)
        return self._commit(rt, new, stored, "MODIFIED")

    def _merge_server_fields(self, rt: ResourceType, stored: dict, new: dict) -> dict:
        """Keep server-owned metadata (and status behind a subresource); recompute generation."""
        old_meta, meta = stored["metadata"], new["metadata"]
        for key in ("uid", "creationTimestamp", "namespace", "deletionTimestamp",
                    "deletionGracePeriodSeconds", "generation"):  # fmt: skip
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta.pop("managedFields", None)
        if rt.status:
            if "status" in stored:
                new["status"] = stored["status"]
            else:
                new.pop("status", None)
        skip = ("metadata", "status") if rt.status else ("metadata",)
        if _content_without(new, skip) != _content_without(stored, skip):
            meta["generation"] = old_meta.get("generation", 0) + 1
        if rt.key == CRD_KEY:
            new["status"] = _crd_status(new)
        return new

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        preconditions: dict | None = None,
        dry_run: bool = False,
        grace_seconds: int | None = None,
        admit: Any = None,
    ) -> tuple[dict, bool]:
        """Delete, or mark for deletion when finalizers remain or a pod on a node must first be
        stopped by its kubelet (graceful deletion). Returns (object, deleted now).
        ``admit(None, stored)`` (the admission chain) is called outside the lock, and again
        if the object changed meanwhile, as ``update`` does."""
        key = (namespace if rt.namespaced else "", name)
        while True:
            with self.lock:
                stored = self._deletable(rt, namespace, name, preconditions)
                if admit is None:
                    return self._delete_now(rt, stored, dry_run, grace_seconds)
            admit(None, stored)
            with self.lock:
                if self.objects[rt.key].get(key) is stored:
                    return self._delete_now(rt, stored, dry_run, grace_seconds)

    def delete_many(
        self,
        rt: ResourceType,
        keys: list[tuple[str, str]],
        dry_run: bool = False,
        grace_seconds: int | None = None,
    ) -> list[dict]:
        """``deletecollection``'s deletions of ``keys`` ((namespace, name), in list order) that
        no admission webhook needs to see, under one hold of the lock. Each object is still
        deleted (or marked) as ``delete`` does it, with its own resourceVersions and events,
        as kube-apiserver's registry deletes a collection item by item; one gone meanwhile is
        skipped, as there. Returns the objects as the deletions left them.

        One hold, not one per item: in a storm of 5,000 pods a hold per item let every
        kubelet's and agent's request in between two items, and the call took 15-18 s; one
        hold took it to 7 s, the watch index by node (``node_trigger``) to about 1 s."""
        done = []
        with self.lock:
            for namespace, name in keys:
                try:
                    stored = self._deletable(rt, namespace, name, None)
                except ApiError:
                    continue
                done.append(self._delete_now(rt, stored, dry_run, grace_seconds)[0])
        return done

    def _deletable(
        self, rt: ResourceType, namespace: str, name: str, preconditions: dict | None
    ) -> dict:
        """Under the lock: the stored object, if the delete's preconditions hold."""
        stored = self.objects[rt.key].get((namespace if rt.namespaced else "", name))
        if stored is None:
            raise not_found(rt, name)
        meta = stored["metadata"]
        preconditions = preconditions or {}
        want_uid, want_rv = preconditions.get("uid"), preconditions.get("resourceVersion")
        if want_uid and want_uid != meta["uid"]:
            raise conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: "
                f"{meta['uid']}",
            )
        if want_rv and want_rv != meta["resourceVersion"]:
            raise conflict(
                rt,
                name,
                f"Precondition failed: ResourceVersion in precondition: {want_rv}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}",
            )
        return stored

    def _delete_now(
        self, rt: ResourceType, stored: dict, dry_run: bool, grace_seconds: int | None
    ) -> tuple[dict, bool]:
        """Under the lock: the deletion (or the mark) of ``stored``."""
        meta = stored["metadata"]
        if rt.key == PODS_KEY:
            return self._delete_pod(rt, stored, grace_seconds, dry_run)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return stored, False
            marked = dict(stored)
            marked["metadata"] = dict(
                meta, deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0
            )
            if meta.get("generation"):
                marked["metadata"]["generation"] = meta["generation"] + 1
            if dry_run:
                return marked, False
            return self._commit(rt, marked, stored, "MODIFIED"), False
        if dry_run:
            return stored, True
        return self._remove(rt, stored), True

    def _delete_pod(
        self, rt: ResourceType, stored: dict, grace_seconds: int | None, dry_run: bool
    ) -> tuple[dict, bool]:
        """Graceful deletion, as the pod strategy does it: the pod is first stamped with
        `deletionTimestamp` (a MODIFIED event). With a grace period it then stays Terminating
        for its kubelet to stop and delete with grace 0; with none it goes at once (DELETED).
        While Terminating, only a shorter grace period changes anything."""
        meta = stored["metadata"]
        grace = _pod_grace_seconds(stored, grace_seconds)
        current = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and current is not None:
            if grace_seconds is None or grace >= current:
                return stored, False
            started = _parse_time(meta["deletionTimestamp"]) - timedelta(seconds=current)
        else:
            started = datetime.now(UTC)
        deadline = (started + timedelta(seconds=grace)).strftime("%Y-%m-%dT%H:%M:%SZ")
        marked = dict(stored)
        marked["metadata"] = dict(
            meta, deletionTimestamp=deadline, deletionGracePeriodSeconds=grace
        )
        gone = grace == 0 and not meta.get("finalizers")
        if dry_run:
            return marked, gone
        marked = self._commit(rt, marked, stored, "MODIFIED")
        return (self._remove(rt, marked), True) if gone else (marked, False)

    def reset(self) -> None:
        """Forget every object except CRDs; the rv counter keeps rising so old rvs get 410."""
        with self.lock:
            for key, bucket in self.objects.items():
                if key != CRD_KEY:
                    bucket.clear()
                    self._sorted[key] = None
            self.log.clear()
        self._create_system_namespaces()

    # -- validation -------------------------------------------------------------------------

    def _check_body(self, rt: ResourceType, version: str, body: Any) -> dict:
        if not isinstance(body, dict):
            raise bad_request("the body of the request was in an unknown format")
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if not rt.builtin and (not kind or not api_version):
            missing = "Kind" if not kind else "Version"
            raise bad_request(f"Object '{missing}' is missing in '{json.dumps(body)[:200]}'")
        if kind and kind != rt.kind:
            raise bad_request(
                f"the kind of the object ({kind}) does not match the kind of the endpoint "
                f"({rt.kind})"
            )
        if api_version:
            group, _, ver = api_version.rpartition("/")
            if group != rt.group or ver not in rt.versions:
                raise bad_request(
                    f"the API version in the data ({api_version}) does not match the expected "
                    f"API version ({rt.api_version(version)})"
                )
        obj = dict(body)
        obj["kind"] = rt.kind
        obj["apiVersion"] = api_version or rt.api_version(version)
        return _empty_string_for_null(rt, obj)

    def _validate(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        meta = obj["metadata"]
        name = meta.get("name", "")
        if old is None:
            problem = _name_problem(rt.name_rule, name)
            if problem:
                raise invalid(
                    rt, name, f'metadata.name: Invalid value: "{name}": {problem}', "metadata.name"
                )
        for key in ("labels", "annotations"):
            value = meta.get(key)
            if value is None:
                continue
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise bad_request(f"metadata.{key} must be a map of string keys to string values")
        for key, value in (meta.get("labels") or {}).items():
            problem = _label_problem(key, value)
            if problem:
                raise invalid(rt, name, f"metadata.labels: {problem}", "metadata.labels")
        validator = self.validators.get(rt.key)
        problems = validator(obj) if validator is not None else []
        if problems:
            raise schema_invalid(rt, name, problems)
        if old is None:
            return
        old_meta = old["metadata"]
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                raise invalid(
                    rt,
                    name,
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object "
                    "is being deleted, found new finalizers " + json.dumps(sorted(added)),
                    "metadata.finalizers",
                )
        if rt.key == ("", "pods") and _pod_spec_frozen(obj) != _pod_spec_frozen(old):
            raise invalid(
                rt,
                name,
                "spec: Forbidden: pod updates may not change fields other than "
                "`spec.containers[*].image`,`spec.initContainers[*].image`,"
                "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing "
                "tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it "
                "was previously negative)",
                "spec",
            )


_QUANTITY_CHECKS = {
    ("", "pods"): ("spec", quantity.pod_problems),
    ("", "nodes"): ("status", quantity.node_problems),
}

# String maps where a JSON null decodes to "" (Go's zero value) instead of being refused.
_STRING_MAPS = {("", "configmaps"): ("data",), ("", "secrets"): ("data", "stringData")}


def _empty_string_for_null(rt: ResourceType, obj: dict) -> dict:
    """`{"labels": {"a": null}}` is stored as `{"a": ""}` by a real server (Go decodes null
    into a map[string]string entry as ""); so are ConfigMap and Secret data."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        obj["metadata"] = meta = dict(meta)
        for key in ("labels", "annotations"):
            if isinstance(meta.get(key), dict):
                meta[key] = _nulls_as_empty(meta[key])
    for key in _STRING_MAPS.get(rt.key, ()):
        if isinstance(obj.get(key), dict):
            obj[key] = _nulls_as_empty(obj[key])
    return obj


def _nulls_as_empty(values: dict) -> dict:
    if all(v is not None for v in values.values()):
        return values
    return {k: "" if v is None else v for k, v in values.items()}


def _parse_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _pod_grace_seconds(pod: dict, asked: int | None) -> int:
    """The grace period a delete gives a pod (the pod strategy's CheckGracefulDelete)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in ("Failed", "Succeeded"):
        return 0  # never scheduled, or already finished: nothing for a kubelet to stop
    if asked is None:
        asked = spec.get("terminationGracePeriodSeconds")
    if asked is None:
        asked = DEFAULT_POD_GRACE_SECONDS
    return max(int(asked), 0)


def _pod_spec_frozen(pod: dict) -> dict:
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k not in _POD_MUTABLE_SPEC}
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            spec[key] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                for c in spec[key]
            ]
    return spec


def _name_problem(rule: str, name: str) -> str | None:
    if rule == "label":
        ok = len(name) <= 63 and _LABEL_1123_RE.fullmatch(name)
        what = "a lowercase RFC 1123 label"
    elif rule == "label1035":
        ok = len(name) <= 63 and _LABEL_1035_RE.fullmatch(name)
        what = "a DNS-1035 label"
    else:
        ok = len(name) <= 253 and _SUBDOMAIN_RE.fullmatch(name)
        what = "a lowercase RFC 1123 subdomain"
    if ok:
        return None
    return f"a valid name must be {what} (lowercase alphanumerics, '-' or '.')"


def _label_problem(key: str, value: str) -> str | None:
    prefix, _, short = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN_RE.fullmatch(prefix)):
        return f'Invalid value: "{key}": prefix part must be a lowercase RFC 1123 subdomain'
    if not short or len(short) > 63 or not _QUALIFIED_NAME_RE.fullmatch(short):
        return f'Invalid value: "{key}": name part must be a valid qualified name'
    if len(value) > 63 or not _LABEL_VALUE_RE.fullmatch(value):
        return (
            f'Invalid value: "{value}": a valid label must be an empty string or consist of '
            "alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character (at most 63 characters)"
        )
    return None


def _crd_status(crd: dict) -> dict:
    """The status a real server converges to once the CRD is served."""
    spec = crd.get("spec") or {}
    now = now_rfc3339()
    names = dict(spec.get("names") or {})
    if names.get("kind"):
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
    return {
        "acceptedNames": names,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
        "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
    }  # fmt: skip


def _encode_continue(rv: int, after: tuple[str, str]) -> str:
    raw = json.dumps({"rv": rv, "start": list(after)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), (str(data["start"][0]), str(data["start"][1]))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise bad_request("continue key is not valid: " + str(exc)) from exc


# -- error constructors ----------------------------------------------------------------------


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', rt.details(name))


def conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}',
        rt.details(name),
    )


def invalid(rt: ResourceType, name: str, problem: str, field_path: str) -> ApiError:
    details = rt.details(name, kind=rt.kind)
    details["causes"] = [{"reason": "FieldValueInvalid", "message": problem, "field": field_path}]
    return ApiError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {problem}', details)


def schema_invalid(rt: ResourceType, name: str, problems: list[tuple[str, str]]) -> ApiError:
    """422 for a custom resource its schema refuses: one cause per problem, as the real server."""
    texts = [f"{path}: {message}" for path, message in problems]
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = rt.details(name, kind=rt.kind)
    details["causes"] = [
        {"reason": _cause_reason(message), "message": message, "field": path}
        for path, message in problems
    ]
    return ApiError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {summary}', details)


def _cause_reason(message: str) -> str:
    for prefix, reason in (
        ("Required value", "FieldValueRequired"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Duplicate value", "FieldValueDuplicate"),
    ):
        if message.startswith(prefix):
            return reason
    if " in body must be of type " in message:
        return "FieldValueTypeInvalid"  # field.TypeInvalid (current servers; 1.20: Invalid)
    return "FieldValueInvalid"


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def deepcopy(obj: Any) -> Any:
    return copy.deepcopy(obj)
