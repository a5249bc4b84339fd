"""Seed 001's worked example ("Resource sharing between CL and IL device plugins"), step by step
and end to end: the API-server simulator over HTTP, agents for node-a and node-b sharing one
cache sync, a kubelet simulator each, real gRPC. Two cameras (debugEcho ``foo0`` -> ``8120fe``,
``foo1`` -> ``a19705``), shared, capacity 2; once with uniqueDevices true, once false.

What the seed calls a node's "Capacity" after a step is, in kubelet terms, what is still free
to hand out: ``kubelet.free()`` (Healthy minus allocated), which is also what kube-scheduler
computes (allocatable, the Healthy count, minus the requests of the node's pods). The seed
shows one node's view; we assert both nodes'.

One departure from the seed: in unique mode the seed caps a node at one CL slot per camera
(node-a's CL shows "0 (2 - 2)" after its pod took one slot of each). We keep the vdevs a pod
holds Healthy, as every device plugin keeps its held devices, and offer as many more as the
node can still claim; uniqueness binds the devices of one request, so a second pod of node-a
may take the other slot of each camera. Marking held vdevs Unhealthy (Akri #849) makes
kube-scheduler subtract them twice and a node stops taking CL pods after the first.

Where our slot choice differs from the seed's picture, the comments say why. A pod asking for
3 unique devices where 2 exist is refused whole with no claim left behind:
``tests/test_agent_cl.py::test_three_unique_devices_where_two_exist_are_refused_whole``.
"""

from __future__ import annotations

import pytest

from .test_agent_lifecycle import (
    CONFIG,
    FOO0,
    FOO1,
    AgentCluster,
    configuration_body,
    wait_instances,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CL = f"akri.sh/{CONFIG}"
IL0 = f"akri.sh/{FOO0}"  # akri-onvif-8120fe in the seed
IL1 = f"akri.sh/{FOO1}"  # akri-onvif-a19705 in the seed
VDEV0 = f"{CONFIG}-0"
VDEV1 = f"{CONFIG}-1"

Views = dict[str, dict[str, tuple[int, int]]]  # node -> resource -> (capacity, allocatable)


@pytest.fixture
def cluster(kube):
    started = AgentCluster(kube, nodes=("node-a", "node-b")).start()
    yield started
    started.stop()


def advertised(cluster: AgentCluster, node: str) -> dict[str, tuple[int, int]]:
    kubelet = cluster[node].kubelet
    return {r: (kubelet.capacity(r), kubelet.free(r)) for r in (CL, IL0, IL1)}


def assert_views(cluster: AgentCluster, expected: Views) -> None:
    """Each node's kubelet reaches ``expected`` (lists travel asynchronously), then holds it."""
    for node, wanted in expected.items():
        cluster[node].kubelet.wait_for(lambda n=node, w=wanted: advertised(cluster, n) == w)
        assert advertised(cluster, node) == wanted, node


def assert_devices(cluster: AgentCluster, node: str, resource: str, wanted: dict) -> None:
    """The kubelet's list of ``resource`` on ``node`` reaches ``wanted`` (id -> health)."""
    kubelet = cluster[node].kubelet

    def devices() -> dict | None:
        state = kubelet.resources().get(resource)  # None until its plugin has registered
        return state.devices if state is not None else None

    kubelet.wait_for(lambda: devices() == wanted)
    assert devices() == wanted


def device_usage(cluster: AgentCluster) -> dict[str, dict[str, str]]:
    return {FOO0: cluster.usage(FOO0), FOO1: cluster.usage(FOO1)}


def step_0(cluster: AgentCluster, unique: bool) -> None:
    cluster.api.create_configuration(configuration_body(capacity=2, unique=unique))
    wait_instances(cluster, {FOO0, FOO1}, nodes=("node-a", "node-b"))


def step_1(cluster: AgentCluster) -> list[str]:
    """A pod asking for 2 CL devices lands on node-a; returns the vdevs it got."""
    result = cluster["node-a"].kubelet.admit_pod(
        "default", "two-cameras", [{"name": "c", "requests": {CL: 2}}]
    )
    assert result.admitted, result.error
    return result.container("c").devices[CL]


def step_2(cluster: AgentCluster) -> list[str]:
    """A pod asking for 1 of the second camera's IL resource lands on node-b."""
    result = cluster["node-b"].kubelet.admit_pod(
        "default", "second-camera", [{"name": "c", "requests": {IL1: 1}}]
    )
    assert result.admitted, result.error
    return result.container("c").devices[IL1]


def test_seed_001_worked_example_with_unique_devices(cluster):
    step_0(cluster, unique=True)

    # Step 0, as the seed's first Capacity block: CL 2 (one per camera), each IL 2.
    assert_views(
        cluster,
        {
            "node-a": {CL: (2, 2), IL0: (2, 2), IL1: (2, 2)},
            "node-b": {CL: (2, 2), IL0: (2, 2), IL1: (2, 2)},
        },
    )
    # v0.13 leaves free slots out (SSA); we write them as "" (readable by v0.12 as well).
    assert device_usage(cluster) == {
        FOO0: {f"{FOO0}-0": "", f"{FOO0}-1": ""},
        FOO1: {f"{FOO1}-0": "", f"{FOO1}-1": ""},
    }

    vdevs = step_1(cluster)

    # One slot on each camera, as the seed shows. The seed draws a19705-1; we take the first
    # free slot of each Instance, as Akri v0.13's CL Allocate does, so it is a19705-0.
    assert vdevs == [VDEV0, VDEV1]
    assert device_usage(cluster) == {
        FOO0: {f"{FOO0}-0": f"C:{VDEV0}:node-a", f"{FOO0}-1": ""},
        FOO1: {f"{FOO1}-0": f"C:{VDEV1}:node-a", f"{FOO1}-1": ""},
    }
    # The seed shows node-a "CL 0 (2 - 2), IL 1 each". Each camera still has a free slot, so
    # node-a offers two more vdevs besides the pod's two (see the module's docstring); node-b
    # can still get two unique cameras through CL too.
    assert_views(
        cluster,
        {
            "node-a": {CL: (4, 2), IL0: (2, 1), IL1: (2, 1)},
            "node-b": {CL: (2, 2), IL0: (2, 1), IL1: (2, 1)},
        },
    )
    # The pod's vdevs stay Healthy (allocated to it, counted in allocatable and in its
    # request, as kube-scheduler reckons), not Unhealthy as Akri #849 would have them.
    assert_devices(
        cluster,
        "node-a",
        CL,
        {VDEV0: "Healthy", VDEV1: "Healthy", f"{CONFIG}-2": "Healthy", f"{CONFIG}-3": "Healthy"},
    )

    slots = step_2(cluster)

    # The seed gives node-b a19705-0 because its picture had node-a on a19705-1; the only
    # slot of a19705 left here is a19705-1.
    assert slots == [f"{FOO1}-1"]
    assert device_usage(cluster) == {
        FOO0: {f"{FOO0}-0": f"C:{VDEV0}:node-a", f"{FOO0}-1": ""},
        FOO1: {f"{FOO1}-0": f"C:{VDEV1}:node-a", f"{FOO1}-1": "node-b"},
    }
    # The seed's final block (CL 0, 8120fe 1, a19705 0) is node-a's; our node-a still offers
    # the one free slot left (8120fe-1) through CL as well. On node-b that slot shows through
    # both views; a19705's slot node-b holds stays Healthy there (the kubelet may re-ask, Akri
    # PR #556) but is allocated to the pod.
    assert_views(
        cluster,
        {
            "node-a": {CL: (3, 1), IL0: (2, 1), IL1: (2, 0)},
            "node-b": {CL: (2, 1), IL0: (2, 1), IL1: (2, 0)},
        },
    )
    assert_devices(cluster, "node-b", IL1, {f"{FOO1}-0": "Unhealthy", f"{FOO1}-1": "Healthy"})


def test_seed_001_worked_example_with_packing(cluster):
    step_0(cluster, unique=False)

    # Step 0, as the seed's uniqueDevices=false block: CL 4 (2 cameras x capacity 2).
    assert_views(
        cluster,
        {
            "node-a": {CL: (4, 4), IL0: (2, 2), IL1: (2, 2)},
            "node-b": {CL: (4, 4), IL0: (2, 2), IL1: (2, 2)},
        },
    )
    assert device_usage(cluster) == {
        FOO0: {f"{FOO0}-0": "", f"{FOO0}-1": ""},
        FOO1: {f"{FOO1}-0": "", f"{FOO1}-1": ""},
    }

    vdevs = step_1(cluster)

    # The seed says the flow is "exactly the same" without uniqueness; our packing policy
    # fills the most-used Instance first (ties by name), so both slots land on 8120fe and
    # a19705 stays whole for a later request that needs distinct devices.
    assert vdevs == [VDEV0, VDEV1]
    assert device_usage(cluster) == {
        FOO0: {f"{FOO0}-0": f"C:{VDEV0}:node-a", f"{FOO0}-1": f"C:{VDEV1}:node-a"},
        FOO1: {f"{FOO1}-0": "", f"{FOO1}-1": ""},
    }
    # CL shows 4 - used = 2 free on both nodes (the seed would show node-a 4 - 2 too); IL
    # follows where the slots went: 8120fe 0, a19705 2, not the seed's "1 each".
    assert_views(
        cluster,
        {
            "node-a": {CL: (4, 2), IL0: (2, 0), IL1: (2, 2)},
            "node-b": {CL: (4, 2), IL0: (2, 0), IL1: (2, 2)},
        },
    )
    assert_devices(
        cluster,
        "node-a",
        CL,
        {
            VDEV0: "Healthy",
            VDEV1: "Healthy",
            f"{CONFIG}-2": "Healthy",
            f"{CONFIG}-3": "Healthy",
        },
    )

    slots = step_2(cluster)

    assert slots == [f"{FOO1}-0"]
    assert device_usage(cluster) == {
        FOO0: {f"{FOO0}-0": f"C:{VDEV0}:node-a", f"{FOO0}-1": f"C:{VDEV1}:node-a"},
        FOO1: {f"{FOO1}-0": "node-b", f"{FOO1}-1": ""},
    }
    # One slot left (a19705-1), visible through CL and a19705's IL on both nodes: 4 - 3 = 1.
    assert_views(
        cluster,
        {
            "node-a": {CL: (4, 1), IL0: (2, 0), IL1: (2, 1)},
            "node-b": {CL: (4, 1), IL0: (2, 0), IL1: (2, 1)},
        },
    )
