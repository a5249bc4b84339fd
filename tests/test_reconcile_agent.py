"""Slot reconciliation end to end: node agents with their reconciler, kubelet simulators over
real gRPC (device plugins and PodResources), the API-server simulator over HTTP."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from agent.kube.claims import ClaimStore
from agent.models import ReconcileRun, SlotEvent, SlotPodBinding
from agent.node.agent import NodeAgent
from tests.reconcile_world import create_pod
from tests.test_agent_lifecycle import (
    CONFIG,
    FOO0,
    AgentCluster,
    configuration_body,
    healthy,
    wait_instances,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

NODES = ("node-a", "node-b")
IL = f"akri.sh/{FOO0}"
CL = f"akri.sh/{CONFIG}"


@pytest.fixture
def cluster(kube):
    started = AgentCluster(kube, nodes=NODES, reconcile=True).start()
    started.api.create_configuration(configuration_body(descriptions=("foo0",), capacity=2))
    wait_instances(started, {FOO0}, NODES)
    for kubelet in started.kubelets():
        kubelet.wait_devices(IL, lambda d: len(healthy(d)) == 2)
    yield started
    started.stop()


def run_pod(cluster: AgentCluster, node: str, name: str, resource: str = IL) -> str:
    """Create the pod in the API server, have the node's kubelet admit it; its device id."""
    pod = create_pod(client.CoreV1Api(cluster.kube.api_client), cluster.kube.namespace, name, node)
    result = cluster[node].kubelet.admit_pod(
        cluster.kube.namespace,
        name,
        [{"name": "main", "requests": {resource: 1}}],
        uid=pod["metadata"]["uid"],
    )
    assert result.admitted, result.error
    [device] = result.container("main").devices[resource]
    return device


def end_pod(cluster: AgentCluster, node: str, name: str) -> None:
    """Delete the pod as a user does; as on a cluster, it stays Terminating until the node's
    kubelet (its PodFinisher) has stopped it and deleted it with grace 0."""
    client.CoreV1Api(cluster.kube.api_client).delete_namespaced_pod(name, cluster.kube.namespace)


def wait_gone(cluster: AgentCluster, name: str) -> None:
    """Until the node's kubelet has finished the pod and the API server has let it go."""
    core = client.CoreV1Api(cluster.kube.api_client)

    def gone() -> bool:
        pods = core.list_namespaced_pod(cluster.kube.namespace).items
        return name not in {p.metadata.name for p in pods}

    cluster.wait_for(gone, message=f"pod {name} gone from the API server")


def bound(cluster: AgentCluster, slot: str, pod: str) -> bool:
    return SlotPodBinding.objects.filter(slot=slot, pod_name=pod).exists()


def test_a_deleted_pods_slot_is_free_and_offered_to_other_nodes_at_once(cluster):
    slot = run_pod(cluster, "node-a", "web-1")
    cluster.wait_for(lambda: bound(cluster, slot, "web-1"), message="the slot bound to web-1")
    cluster["node-b"].kubelet.wait_devices(IL, lambda d: d[slot] == "Unhealthy")

    started = time.monotonic()
    end_pod(cluster, "node-a", "web-1")

    cluster.wait_for(lambda: cluster.usage(FOO0)[slot] == "", message="the slot free")
    # Generous (speed is the release bench's): still well below Akri v0.13's 20-30 s.
    assert time.monotonic() - started < 10.0
    cluster["node-b"].kubelet.wait_devices(IL, lambda d: d[slot] == "Healthy")
    run = cluster.wait_for(
        lambda: ReconcileRun.objects.filter(node="node-a", trigger="event", released=1).first()
    )
    assert run.scope == "node"
    assert SlotEvent.objects.filter(slot=slot, before="node-a", after="").exists()


def test_a_configuration_level_slot_is_released_when_its_pod_goes(cluster):
    cluster["node-a"].kubelet.wait_devices(CL, lambda d: len(healthy(d)) >= 1)
    vdev = run_pod(cluster, "node-a", "cl-1", CL)
    [slot] = [k for k, v in cluster.usage(FOO0).items() if v == f"C:{vdev}:node-a"]
    cluster.wait_for(lambda: bound(cluster, slot, "cl-1"), message="the CL slot bound to cl-1")

    end_pod(cluster, "node-a", "cl-1")

    cluster.wait_for(lambda: cluster.usage(FOO0)[slot] == "", message="the CL slot free")


def test_a_kubelet_restart_frees_nothing_and_reconciliation_goes_on(cluster):
    slot = run_pod(cluster, "node-a", "web-1")
    cluster.wait_for(lambda: bound(cluster, slot, "web-1"))
    reconciler = cluster["node-a"].agent.reconciler

    cluster["node-a"].kubelet.restart()
    run = reconciler.sweep()

    assert (run.released, run.errors) == (0, 0)
    assert cluster.usage(FOO0)[slot] == "node-a"
    end_pod(cluster, "node-a", "web-1")
    cluster.wait_for(
        lambda: cluster.usage(FOO0)[slot] == "", message="the slot free after the restart"
    )


def test_a_restarted_agent_frees_what_went_while_it_was_down_and_keeps_the_rest(cluster):
    gone = run_pod(cluster, "node-a", "gone")
    kept = run_pod(cluster, "node-a", "kept")
    cluster.wait_for(lambda: bound(cluster, gone, "gone") and bound(cluster, kept, "kept"))
    node = cluster["node-a"]
    node.agent.stop()
    end_pod(cluster, "node-a", "gone")
    wait_gone(cluster, "gone")  # while the agent is down

    node.agent = NodeAgent(
        node.name,
        cluster.kube.new_client(),
        cluster.kube.namespace,
        node.plugin_dir,
        node.kubelet.pod_resources_socket,
        handlers=node.handlers,
        sync=cluster.sync,
        offline_grace=cluster.grace,
    ).start()

    cluster.wait_for(
        lambda: cluster.usage(FOO0)[gone] == "", message="the slot of the deleted pod free"
    )
    cluster.wait_for(
        lambda: ReconcileRun.objects.filter(node="node-a", trigger="startup", released=1).exists()
    )
    assert cluster.usage(FOO0)[kept] == "node-a"
    assert bound(cluster, kept, "kept")


def test_a_live_pods_slot_released_by_hand_is_claimed_back_without_waiting_for_a_sweep(cluster):
    slot = run_pod(cluster, "node-a", "web-1")
    cluster.wait_for(lambda: bound(cluster, slot, "web-1"))

    ClaimStore(cluster.api, "user:ops").release(FOO0, slot, "node-a", cause=SlotEvent.Cause.MANUAL)

    cluster.wait_for(lambda: cluster.usage(FOO0)[slot] == "node-a", message="the slot claimed back")
    run = cluster.wait_for(lambda: ReconcileRun.objects.filter(node="node-a", restored=1).first())
    assert run.trigger == "event"  # the Instance change, not a sweep (every 10 s)
    assert f"{slot}: restored for {cluster.kube.namespace}/web-1" in run.detail
