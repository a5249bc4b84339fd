"""The sharing policies (seed 004) alone: verdicts, allocation and the books they keep."""

from __future__ import annotations

import json

import pytest

from agent.sharing.akri_slots import ASSIGNMENT
from agent.sharing.gpu_cards import GPU_INDEX, PREDICATE_TIME
from agent.sharing.policy import Code, PolicyError
from agent.sharing.registry import UnknownPolicy, available, enabled
from tests.sharing_world import assigned, configs, gpu_node, instance, pod, policies

CAM = configs(("cam", 2, True))
GPU = configs(("gpu", 2, False))


def cams(n: int, node: str = "n1", held: dict[int, dict[int, str]] | None = None) -> list:
    return [instance(f"cam-{i:06x}", (node,), 2, (held or {}).get(i)) for i in range(n)]


def slots_of(annotations: dict[str, str], resource: str) -> list[str]:
    return json.loads(annotations[ASSIGNMENT])["slots"][resource]


# --- registry -------------------------------------------------------------------------------
def test_the_four_policies_are_found_through_their_entry_points():
    assert set(available()) >= {"akri-instance", "akri-configuration", "gpushare", "gpu-number"}


def test_enabling_a_policy_nobody_installed_names_it():
    with pytest.raises(UnknownPolicy, match="no-such-policy"):
        enabled(["akri-instance", "no-such-policy"])


# --- akri-configuration ---------------------------------------------------------------------
def test_three_unique_devices_on_a_node_that_sees_two_is_unresolvable():
    cl = policies("n1", cams(2), CAM)["akri-configuration"]

    code, reason = cl.filter_node(pod({"akri.sh/cam": 3}))

    assert code is Code.UNRESOLVABLE
    assert reason == "3 unique cam devices requested, node n1 sees 2"


def test_three_unique_devices_when_one_of_three_is_full_is_unschedulable():
    full = {1: {0: "n2", 1: "n3"}}
    cl = policies("n1", cams(3, held=full), CAM)["akri-configuration"]

    code, reason = cl.filter_node(pod({"akri.sh/cam": 3}))

    assert code is Code.UNSCHEDULABLE
    assert "2 of 3 free" in reason


def test_unique_allocation_takes_one_slot_on_each_of_three_instances():
    cl = policies("n1", cams(3, held={0: {0: "n2"}}), CAM)["akri-configuration"]
    asking = pod({"akri.sh/cam": 3})

    assert cl.filter_node(asking) == (Code.SUCCESS, "")
    keys = slots_of(cl.allocate(asking), "akri.sh/cam")

    assert len({k.rpartition("-")[0] for k in keys}) == 3
    assert "cam-000000-0" not in keys
    # cam-0 is full now; cam-1 and cam-2 each have a slot left for later requests.
    assert cl.filter_node(pod({"akri.sh/cam": 3})) == (
        Code.UNSCHEDULABLE,
        "3 unique cam devices requested, 2 of 3 free on node n1",
    )
    assert cl.filter_node(pod({"akri.sh/cam": 2})) == (Code.SUCCESS, "")


def test_slots_the_node_holds_through_cl_do_not_count_against_a_new_request():
    # Seed 001's cameras: one pod of n1 holds a slot of each through CL. The other slot of
    # each is what n1's CL plugin still offers (issue 27; the seed would show 0), so a second
    # pod asking for two unique cameras fits, and a third does not.
    held = {0: {0: "C:cam-0:n1"}, 1: {1: "C:cam-1:n1"}}
    cl = policies("n1", cams(2, held=held), CAM)["akri-configuration"]
    asking = pod({"akri.sh/cam": 2})

    assert cl.filter_node(asking) == (Code.SUCCESS, "")
    cl.allocate(asking)

    code, reason = cl.filter_node(pod({"akri.sh/cam": 1}))
    assert code is Code.UNSCHEDULABLE
    assert "0 of 2 free" in reason


def test_packing_fills_the_most_used_instance_first():
    gpus = [
        instance("gpu-00000a", ("n1",), 2, {0: "n2"}, "gpu"),
        instance("gpu-00000b", ("n1",), 2, None, "gpu"),
    ]
    cl = policies("n1", gpus, GPU)["akri-configuration"]

    keys = slots_of(cl.allocate(pod({"akri.sh/gpu": 2})), "akri.sh/gpu")

    assert keys == ["gpu-00000a-1", "gpu-00000b-0"]
    assert cl.filter_node(pod({"akri.sh/gpu": 2})) == (
        Code.UNSCHEDULABLE,
        "2 gpu slots requested, 1 of 4 free on node n1",
    )
    assert cl.filter_node(pod({"akri.sh/gpu": 5}))[0] is Code.UNRESOLVABLE


def test_release_gives_the_slots_back():
    cl = policies("n1", cams(2), CAM)["akri-configuration"]
    asking = pod({"akri.sh/cam": 2})
    second = pod({"akri.sh/cam": 2})
    cl.allocate(asking)
    cl.allocate(second)
    assert cl.filter_node(pod({"akri.sh/cam": 2}))[0] is Code.UNSCHEDULABLE

    cl.release(asking)

    assert cl.filter_node(pod({"akri.sh/cam": 2})) == (Code.SUCCESS, "")
    cl.release(second)
    assert cl.slots.assumed == {}


def test_an_unconsumed_assignment_of_a_bound_pod_counts_until_the_agent_takes_it():
    # The second slot of each camera is held elsewhere: the assignment takes what is left.
    cl = policies("n1", cams(2, held={0: {1: "n2"}, 1: {1: "n2"}}), CAM)["akri-configuration"]
    slots = {"akri.sh/cam": ["cam-000000-0", "cam-000001-0"]}
    bound = pod({"akri.sh/cam": 2}, annotations=assigned("n1", slots), node="n1")

    cl.add_resource(bound)
    assert cl.filter_node(pod({"akri.sh/cam": 2}))[0] is Code.UNSCHEDULABLE
    cl.sub_resource(bound)
    assert cl.filter_node(pod({"akri.sh/cam": 2}))[0] is Code.SUCCESS

    taken = pod(
        {"akri.sh/cam": 2},
        annotations=assigned("n1", slots, consumed={"akri.sh/cam": 2}),
        node="n1",
    )
    cl.add_resource(taken)
    assert cl.slots.assumed == {}


def test_an_assignment_older_than_the_timeout_counts_nothing():
    cl = policies("n1", cams(2), CAM)["akri-configuration"]
    old = assigned("n1", {"akri.sh/cam": ["cam-000000-0"]}, at=1)

    cl.add_resource(pod({"akri.sh/cam": 1}, annotations=old, node="n1"))

    assert cl.slots.assumed == {}


def test_an_assignment_for_another_node_counts_nothing_here():
    cl = policies("n1", cams(2), CAM)["akri-configuration"]
    elsewhere = assigned("n2", {"akri.sh/cam": ["cam-000000-0"]})

    cl.add_resource(pod({"akri.sh/cam": 1}, annotations=elsewhere, node="n2"))

    assert cl.slots.assumed == {}


def test_a_quantity_that_is_not_a_whole_number_is_an_error():
    cl = policies("n1", cams(2), CAM)["akri-configuration"]

    code, reason = cl.filter_node(pod({"akri.sh/cam": "1.5"}))

    assert code is Code.ERROR
    assert "not a whole number" in reason


def test_init_containers_count_as_their_largest_not_their_sum():
    cl = policies("n1", cams(3), CAM)["akri-configuration"]

    assert cl.filter_node(pod({"akri.sh/cam": 1}, init={"akri.sh/cam": "3"}))[0] is Code.SUCCESS
    assert cl.filter_node(pod({"akri.sh/cam": 1}, init={"akri.sh/cam": "4"}))[0] is (
        Code.UNRESOLVABLE
    )


# --- akri-instance --------------------------------------------------------------------------
def test_an_instance_the_node_cannot_see_is_unresolvable():
    il = policies("n1", cams(1), CAM)["akri-instance"]

    assert il.filter_node(pod({"akri.sh/cam-0000ff": 1})) == (
        Code.UNRESOLVABLE,
        "Instance cam-0000ff is not visible to node n1",
    )


def test_more_slots_than_the_instance_has_is_unresolvable_and_busy_ones_unschedulable():
    il = policies("n1", cams(1, held={0: {0: "n2"}}), CAM)["akri-instance"]

    assert il.filter_node(pod({"akri.sh/cam-000000": 3}))[0] is Code.UNRESOLVABLE
    assert il.filter_node(pod({"akri.sh/cam-000000": 2})) == (
        Code.UNSCHEDULABLE,
        "Instance cam-000000: 2 slots requested, 1 free of 2",
    )
    assert il.filter_node(pod({"akri.sh/cam-000000": 1})) == (Code.SUCCESS, "")


def test_instance_and_configuration_requests_share_the_same_slots():
    both = policies("n1", cams(1), CAM)
    il, cl = both["akri-instance"], both["akri-configuration"]

    il.allocate(pod({"akri.sh/cam-000000": 2}))

    assert cl.filter_node(pod({"akri.sh/cam": 1}))[0] is Code.UNSCHEDULABLE


def test_other_resources_are_nobody_s_business():
    found = policies("n1", cams(1), CAM)
    plain = pod({"cpu": "500m", "memory": "1Gi", "example.com/widget": 1})

    assert not any(p.has_device_request(plain) for p in found.values())


# --- gpushare / gpu-number ------------------------------------------------------------------
def test_gpushare_chooses_the_fullest_card_that_fits_and_writes_it_as_volcano_does():
    share = policies("n1", node_obj=gpu_node("n1", 2, 8000))["gpushare"]
    first = share.allocate(pod({"volcano.sh/gpu-memory": 6000}))
    second = share.allocate(pod({"volcano.sh/gpu-memory": 2000}))

    assert first[GPU_INDEX] == "0"
    assert second[GPU_INDEX] == "0"  # best fit: card 0 has exactly 2000 left
    assert int(second[PREDICATE_TIME]) > 0
    assert share.filter_node(pod({"volcano.sh/gpu-memory": 8000})) == (Code.SUCCESS, "")
    assert share.filter_node(pod({"volcano.sh/gpu-memory": 9000}))[0] is Code.UNRESOLVABLE


def test_gpushare_counts_pods_by_their_gpu_index_and_forgets_finished_ones():
    share = policies("n1", node_obj=gpu_node("n1", 1, 8000))["gpushare"]
    running = pod({"volcano.sh/gpu-memory": 7000}, annotations={GPU_INDEX: "0"}, node="n1")
    share.add_resource(running)
    assert share.filter_node(pod({"volcano.sh/gpu-memory": 2000}))[0] is Code.UNSCHEDULABLE

    done = dict(running, status={"phase": "Succeeded"})
    share.sub_resource(running)
    share.add_resource(done)

    assert share.filter_node(pod({"volcano.sh/gpu-memory": 2000})) == (Code.SUCCESS, "")


def test_unhealthy_cards_are_left_out():
    number = policies("n1", node_obj=gpu_node("n1", 2, 8000, unhealthy="1"))["gpu-number"]

    assert number.filter_node(pod({"volcano.sh/gpu-number": 2}))[0] is Code.UNRESOLVABLE


def test_gpu_number_wants_idle_cards_and_a_shared_card_is_not_idle():
    found = policies("n1", node_obj=gpu_node("n1", 2, 8000))
    found["gpushare"].allocate(pod({"volcano.sh/gpu-memory": 1000}))
    number = found["gpu-number"]

    assert number.filter_node(pod({"volcano.sh/gpu-number": 2})) == (
        Code.UNSCHEDULABLE,
        "volcano.sh/gpu-number 2 requested, 1 of 2 cards of node n1 idle",
    )
    assert number.allocate(pod({"volcano.sh/gpu-number": 1}))[GPU_INDEX] == "1"
    assert number.filter_node(pod({"volcano.sh/gpu-number": 3}))[0] is Code.UNRESOLVABLE


def test_a_node_without_gpus_is_unresolvable_for_gpu_pods():
    found = policies("n1", node_obj={"metadata": {"name": "n1"}})

    assert found["gpushare"].filter_node(pod({"volcano.sh/gpu-memory": 1}))[0] is (
        Code.UNRESOLVABLE
    )
    with pytest.raises(PolicyError):
        found["gpu-number"].allocate(pod({"volcano.sh/gpu-number": 1}))


def test_every_policy_says_its_status_in_words():
    found = policies("n1", cams(2), CAM, gpu_node("n1", 2, 8000))

    statuses = {name: p.status() for name, p in found.items()}

    assert (
        statuses["akri-configuration"]
        == "cam: 2 of 2 Instances with a free slot, 0 held or assigned here"
    )
    assert statuses["gpu-number"] == "2 of 2 cards idle"
    assert "4 of 4 slots free" in statuses["akri-instance"]
