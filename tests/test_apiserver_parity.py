"""What the API-server simulator shares with a real kube-apiserver, checked on both.

Each test runs against the simulator by default and against a real server when
AKRI_TEST_KUBECONFIG is set (see tests/kubeenv.py); messages were taken from kube-apiserver
v1.37 (scripts/real-apiserver). Pod deletion, the Akri CRDs' schemas (validation, defaulting,
pruning, nulls) and namespaces that must exist.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from kubernetes import client

from agent.simulator.kubelet import KubeletSimulator
from agent.simulator.kubelet_pods import PodFinisher

pytestmark = pytest.mark.kube

GROUP, VERSION = "akri.sh", "v0"


def failure(call, *args, **kwargs) -> tuple[int, dict]:
    with pytest.raises(client.ApiException) as info:
        call(*args, **kwargs)
    return info.value.status, json.loads(info.value.body)


def pod_body(name: str, node: str = "") -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def configuration(name: str, **spec: object) -> dict:
    return {"apiVersion": "akri.sh/v0", "kind": "Configuration", "metadata": {"name": name},
            "spec": {"discoveryHandler": {"name": "debugEcho"}, **spec}}  # fmt: skip


def instance(name: str, **spec: object) -> dict:
    return {"apiVersion": "akri.sh/v0", "kind": "Instance", "metadata": {"name": name},
            "spec": {"configurationName": "cfg", "cdiName": "akri.sh/cfg=x", "capacity": 2,
                     **spec}}  # fmt: skip


@pytest.fixture
def core(kube) -> client.CoreV1Api:
    return client.CoreV1Api(kube.api_client)


@pytest.fixture
def co(kube) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api_client)


# -- pods: graceful deletion -----------------------------------------------------------------


def test_a_pod_bound_to_a_node_stays_terminating_until_deleted_with_grace_0(kube, core):
    ns = kube.namespace
    created = core.create_namespaced_pod(ns, pod_body("web", node="node-x"))

    marked = core.delete_namespaced_pod("web", ns)

    assert marked.metadata.deletion_timestamp is not None
    assert marked.metadata.deletion_grace_period_seconds == 30
    stored = core.read_namespaced_pod("web", ns)
    assert stored.metadata.deletion_timestamp == marked.metadata.deletion_timestamp
    assert stored.metadata.resource_version != created.metadata.resource_version
    again = core.delete_namespaced_pod("web", ns)  # a longer or equal grace changes nothing
    assert again.metadata.resource_version == stored.metadata.resource_version
    shorter = core.delete_namespaced_pod("web", ns, grace_period_seconds=10)
    assert shorter.metadata.deletion_grace_period_seconds == 10
    core.delete_namespaced_pod("web", ns, grace_period_seconds=0)
    assert failure(core.read_namespaced_pod, "web", ns)[0] == 404


@pytest.mark.parametrize("phase", [None, "Failed", "Succeeded"])
def test_a_pod_without_a_node_or_already_finished_is_deleted_at_once(kube, core, phase):
    ns = kube.namespace
    core.create_namespaced_pod(ns, pod_body("job", node="node-x" if phase else ""))
    if phase:
        core.patch_namespaced_pod_status("job", ns, {"status": {"phase": phase}})

    gone = core.delete_namespaced_pod("job", ns)

    assert gone.metadata.deletion_grace_period_seconds == 0
    assert failure(core.read_namespaced_pod, "job", ns)[0] == 404


def test_the_pod_finisher_stops_a_terminating_pod_in_its_kubelet_then_deletes_it(kube, core):
    ns = kube.namespace
    root = tempfile.mkdtemp(prefix="pf", dir="/tmp")
    kubelet = KubeletSimulator(os.path.join(root, "dp"), os.path.join(root, "pr.sock"), "node-x")
    os.makedirs(kubelet.plugin_dir)
    kubelet.start()
    finisher = PodFinisher(kubelet, kube.new_client(), ns).start()
    try:
        assert finisher.wait_synced()
        pod = core.create_namespaced_pod(ns, pod_body("web", node="node-x"))
        assert kubelet.admit_pod(ns, "web", [{"name": "main", "requests": {}}],
                                 uid=pod.metadata.uid).admitted  # fmt: skip

        core.delete_namespaced_pod("web", ns)

        kube.wait_for(lambda: not kubelet.pods(), message="the pod gone from the kubelet")
        kube.wait_for(
            lambda: not core.list_namespaced_pod(ns).items, message="the pod gone from the API"
        )
        # The finisher counts once its grace-0 delete has answered, which can be just after
        # the list above no longer shows the pod.
        kube.wait_for(lambda: finisher.finished == 1, message="the finisher to count the pod")
        assert finisher.finished == 1
    finally:
        finisher.stop()
        kubelet.stop()


# -- namespaces ------------------------------------------------------------------------------


def test_objects_in_a_namespace_that_does_not_exist_are_404(kube, core, co):
    missing = kube.namespace + "-missing"

    status, body = failure(core.create_namespaced_pod, missing, pod_body("p"))
    assert (status, body["reason"]) == (404, "NotFound")
    assert body["message"] == f'namespaces "{missing}" not found'
    assert body["details"] == {"name": missing, "kind": "namespaces"}
    status, body = failure(
        co.create_namespaced_custom_object, GROUP, VERSION, missing, "instances", instance("i")
    )
    assert (status, body["message"]) == (404, f'namespaces "{missing}" not found')
    assert core.list_namespaced_pod(kube.namespace).items == []


# -- custom resources against the CRD schemas ------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "body", "problem"),
    [
        ("configurations", configuration("c", capacity="two"),
         'spec.capacity: Invalid value: "string": spec.capacity in body must be of type '
         'integer: "string"'),
        ("configurations", dict(configuration("c"), spec={"discoveryHandler": {}}),
         "spec.discoveryHandler.name: Required value"),
        ("configurations", configuration("c", capacity=2000),
         "spec.capacity: Invalid value: 2000: spec.capacity in body should be less than or "
         "equal to 1024"),
        ("configurations", dict(configuration("c"), spec={"discoveryHandler": {"name": ""}}),
         'spec.discoveryHandler.name: Invalid value: "": spec.discoveryHandler.name in body '
         "should be at least 1 chars long"),
        ("configurations", dict(configuration("c"), spec={"discoveryHandler": {
            "name": "x", "discoveryProperties": [{"name": "ok"}, {"name": "1bad", "value": "v"}]}}),
         'spec.discoveryHandler.discoveryProperties[1].name: Invalid value: "1bad": '
         "spec.discoveryHandler.discoveryProperties[1].name in body should match "
         "'^[_A-Za-z][_A-Za-z0-9]*$'"),
        ("configurations", dict(configuration("c"), spec={"discoveryHandler": {
            "name": "x", "discoveryProperties": [{"value": "v"}]}}),
         "spec.discoveryHandler.discoveryProperties[0].name: Required value"),
        ("configurations", configuration("c", brokerSpec={"brokerPodSpec": {}, "brokerJobSpec": {}}),
         '<nil>: Invalid value: "": "spec.brokerSpec" must validate one and only one schema '
         "(oneOf). Found 2 valid alternatives"),
        ("instances", instance("i", nodes=["a", "a"]), 'spec.nodes[1]: Duplicate value: "a"'),
        ("instances", instance("i", capacity=-1),
         "spec.capacity: Invalid value: -1: spec.capacity in body should be greater than or "
         "equal to 0"),
        ("instances", instance("i", deviceUsage={"i-0": 1}),
         'spec.deviceUsage.i-0: Invalid value: "integer": spec.deviceUsage.i-0 in body must be '
         'of type string: "integer"'),
        ("instances", {"apiVersion": "akri.sh/v0", "kind": "Instance", "metadata": {"name": "i"}},
         "spec: Required value"),
    ],
)  # fmt: skip
def test_a_custom_resource_its_schema_refuses_is_422_with_the_real_message(
    kube, co, kind, body, problem
):
    status, answer = failure(
        co.create_namespaced_custom_object, GROUP, VERSION, kube.namespace, kind, body
    )

    name, kind_name = body["metadata"]["name"], body["kind"]
    assert (status, answer["reason"]) == (422, "Invalid")
    assert answer["message"] == f'{kind_name}.akri.sh "{name}" is invalid: {problem}'
    field, _, message = problem.partition(": ")
    assert {"field": field, "message": message} == {
        k: answer["details"]["causes"][0][k] for k in ("field", "message")
    }
    assert co.list_namespaced_custom_object(GROUP, VERSION, kube.namespace, kind)["items"] == []


def test_a_fraction_for_an_integer_fails_its_type_and_the_integer_format(kube, co):
    # Current servers report both (kube-apiserver 1.20 reported the type alone).
    status, answer = failure(
        co.create_namespaced_custom_object, GROUP, VERSION, kube.namespace, "configurations",
        configuration("c", capacity=1.5),
    )  # fmt: skip

    causes = [
        ("FieldValueTypeInvalid", "spec.capacity",
         'Invalid value: "number": spec.capacity in body must be of type integer: "number"'),
        ("FieldValueInvalid", "<nil>",
         'Invalid value: "": Checked value must be of type integer (default format) in '
         "spec.capacity"),
    ]  # fmt: skip
    assert status == 422
    listed = ", ".join(f"{field}: {message}" for _, field, message in causes)
    assert answer["message"] == f'Configuration.akri.sh "c" is invalid: [{listed}]'
    assert [(c["reason"], c["field"], c["message"]) for c in answer["details"]["causes"]] == causes


def test_several_problems_are_listed_together(kube, co):
    body = instance("i")
    del body["spec"]["cdiName"], body["spec"]["capacity"]

    status, answer = failure(
        co.create_namespaced_custom_object, GROUP, VERSION, kube.namespace, "instances", body
    )

    assert status == 422
    assert answer["message"].startswith('Instance.akri.sh "i" is invalid: [')
    fields = sorted(c["field"] for c in answer["details"]["causes"])
    assert fields == ["spec.capacity", "spec.cdiName"]


def test_an_update_its_schema_refuses_is_422_and_changes_nothing(kube, co):
    args = (GROUP, VERSION, kube.namespace, "instances", "i")
    created = co.create_namespaced_custom_object(*args[:4], instance("i"))

    status, answer = failure(co.patch_namespaced_custom_object, *args, {"spec": {"capacity": "x"}})

    assert status == 422
    assert answer["details"]["causes"][0]["field"] == "spec.capacity"
    stored = co.get_namespaced_custom_object(*args)
    assert stored["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_schema_defaults_are_filled_in_and_undeclared_fields_pruned(kube, co):
    ns = kube.namespace
    made = co.create_namespaced_custom_object(
        GROUP, VERSION, ns, "instances", instance("i", extra=1, nodes=None, shared=None)
    )
    cfg = co.create_namespaced_custom_object(
        GROUP, VERSION, ns, "configurations", configuration("c", zzz=True, capacity=None)
    )

    assert made["spec"] == {"configurationName": "cfg", "cdiName": "akri.sh/cfg=x",
                            "capacity": 2, "nodes": [], "deviceUsage": {}, "shared": False,
                            "brokerProperties": {}}  # fmt: skip
    assert cfg["spec"] == {"discoveryHandler": {"name": "debugEcho"}, "capacity": 1,
                           "uniqueDevices": True}  # fmt: skip


def test_a_null_label_value_is_stored_as_an_empty_string(kube, co):
    body = instance("i")
    body["metadata"]["labels"] = {"a": None, "b": "x"}

    made = co.create_namespaced_custom_object(GROUP, VERSION, kube.namespace, "instances", body)

    assert made["metadata"]["labels"] == {"a": "", "b": "x"}


def test_null_values_are_dropped_or_kept_as_the_schema_says(kube, co):
    args = (GROUP, VERSION, kube.namespace, "instances")
    made = co.create_namespaced_custom_object(
        *args, instance("i", deviceUsage={"i-0": None, "i-1": ""}, brokerProperties={"k": None})
    )
    assert made["spec"]["deviceUsage"] == {"i-1": ""}
    assert made["spec"]["brokerProperties"] == {}
    cfg = co.create_namespaced_custom_object(
        GROUP, VERSION, kube.namespace, "configurations", configuration("c", brokerSpec=None)
    )
    assert cfg["spec"]["brokerSpec"] is None  # nullable: kept

    merged = co.patch_namespaced_custom_object(
        *args, "i", {"spec": {"deviceUsage": {"i-1": None, "i-2": "node-a"}}}
    )
    assert merged["spec"]["deviceUsage"] == {"i-2": "node-a"}
    added = co.patch_namespaced_custom_object(
        *args, "i", [{"op": "add", "path": "/spec/deviceUsage/i-3", "value": None}],
        _content_type="application/json-patch+json",
    )  # fmt: skip
    assert added["spec"]["deviceUsage"] == {"i-2": "node-a"}


# -- quantities: stored canonical, extended resources whole and equal -------------------------


def pod_asking(name: str, requests: dict | None, limits: dict | None) -> dict:
    resources = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources}]},
    }


def stored_resources(core, namespace: str, name: str) -> dict:
    raw = core.read_namespaced_pod(name, namespace, _preload_content=False)
    return json.loads(raw.data)["spec"]["containers"][0]["resources"]


def test_quantities_come_back_in_canonical_form(kube, core):
    asked = {"akri.sh/x": "1000", "example.com/mem": "2048Ki", "memory": "1536Mi", "cpu": "0.5"}
    core.create_namespaced_pod(kube.namespace, pod_asking("canonical", asked, asked))

    stored = stored_resources(core, kube.namespace, "canonical")

    wanted = {"akri.sh/x": "1k", "example.com/mem": "2Mi", "memory": "1536Mi", "cpu": "500m"}
    assert stored == {"requests": wanted, "limits": wanted}


def test_a_limit_alone_is_also_the_request(kube, core):
    core.create_namespaced_pod(kube.namespace, pod_asking("limits", None, {"akri.sh/x": "2"}))

    assert stored_resources(core, kube.namespace, "limits") == {
        "requests": {"akri.sh/x": "2"},
        "limits": {"akri.sh/x": "2"},
    }


@pytest.mark.parametrize(
    ("requests", "limits", "problem"),
    [
        ({"akri.sh/x": "500m"}, {"akri.sh/x": "500m"}, "must be an integer"),
        ({"akri.sh/x": "-1"}, {"akri.sh/x": "-1"}, "must be greater than or equal to 0"),
        ({"akri.sh/x": "2"}, {"akri.sh/x": "1"}, "must be equal to akri.sh/x limit of 1"),
        ({"akri.sh/x": "1"}, None, "Limit must be set for non overcommitable resources"),
    ],
)
def test_an_extended_resource_asked_wrongly_is_422(kube, core, requests, limits, problem):
    status, body = failure(
        core.create_namespaced_pod, kube.namespace, pod_asking("wrong", requests, limits)
    )

    assert status == 422
    assert problem in body["message"]
    assert body["details"]["causes"]


# -- deletecollection ------------------------------------------------------------------------


def test_deletecollection_answers_the_list_it_deleted_as_listed_before(kube, core, co):
    """Not a Status: the registry's list, its items as they were before the deletions (their
    resourceVersions then, no deletionTimestamp), built-in items without kind/apiVersion."""
    ns = kube.namespace
    made = [
        core.create_namespaced_config_map(ns, {"metadata": {"name": f"dc-{i}"}}).metadata
        for i in range(2)
    ]
    answer = json.loads(
        core.delete_collection_namespaced_config_map(ns, _preload_content=False).data
    )
    assert (answer["kind"], answer["apiVersion"]) == ("ConfigMapList", "v1")
    assert answer["metadata"]["resourceVersion"]
    assert [(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in answer["items"]] == [
        (m.name, m.resource_version) for m in made
    ]
    assert all(set(i) == {"metadata"} for i in answer["items"])
    assert core.list_namespaced_config_map(ns).items == []

    co.create_namespaced_custom_object(GROUP, VERSION, ns, "instances", instance("dc-i"))
    answer = json.loads(
        co.delete_collection_namespaced_custom_object(
            GROUP, VERSION, ns, "instances", _preload_content=False
        ).data
    )
    assert (answer["kind"], answer["apiVersion"]) == ("InstanceList", "akri.sh/v0")
    assert [(i["kind"], i["metadata"]["name"]) for i in answer["items"]] == [("Instance", "dc-i")]
