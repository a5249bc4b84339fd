"""What a pod holds, in the pod's own words: the ``akri-site.io/holds`` annotation.

The kubelet never tells a device plugin which pod an Allocate is for; PodResources says it
afterwards, on the node only. So each node agent writes on every pod of its node the slots
that pod holds (``agent.node.holdings``), and whoever watches pods (the controller, any of
its replicas) can build the slot-to-pod map without the agents' databases. The annotation
is a JSON object ``{"<instance namespace>/<slot key>": "<container>"}``; an agent rewrites
only the entries of its own namespace, so two installs on one node do not undo each other.

Also here: the rule that makes the scheduler extender's assignment true after admission
(``reassign``): the kubelet admits pods in its own order, so an Allocate may take the
assignment of another pod bound to the node; once PodResources shows who holds what, each
admitted pod is recorded with what it holds, and the slots reserved for pods still waiting
go to those pods.

Plain Python: no Django, no Kubernetes client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.domain.jsonpatch import pointer

HOLDS = "akri-site.io/holds"


def holds_key(namespace: str, slot: str) -> str:
    return f"{namespace}/{slot}"


def split_key(key: str) -> tuple[str, str]:
    """(Instance namespace, slot key) of an annotation entry."""
    namespace, _, slot = key.partition("/")
    return namespace, slot


def parse_holds(raw: Any) -> dict[str, str] | None:
    """The entries of a holds annotation; None when there is none or it is not ours to read
    (not a JSON object of strings: someone else wrote it, and it claims nothing)."""
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return {
        str(k): str(v)
        for k, v in value.items()
        if isinstance(v, str) and "/" in str(k) and all(split_key(str(k)))
    }


def format_holds(entries: Mapping[str, str]) -> str:
    return json.dumps(dict(entries), sort_keys=True, separators=(",", ":"))


def merged(current: Mapping[str, str] | None, namespace: str, mine: Mapping[str, str]) -> dict:
    """``current`` with this namespace's entries replaced by ``mine`` (slot key -> container)."""
    prefix = namespace + "/"
    out = {k: v for k, v in (current or {}).items() if not k.startswith(prefix)}
    out.update({holds_key(namespace, slot): container for slot, container in mine.items()})
    return out


def annotation_patch(
    annotations: Mapping[str, str] | None,
    resource_version: str,
    changes: Mapping[str, str | None],
) -> list[dict[str, Any]]:
    """A conditional JSON patch setting (or, with None, removing) some annotations.

    Every annotation changed is ``test``ed at the value seen, so a write decided on an old
    view fails (422) instead of undoing someone else's. JSON patch cannot test that a key is
    absent: when one is added, the resourceVersion seen is tested instead (and without any
    annotations map, ``add /metadata/annotations`` would replace one written meanwhile).
    """
    seen = annotations or {}
    ops: list[dict[str, Any]] = []
    if annotations is None or any(k not in seen for k, v in changes.items() if v is not None):
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
    if annotations is None:
        added = {k: v for k, v in changes.items() if v is not None}
        if added:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": added})
        return ops if added else []
    for key, value in sorted(changes.items()):
        path = pointer("metadata", "annotations", key)
        if key in seen:
            ops.append({"op": "test", "path": path, "value": seen[key]})
            if value is None:
                ops.append({"op": "remove", "path": path})
            else:
                ops.append({"op": "replace", "path": path, "value": value})
        elif value is not None:
            ops.append({"op": "add", "path": path, "value": value})
    return ops if any(op["op"] != "test" for op in ops) else []


# --- the extender's assignment, made true ----------------------------------------------------
@dataclass(frozen=True)
class Assigned:
    """One pod's assignment of one resource on this node, as its annotations say."""

    pod: tuple[str, str]  # (namespace, name)
    age: tuple  # sort key: older first (assignment time, creation time, name)
    slots: tuple[str, ...]
    consumed: int  # how many of ``slots`` (a prefix) are marked taken


def instance_of(slot: str) -> str:
    return slot.rpartition("-")[0]


def reassign(
    pods: Sequence[Assigned],
    held: Mapping[tuple[str, str], Sequence[str]],
    busy: set[str],
    *,
    unique: bool = False,
) -> dict[tuple[str, str], tuple[tuple[str, ...], int]]:
    """The assignment records of one resource on one node once admission is known, for the
    pods whose record changes: pod -> (slots, consumed).

    ``held``: what PodResources shows each pod holding of the resource (admitted pods);
    ``busy``: slots ``deviceUsage`` shows held by anyone. An admitted pod's record becomes
    what it holds, all taken. The slots the extender reserved and nobody holds stay reserved
    for the pods still waiting: each keeps its own free ones, the oldest first fills the rest
    from the others' (never two slots of one Instance when ``unique``), and none is marked
    taken: a mark on a waiting pod was another pod's Allocate. A waiting pod that cannot be
    given enough keeps its slots, unmarked. Call it only when no Allocate of the resource is
    in flight (a mark may then be the waiting pod's own).
    """
    out: dict[tuple[str, str], tuple[tuple[str, ...], int]] = {}
    admitted = [p for p in pods if held.get(p.pod)]
    taken = set(busy)
    for p in admitted:
        slots = tuple(sorted(held[p.pod]))
        taken.update(slots)
        out[p.pod] = (slots, len(slots))
    waiting = sorted((p for p in pods if not held.get(p.pod)), key=lambda p: p.age)
    pool = [s for p in sorted(pods, key=lambda p: p.age) for s in p.slots if s not in taken]
    pool = list(dict.fromkeys(pool))
    used: set[str] = set()
    given: dict[tuple[str, str], list[str]] = {}
    for p in waiting:  # each keeps its own free slots first
        own = [s for s in dict.fromkeys(p.slots) if s in pool and s not in used]
        given[p.pod] = own
        used.update(own)
    for p in waiting:
        mine = given[p.pod]
        for s in pool:
            if len(mine) >= len(p.slots):
                break
            if s in used or (unique and instance_of(s) in {instance_of(x) for x in mine}):
                continue
            mine.append(s)
            used.add(s)
        if len(mine) < len(p.slots):
            used.difference_update(s for s in mine if s not in p.slots)
            out[p.pod] = (p.slots, 0)
        else:
            out[p.pod] = (tuple(mine), 0)
    by_pod = {p.pod: p for p in pods}
    return {
        pod: record
        for pod, record in out.items()
        if record != (by_pod[pod].slots, by_pod[pod].consumed)
    }
