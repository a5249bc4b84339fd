"""End to end: the extender, agents honouring its assignments, and kubelet simulators.

Three nodes each discover their own three cameras (unshared, capacity 1, unique devices):
node-a has all three free, node-b has one taken already, node-c's cameras are offline. A pod
asking for three unique cameras must land on node-a only, be admitted there with exactly the
slots the extender chose, and the next such pod must wait Pending with the reason in words:
no pod ever fails admission.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from agent.discovery.base import HandlerRegistry
from agent.discovery.debugecho import DebugEchoHandler
from agent.extender.service import ExtenderService
from agent.scheduling.models import PodVerdict
from agent.sharing.akri_slots import ASSIGNMENT, CONSUMED
from agent.simulator.scheduler import MiniScheduler, pod_body, register_nodes, unregister_nodes
from tests.extender_http import make_certs
from tests.sharing_world import assigned
from tests.test_agent_lifecycle import AgentCluster, configuration_body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CONFIG = "cams"
RESOURCE = f"akri.sh/{CONFIG}"
NODES = ("node-a", "node-b", "node-c")


@pytest.fixture
def world(kube, settings, tmp_path):
    settings.AKRI = {**settings.AKRI, "AGENT_ASSIGNMENTS": True}
    cluster = AgentCluster(kube, nodes=NODES)
    for node in cluster.nodes.values():
        node.handlers = HandlerRegistry()
        node.handlers.register(
            DebugEchoHandler(shared=False, availability_path=node.availability, poll_interval=0.05)
        )
    cluster["node-c"].set_available(False)
    cluster.start()
    cluster.api.create_configuration(
        configuration_body(CONFIG, ("cam0", "cam1", "cam2"), capacity=1, unique=True)
    )
    core = client.CoreV1Api(kube.api_client)
    registered = register_nodes(core, NODES)
    # As deploy/ runs it: HTTPS, only for kube-scheduler's client certificate.
    certs = make_certs(tmp_path / "certs")
    service = ExtenderService(
        kube.new_client(),
        namespace=kube.namespace,
        feed_interval=0.05,
        kube_interval=3600,
        tls=certs.server("system:kube-scheduler"),
    ).start()
    kubelets = {name: cluster[name].kubelet for name in NODES}
    # As deploy/scheduler's configuration has it: the CL resource is left to the extender
    # (ignoredByScheduler), whose reasons then reach the pod.
    scheduler = MiniScheduler(
        core,
        kube.namespace,
        service.url,
        kubelets,
        ignored_by_scheduler={RESOURCE},
        tls=certs.scheduler(),
    )
    for name in ("node-a", "node-b"):
        cluster[name].kubelet.wait_devices(RESOURCE, lambda d: len(d) == 3, timeout=10)
    yield cluster, service, scheduler
    service.stop()
    cluster.stop()
    unregister_nodes(core, registered)


def books_show_one_taken_on_node_b(service: ExtenderService) -> bool:
    """The extender has read, from the cache, six cameras and node-b's early claim."""
    with service.state.lock:
        states = service.state._instances.values()
        taken = sum(s.used_count() for s in states if "node-b" in s.nodes)
        return len(states) == 6 and taken == 1


def test_a_three_camera_pod_lands_only_where_three_are_free_and_the_next_one_waits(kube, world):
    cluster, service, scheduler = world
    # node-b: one camera taken by a pod the kubelet admitted before the extender was asked.
    early = scheduler.create("early", {RESOURCE: 1})
    assert scheduler.admit(early, "node-b") == (True, "")
    kube.wait_for(lambda: books_show_one_taken_on_node_b(service), timeout=10)

    first = scheduler.schedule(scheduler.create("three", {RESOURCE: 3}))

    assert (first.node, first.admitted, first.error) == ("node-a", True, "")
    assert first.filter_result["FailedNodes"] == {
        "node-b": "3 unique cams devices requested, 2 of 3 free on node node-b"
    }
    assert first.filter_result["FailedAndUnresolvableNodes"] == {
        "node-c": "3 unique cams devices requested, node node-c sees 0"
    }
    stored = client.CoreV1Api(kube.api_client).read_namespaced_pod("three", kube.namespace)
    annotations = stored.metadata.annotations
    assigned = json.loads(annotations[ASSIGNMENT])["slots"][RESOURCE]
    assert json.loads(annotations[CONSUMED]) == {RESOURCE: 3}
    # The agent claimed exactly the slots the extender chose, through the CL plugin.
    held = {}
    for obj in cluster.instances().values():
        for key, value in obj["spec"]["deviceUsage"].items():
            if value.endswith(":node-a"):
                held[key] = value
    assert sorted(held) == sorted(assigned)
    assert all(v.startswith("C:cams-") for v in held.values())

    second = scheduler.schedule(scheduler.create("three-more", {RESOURCE: 3}))

    assert second.node == ""
    assert second.filter_result["FailedNodes"]["node-a"] == (
        "3 unique cams devices requested, 0 of 3 free on node node-a"
    )
    service.recorder.flush()
    verdict = PodVerdict.objects.get(namespace=kube.namespace, name="three-more")
    assert verdict.fits == 0 and verdict.bound_to == ""
    assert verdict.unresolvable == {"node-c": "3 unique cams devices requested, node node-c sees 0"}
    for kubelet in scheduler.kubelets.values():
        assert all(p.name != "three-more" for p in kubelet.pods())


def test_without_an_assignment_the_agent_allocates_as_before(kube, world):
    cluster, service, scheduler = world
    plain = scheduler.create("plain", {RESOURCE: 2})

    assert scheduler.admit(plain, "node-a") == (True, "")

    held = [
        v
        for obj in cluster.instances().values()
        for v in obj["spec"]["deviceUsage"].values()
        if v.endswith(":node-a")
    ]
    assert len(held) == 2


def test_an_instance_level_pod_gets_the_slot_its_assignment_names(kube, world):
    cluster, service, scheduler = world
    cluster.api.create_configuration(configuration_body("pair", ("p0",), capacity=2, unique=True))
    name = kube.wait_for(
        lambda: next(
            (
                n
                for n, o in cluster.instances().items()
                if o["spec"]["configurationName"] == "pair" and "node-a" in o["spec"]["nodes"]
            ),
            None,
        ),
        timeout=10,
    )
    resource = f"akri.sh/{name}"
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(resource, lambda d: len(d) == 2, timeout=10)
    # The extender chose slot 1; left alone, the kubelet would pick slot 0.
    core = client.CoreV1Api(kube.api_client)
    body = pod_body("il-pod", {resource: 1})
    body["metadata"]["annotations"] = assigned("node-a", {resource: [f"{name}-1"]})
    body["spec"]["nodeName"] = "node-a"
    core.create_namespaced_pod(kube.namespace, body)
    created = json.loads(
        core.read_namespaced_pod("il-pod", kube.namespace, _preload_content=False).data
    )

    assert scheduler.admit(created, "node-a") == (True, "")

    usage = cluster.usage(name)
    assert usage == {f"{name}-0": "", f"{name}-1": "node-a"}
    stored = core.read_namespaced_pod("il-pod", kube.namespace)
    assert json.loads(stored.metadata.annotations[CONSUMED]) == {resource: 1}
