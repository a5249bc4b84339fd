"""The Configuration-level plugin: ``akri.sh/<configuration>`` requests mapped onto real slots."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from agent.kube.claims import ClaimStore
from agent.protos import deviceplugin_pb2 as dp
from agent.protos import deviceplugin_pb2_grpc as dp_grpc

from .test_agent_lifecycle import (
    CONFIG,
    FOO0,
    FOO1,
    AgentCluster,
    allocate,
    configuration_body,
    healthy,
    wait_instances,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

RESOURCE = f"akri.sh/{CONFIG}"


@pytest.fixture
def cluster(kube):
    started = AgentCluster(kube, nodes=("node-a", "node-b")).start()
    yield started
    started.stop()


def preferred(endpoint: str, available: list[str], size: int) -> Any:
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, allocation_size=size
            )
        ]
    )
    with grpc.insecure_channel("unix://" + endpoint) as channel:
        try:
            return dp_grpc.DevicePluginStub(channel).GetPreferredAllocation(request, timeout=5)
        except grpc.RpcError as exc:
            return exc


def start(cluster: AgentCluster, **spec) -> None:
    cluster.api.create_configuration(configuration_body(**spec))
    wait_instances(cluster, {FOO0, FOO1}, nodes=("node-a", "node-b"))


def test_two_configuration_devices_get_two_distinct_instances(cluster):
    start(cluster)
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)

    result = kubelet.admit_pod("default", "two", [{"name": "c", "requests": {RESOURCE: 2}}])

    assert result.admitted, result.error
    vdevs = result.container("c").devices[RESOURCE]
    values = {**cluster.usage(FOO0), **cluster.usage(FOO1)}
    held = {k: v for k, v in values.items() if v}
    assert sorted(held.values()) == sorted(f"C:{v}:node-a" for v in vdevs)
    assert {k.rsplit("-", 1)[0] for k in held} == {FOO0, FOO1}
    envs = result.container("c").envs
    assert envs["DEBUG_ECHO_DESCRIPTION_8120FE"] == "foo0"
    assert envs["DEBUG_ECHO_DESCRIPTION_A19705"] == "foo1"
    # The pod's vdevs stay Healthy (it holds them: the kubelet counts them in allocatable and
    # kube-scheduler subtracts the pod's request), and each camera's other slot is offered
    # through one more vdev; the IL slots the pod took are gone from the IL views.
    devices = kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 4)
    assert set(vdevs) <= healthy(devices)
    assert kubelet.free(RESOURCE) == 2
    for instance in (FOO0, FOO1):
        il = kubelet.wait_devices(f"akri.sh/{instance}", lambda d: len(healthy(d)) == 1)
        assert len(il) == 2
        other = cluster["node-b"].kubelet
        other.wait_devices(f"akri.sh/{instance}", lambda d: len(healthy(d)) == 1)


def test_three_unique_devices_where_two_exist_are_refused_whole(cluster):
    start(cluster)
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)

    answer = allocate(kubelet, RESOURCE, [f"{CONFIG}-0", f"{CONFIG}-1", f"{CONFIG}-2"])

    assert isinstance(answer, grpc.RpcError)
    assert answer.code() == grpc.StatusCode.UNKNOWN
    assert "3 unique devices requested, 2 available" in answer.details()
    assert cluster.usage(FOO0) == {f"{FOO0}-0": "", f"{FOO0}-1": ""}
    assert cluster.usage(FOO1) == {f"{FOO1}-0": "", f"{FOO1}-1": ""}
    assert cluster.events() == []


def test_a_refused_request_releases_the_claims_it_made(cluster):
    start(cluster)
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)
    cluster.sync.instances.stop()  # node-a's view goes stale: it still sees foo1 free
    cluster.api.patch_instance(
        FOO1,
        [
            {"op": "replace", "path": f"/spec/deviceUsage/{FOO1}-0", "value": "x:y"},
            {"op": "replace", "path": f"/spec/deviceUsage/{FOO1}-1", "value": "x:z"},
        ],
    )

    answer = allocate(kubelet, RESOURCE, [f"{CONFIG}-0", f"{CONFIG}-1"])

    assert isinstance(answer, grpc.RpcError)
    assert "2 unique devices requested, 1 available" in answer.details()
    assert cluster.usage(FOO0) == {f"{FOO0}-0": "", f"{FOO0}-1": ""}
    assert cluster.usage(FOO1) == {f"{FOO1}-0": "x:y", f"{FOO1}-1": "x:z"}
    assert [e.cause for e in cluster.events(instance=FOO0)] == ["allocate", "release"]


def test_a_slot_lost_between_plan_and_write_is_planned_again(cluster):
    start(cluster)
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)
    cluster.sync.instances.stop()  # node-a does not hear of node-b's claims
    other = ClaimStore(cluster.api, "agent:node-b")
    other.claim(FOO0, f"{FOO0}-0", "node-b")
    other.claim(FOO1, f"{FOO1}-0", "node-b")

    answer = allocate(kubelet, RESOURCE, [f"{CONFIG}-0", f"{CONFIG}-1"])

    assert isinstance(answer, dp.AllocateResponse), answer
    assert cluster.usage(FOO0)[f"{FOO0}-0"] == "node-b"
    assert cluster.usage(FOO0)[f"{FOO0}-1"].endswith(":node-a")
    assert cluster.usage(FOO1)[f"{FOO1}-0"] == "node-b"
    assert cluster.usage(FOO1)[f"{FOO1}-1"].endswith(":node-a")


def test_packing_puts_several_slots_on_one_instance(cluster):
    start(cluster, unique=False)
    kubelet = cluster["node-a"].kubelet
    devices = kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 4)
    assert len(devices) == 4

    result = kubelet.admit_pod("default", "packed", [{"name": "c", "requests": {RESOURCE: 2}}])

    assert result.admitted, result.error
    assert sorted(v for v in cluster.usage(FOO0).values() if v) == sorted(
        f"C:{v}:node-a" for v in result.container("c").devices[RESOURCE]
    )
    assert cluster.usage(FOO1) == {f"{FOO1}-0": "", f"{FOO1}-1": ""}
    # The pod's two vdevs stay Healthy (allocated to it); a19705's two slots are offered.
    kubelet.wait_for(lambda: kubelet.free(RESOURCE) == 2)
    assert kubelet.allocatable(RESOURCE) == 4


def test_cl_pods_on_one_node_are_admitted_while_slots_are_free(cluster):
    """Issue 27's reproduction: after the first CL pod, the node keeps taking CL pods until
    every slot is held, and what the kubelet counts free is always what is free."""
    start(cluster, capacity=3)
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)

    first = kubelet.admit_pod(
        "default",
        "two-containers",
        [{"name": "c1", "requests": {RESOURCE: 1}}, {"name": "c2", "requests": {RESOURCE: 1}}],
    )
    assert first.admitted, first.error
    pods = [first]
    for n in range(4):
        kubelet.wait_for(lambda n=n: kubelet.free(RESOURCE) == min(2, 4 - n))
        assert kubelet.free(RESOURCE) == min(2, 4 - n)  # unique: one per camera with room
        late = kubelet.admit_pod("default", f"late-{n}", [{"name": "c", "requests": {RESOURCE: 1}}])
        assert late.admitted, (n, late.error)
        pods.append(late)
    kubelet.wait_for(lambda: kubelet.free(RESOURCE) == 0)
    assert kubelet.free(RESOURCE) == 0
    assert not kubelet.admit_pod(
        "default", "one-too-many", [{"name": "c", "requests": {RESOURCE: 1}}]
    ).admitted

    values = [v for i in (FOO0, FOO1) for v in cluster.usage(i).values() if v]
    vdevs = [v for pod in pods for c in pod.containers for v in c.devices[RESOURCE]]
    assert sorted(values) == sorted(f"C:{v}:node-a" for v in vdevs)
    assert len(set(vdevs)) == 6
    # Every held vdev is Healthy, allocated to its pod: allocatable 6, requests 6.
    assert kubelet.allocatable(RESOURCE) == 6


def test_a_re_asked_vdev_maps_to_the_slot_it_already_holds(cluster):
    start(cluster)
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)
    assert isinstance(allocate(kubelet, RESOURCE, [f"{CONFIG}-0"]), dp.AllocateResponse)
    before = {**cluster.usage(FOO0), **cluster.usage(FOO1)}

    again = allocate(kubelet, RESOURCE, [f"{CONFIG}-0"])

    assert isinstance(again, dp.AllocateResponse)
    assert {**cluster.usage(FOO0), **cluster.usage(FOO1)} == before
    assert len(cluster.events()) == 1


def test_preferred_allocation_names_the_lowest_available_devices(cluster):
    start(cluster)
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)
    kubelet.wait_devices(f"akri.sh/{FOO0}")  # its IL plugin registers on its own schedule
    state = kubelet.resources()[RESOURCE]
    assert state.options.get_preferred_allocation_available
    il = kubelet.resources()[f"akri.sh/{FOO0}"]
    assert not il.options.get_preferred_allocation_available
    answer = preferred(state.endpoint, [f"{CONFIG}-1", f"{CONFIG}-0"], 1)
    refused = preferred(il.endpoint, [f"{FOO0}-0"], 1)

    assert list(answer.container_responses[0].deviceIDs) == [f"{CONFIG}-0"]
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.UNIMPLEMENTED


def test_device_lists_wait_for_every_hold_and_go_out_when_the_last_one_ends(cluster):
    """What an Allocate's RPC does around its claims (``defer_notifications``): a claim made
    meanwhile changes health, and the kubelet hears of it only once every hold has ended;
    releasing the same hold twice ends nothing else."""
    start(cluster)
    node = cluster["node-a"]
    kubelet, agent = node.kubelet, node.agent
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)
    first, second = agent.defer_notifications(), agent.defer_notifications()

    value = f"C:{CONFIG}-0:node-a"
    assert agent.claims.claim(FOO0, f"{FOO0}-0", value, node="node-a") == "claimed"
    first()
    first()
    with pytest.raises(TimeoutError):
        kubelet.wait_devices(RESOURCE, lambda d: len(d) == 3, timeout=0.5)

    second()
    # The held vdev stays Healthy and both cameras still have a free slot: 3 listed.
    devices = kubelet.wait_devices(RESOURCE, lambda d: len(d) == 3)
    assert devices[f"{CONFIG}-0"] == "Healthy"


def test_held_vdevs_offered_together_to_a_new_pod_are_planned_afresh(cluster):
    """Two pods each held a slot of the same camera and ended; before their releases are
    through, the kubelet offers both vdevs to one new pod asking for two unique devices. They
    are the node's to give, so the pod gets two distinct cameras, not an admission error."""
    start(cluster)
    node = cluster["node-a"]
    kubelet, agent = node.kubelet, node.agent
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)
    vdevs = [f"{CONFIG}-0", f"{CONFIG}-1"]
    for i, vdev in enumerate(vdevs):
        held = f"C:{vdev}:node-a"
        assert agent.claims.claim(FOO0, f"{FOO0}-{i}", held, node="node-a") == "claimed"
    kubelet.wait_devices(RESOURCE, lambda d: set(vdevs) <= healthy(d))

    answer = allocate(kubelet, RESOURCE, vdevs)

    assert isinstance(answer, dp.AllocateResponse), answer
    values = {**cluster.usage(FOO0), **cluster.usage(FOO1)}
    held = {k.rsplit("-", 1)[0]: v for k, v in values.items() if v}
    assert sorted(held) == [FOO0, FOO1]
    assert sorted(held.values()) == sorted(f"C:{v}:node-a" for v in vdevs)


def test_a_vdev_from_the_list_before_the_last_is_admitted_while_slots_are_free(cluster):
    """In unique mode the node lists held vdevs plus one per Instance with a free slot, so its
    list shrinks as pods are admitted; in a burst the kubelet may pick an id from the list
    before the last. That id is a count, held by no pod here: with slots free the pod is
    admitted (it used to fail with "not a device of"), and an id no list could hold is still
    refused."""
    start(cluster)
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2)
    beyond = f"{CONFIG}-5"  # well-formed, beyond the two ids listed now

    answer = allocate(kubelet, RESOURCE, [beyond])

    assert isinstance(answer, dp.AllocateResponse), answer
    values = {**cluster.usage(FOO0), **cluster.usage(FOO1)}
    assert sorted(v for v in values.values() if v) == [f"C:{beyond}:node-a"]
    refused = allocate(kubelet, RESOURCE, [f"{CONFIG}-x"])
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
