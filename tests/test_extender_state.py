"""The extender's books without HTTP: assumptions made at bind, and when they end."""

from __future__ import annotations

import json

from agent.extender.state import SchedulerState
from agent.sharing.akri_slots import ASSIGNMENT, CONSUMED
from agent.sharing.registry import enabled
from tests.sharing_world import configs, instance, pod

CAM = configs(("cam", 1, True))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state_with(instances, clock=None) -> SchedulerState:
    state = SchedulerState(
        enabled(["akri-instance", "akri-configuration"]),
        assume_seconds=30,
        clock=clock or Clock(),
    )
    state.set_inventory(instances, CAM)
    return state


def test_two_pods_scheduled_back_to_back_do_not_both_get_the_last_slot():
    state = state_with([instance("cam-000001", ("n1",), 1, configuration="cam")])
    first, second = pod({"akri.sh/cam": 1}), pod({"akri.sh/cam": 1})

    assert state.filter(first, ["n1"]).fits == ["n1"]
    state.allocate(first, "n1")
    decision = state.filter(second, ["n1"])

    assert decision.fits == []
    assert decision.failed == {"n1": "1 unique cam devices requested, 0 of 1 free on node n1"}


def test_a_shared_instance_assigned_on_one_node_is_taken_on_every_node_that_sees_it():
    shared = instance("cam-000001", ("n1", "n2"), 1, configuration="cam")
    state = state_with([shared])
    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == ["n1", "n2"]

    state.allocate(pod({"akri.sh/cam": 1}), "n1")

    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == []


def test_the_assumption_ends_when_the_cache_shows_the_agents_claim():
    state = state_with([instance("cam-000001", ("n1", "n2"), 1, configuration="cam")])
    bound = pod({"akri.sh/cam": 1})
    state.allocate(bound, "n1")
    assert state.assumptions

    claimed = instance("cam-000001", ("n1", "n2"), 1, {0: "C:cam-0:n1"}, "cam")
    state.set_inventory([claimed], CAM)

    assert state.assumptions == {}
    assert state.filter(pod({"akri.sh/cam": 1}), ["n2"]).fits == []  # held, per deviceUsage


def test_an_assignment_the_agent_never_claims_times_out():
    clock = Clock()
    state = state_with([instance("cam-000001", ("n1",), 1, configuration="cam")], clock)
    state.allocate(pod({"akri.sh/cam": 1}), "n1")

    clock.now += 29
    assert state.filter(pod({"akri.sh/cam": 1}), ["n1"]).fits == []
    clock.now += 2
    assert state.filter(pod({"akri.sh/cam": 1}), ["n1"]).fits == ["n1"]
    assert state.assumptions == {}


def test_a_failed_binding_gives_the_slots_back_on_every_node():
    state = state_with([instance("cam-000001", ("n1", "n2"), 1, configuration="cam")])
    bound = pod({"akri.sh/cam": 1})
    state.allocate(bound, "n1")

    state.release(bound, "n1")

    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == ["n1", "n2"]


def test_a_pod_the_feed_shows_consumed_keeps_its_slot_until_the_claim_shows():
    # The agent marks the assignment consumed just before it claims: a relist in between
    # must not make the slot look free.
    shared = instance("cam-000001", ("n1", "n2"), 1, configuration="cam")
    state = state_with([shared])
    bound = pod({"akri.sh/cam": 1})
    annotations = state.allocate(bound, "n1")
    consumed = {**annotations, CONSUMED: json.dumps({"akri.sh/cam": 1})}
    bound["metadata"]["annotations"] = consumed
    bound["spec"]["nodeName"] = "n1"

    state.set_pods([bound])

    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == []
    claimed = instance("cam-000001", ("n1", "n2"), 1, {0: "C:cam-0:n1"}, "cam")
    state.set_inventory([claimed], CAM)
    assert state.assumptions == {}
    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == []


def test_a_pod_in_the_feed_and_in_the_assumptions_counts_once():
    state = state_with([instance("cam-000001", ("n1",), 2, configuration="cam")])
    bound = pod({"akri.sh/cam-000001": 1})
    bound["metadata"]["annotations"] = state.allocate(bound, "n1")
    bound["spec"]["nodeName"] = "n1"

    state.set_pods([bound])

    assert state.filter(pod({"akri.sh/cam-000001": 1}), ["n1"]).fits == ["n1"]
    assert state.filter(pod({"akri.sh/cam-000001": 2}), ["n1"]).fits == []


def test_a_pod_we_cannot_read_is_an_error_not_an_exception():
    state = state_with([instance("cam-000001", ("n1",), 1, configuration="cam")])
    broken = pod({"akri.sh/cam": "lots"})

    decision = state.filter(broken, ["n1"])

    assert decision.fits == [] and "not a Kubernetes quantity" in decision.error


def test_spreading_and_packing_score_free_room_opposite_ways():
    state = state_with(
        [
            instance("cam-000001", ("n1",), 1, configuration="cam"),
            instance("cam-000002", ("n2",), 1, {0: "n9"}, "cam"),
            instance("cam-000003", ("n2",), 1, configuration="cam"),
        ]
    )
    asking = pod({"akri.sh/cam": 1})

    assert state.scores(asking, ["n1", "n2"], pack=False) == [("n1", 10), ("n2", 5)]
    assert state.scores(asking, ["n1", "n2"], pack=True) == [("n1", 0), ("n2", 5)]
    assert state.filter(asking, ["n1"]).fits == ["n1"]


def test_a_pod_bound_with_two_slots_keeps_the_unclaimed_one_taken_until_every_claim_shows():
    """Issue 30: the agent claims a pod's slots one Instance at a time, so the cache may show
    the claim of one and not yet the other. The other must still count as taken, or the next
    pod is assigned it too and fails admission at its kubelet."""
    shared = [instance(f"cam-00000{i}", ("n1", "n2"), 1, configuration="cam") for i in (1, 2)]
    state = state_with(shared)
    annotations = state.allocate(pod({"akri.sh/cam": 2}), "n1")
    assigned = json.loads(annotations[ASSIGNMENT])["slots"]["akri.sh/cam"]
    claimed, unclaimed = sorted(assigned)

    def cache_showing(held: set[str]) -> list:
        return [
            instance(
                f"cam-00000{i}",
                ("n1", "n2"),
                1,
                {0: "C:cam-0:n1"} if f"cam-00000{i}-0" in held else None,
                "cam",
            )
            for i in (1, 2)
        ]

    state.set_inventory(cache_showing({claimed}), CAM)

    assert state.assumptions, "dropped while a slot is still unclaimed"
    decision = state.filter(pod({"akri.sh/cam": 1}), ["n2"])
    assert decision.fits == []
    assert decision.failed == {"n2": "1 unique cam devices requested, 0 of 2 free on node n2"}
    assert state.filter(pod({"akri.sh/cam-000002": 1}), ["n2"]).fits == []

    state.set_inventory(cache_showing({claimed, unclaimed}), CAM)

    assert state.assumptions == {}
    assert state.filter(pod({"akri.sh/cam": 1}), ["n2"]).fits == []  # held, per deviceUsage
