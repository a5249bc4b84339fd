"""The agent's word on its node's pods, end to end: agents with their reconciler, kubelet
simulators over real gRPC (device plugins and PodResources), the scheduler extender, and the
API server over HTTP. After admission each pod says which slots it holds
(``akri-site.io/holds``), and the extender's assignment names the pod the kubelet admitted
(issue 27, item 5)."""

from __future__ import annotations

import json
import threading

import pytest
from kubernetes import client

from agent.discovery.base import HandlerRegistry
from agent.discovery.debugecho import DebugEchoHandler
from agent.domain.holdings import HOLDS, parse_holds
from agent.extender.service import ExtenderService
from agent.node import assignments
from agent.sharing.akri_slots import ASSIGNMENT, CONSUMED
from agent.simulator.scheduler import MiniScheduler, register_nodes, unregister_nodes
from tests.test_agent_lifecycle import AgentCluster, configuration_body, healthy, wait_instances
from tests.test_reconcile_agent import FOO0, IL, end_pod, run_pod

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]


def annotations(kube, name: str) -> dict[str, str]:
    pod = client.CoreV1Api(kube.api_client).read_namespaced_pod(name, kube.namespace)
    return pod.metadata.annotations or {}


def said(kube, name: str) -> dict[str, str] | None:
    return parse_holds(annotations(kube, name).get(HOLDS))


@pytest.fixture
def cluster(kube):
    started = AgentCluster(kube, nodes=("node-a",), reconcile=True).start()
    started.api.create_configuration(configuration_body(descriptions=("foo0",), capacity=2))
    wait_instances(started, {FOO0}, ("node-a",))
    started["node-a"].kubelet.wait_devices(IL, lambda d: len(healthy(d)) == 2)
    yield started
    started.stop()


def test_an_admitted_pod_is_told_which_slot_it_holds_and_nothing_is_written_twice(kube, cluster):
    slot = run_pod(cluster, "node-a", "holder")

    cluster.wait_for(
        lambda: said(kube, "holder") == {f"{kube.namespace}/{slot}": "main"},
        message="the pod's holds annotation",
    )
    reconciler = cluster["node-a"].agent.reconciler
    cluster.wait_for(
        lambda: reconciler.publisher.plan(reconciler.pods.all(), reconciler.bindings()) == [],
        message="nothing left to write",
    )
    assert reconciler.publish()  # an idempotent pass: still nothing to write

    end_pod(cluster, "node-a", "holder")
    cluster.wait_for(lambda: cluster.usage(FOO0)[slot] == "", message="the slot freed")


def test_a_wrong_word_on_a_pod_is_put_right(kube, cluster):
    slot = run_pod(cluster, "node-a", "holder")
    truth = {f"{kube.namespace}/{slot}": "main"}
    cluster.wait_for(lambda: said(kube, "holder") == truth)

    # Someone else claims, on the pod, a slot it does not hold.
    client.CoreV1Api(kube.api_client).patch_namespaced_pod(
        "holder",
        kube.namespace,
        {"metadata": {"annotations": {HOLDS: json.dumps({f"{kube.namespace}/x-0": "c"})}}},
    )

    cluster.wait_for(lambda: said(kube, "holder") == truth, message="the agent's word again")


def test_a_pod_the_agent_never_bound_gets_no_annotation(kube, cluster):
    core = client.CoreV1Api(kube.api_client)
    core.create_namespaced_pod(
        kube.namespace,
        {
            "metadata": {"name": "plain"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "busybox"}]},
        },
    )
    slot = run_pod(cluster, "node-a", "holder")
    cluster.wait_for(lambda: said(kube, "holder") == {f"{kube.namespace}/{slot}": "main"})

    assert HOLDS not in annotations(kube, "plain")


# --- a burst through the scheduler extender (issue 27, item 5) --------------------------------
CONFIG = "burst"
RESOURCE = f"akri.sh/{CONFIG}"
ROOM = 10


@pytest.fixture
def burst_world(kube, settings, monkeypatch):
    settings.AKRI = {**settings.AKRI, "AGENT_ASSIGNMENTS": True}
    # The records of a resource are rewritten once no assignment was taken for this long.
    monkeypatch.setattr(assignments, "TAKE_SETTLE_SECONDS", 0.5)
    cluster = AgentCluster(kube, nodes=("node-a",), reconcile=True)
    node = cluster["node-a"]
    node.handlers = HandlerRegistry()
    node.handlers.register(
        DebugEchoHandler(shared=False, availability_path=node.availability, poll_interval=0.05)
    )
    cluster.start()
    cams = tuple(f"cam{i}" for i in range(ROOM))
    cluster.api.create_configuration(configuration_body(CONFIG, cams, capacity=1, unique=True))
    service = ExtenderService(
        kube.new_client(), namespace=kube.namespace, feed_interval=0.05, kube_interval=3600
    ).start()
    core = client.CoreV1Api(kube.api_client)
    registered = register_nodes(core, ["node-a"])  # the extender binds to existing nodes only
    scheduler = MiniScheduler(core, kube.namespace, service.url, {"node-a": node.kubelet})
    node.kubelet.wait_devices(RESOURCE, lambda d: len(d) == ROOM, timeout=10)
    kube.wait_for(lambda: len(service.state._instances) == ROOM, timeout=10, message="the books")
    yield cluster, scheduler
    service.stop()
    cluster.stop()
    unregister_nodes(core, registered)


def holders_by_slot(cluster: AgentCluster, admitted: dict[str, list[str]]) -> dict[str, str]:
    """slot key -> the pod whose kubelet admission got that slot's vdev."""
    vdev_of_slot = {
        key: value.split(":")[1]
        for obj in cluster.instances().values()
        for key, value in obj["spec"]["deviceUsage"].items()
        if value.startswith("C:")
    }
    pod_of_vdev = {vdev: pod for pod, vdevs in admitted.items() for vdev in vdevs}
    return {key: pod_of_vdev[vdev] for key, vdev in vdev_of_slot.items()}


def test_a_burst_admitted_out_of_order_ends_with_every_record_naming_the_admitted_pod(
    kube, burst_world
):
    cluster, scheduler = burst_world
    pods = [scheduler.create(f"burst-{i:02d}", {RESOURCE: 1}) for i in range(2 * ROOM)]
    bound = [p for p in pods if scheduler.bind_best(p).node == "node-a"]
    assert len(bound) == ROOM  # room for ten: the other ten wait Pending

    # The kubelet admits in its own order: the youngest first, all at once.
    admitted: dict[str, list[str]] = {}
    errors: list[str] = []

    def admit(pod: dict) -> None:
        name = pod["metadata"]["name"]
        result = cluster["node-a"].kubelet.admit_pod(
            kube.namespace,
            name,
            [{"name": "main", "requests": {RESOURCE: 1}}],
            uid=pod["metadata"]["uid"],
        )
        if result.admitted:
            admitted[name] = result.container("main").devices[RESOURCE]
        else:
            errors.append(f"{name}: {result.error}")

    threads = [threading.Thread(target=admit, args=(p,)) for p in reversed(bound)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == [] and len(admitted) == ROOM

    by_slot = holders_by_slot(cluster, admitted)
    assert len(by_slot) == ROOM  # no slot overbooked, none lost
    held = {pod: slot for slot, pod in by_slot.items()}

    def records_true() -> bool:
        for name, slot in held.items():
            notes = annotations(kube, name)
            assignment = json.loads(notes[ASSIGNMENT])
            if assignment["slots"] != {RESOURCE: [slot]}:
                return False
            if json.loads(notes.get(CONSUMED, "{}")) != {RESOURCE: 1}:
                return False
            if parse_holds(notes.get(HOLDS)) != {f"{kube.namespace}/{slot}": "main"}:
                return False
        return True

    cluster.wait_for(records_true, timeout=30, message="every record naming the admitted pod")


def test_the_plan_leaves_a_pod_admitted_once_that_holds_nothing_now_alone(kube):
    """A pod whose slot was released under it (by an operator, say) will not Allocate again:
    its record is not handed reservations back, while a waiting pod's wrong mark is undone."""
    from agent.kube.client import CoreApi
    from agent.node.holdings import Publisher
    from agent.node.reconcile import Binding, PodInfo
    from agent.sharing.akri_slots import format_assignment

    resource = "akri.sh/cams"

    def pod(name: str, slot: str, consumed: int, holds: str | None) -> PodInfo:
        notes = [(ASSIGNMENT, format_assignment("node-a", 1, {resource: [slot]}))]
        if consumed:
            notes.append((CONSUMED, json.dumps({resource: consumed})))
        if holds is not None:
            notes.append((HOLDS, holds))
        return PodInfo("ns", name, f"uid-{name}", "Running", annotated=True, notes=tuple(notes))

    admitted = pod("admitted", "cams-b-0", 0, None)  # ran on the waiting pod's slot
    waiting = pod("waiting", "cams-a-0", 1, None)  # marked by the admitted pod's Allocate
    released = pod("released", "cams-c-0", 1, "{}")  # admitted before; slot released since
    bindings = [
        Binding("cams-a-0", "cams-a", "v0", resource, allocated_at=None, pod_namespace="ns",
                pod_name="admitted", pod_uid="uid-admitted", container="main"),
    ]  # fmt: skip
    publisher = Publisher(CoreApi(kube.api_client), "node-a", kube.namespace)

    plan = {c.name: c for c in publisher.plan([admitted, waiting, released], bindings)}

    assert "released" not in plan
    assert list(plan) == ["waiting", "admitted"]  # the waiting pod's reservation first
    assert json.loads(plan["waiting"].changes[ASSIGNMENT])["slots"] == {resource: ["cams-b-0"]}
    assert plan["waiting"].changes[CONSUMED] is None
    assert json.loads(plan["admitted"].changes[ASSIGNMENT])["slots"] == {resource: ["cams-a-0"]}
    assert json.loads(plan["admitted"].changes[CONSUMED]) == {resource: 1}
    assert parse_holds(plan["admitted"].changes[HOLDS]) == {f"{kube.namespace}/cams-a-0": "main"}
