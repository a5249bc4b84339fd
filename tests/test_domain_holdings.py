"""The pod's own word on what it holds, and the extender's assignment made true after admission
(``agent.domain.holdings``): plain functions, no server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.domain.holdings import (
    HOLDS,
    Assigned,
    annotation_patch,
    format_holds,
    merged,
    parse_holds,
    reassign,
)
from agent.domain.jsonpatch import JsonPatchTestFailed, apply_json_patch


def pod_doc(annotations=None, rv="7"):
    meta = {"name": "p", "resourceVersion": rv}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta}


def test_holds_round_trip_and_garbage_claims_nothing():
    entries = {"akri/cam-0": "main", "akri/cam-1": "side"}
    assert parse_holds(format_holds(entries)) == entries
    assert parse_holds(None) is None
    assert parse_holds("not json") is None
    assert parse_holds("[1]") is None
    assert parse_holds(json.dumps({"no-namespace": "c", "akri/x-0": 3, "akri/y-0": "c"})) == {
        "akri/y-0": "c"
    }


def test_an_agent_rewrites_only_its_own_namespaces_entries():
    current = {"akri/cam-0": "main", "other/cam-0": "main"}
    assert merged(current, "akri", {"cam-1": "c"}) == {"other/cam-0": "main", "akri/cam-1": "c"}
    assert merged(None, "akri", {}) == {}


def test_a_first_annotation_on_a_pod_without_any_tests_the_resource_version():
    ops = annotation_patch(None, "7", {HOLDS: "{}"})
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert apply_json_patch(pod_doc(), ops)["metadata"]["annotations"] == {HOLDS: "{}"}
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(pod_doc(rv="8"), ops)


def test_a_changed_annotation_is_tested_at_the_value_seen():
    seen = {HOLDS: '{"akri/cam-0":"main"}', "keep": "x"}
    ops = annotation_patch({HOLDS: seen[HOLDS]}, "7", {HOLDS: "{}"})
    assert not any(op["path"] == "/metadata/resourceVersion" for op in ops)
    # Another change to the pod meanwhile (a new resourceVersion) does not matter...
    assert apply_json_patch(pod_doc(seen, rv="9"), ops)["metadata"]["annotations"] == {
        HOLDS: "{}",
        "keep": "x",
    }
    # ...one to the annotation itself does.
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(pod_doc({HOLDS: '{"akri/cam-1":"main"}'}, rv="9"), ops)


def test_removing_what_is_not_there_writes_nothing():
    assert annotation_patch({}, "7", {HOLDS: None}) == []
    assert annotation_patch(None, "7", {HOLDS: None}) == []


def rec(name, slots, consumed=0, at=0):
    return Assigned(("ns", name), (at, "", name), tuple(slots), consumed)


def test_pods_that_took_each_others_slots_are_recorded_with_what_they_hold():
    # a and b bound at once; the kubelet admitted b first, whose Allocate took a's slot.
    pods = [rec("a", ["cam-0"], consumed=1, at=1), rec("b", ["cam-1"], consumed=1, at=2)]
    held = {("ns", "a"): ["cam-1"], ("ns", "b"): ["cam-0"]}

    out = reassign(pods, held, busy={"cam-0", "cam-1"})

    assert out == {("ns", "a"): (("cam-1",), 1), ("ns", "b"): (("cam-0",), 1)}


def test_a_waiting_pod_whose_slots_another_took_is_given_the_ones_left_unmarked():
    # b was admitted on a's slot (marking a); a still waits: b's own slot is now a's.
    pods = [rec("a", ["cam-0"], consumed=1, at=1), rec("b", ["cam-1"], consumed=0, at=2)]
    held = {("ns", "b"): ["cam-0"]}

    out = reassign(pods, held, busy={"cam-0"})

    assert out == {("ns", "a"): (("cam-1",), 0), ("ns", "b"): (("cam-0",), 1)}


def test_a_chain_of_wrong_takes_ends_with_every_reservation_kept():
    # b took a's, c took b's; a waits: c's slot is the one nobody holds.
    pods = [
        rec("a", ["s-0"], consumed=1, at=1),
        rec("b", ["s-1"], consumed=1, at=2),
        rec("c", ["s-2"], consumed=0, at=3),
    ]
    held = {("ns", "b"): ["s-0"], ("ns", "c"): ["s-1"]}

    out = reassign(pods, held, busy={"s-0", "s-1"})

    assert out[("ns", "a")] == (("s-2",), 0)
    assert out[("ns", "b")] == (("s-0",), 1)
    assert out[("ns", "c")] == (("s-1",), 1)


def test_records_already_true_are_left_alone():
    pods = [rec("a", ["cam-0"], consumed=1), rec("w", ["cam-1"], consumed=0, at=5)]
    assert reassign(pods, {("ns", "a"): ["cam-0"]}, busy={"cam-0"}) == {}


def test_unique_devices_never_get_two_slots_of_one_instance():
    # w waits for two unique devices; p was admitted on w's x-0. Left unheld: w's y-0 and
    # p's y-1, both of Instance y.
    pods = [
        rec("w", ["x-0", "y-0"], consumed=0, at=1),
        rec("p", ["y-1", "z-0"], consumed=0, at=2),
    ]
    held = {("ns", "p"): ["x-0", "z-0"]}

    out = reassign(pods, held, busy={"x-0", "z-0"}, unique=True)

    # y-1 would be a second slot of Instance y: w keeps its own record, unmarked.
    assert out == {("ns", "p"): (("x-0", "z-0"), 2)}
    packed = reassign(pods, held, busy={"x-0", "z-0"}, unique=False)
    assert packed[("ns", "w")] == (("y-0", "y-1"), 0)


names = st.sampled_from([f"s-{i}" for i in range(6)])


@given(
    st.lists(st.lists(names, min_size=1, max_size=2, unique=True), min_size=1, max_size=4),
    st.data(),
)
def test_no_slot_is_recorded_for_two_pods(assignments, data):
    pods = [
        rec(f"p{i}", slots, consumed=data.draw(st.integers(0, len(slots))), at=i)
        for i, slots in enumerate(assignments)
    ]
    # Some pods admitted, each on distinct slots of the same count as asked.
    free = [f"s-{i}" for i in range(6)]
    held = {}
    for p in pods:
        if data.draw(st.booleans()) and len(free) >= len(p.slots):
            held[p.pod] = [free.pop() for _ in p.slots]
    busy = {s for slots in held.values() for s in slots}

    out = reassign(pods, held, busy)

    final = {p.pod: out.get(p.pod, (p.slots, p.consumed)) for p in pods}
    for pod, slots in held.items():
        assert final[pod] == (tuple(sorted(slots)), len(slots))
    by_pod = {p.pod: p for p in pods}
    moved = [
        slots for pod, (slots, _) in out.items() if pod not in held and slots != by_pod[pod].slots
    ]
    given = [s for slots in moved for s in slots]
    assert len(given) == len(set(given))  # a reservation moved to one waiting pod only
    assert not set(given) & busy  # and never onto a slot someone holds
    assert all(n == 0 for pod, (_, n) in out.items() if pod not in held)
