"""The agent's use of an assignment: taken as it is, or not at all (then it plans as before)."""

from __future__ import annotations

from agent.node.assignments import NoAssignments, Taken, cl_plan, may_take
from tests.sharing_world import assigned, instance, pod

STATES = [
    instance("cam-00000a", ("n1",), 2, {0: "n2"}, "cam"),
    instance("cam-00000b", ("n1",), 2, None, "cam"),
    instance("cam-00000c", ("n2",), 2, None, "cam"),
]


def taken(*keys: str) -> Taken:
    return Taken("apps", "p", keys)


def test_an_assignment_that_fits_maps_each_vdev_to_its_slot_in_order():
    plan = cl_plan(
        taken("cam-00000a-1", "cam-00000b-0"), STATES, "n1", ["cam-0", "cam-1"], True, "cam"
    )

    assert plan == [
        ("cam-0", "cam-00000a", "cam-00000a-1"),
        ("cam-1", "cam-00000b", "cam-00000b-0"),
    ]


def test_an_assignment_is_not_used_when_a_slot_is_taken_meanwhile():
    assert cl_plan(taken("cam-00000a-0"), STATES, "n1", ["cam-0"], True, "cam") is None


def test_an_assignment_of_another_size_or_on_an_unusable_instance_is_not_used():
    assert cl_plan(taken("cam-00000b-0"), STATES, "n1", ["cam-0", "cam-1"], True, "cam") is None
    assert cl_plan(taken("cam-00000c-0"), STATES, "n1", ["cam-0"], True, "cam") is None


def test_unique_devices_never_take_two_slots_of_one_instance():
    pair = taken("cam-00000b-0", "cam-00000b-1")

    assert cl_plan(pair, STATES, "n1", ["cam-0", "cam-1"], True, "cam") is None
    assert cl_plan(pair, STATES, "n1", ["cam-0", "cam-1"], False, "cam") is not None


def test_a_vdev_the_node_already_holds_keeps_its_slot():
    held = [instance("cam-00000a", ("n1",), 2, {0: "C:cam-0:n1"}, "cam"), *STATES[1:]]

    assert cl_plan(taken("cam-00000b-0"), held, "n1", ["cam-0"], True, "cam") is None


def test_without_assignments_nothing_is_ever_found():
    off = NoAssignments()

    assert off.take("akri.sh/cam", 1) is None and off.peek("akri.sh/cam", 1) == ()


def test_a_running_pod_s_assignment_is_never_taken_for_a_new_allocate():
    """The kubelet allocates a pod's devices before it starts it: a Running pod with an
    assignment it never took (the agent planned alone for it) is not the pod of any Allocate
    now. Taken, it made the new pod's own assignment go unused."""
    assigned_pod = pod(
        {"akri.sh/cam": 1}, annotations=assigned("n1", {"akri.sh/cam": ["cam-00000b-0"]})
    )

    assert may_take(assigned_pod, "n1", "akri.sh/cam", 1)
    assigned_pod["status"] = {"phase": "Running"}
    assert not may_take(assigned_pod, "n1", "akri.sh/cam", 1)
    assigned_pod["status"] = {"phase": "Pending"}
    assigned_pod["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    assert not may_take(assigned_pod, "n1", "akri.sh/cam", 1)
