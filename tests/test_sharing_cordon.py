"""The Akri sharing policies treat a cordoned Instance as absent and say why in words."""

from __future__ import annotations

import dataclasses

from agent.domain.cordon import Cordon
from agent.sharing.policy import Code
from tests.sharing_world import configs, instance, pod, policies

CAM = configs(("cam", 2, True))
PACKED = configs(("cam", 2, False))
ALICE = Cordon("alice", "replacing lens")


def cordoned(state, cordon=ALICE):
    return dataclasses.replace(state, cordon=cordon)


def test_an_instance_request_for_a_cordoned_instance_is_refused_in_words():
    cam = cordoned(instance("cam-000000", ("n1",), 2, {0: "n1"}))
    il = policies("n1", [cam], CAM)["akri-instance"]

    code, reason = il.filter_node(pod({"akri.sh/cam-000000": 1}))

    assert code is Code.UNRESOLVABLE
    assert reason == "Instance cam-000000 is cordoned by alice: replacing lens"
    assert il.slots.free("cam-000000") == []


def test_uncordoned_the_same_instance_fits_again():
    cam = instance("cam-000000", ("n1",), 2, {0: "n1"})
    il = policies("n1", [cam], CAM)["akri-instance"]

    assert il.filter_node(pod({"akri.sh/cam-000000": 1})) == (Code.SUCCESS, "")


def test_a_configuration_request_does_not_count_a_cordoned_instance():
    cams = [cordoned(instance("cam-000000", ("n1",))), instance("cam-000001", ("n1",))]
    cl = policies("n1", cams, CAM)["akri-configuration"]

    assert cl.filter_node(pod({"akri.sh/cam": 1})) == (Code.SUCCESS, "")
    code, reason = cl.filter_node(pod({"akri.sh/cam": 2}))

    assert code is Code.UNRESOLVABLE
    assert reason == (
        "2 unique cam devices requested, node n1 sees 1; "
        "Instance cam-000000 is cordoned by alice: replacing lens"
    )


def test_a_configuration_allocation_never_assigns_a_cordoned_slot():
    cams = [cordoned(instance("cam-000000", ("n1",))), instance("cam-000001", ("n1",))]
    for config in (CAM, PACKED):
        cl = policies("n1", cams, config)["akri-configuration"]
        annotations = cl.allocate(pod({"akri.sh/cam": 1}))
        assert "cam-000000" not in annotations["akri.sh/assignment"]
        assert "cam-000001-" in annotations["akri.sh/assignment"]


def test_packing_over_only_cordoned_instances_is_refused_in_words():
    cams = [cordoned(instance("cam-000000", ("n1",)))]
    cl = policies("n1", cams, PACKED)["akri-configuration"]

    code, reason = cl.filter_node(pod({"akri.sh/cam": 1}))

    assert code is Code.UNRESOLVABLE
    assert "cordoned by alice: replacing lens" in reason
