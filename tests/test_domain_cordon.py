"""Cordon rules alone (agent.domain.cordon and what slots/cl/claims make of a cordon)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.domain.cl import cl_devices, plan_cl_claims
from agent.domain.claims import ClaimOutcome, claim_patch, decide_claim
from agent.domain.cordon import (
    ANNOTATION,
    Cordon,
    CordonInputError,
    InstanceCordoned,
    cordon_of,
    cordon_patch,
    format_cordon,
    new_cordon,
    parse_cordon,
    uncordon_patch,
)
from agent.domain.errors import InsufficientDevices
from agent.domain.jsonpatch import JsonPatchTestFailed, apply_json_patch
from agent.domain.slots import HEALTHY, UNHEALTHY, InstanceState, il_devices

ALICE = Cordon("alice", "replacing lens", "2026-11-27T03:00:00+00:00")


def instance(name="cam", usage=None, cordon=None, capacity=2, nodes=("node-a",), rv="7"):
    meta = {"name": name, "resourceVersion": rv}
    if cordon is not None:
        meta["annotations"] = {ANNOTATION: cordon}
    return {
        "metadata": meta,
        "spec": {
            "configurationName": "cams",
            "capacity": capacity,
            "nodes": list(nodes),
            "deviceUsage": usage if usage is not None else {f"{name}-0": "", f"{name}-1": ""},
        },
    }


def test_it_describes_a_cordon_in_words():
    assert ALICE.describe() == "cordoned by alice: replacing lens"
    assert Cordon("bob").describe() == "cordoned by bob"


@given(st.text(min_size=1, max_size=40), st.text(max_size=80))
def test_format_and_parse_round_trip(by, reason):
    written = Cordon(by, reason, "2026-11-27T03:00:00+00:00")
    assert parse_cordon({ANNOTATION: format_cordon(written)}) == written


@pytest.mark.parametrize("raw", ["", "{", "[]", "null", "42", '"text"'])
def test_an_unreadable_annotation_still_cordons(raw):
    found = parse_cordon({ANNOTATION: raw})
    assert found is not None
    assert found.by == "unknown"


def test_no_annotation_is_not_cordoned():
    assert parse_cordon(None) is None
    assert parse_cordon({"other": "x"}) is None
    assert cordon_of({"metadata": {"annotations": "garbage"}}) is None


@pytest.mark.parametrize(
    ("by", "reason"),
    [("", "x"), ("  ", "x"), (None, "x"), ("alice", None), ("alice", "a\nb"), ("a" * 151, "")],
)
def test_new_cordon_refuses_garbage(by, reason):
    with pytest.raises(CordonInputError):
        new_cordon(by, reason, "now")


def test_new_cordon_refuses_an_overlong_reason():
    with pytest.raises(CordonInputError):
        new_cordon("alice", "x" * 501, "now")


def test_cordon_patch_is_conditional_and_idempotent():
    obj = instance()
    ops = cordon_patch(obj, ALICE)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    cordoned = apply_json_patch(obj, ops)
    assert cordon_of(cordoned) == ALICE
    assert cordon_patch(cordoned, Cordon("bob", "other")) == []  # the first cordon stays
    changed = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "8"}}
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(changed, ops)


def test_cordon_patch_keeps_other_annotations():
    obj = instance()
    obj["metadata"]["annotations"] = {"keep": "me"}
    cordoned = apply_json_patch(obj, cordon_patch(obj, ALICE))
    assert cordoned["metadata"]["annotations"]["keep"] == "me"
    assert cordon_of(cordoned) == ALICE


def test_uncordon_patch_tests_the_cordon_it_removes():
    obj = instance(cordon=format_cordon(ALICE))
    ops = uncordon_patch(obj)
    assert cordon_of(apply_json_patch(obj, ops)) is None
    assert uncordon_patch(instance()) == []
    other = instance(cordon=format_cordon(Cordon("bob", "x")))
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(other, ops)


def test_il_health_offers_no_free_slot_of_a_cordoned_instance_and_keeps_held_ones():
    usage = {"cam-0": "node-a", "cam-1": ""}
    assert il_devices("cam", 2, usage, "node-a") == [("cam-0", HEALTHY), ("cam-1", HEALTHY)]
    assert il_devices("cam", 2, usage, "node-a", cordoned=True) == [
        ("cam-0", HEALTHY),
        ("cam-1", UNHEALTHY),
    ]


def test_a_claim_on_a_cordoned_instance_is_refused_but_a_re_ask_is_not():
    state = InstanceState.from_object(
        instance(usage={"cam-0": "node-a", "cam-1": ""}, cordon=format_cordon(ALICE))
    )
    assert state.cordon == ALICE
    assert state.free_slots() == ["cam-1"]
    assert state.claimable_slots() == []
    assert decide_claim(state, "cam-1", "node-a") is ClaimOutcome.CORDONED
    assert decide_claim(state, "cam-0", "node-a") is ClaimOutcome.ALREADY_OURS
    with pytest.raises(InstanceCordoned) as refused:
        claim_patch(state, "cam-1", "node-a", "7")
    assert "cordoned by alice: replacing lens" in str(refused.value)


def _states(cordoned_usage):
    a = InstanceState.from_object(instance("cam-a", usage=cordoned_usage, cordon=json.dumps({})))
    b = InstanceState.from_object(instance("cam-b"))
    return [a, b]


def test_cl_counts_no_free_slot_of_a_cordoned_instance_as_claimable():
    states = _states({"cam-a-0": "C:cams-0:node-a", "cam-a-1": ""})
    # unique: 2 usable Instances listed; cams-0 held (Healthy); cam-b claimable -> 1 more.
    assert cl_devices("cams", states, "node-a", unique=True) == [
        ("cams-0", HEALTHY),
        ("cams-1", HEALTHY),
    ]
    packed = cl_devices("cams", states, "node-a", unique=False)
    assert [h for _, h in packed] == [HEALTHY, HEALTHY, HEALTHY, UNHEALTHY]
    states = _states({"cam-a-0": "", "cam-a-1": ""})
    assert cl_devices("cams", states, "node-a", unique=True) == [
        ("cams-0", HEALTHY),
        ("cams-1", UNHEALTHY),
    ]


def test_cl_plans_never_pick_a_cordoned_instance():
    states = _states({"cam-a-0": "", "cam-a-1": ""})
    plan = plan_cl_claims(states, "node-a", ["cams-0"], unique=True, configuration="cams")
    assert plan[0][1] == "cam-b"
    with pytest.raises(InsufficientDevices):
        plan_cl_claims(states, "node-a", ["cams-0", "cams-1"], True, "cams")
    packed = plan_cl_claims(states, "node-a", ["cams-0", "cams-1"], False, "cams")
    assert {name for _, name, _ in packed} == {"cam-b"}
