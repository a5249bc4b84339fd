"""The demo's brokers: in a simulated cluster (agents, kubelets, controller, embedded runner)
a debugEcho Configuration with a brokerPodSpec gets its brokers running on the nodes' devices,
and its Services; a broker deleted by hand comes back."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from agent.brokers.dispatch import Dispatcher
from agent.brokers.models import Broker
from agent.brokers.specs import with_brokers
from agent.simulator.cluster import SimulatedCluster, debug_echo_configuration

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(predicate, timeout=30.0, message=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {message}")


@pytest.fixture
def cluster(settings):
    body = with_brokers(debug_echo_configuration("akri-debug-echo-foo", ["foo0"], capacity=2))
    running = SimulatedCluster(nodes=2, configurations=[body])
    settings.AKRI = {**settings.AKRI, "KUBECONFIG": running.kubeconfig, "NAMESPACE": "default"}
    running.start()
    yield running
    running.stop()


def running_brokers(cluster) -> dict[str, str]:
    pods = cluster.core.list_namespaced_pod("default", label_selector="akri.sh/configuration")
    return {p.metadata.name: p.spec.node_name for p in pods.items if p.status.phase == "Running"}


def services(cluster) -> set[str]:
    return {s.metadata.name for s in cluster.core.list_namespaced_service("default").items}


def test_debug_echo_brokers_run_on_their_nodes_devices_with_services(cluster):
    wanted = {f"node-{n}-akri-debug-echo-foo-8120fe-pod": f"node-{n}" for n in "ab"}

    wait_for(lambda: running_brokers(cluster) == wanted, message="both brokers Running")
    wait_for(
        lambda: services(cluster) == {"akri-debug-echo-foo-8120fe-svc", "akri-debug-echo-foo-svc"},
        message="the Instance and Configuration Services",
    )
    usage = cluster.akri.get_instance("akri-debug-echo-foo-8120fe")["spec"]["deviceUsage"]
    assert sorted(v for v in usage.values() if v) == ["node-a", "node-b"]  # a slot per broker
    wait_for(
        lambda: Broker.objects.filter(kind="Pod", phase="Running").count() == 2, message="mirror"
    )

    cluster.core.delete_namespaced_pod("node-a-akri-debug-echo-foo-8120fe-pod", "default")
    with_grace = client.V1DeleteOptions(grace_period_seconds=0)
    try:  # a bound pod may stay Terminating until its kubelet finishes: the runner does
        cluster.core.delete_namespaced_pod(
            "node-a-akri-debug-echo-foo-8120fe-pod", "default", body=with_grace
        )
    except client.ApiException as exc:
        assert exc.status == 404
    Dispatcher().level("default")  # what beat (the demo's timer) does every 30 s
    wait_for(lambda: running_brokers(cluster) == wanted, message="the broker back")
