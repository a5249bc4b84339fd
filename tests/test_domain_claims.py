"""Claim and release decisions and their conditional JSON patches (DESIGN.md invariant 1)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.domain.claims import (
    ClaimOutcome,
    ReleaseOutcome,
    add_node_patch,
    claim_patch,
    decide_claim,
    decide_release,
    release_patch,
    remove_node_patch,
    resize_patch,
)
from agent.domain.errors import ForeignValue, InvalidDeviceId, SlotChanged, SlotTaken
from agent.domain.jsonpatch import JsonPatchTestFailed, apply_json_patch
from agent.domain.naming import slot_key
from agent.domain.slots import InstanceState, format_cl, format_il, parse_usage

INST = "cfg-8120fe"
A = format_il("node-a")
B = format_il("node-b")
CL_A = format_cl("cfg-0", "node-a")


def k(i: int) -> str:
    return slot_key(INST, i)


def instance(usage: dict | None, capacity: int = 2, rv: str = "10", nodes=None) -> dict:
    spec = {"configurationName": "cfg", "cdiName": "akri.sh/cfg=8120fe", "capacity": capacity}
    if usage is not None:
        spec["deviceUsage"] = dict(usage)
    if nodes is not None:
        spec["nodes"] = list(nodes)
    return {"metadata": {"name": INST, "resourceVersion": rv}, "spec": spec}


def state_of(obj: dict) -> InstanceState:
    return InstanceState.from_object(obj)


def claim(obj: dict, key: str, wanted: str) -> dict:
    ops = claim_patch(state_of(obj), key, wanted, obj["metadata"]["resourceVersion"])
    return apply_json_patch(obj, ops)


@pytest.mark.parametrize(
    ("usage", "key", "wanted", "outcome"),
    [
        ({k(0): ""}, k(0), A, ClaimOutcome.CLAIM),
        ({}, k(1), A, ClaimOutcome.CLAIM),
        (None, k(1), CL_A, ClaimOutcome.CLAIM),
        ({k(0): A}, k(0), A, ClaimOutcome.ALREADY_OURS),
        ({k(0): CL_A}, k(0), CL_A, ClaimOutcome.ALREADY_OURS),
        ({k(5): A}, k(5), A, ClaimOutcome.ALREADY_OURS),  # surplus, still ours
        ({k(0): B}, k(0), A, ClaimOutcome.TAKEN),
        ({k(0): CL_A}, k(0), A, ClaimOutcome.TAKEN),  # same node, other plugin
        ({k(0): A}, k(0), CL_A, ClaimOutcome.TAKEN),
        ({k(0): format_cl("cfg-1", "node-a")}, k(0), CL_A, ClaimOutcome.TAKEN),
        ({k(0): "C:node-a"}, k(0), A, ClaimOutcome.FOREIGN),
        ({k(0): "N:x:y:z"}, k(0), A, ClaimOutcome.FOREIGN),
        ({}, k(2), A, ClaimOutcome.NO_SLOT),
        ({k(2): ""}, k(2), A, ClaimOutcome.NO_SLOT),
        ({}, "other-8120fe-0", A, ClaimOutcome.NO_SLOT),
        ({}, INST + "-01", A, ClaimOutcome.NO_SLOT),
    ],
)
def test_decide_claim(usage, key, wanted, outcome):
    assert decide_claim(state_of(instance(usage)), key, wanted) is outcome


def test_decide_claim_refuses_to_claim_with_a_non_holder_value():
    with pytest.raises(ValueError):
        decide_claim(state_of(instance({})), k(0), "")
    with pytest.raises(ValueError):
        decide_claim(state_of(instance({})), k(0), "C:node-a")


def test_claim_of_a_present_free_key_tests_that_key_and_the_capacity():
    s = state_of(instance({k(0): "", k(1): B}))
    assert claim_patch(s, k(0), A, "10") == [
        {"op": "test", "path": "/spec/deviceUsage/cfg-8120fe-0", "value": ""},
        {"op": "test", "path": "/spec/capacity", "value": 2},
        {"op": "replace", "path": "/spec/deviceUsage/cfg-8120fe-0", "value": "node-a"},
    ]


def test_without_spec_capacity_a_claim_tests_only_the_key():
    obj = instance({k(0): "", k(1): ""})
    del obj["spec"]["capacity"]  # Akri v0.12: capacity inferred from the pre-filled keys
    ops = claim_patch(state_of(obj), k(0), A, "10")
    assert [op["path"] for op in ops if op["op"] == "test"] == ["/spec/deviceUsage/cfg-8120fe-0"]
    assert apply_json_patch(obj, ops)["spec"]["deviceUsage"][k(0)] == A


def test_a_release_and_a_claim_decided_before_a_shrink_cannot_land_beyond_it():
    # Capacity 2, slot 1 held by A. A release of it and, from the same era, a claim of it by
    # B (decided when the slot was free) are both made before the Instance shrinks to 1.
    held = instance({k(0): "", k(1): A}, rv="10")
    late_release = release_patch(state_of(held), k(1), A)
    freed = apply_json_patch(held, late_release)
    late_claim = claim_patch(state_of(freed), k(1), B, "11")
    shrunk = apply_json_patch(held, resize_patch(state_of(held), 1, "10"))
    assert shrunk["spec"]["deviceUsage"] == {k(0): "", k(1): A}  # held surplus stays
    # Replayed now, the release must not leave a free key beyond capacity 1 ...
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(shrunk, late_release)
    # ... and the claim must not take slot 1 even if such a key were there.
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(
            {**shrunk, "spec": {**shrunk["spec"], "deviceUsage": {k(1): ""}}}, late_claim
        )
    # Decided afresh, the release removes the surplus key.
    fresh = release_patch(state_of(shrunk), k(1), A)
    assert apply_json_patch(shrunk, fresh)["spec"]["deviceUsage"] == {k(0): ""}


def test_claim_of_an_absent_key_tests_the_resource_version():
    s = state_of(instance({k(1): B}))
    assert claim_patch(s, k(0), A, "10") == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "10"},
        {"op": "add", "path": "/spec/deviceUsage/cfg-8120fe-0", "value": "node-a"},
    ]


def test_claim_without_device_usage_creates_the_map():
    s = state_of(instance(None))
    assert claim_patch(s, k(1), CL_A, "10") == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "10"},
        {"op": "add", "path": "/spec/deviceUsage", "value": {k(1): CL_A}},
    ]
    assert claim(instance(None), k(1), CL_A)["spec"]["deviceUsage"] == {k(1): CL_A}


def test_claim_escapes_json_pointer_characters():
    s = InstanceState("a/b~c", "cfg", 1, {"a/b~c-0": ""}, ("node-a",))
    assert claim_patch(s, "a/b~c-0", A, "1")[0]["path"] == "/spec/deviceUsage/a~1b~0c-0"


def test_claim_without_a_resource_version_when_one_is_needed_is_refused():
    with pytest.raises(ValueError):
        claim_patch(state_of(instance({})), k(0), A, "")


def test_already_ours_needs_no_write():
    assert claim_patch(state_of(instance({k(0): A})), k(0), A, "10") == []


@pytest.mark.parametrize(
    ("usage", "key", "error"),
    [
        ({k(0): B}, k(0), SlotTaken),
        ({k(0): "C:x"}, k(0), ForeignValue),
        ({}, k(2), InvalidDeviceId),
        ({}, "nope", InvalidDeviceId),
    ],
)
def test_refused_claims_raise(usage, key, error):
    with pytest.raises(error):
        claim_patch(state_of(instance(usage)), key, A, "10")


def test_it_refuses_a_claim_when_another_node_claimed_the_slot_first():
    before = instance({k(0): ""})
    ops = claim_patch(state_of(before), k(0), A, "10")
    now = claim(before, k(0), B)
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(now, ops)


def test_it_refuses_a_claim_of_an_absent_key_when_the_object_changed():
    before = instance({})
    ops = claim_patch(state_of(before), k(0), A, "10")
    now = {**claim(before, k(0), B), "metadata": {"name": INST, "resourceVersion": "11"}}
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(now, ops)


def test_a_claim_of_a_present_key_survives_writes_to_other_slots():
    before = instance({k(0): "", k(1): ""})
    ops = claim_patch(state_of(before), k(0), A, "10")
    now = {**claim(before, k(1), B), "metadata": {"name": INST, "resourceVersion": "11"}}
    assert apply_json_patch(now, ops)["spec"]["deviceUsage"] == {k(0): A, k(1): B}


@pytest.mark.parametrize(
    ("usage", "key", "expected", "outcome"),
    [
        ({k(0): A}, k(0), A, ReleaseOutcome.RELEASE),
        ({k(5): CL_A}, k(5), CL_A, ReleaseOutcome.RELEASE),
        ({k(0): ""}, k(0), A, ReleaseOutcome.ALREADY_FREE),
        ({}, k(0), A, ReleaseOutcome.ALREADY_FREE),
        ({}, k(7), A, ReleaseOutcome.ALREADY_FREE),
        ({k(0): B}, k(0), A, ReleaseOutcome.CHANGED),
        ({k(0): CL_A}, k(0), A, ReleaseOutcome.CHANGED),
        ({k(0): "C:x"}, k(0), A, ReleaseOutcome.CHANGED),
        ({}, "other-0", A, ReleaseOutcome.NO_SLOT),
    ],
)
def test_decide_release(usage, key, expected, outcome):
    assert decide_release(state_of(instance(usage)), key, expected) is outcome


def test_release_sets_the_slot_free_if_it_still_holds_the_holder():
    s = state_of(instance({k(0): A}))
    assert release_patch(s, k(0), A) == [
        {"op": "test", "path": "/spec/deviceUsage/cfg-8120fe-0", "value": "node-a"},
        {"op": "test", "path": "/spec/capacity", "value": 2},
        {"op": "replace", "path": "/spec/deviceUsage/cfg-8120fe-0", "value": ""},
    ]


def test_release_of_a_surplus_slot_removes_the_key():
    obj = instance({k(0): "", k(3): CL_A}, capacity=1)
    ops = release_patch(state_of(obj), k(3), CL_A, "10")
    assert ops[-1] == {"op": "remove", "path": "/spec/deviceUsage/cfg-8120fe-3"}
    assert apply_json_patch(obj, ops)["spec"]["deviceUsage"] == {k(0): ""}


def test_release_of_a_free_slot_is_a_no_op():
    assert release_patch(state_of(instance({})), k(0), A) == []


@pytest.mark.parametrize(
    ("usage", "key", "error"), [({k(0): B}, k(0), SlotChanged), ({}, "x", InvalidDeviceId)]
)
def test_refused_releases_raise(usage, key, error):
    with pytest.raises(error):
        release_patch(state_of(instance(usage)), key, A)


def test_it_does_not_release_a_slot_someone_else_took_meanwhile():
    before = instance({k(0): A})
    ops = release_patch(state_of(before), k(0), A)
    freed = apply_json_patch(before, ops)
    retaken = claim(freed, k(0), B)
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(retaken, ops)


def test_node_patches():
    assert add_node_patch(["node-a"], "node-a", "10") == []
    assert add_node_patch(["node-a"], "node-b", "10") == [
        {"op": "test", "path": "/spec/nodes", "value": ["node-a"]},
        {"op": "add", "path": "/spec/nodes/-", "value": "node-b"},
    ]
    assert add_node_patch(None, "node-a", "10") == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "10"},
        {"op": "add", "path": "/spec/nodes", "value": ["node-a"]},
    ]
    assert remove_node_patch(["node-a", "node-b"], "node-a") == [
        {"op": "test", "path": "/spec/nodes", "value": ["node-a", "node-b"]},
        {"op": "replace", "path": "/spec/nodes", "value": ["node-b"]},
    ]
    assert remove_node_patch(["node-b"], "node-a") == []
    assert remove_node_patch(None, "node-a") == []


def test_node_patches_apply_and_fail_on_a_changed_list():
    obj = instance({}, nodes=["node-a"])
    added = apply_json_patch(obj, add_node_patch(["node-a"], "node-b", "10"))
    assert added["spec"]["nodes"] == ["node-a", "node-b"]
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(added, add_node_patch(["node-a"], "node-c", "10"))
    removed = apply_json_patch(added, remove_node_patch(["node-a", "node-b"], "node-a"))
    assert removed["spec"]["nodes"] == ["node-b"]
    assert apply_json_patch(instance({}), add_node_patch(None, "n", "10"))["spec"]["nodes"] == ["n"]


def test_resize_patch_grows_and_shrinks_keeping_held_slots():
    obj = instance({k(0): "", k(1): A}, capacity=2)
    grown = apply_json_patch(obj, resize_patch(state_of(obj), 3, "10"))
    assert grown["spec"]["capacity"] == 3
    assert grown["spec"]["deviceUsage"] == {k(0): "", k(1): A, k(2): ""}
    shrunk = apply_json_patch(grown, resize_patch(state_of(grown), 1, "10"))
    assert shrunk["spec"]["capacity"] == 1
    assert shrunk["spec"]["deviceUsage"] == {k(0): "", k(1): A}
    created = apply_json_patch(instance(None), resize_patch(state_of(instance(None)), 1, "10"))
    assert created["spec"]["deviceUsage"] == {k(0): ""}
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(obj, resize_patch(state_of(obj), 3, "9"))


# Property tests: a patch touches nothing but its own key.

nodes = st.sampled_from(["node-a", "node-b", "node-c"])
holder_values = st.one_of(
    nodes, st.builds(format_cl, st.sampled_from(["cfg-0", "cfg-1", "cfg-2"]), nodes)
)
any_values = st.one_of(st.just(""), holder_values, st.sampled_from(["C:x", "a:b", "C::n"]))
keys = st.one_of(st.integers(0, 4).map(k), st.sampled_from(["stray-0", INST + "-01"]))
usages = st.one_of(st.none(), st.dictionaries(keys, any_values, max_size=6))


def others(obj: dict, key: str) -> dict:
    usage = obj["spec"].get("deviceUsage") or {}
    return {name: value for name, value in usage.items() if name != key}


@given(usages, st.integers(0, 4), keys, holder_values)
def test_claim_patch_changes_only_its_own_key(usage, capacity, key, wanted):
    obj = instance(usage, capacity=capacity)
    s = state_of(obj)
    outcome = decide_claim(s, key, wanted)
    try:
        ops = claim_patch(s, key, wanted, "10")
    except (SlotTaken, ForeignValue, InvalidDeviceId):
        assert outcome in (ClaimOutcome.TAKEN, ClaimOutcome.FOREIGN, ClaimOutcome.NO_SLOT)
        return
    after = apply_json_patch(obj, ops)
    assert after["spec"]["deviceUsage"][key] == wanted
    assert others(after, key) == others(obj, key)
    assert {k: v for k, v in after.items() if k != "spec"} == {
        k: v for k, v in obj.items() if k != "spec"
    }
    if outcome is ClaimOutcome.CLAIM:
        assert parse_usage((usage or {}).get(key)).is_free
    else:
        assert outcome is ClaimOutcome.ALREADY_OURS and ops == []


@given(usages, st.integers(0, 4), keys, holder_values)
def test_release_patch_changes_only_its_own_key(usage, capacity, key, expected):
    obj = instance(usage, capacity=capacity)
    s = state_of(obj)
    outcome = decide_release(s, key, expected)
    try:
        ops = release_patch(s, key, expected, "10")
    except (SlotChanged, InvalidDeviceId):
        assert outcome in (ReleaseOutcome.CHANGED, ReleaseOutcome.NO_SLOT)
        return
    after = apply_json_patch(obj, ops)
    assert others(after, key) == others(obj, key)
    assert parse_usage((after["spec"].get("deviceUsage") or {}).get(key)).is_free
    if outcome is ReleaseOutcome.RELEASE:
        assert usage[key] == expected
    else:
        assert ops == []


@given(usages, st.integers(0, 4), keys, holder_values, holder_values)
def test_a_stale_claim_never_overwrites_a_holder(usage, capacity, key, first, second):
    # Two writers decide from the same snapshot; the second must fail if the first took its slot.
    obj = instance(usage, capacity=capacity)
    s = state_of(obj)
    if decide_claim(s, key, first) is not ClaimOutcome.CLAIM:
        return
    now = apply_json_patch(obj, claim_patch(s, key, first, "10"))
    now["metadata"]["resourceVersion"] = "11"
    if first == second:
        return
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(now, claim_patch(s, key, second, "10"))
