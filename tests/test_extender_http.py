"""The extender over HTTP, fed by real cache rows, with the scheduler's own JSON shapes in both
``nodeCacheCapable`` modes; bind against the API server (simulator or real)."""

from __future__ import annotations

import json
import socket

import pytest
from kubernetes import client

from agent.extender.service import ExtenderService
from agent.scheduling.models import PodVerdict
from agent.sharing.akri_slots import ASSIGNMENT
from agent.simulator.scheduler import STAND_IN, register_nodes, unregister_nodes
from tests.extender_http import (
    filter_args,
    node_object,
    post,
    put_configuration,
    put_instance,
)
from tests.sharing_world import pod

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAM = "cam"


def nodes(kube) -> tuple[str, str, str]:
    """Node names of this test: a real API server keeps other runs' bound pods, and the
    extender rightly counts their assignments on nodes of the same name."""
    return tuple(f"{kube.namespace}-n{i}" for i in (1, 2, 3))


def cam(kube, node: str, i: int) -> str:
    """An Instance name of this test: slot keys carry no namespace, and a real API server keeps
    other runs' pods, whose fresh assignments name slots of Instances called the same."""
    return f"cam-{kube.namespace[2:]}{node}{i}"


@pytest.fixture
def world(kube):
    """Three nodes: n1 sees three cameras, n2 sees three with one busy, n3 sees two."""
    ns = kube.namespace
    n1, n2, n3 = nodes(kube)
    put_configuration(ns, CAM, capacity=1, unique=True)
    for i in range(3):
        put_instance(ns, cam(kube, "a", i), [n1])
    put_instance(ns, cam(kube, "b", 0), [n2], usage={f"{cam(kube, 'b', 0)}-0": f"C:cam-0:{n2}"})
    put_instance(ns, cam(kube, "b", 1), [n2])
    put_instance(ns, cam(kube, "b", 2), [n2])
    put_instance(ns, cam(kube, "c", 0), [n3])
    put_instance(ns, cam(kube, "c", 1), [n3])
    core = client.CoreV1Api(kube.api_client)
    registered = register_nodes(core, [n1, n2, n3])
    service = ExtenderService(
        kube.new_client(),
        namespace=ns,
        policies=["akri-instance", "akri-configuration", "gpushare", "gpu-number"],
        feed_interval=0.05,
        kube_interval=3600,
    ).start()
    yield service
    service.stop()
    unregister_nodes(core, registered)


def created_pod(kube, requests: dict[str, int], name: str) -> dict:
    """Create the pod and read it back: the full v1.Pod JSON the scheduler would send."""
    core = client.CoreV1Api(kube.api_client)
    body = pod(requests, name=name)
    del body["metadata"]["uid"], body["status"]
    body["metadata"]["namespace"] = kube.namespace
    body["spec"]["schedulerName"] = STAND_IN  # no real kube-scheduler binds it meanwhile
    core.create_namespaced_pod(kube.namespace, body)
    response = core.read_namespaced_pod(name, kube.namespace, _preload_content=False)
    return json.loads(response.data)


@pytest.mark.parametrize("cache_capable", [True, False])
def test_filter_keeps_only_the_node_with_three_free_unique_devices(kube, world, cache_capable):
    n1, n2, n3 = nodes(kube)
    asking = created_pod(kube, {"akri.sh/cam": 3}, "three-cams")
    names = [n1, n2, n3]
    objects = None if cache_capable else [node_object(n) for n in names]

    status, result = post(world.url + "/filter", filter_args(asking, names, objects))

    assert status == 200
    assert result["Error"] == ""
    if cache_capable:
        assert result["NodeNames"] == [n1]
        assert result["Nodes"] is None
    else:
        assert result["NodeNames"] is None
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == [n1]
        assert result["Nodes"]["items"][0] == objects[0]  # echoed untouched
    assert result["FailedNodes"] == {
        n2: f"3 unique cam devices requested, 2 of 3 free on node {n2}"
    }
    assert result["FailedAndUnresolvableNodes"] == {
        n3: f"3 unique cam devices requested, node {n3} sees 2"
    }


def test_a_pod_asking_for_nothing_of_ours_passes_every_node_untouched(kube, world):
    n1, n2, n3 = nodes(kube)
    plain = created_pod(kube, {"example.com/widget": 1}, "plain")

    status, result = post(world.url + "/filter", filter_args(plain, [n1, n2, "n9"]))

    assert status == 200
    assert result == {
        "Nodes": None,
        "NodeNames": [n1, n2, "n9"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[]",
        b'{"Pod": null, "NodeNames": ["n1"]}',
        b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "n1"}',
        b'{"Pod": {"metadata": {"name": "p"}}}',
        b'{"Pod": {"metadata": {"name": "p"}, "spec": {"containers": "x"}}, "NodeNames": []}',
        "\u00ff".encode("latin-1"),
    ],
)
def test_malformed_filter_requests_get_200_with_error_set(world, raw):
    status, result = post(world.url + "/filter", None, raw=raw)

    assert status == 200
    assert result["Error"]
    assert not result["NodeNames"] and not result["Nodes"]


def test_lowercase_keys_are_read_as_go_reads_them(kube, world):
    n1, n2, n3 = nodes(kube)
    asking = created_pod(kube, {"akri.sh/cam": 3}, "lower")

    status, result = post(world.url + "/filter", {"pod": asking, "nodenames": [n1, n3]})

    assert status == 200
    assert result["NodeNames"] == [n1]


def test_prioritize_spreads_by_free_room_and_answers_a_bare_list(kube, world):
    n1, n2, n3 = nodes(kube)
    asking = created_pod(kube, {"akri.sh/cam": 1}, "one-cam")

    status, result = post(world.url + "/prioritize", filter_args(asking, [n1, n2]))
    bad_status, bad = post(world.url + "/prioritize", None, raw=b"{oops")

    assert status == 200
    assert result == [{"Host": n1, "Score": 10}, {"Host": n2, "Score": 7}]
    assert (bad_status, bad) == (200, [])


def test_bind_writes_the_assignment_then_the_binding_and_books_the_slots(kube, world):
    n1, n2, n3 = nodes(kube)
    asking = created_pod(kube, {"akri.sh/cam": 3}, "bound")
    post(world.url + "/filter", filter_args(asking, [n1]))
    meta = asking["metadata"]
    bind = {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": n1,
    }

    status, result = post(world.url + "/bind", bind)

    assert (status, result) == (200, {"Error": ""})
    stored = client.CoreV1Api(kube.api_client).read_namespaced_pod("bound", kube.namespace)
    assert stored.spec.node_name == n1
    assignment = json.loads(stored.metadata.annotations[ASSIGNMENT])
    assert assignment["node"] == n1
    assert sorted(assignment["slots"]["akri.sh/cam"]) == [
        f"{cam(kube, 'a', 0)}-0",
        f"{cam(kube, 'a', 1)}-0",
        f"{cam(kube, 'a', 2)}-0",
    ]
    # Until the agent claims them, the slots are taken for the next pod.
    again = created_pod(kube, {"akri.sh/cam": 1}, "next")
    _, result = post(world.url + "/filter", filter_args(again, [n1]))
    assert result["NodeNames"] == []
    assert "0 of 3 free" in result["FailedNodes"][n1]


def test_bind_of_a_pod_that_no_longer_fits_is_refused_and_writes_nothing(kube, world):
    n1, n2, n3 = nodes(kube)
    asking = created_pod(kube, {"akri.sh/cam": 3}, "too-big")
    meta = asking["metadata"]
    bind = {
        "PodName": "too-big",
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": n3,
    }

    status, result = post(world.url + "/bind", bind)

    assert status == 200
    assert f"no longer fits node {n3}" in result["Error"]
    stored = client.CoreV1Api(kube.api_client).read_namespaced_pod("too-big", kube.namespace)
    assert stored.spec.node_name is None
    assert ASSIGNMENT not in (stored.metadata.annotations or {})


def test_bind_of_a_pod_that_does_not_exist_is_an_error_not_a_500(kube, world):
    bind = {"PodName": "ghost", "PodNamespace": kube.namespace, "PodUID": "u", "Node": "n1"}

    status, result = post(world.url + "/bind", bind)
    bad_status, bad = post(world.url + "/bind", {"PodName": 3})

    assert status == 200 and "cannot read pod" in result["Error"]
    assert bad_status == 200 and "PodName" in bad["Error"]


def test_the_last_verdict_of_a_waiting_pod_is_recorded_in_words(kube, world):
    n1, n2, n3 = nodes(kube)
    asking = created_pod(kube, {"akri.sh/cam": 3}, "waiting")

    post(world.url + "/filter", filter_args(asking, [n2, n3]))
    world.recorder.flush()

    verdict = kube.wait_for(lambda: PodVerdict.objects.filter(name="waiting").first())
    assert verdict.fits == 0
    assert verdict.unresolvable == {n3: f"3 unique cam devices requested, node {n3} sees 2"}
    assert verdict.reasons == {
        "3 unique cam devices requested, 2 of 3 free on the node": 1,
        "3 unique cam devices requested, the node sees 2": 1,
    }


def test_a_request_that_never_ends_does_not_hang_the_next_one(kube, world):
    n1, n2, n3 = nodes(kube)
    host, port = world.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as stuck:
        stuck.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        asking = created_pod(kube, {"akri.sh/cam": 1}, "meanwhile")
        status, result = post(world.url + "/filter", filter_args(asking, [n1]), timeout=5)
    assert status == 200 and result["NodeNames"] == [n1]


def test_a_retried_bind_of_a_pod_already_bound_there_succeeds(kube, world):
    n1, n2, n3 = nodes(kube)
    asking = created_pod(kube, {"akri.sh/cam": 1}, "twice")
    meta = asking["metadata"]
    bind = {
        "PodName": "twice",
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": n1,
    }
    assert post(world.url + "/bind", bind) == (200, {"Error": ""})

    status, result = post(world.url + "/bind", bind)
    elsewhere = post(world.url + "/bind", {**bind, "Node": n2})[1]

    assert (status, result) == (200, {"Error": ""})
    stored = client.CoreV1Api(kube.api_client).read_namespaced_pod("twice", kube.namespace)
    assert stored.spec.node_name == n1
    assert ASSIGNMENT in stored.metadata.annotations
    assert elsewhere["Error"]


# --- Unschedulable or UnschedulableAndUnresolvable ----------------------------------------------
# kube-scheduler tries preemption only on the nodes an extender calls Unschedulable: a busy
# device may free up if a pod goes; a device the node lacks, or fewer slots than asked, never.


def instance_request(kube) -> tuple[dict, dict, str, str]:
    """One slot of n2's busy camera (its one slot held), and two of its free one (capacity 1)."""
    busy, small = cam(kube, "b", 0), cam(kube, "b", 1)
    one = created_pod(kube, {f"akri.sh/{busy}": 1}, "one-of-busy")
    two = created_pod(kube, {f"akri.sh/{small}": 2}, "two-of-one")
    return one, two, busy, small


def test_an_instance_request_is_unschedulable_when_busy_and_unresolvable_when_it_never_fits(
    kube, world
):
    n1, n2, n3 = nodes(kube)
    one, two, busy, small = instance_request(kube)

    _, first = post(world.url + "/filter", filter_args(one, [n1, n2, n3]))
    _, second = post(world.url + "/filter", filter_args(two, [n2]))

    assert first["NodeNames"] == [] and first["Error"] == ""
    assert first["FailedNodes"] == {n2: f"Instance {busy}: 1 slots requested, 0 free of 1"}
    assert first["FailedAndUnresolvableNodes"] == {
        n1: f"Instance {busy} is not visible to node {n1}",
        n3: f"Instance {busy} is not visible to node {n3}",
    }
    assert second["FailedNodes"] == {}
    assert second["FailedAndUnresolvableNodes"] == {
        n2: f"Instance {small} has capacity 1, 2 slots requested"
    }


def test_the_node_page_says_busy_or_cannot_fit_as_the_extender_answered(kube, world, client):
    """The extender's verdicts as recorded and shown on the node's page (a viewer's session,
    the real views): "busy" for Unschedulable, "cannot fit" for UnschedulableAndUnresolvable."""
    from django.contrib.auth.models import Group, User

    n1, n2, n3 = nodes(kube)
    one, two, busy, small = instance_request(kube)
    post(world.url + "/filter", filter_args(one, [n1, n2]))
    post(world.url + "/filter", filter_args(two, [n2]))
    world.recorder.flush()
    kube.wait_for(
        lambda: PodVerdict.objects.filter(name__in=["one-of-busy", "two-of-one"]).count() == 2
    )
    viewer = User.objects.create_user("scheduling-viewer")
    viewer.groups.add(Group.objects.get(name="viewer"))
    client.force_login(viewer)

    on_n2 = client.get(f"/nodes/{n2}/")
    on_n1 = client.get(f"/nodes/{n1}/")

    assert on_n2.status_code == on_n1.status_code == 200
    n2_page, n1_page = on_n2.content.decode(), on_n1.content.decode()
    assert f"busy: Instance {busy}: 1 slots requested, 0 free of 1" in n2_page
    assert f"cannot fit: Instance {small} has capacity 1, 2 slots requested" in n2_page
    assert f"cannot fit: Instance {busy} is not visible to node {n1}" in n1_page
