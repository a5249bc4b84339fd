"""A cordoned Instance through the agents' two device plugins, over real gRPC against the
kubelet simulator: no new pod gets one of its slots, held slots stay held, uncordon restores."""

from __future__ import annotations

import grpc
import pytest

from agent import cordon as service
from agent.domain.cordon import cordon_of

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

CL = f"akri.sh/{CONFIG}"
IL0 = f"akri.sh/{FOO0}"


@pytest.fixture
def cluster(kube):
    started = AgentCluster(kube, nodes=("node-a", "node-b")).start()
    started.api.create_configuration(configuration_body())
    wait_instances(started, {FOO0, FOO1}, nodes=("node-a", "node-b"))
    yield started
    started.stop()


def cordon(cluster, name=FOO0):
    return service.cordon(
        cluster.kube.namespace, name, user="alice", reason="replacing lens", api=cluster.api
    )


def test_a_cordoned_instance_gets_no_new_pod_through_its_instance_plugin(cluster):
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(IL0, lambda d: len(healthy(d)) == 2)
    held = kubelet.admit_pod("default", "holder", [{"name": "c", "requests": {IL0: 1}}])
    assert held.admitted, held.error
    (mine,) = held.container("c").devices[IL0]

    cordon(cluster)

    # The free slot goes Unhealthy on both nodes; the held one stays Healthy where it is held.
    devices = kubelet.wait_devices(IL0, lambda d: healthy(d) == {mine})
    assert len(devices) == 2
    cluster["node-b"].kubelet.wait_devices(IL0, lambda d: not healthy(d))
    refused = kubelet.admit_pod("default", "new", [{"name": "c", "requests": {IL0: 1}}])
    assert not refused.admitted
    (free,) = set(devices) - {mine}
    answer = allocate(kubelet, IL0, [free])
    assert isinstance(answer, grpc.RpcError)
    assert "cordoned by alice: replacing lens" in answer.details()
    assert cluster.usage(FOO0) == {mine: "node-a", free: ""}
    # A re-ask for the held slot is not a new claim.
    assert not isinstance(allocate(kubelet, IL0, [mine]), grpc.RpcError)


def test_a_cordoned_instance_gets_no_new_pod_through_the_configuration_plugin(cluster):
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(CL, lambda d: len(healthy(d)) == 2)

    cordon(cluster)

    kubelet.wait_devices(CL, lambda d: len(healthy(d)) == 1)
    one = kubelet.admit_pod("default", "one", [{"name": "c", "requests": {CL: 1}}])
    assert one.admitted, one.error
    assert set(cluster.usage(FOO0).values()) == {""}
    assert sorted(cluster.usage(FOO1).values())[-1].startswith("C:")
    kubelet.wait_devices(CL, lambda d: len(healthy(d)) == 2)  # held vdev + FOO1's other slot
    two = allocate(kubelet, CL, [f"{CONFIG}-2", f"{CONFIG}-3"])
    assert isinstance(two, grpc.RpcError)
    assert set(cluster.usage(FOO0).values()) == {""}


def test_uncordon_lets_pods_in_again(cluster):
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(IL0, lambda d: len(healthy(d)) == 2)
    cordon(cluster)
    kubelet.wait_devices(IL0, lambda d: not healthy(d))

    service.uncordon(cluster.kube.namespace, FOO0, user="alice", api=cluster.api)

    kubelet.wait_devices(IL0, lambda d: len(healthy(d)) == 2)
    kubelet.wait_devices(CL, lambda d: len(healthy(d)) == 2)
    result = kubelet.admit_pod("default", "again", [{"name": "c", "requests": {IL0: 1}}])
    assert result.admitted, result.error
    assert cordon_of(cluster.api.get_instance(FOO0)) is None


def test_the_cordon_survives_an_agent_restart(cluster):
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(IL0, lambda d: len(healthy(d)) == 2)
    cordon(cluster)
    kubelet.wait_devices(IL0, lambda d: not healthy(d))
    node = cluster["node-a"]
    node.agent.stop()

    node.agent = type(node.agent)(
        node.name,
        cluster.kube.new_client(),
        cluster.kube.namespace,
        node.plugin_dir,
        node.kubelet.pod_resources_socket,
        node.registration_socket,
        handlers=node.handlers,
        sync=cluster.sync,
        offline_grace=cluster.grace,
    ).start()

    devices = kubelet.wait_devices(IL0, lambda d: len(d) == 2 and not healthy(d))
    assert set(devices.values()) == {"Unhealthy"}

    # The new agent's own Allocate knows the cordon (the old one is stopped).
    def refused_by_the_new_agent():
        answer = allocate(kubelet, IL0, [sorted(devices)[0]])
        return isinstance(answer, grpc.RpcError) and "cordoned by alice" in answer.details()

    cluster.wait_for(refused_by_the_new_agent, message="the restarted agent refuses")
    assert set(cluster.usage(FOO0).values()) == {""}
