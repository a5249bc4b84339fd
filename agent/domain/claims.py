"""Claim and release decisions, and the conditional JSON patches that carry them out.

The API server is the truth (DESIGN.md invariant 1), so every write here is conditional: a
JSON-patch `test` of the slot's current value when the key exists (the narrowest condition:
writes to other slots do not conflict), else a `test` of `metadata.resourceVersion` (JSON patch
cannot test that a key is absent, and Akri v0.13 leaves free slots absent). A failed `test`
comes back from the API server as 422: re-read the Instance, decide again.

Patches touch only the keys they are about, never the whole map, so that field ownership of
other slots (server-side apply managers `dp-<node>` of Akri v0.13) is left alone; replacing the
whole map is how Akri #801's conflicts start.

Decisions do not look at `spec.nodes`: a plugin only exists while its node can use the Instance,
and the caller stops it when it cannot (Akri does the same).
"""

import enum
from collections.abc import Sequence

from agent.domain.cordon import InstanceCordoned
from agent.domain.errors import ForeignValue, InvalidDeviceId, SlotChanged, SlotTaken
from agent.domain.jsonpatch import pointer
from agent.domain.naming import slot_index
from agent.domain.slots import InstanceState, UsageKind, parse_usage, resize_usage

RESOURCE_VERSION_PATH = pointer("metadata", "resourceVersion")
DEVICE_USAGE_PATH = pointer("spec", "deviceUsage")
NODES_PATH = pointer("spec", "nodes")
CAPACITY_PATH = pointer("spec", "capacity")


class ClaimOutcome(enum.Enum):
    CLAIM = "claim"  # free: write needed
    ALREADY_OURS = "already-ours"  # holds exactly what we want: success, no write
    TAKEN = "taken"  # held by another node or through the other plugin
    FOREIGN = "foreign"  # a value we do not understand: refuse, never overwrite
    NO_SLOT = "no-slot"  # not a slot key of this Instance, or free but beyond capacity
    CORDONED = "cordoned"  # free, but the Instance is cordoned: no new claims


class ReleaseOutcome(enum.Enum):
    RELEASE = "release"  # holds what we expected: write needed
    ALREADY_FREE = "already-free"  # nothing to do
    CHANGED = "changed"  # holds something else now: leave it
    NO_SLOT = "no-slot"  # not a slot key of this Instance


def usage_path(key: str) -> str:
    return pointer("spec", "deviceUsage", key)


def _check_holder(what: str, value: str) -> None:
    if parse_usage(value).kind not in (UsageKind.NODE, UsageKind.CONFIG):
        raise ValueError(f"{what} must be a node or C:<vdev>:<node> value, got {value!r}")


def _check_rv(resource_version: str) -> None:
    if not resource_version:
        raise ValueError("a resourceVersion is needed to make this write conditional")


def decide_claim(state: InstanceState, key: str, wanted: str) -> ClaimOutcome:
    """Whether `wanted` (from format_il/format_cl) can take slot `key` of `state`.

    Exactly `wanted` already in place is success: kubelet re-asks for devices it already holds
    (Akri PR #556, and #843 for CL), and refusing would fail a pod that owns the slot.
    """
    _check_holder("wanted", wanted)
    index = slot_index(state.name, key)
    if index is None:
        return ClaimOutcome.NO_SLOT
    usage = state.usage(key)
    if usage.raw == wanted:
        return ClaimOutcome.ALREADY_OURS
    if usage.kind is UsageKind.FOREIGN:
        return ClaimOutcome.FOREIGN
    if not usage.is_free:
        return ClaimOutcome.TAKEN
    if index >= state.capacity:
        return ClaimOutcome.NO_SLOT
    if state.cordon is not None:
        # After ALREADY_OURS: a kubelet re-asking for a slot its pod holds is not a new claim.
        return ClaimOutcome.CORDONED
    return ClaimOutcome.CLAIM


def claim_patch(state: InstanceState, key: str, wanted: str, resource_version: str) -> list[dict]:
    """The conditional JSON patch that claims `key` for `wanted`; [] when already ours.

    Raises SlotTaken, ForeignValue or InvalidDeviceId when the claim must be refused.
    """
    outcome = decide_claim(state, key, wanted)
    if outcome is ClaimOutcome.ALREADY_OURS:
        return []
    if outcome is ClaimOutcome.TAKEN:
        raise SlotTaken(key, state.usage(key).raw)
    if outcome is ClaimOutcome.FOREIGN:
        raise ForeignValue(key, state.usage(key).raw)
    if outcome is ClaimOutcome.NO_SLOT:
        raise InvalidDeviceId(key, f"not a slot of {state.name} (capacity {state.capacity})")
    if outcome is ClaimOutcome.CORDONED:
        raise InstanceCordoned(state.name, key, state.cordon)
    return claim_ops(state, key, wanted, resource_version)


def claim_ops(state: InstanceState, key: str, wanted: str, resource_version: str) -> list[dict]:
    """The patch of a claim already decided (``decide_claim`` said CLAIM), without deciding
    again: the claim store decides first, then writes."""
    if state.device_usage.get(key) == "":
        return [
            {"op": "test", "path": usage_path(key), "value": ""},
            *_capacity_test(state),
            {"op": "replace", "path": usage_path(key), "value": wanted},
        ]
    _check_rv(resource_version)
    test_rv = {"op": "test", "path": RESOURCE_VERSION_PATH, "value": resource_version}
    if not state.device_usage_present:
        return [test_rv, {"op": "add", "path": DEVICE_USAGE_PATH, "value": {key: wanted}}]
    return [test_rv, {"op": "add", "path": usage_path(key), "value": wanted}]


def decide_release(state: InstanceState, key: str, expected: str) -> ReleaseOutcome:
    """Whether slot `key` can be freed, given the holder value we believe it has."""
    _check_holder("expected", expected)
    if slot_index(state.name, key) is None:
        return ReleaseOutcome.NO_SLOT
    usage = state.usage(key)
    if usage.is_free:
        return ReleaseOutcome.ALREADY_FREE
    if usage.raw == expected:
        return ReleaseOutcome.RELEASE
    return ReleaseOutcome.CHANGED


def release_patch(
    state: InstanceState, key: str, expected: str, resource_version: str = ""
) -> list[dict]:
    """The conditional JSON patch that frees `key` if it still holds `expected`; [] if free.

    The slot's own value is the condition, so `resource_version` is not needed; it is accepted
    to keep the call shaped like claim_patch. A surplus slot (index >= capacity) is removed
    rather than set to "", finishing the shrink that resize_usage deferred.
    Raises SlotChanged or InvalidDeviceId when the release must not happen.
    """
    outcome = decide_release(state, key, expected)
    if outcome is ReleaseOutcome.ALREADY_FREE:
        return []
    if outcome is ReleaseOutcome.CHANGED:
        raise SlotChanged(key, expected, state.usage(key).raw)
    if outcome is ReleaseOutcome.NO_SLOT:
        raise InvalidDeviceId(key, f"not a slot of {state.name}")
    return release_ops(state, key, expected)


def release_ops(state: InstanceState, key: str, expected: str) -> list[dict]:
    """The patch of a release already decided (``decide_release`` said RELEASE)."""
    tests = [{"op": "test", "path": usage_path(key), "value": expected}, *_capacity_test(state)]
    index = slot_index(state.name, key)
    if index is not None and index >= state.capacity:
        return [*tests, {"op": "remove", "path": usage_path(key)}]
    return [*tests, {"op": "replace", "path": usage_path(key), "value": ""}]


def _capacity_test(state: InstanceState) -> list[dict]:
    """A slot-value write decided under one capacity must not land under another. A release
    decided before a shrink would otherwise leave a free key beyond the new capacity (it
    writes "" where it should now remove the key), and a claim decided before it would take
    such a key (its only condition, the "", still holds). Capacity changes are rare: the
    extra condition costs a re-read then, and nothing otherwise."""
    if not state.capacity_present:
        return []  # no spec.capacity to test (Akri v0.12); we never resized such an object
    return [{"op": "test", "path": CAPACITY_PATH, "value": state.capacity}]


def add_node_patch(
    nodes: Sequence[str] | None, node: str, resource_version: str = ""
) -> list[dict]:
    """Conditionally add `node` to spec.nodes; [] when already there.

    The current list is the condition; when spec.nodes is absent, the resourceVersion is.
    """
    if nodes is None:
        _check_rv(resource_version)
        return [
            {"op": "test", "path": RESOURCE_VERSION_PATH, "value": resource_version},
            {"op": "add", "path": NODES_PATH, "value": [node]},
        ]
    if node in nodes:
        return []
    return [
        {"op": "test", "path": NODES_PATH, "value": list(nodes)},
        {"op": "add", "path": NODES_PATH + "/-", "value": node},
    ]


def remove_node_patch(
    nodes: Sequence[str] | None, node: str, resource_version: str = ""
) -> list[dict]:
    """Conditionally remove every occurrence of `node` from spec.nodes; [] when absent.

    The current list is the condition, so `resource_version` is not needed.
    """
    if not nodes or node not in nodes:
        return []
    return [
        {"op": "test", "path": NODES_PATH, "value": list(nodes)},
        {"op": "replace", "path": NODES_PATH, "value": [n for n in nodes if n != node]},
    ]


def resize_patch(state: InstanceState, new_capacity: int, resource_version: str) -> list[dict]:
    """Conditionally set spec.capacity and add/drop free keys per resize_usage.

    Conditioned on the resourceVersion because it adds keys that may be absent; held surplus
    slots stay until release_patch removes them.
    """
    _check_rv(resource_version)
    ops: list[dict] = [
        {"op": "test", "path": RESOURCE_VERSION_PATH, "value": resource_version},
        {"op": "add", "path": CAPACITY_PATH, "value": new_capacity},
    ]
    resized = resize_usage(state.name, state.device_usage, new_capacity)
    if not state.device_usage_present:
        return ops + [{"op": "add", "path": DEVICE_USAGE_PATH, "value": resized}]
    for key in state.device_usage:
        if key not in resized:
            ops.append({"op": "remove", "path": usage_path(key)})
    for key, value in resized.items():
        if key not in state.device_usage:
            ops.append({"op": "add", "path": usage_path(key), "value": value})
    return ops
