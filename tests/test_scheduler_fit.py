"""kube-scheduler's resource fit and the agents' device lists agree (issue 27).

The scheduler stand-in (``agent.simulator.scheduler``) does what kube-scheduler's
``NodeResourcesFit`` does for extended resources: a node's allocatable (its kubelet's Healthy
devices) minus the requests of the pods bound to it. These tests run pods through it, with no
extender, against the agents and kubelet simulators, on the simulator or a real API server.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest
from kubernetes import client

from agent.simulator.scheduler import MiniScheduler, pod_body

from .test_agent_lifecycle import (
    CONFIG,
    FOO0,
    FOO1,
    AgentCluster,
    configuration_body,
    wait_instances,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

RESOURCE = f"akri.sh/{CONFIG}"


@pytest.fixture
def one_node(kube):
    cluster = AgentCluster(kube, nodes=("node-a",), reconcile=True).start()
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("unique", [True, False], ids=["unique", "packing"])
def test_cl_pods_keep_landing_on_a_node_while_it_has_free_slots(kube, one_node, unique):
    """The reproduction: two Instances of capacity 2 on one node, pods asking for one
    Configuration-level device each. Every pod is scheduled and admitted until the four slots
    are held; the fifth is Pending for want of devices, and runs once a slot is freed."""
    cluster = one_node
    cluster.api.create_configuration(configuration_body(capacity=2, unique=unique))
    wait_instances(cluster, {FOO0, FOO1}, nodes=("node-a",))
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == (2 if unique else 4), timeout=10)
    core = client.CoreV1Api(kube.api_client)
    scheduler = MiniScheduler(core, kube.namespace, None, {"node-a": kubelet})

    # What the node can still claim after each pod: unique, one per camera with a free slot;
    # packing, every free slot. The kubelet's free count must come to it (its device lists
    # travel asynchronously, as the node status a real scheduler reads does).
    still_free = [2, 2, 1, 0] if unique else [3, 2, 1, 0]
    for n in range(4):
        outcome = scheduler.schedule(scheduler.create(f"cl-{n}", {RESOURCE: 1}))
        assert (outcome.node, outcome.admitted, outcome.error) == ("node-a", True, ""), n
        assert kubelet.wait_for(lambda n=n: kubelet.free(RESOURCE) == still_free[n], 10), n

    # Held vdevs stay in allocatable, and the pods' requests take them out once: 4 - 4 = 0.
    assert kubelet.allocatable(RESOURCE) == 4
    held = [v for i in (FOO0, FOO1) for v in cluster.usage(i).values() if v]
    assert len(held) == 4
    waiting = scheduler.create("cl-waits", {RESOURCE: 1})
    pending = scheduler.schedule(waiting)
    assert pending.node == ""
    assert pending.unfit == {"node-a": f"Insufficient {RESOURCE}"}
    assert pending.message(1) == f"0/1 nodes are available: 1 Insufficient {RESOURCE}."

    core.delete_namespaced_pod("cl-1", kube.namespace)
    started = time.monotonic()
    deadline = started + 15
    while True:
        outcome = scheduler.schedule(waiting)
        if outcome.node or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (outcome.node, outcome.admitted, outcome.error) == ("node-a", True, "")
    print(f"rescheduled {time.monotonic() - started:.2f} s after the delete")


def node_with(name: str, allocatable: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": dict(allocatable), "allocatable": dict(allocatable)},
    }


def bound_pod(name: str, node: str, containers: list, init: list | None = None) -> dict:
    spec = {"nodeName": node, "containers": containers}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name}, "spec": spec}


def container(name: str, count: str, restart: str | None = None) -> dict:
    asked = {"example.com/gpu-memory": count}
    found = {"name": name, "image": "busybox", "resources": {"requests": asked, "limits": asked}}
    if restart:
        found["restartPolicy"] = restart
    return found


def test_the_fit_reads_quantities_as_stored_and_counts_init_containers_as_the_scheduler(kube):
    """Node capacity as the API server stores it ("2k"), requests of bound pods summed over
    containers and sidecars, plain init containers at their peak, finished pods not at all."""
    core = client.CoreV1Api(kube.api_client)
    node = f"fit-{kube.namespace}"[:60]
    core.create_node(node_with(node, {"example.com/gpu-memory": "2000"}))
    try:
        stored = json.loads(core.read_node(node, _preload_content=False).data)
        assert stored["status"]["allocatable"]["example.com/gpu-memory"] == "2k"
        # 700 + sidecar 100 = 800 running; the init phase peaks at 900 + 100 = 1000.
        core.create_namespaced_pod(
            kube.namespace,
            bound_pod(
                "sidecar",
                node,
                [container("main", "700")],
                [container("side", "100", "Always"), container("setup", "900")],
            ),
        )
        done = core.create_namespaced_pod(
            kube.namespace, bound_pod("done", node, [container("main", "1500")])
        )
        core.patch_namespaced_pod_status("done", kube.namespace, {"status": {"phase": "Succeeded"}})
        scheduler = MiniScheduler(core, kube.namespace, None, {node: None})
        fits = pod_body("fits", {"example.com/gpu-memory": 1000})
        too_much = pod_body("too-much", {"example.com/gpu-memory": 1001})

        assert scheduler.requested([node]) == {node: {"example.com/gpu-memory": 1000}}
        assert scheduler.fit(fits, [node]) == ([node], {})
        assert scheduler.fit(too_much, [node]) == (
            [],
            {node: "Insufficient example.com/gpu-memory"},
        )
        # Left to an extender that manages it: the scheduler does not count it.
        ignoring = MiniScheduler(
            core, kube.namespace, None, {node: None}, frozenset({"example.com/gpu-memory"})
        )
        assert ignoring.fit(too_much, [node]) == ([node], {})
        assert done.metadata.name == "done"
    finally:
        for name in ("sidecar", "done"):
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(name, kube.namespace, grace_period_seconds=0)
        core.delete_node(node)
