"""The agent's plugins and the kubelet: restarts, lost sockets, late kubelets, clean stops."""

from __future__ import annotations

import os
import time

import pytest

from agent.protos import deviceplugin_pb2 as dp

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

RESOURCES = (f"akri.sh/{FOO0}", f"akri.sh/{FOO1}", f"akri.sh/{CONFIG}")


@pytest.fixture
def cluster(kube):
    started = AgentCluster(kube, nodes=("node-a",)).start()
    yield started
    started.stop()


def ready(cluster: AgentCluster) -> None:
    cluster.api.create_configuration(configuration_body())
    wait_instances(cluster, {FOO0, FOO1}, nodes=("node-a",))
    for resource in RESOURCES:
        cluster["node-a"].kubelet.wait_devices(resource, lambda d: len(healthy(d)) == 2)


def test_every_plugin_re_registers_after_a_kubelet_restart(cluster):
    ready(cluster)
    kubelet = cluster["node-a"].kubelet
    admitted = kubelet.admit_pod(
        "default", "before", [{"name": "c", "requests": {RESOURCES[0]: 1}}]
    )
    assert admitted.admitted
    old_sockets = cluster["node-a"].sockets()
    restarted = time.monotonic()

    kubelet.restart()

    for resource in RESOURCES:
        kubelet.wait_registration(resource, after=restarted, timeout=20)
    devices = kubelet.wait_devices(RESOURCES[0], lambda d: len(d) == 2, timeout=20)
    assert len(healthy(devices)) == 2  # node-a's own slot stays Healthy
    assert kubelet.wait_devices(RESOURCES[2], lambda d: len(healthy(d)) == 2)
    kubelet.wait_devices(RESOURCES[1], lambda d: len(healthy(d)) == 2)
    after = kubelet.admit_pod("default", "after", [{"name": "c", "requests": {RESOURCES[1]: 1}}])
    assert after.admitted, after.error
    assert len(cluster["node-a"].sockets()) == 3
    assert [p.registrations for p in cluster["node-a"].agent.plugins().values()] == [2, 2, 2]
    assert old_sockets  # the kubelet wiped them; the new ones may reuse a name within a second


def test_a_plugin_whose_socket_vanished_serves_and_registers_again(cluster):
    ready(cluster)
    kubelet = cluster["node-a"].kubelet
    plugin = cluster["node-a"].agent.plugins()[RESOURCES[0]]
    lost = time.monotonic()

    os.unlink(plugin.socket_path)

    event = kubelet.wait_registration(RESOURCES[0], after=lost, timeout=20)
    assert os.path.exists(event.endpoint)
    assert isinstance(allocate(kubelet, RESOURCES[0], [f"{FOO0}-0"]), dp.AllocateResponse)


def test_plugins_wait_for_a_kubelet_that_is_not_there_yet(kube):
    cluster = AgentCluster(kube, nodes=("node-a",))
    kubelet = cluster["node-a"].kubelet
    cluster.start()
    kubelet.stop()
    try:
        cluster.api.create_configuration(configuration_body())
        wait_instances(cluster, {FOO0, FOO1}, nodes=("node-a",))
        cluster.wait_for(lambda: len(cluster["node-a"].agent.plugins()) == 3)
        started = time.monotonic()

        kubelet.start()

        for resource in RESOURCES:
            kubelet.wait_registration(resource, after=started, timeout=20)
    finally:
        cluster.stop()


def test_stopping_the_agent_removes_its_sockets_and_ends_its_streams(cluster):
    ready(cluster)
    kubelet = cluster["node-a"].kubelet
    agent = cluster["node-a"].agent

    agent.stop()

    assert cluster["node-a"].sockets() == []
    for resource in RESOURCES:
        state = kubelet.resources()[resource]
        assert not state.connected
        assert healthy(state.devices) == set()
    assert agent.plugins() == {}
