"""Tests of the API-server simulator itself, driven through the official kubernetes client."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.client import ApiException

from agent.simulator.apiserver import ApiServerSimulator
from tests.kubeenv import KubeEnv, restore_simulator

pytest_plugins = ["tests.kubeenv"]

NS = "default"
GROUP, VERSION = "akri.sh", "v0"
JSON_PATCH = "application/json-patch+json"

# A CRD with a status subresource and a selectable field, created through the API by tests.
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.sim.test"},
    "spec": {
        "group": "sim.test",
        "scope": "Namespaced",
        "names": {
            "plural": "widgets",
            "singular": "widget",
            "kind": "Widget",
            "shortNames": ["wd"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "selectableFields": [{"jsonPath": ".spec.color"}],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def sim(apiserver: ApiServerSimulator) -> Iterator[ApiServerSimulator]:
    restore_simulator(apiserver)
    yield apiserver
    restore_simulator(apiserver)


@pytest.fixture
def api(sim: ApiServerSimulator) -> Iterator[client.ApiClient]:
    api_client = sim.api_client()
    yield api_client
    api_client.close()


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def co(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


@pytest.fixture
def gadgets(sim: ApiServerSimulator, api: client.ApiClient) -> str:
    """A CRD without a status subresource that keeps unknown fields."""
    crd = json.loads(json.dumps(WIDGET_CRD).replace("widget", "gadget").replace("Widget", "Gadget"))
    del crd["spec"]["versions"][0]["subresources"]
    try:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    except ApiException as exc:
        assert exc.status == 409
    return "gadgets"


@pytest.fixture
def widgets(sim: ApiServerSimulator, api: client.ApiClient) -> str:
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(WIDGET_CRD)
    except ApiException as exc:
        assert exc.status == 409
    return "widgets"


def instance(name: str, **spec: object) -> dict:
    body = {
        "configurationName": "cfg",
        "cdiName": "akri.sh/cfg=x",
        "capacity": 2,
        "shared": True,
        "nodes": [],
        **spec,
    }
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": name},
        "spec": body,
    }


def pod(name: str, node: str = "", labels: dict | None = None) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def create_instance(co: client.CustomObjectsApi, name: str, **spec: object) -> dict:
    return co.create_namespaced_custom_object(
        GROUP, VERSION, NS, "instances", instance(name, **spec)
    )


def error_of(call, *args, **kwargs) -> tuple[int, dict]:
    with pytest.raises(ApiException) as info:
        call(*args, **kwargs)
    return info.value.status, json.loads(info.value.body)


def raw(sim: ApiServerSimulator, method: str, path: str, body: bytes | None = None,
        content_type: str = "application/json") -> urllib3.BaseHTTPResponse:  # fmt: skip
    http = urllib3.PoolManager()
    return http.request(method, sim.url + path, body=body, headers={"Content-Type": content_type})


def collect(func, *args, count: int, timeout: int = 5, **kwargs) -> list[dict]:
    """Watch until `count` events arrived (or the server ends the stream)."""
    w = watch.Watch()
    events = []
    for event in w.stream(
        func, *args, timeout_seconds=timeout, _request_timeout=timeout + 5, **kwargs
    ):
        events.append(event)
        if len(events) >= count:
            w.stop()
    return events


def names(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["type"], e["raw_object"]["metadata"]["name"]) for e in events]


# -- lifecycle, kubeconfig, CRD loading ------------------------------------------------------


def test_it_starts_fast_serves_and_stops_with_custom_crds(tmp_path: Path) -> None:
    crd = json.loads(json.dumps(WIDGET_CRD))
    (tmp_path / "widgets.yaml").write_text(yaml.safe_dump(crd))
    started = time.monotonic()
    with ApiServerSimulator(crd_dir=tmp_path) as server:
        assert time.monotonic() - started < 10  # generous: a hang, not speed
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", server.url)
        api_client = server.api_client()
        co = client.CustomObjectsApi(api_client)
        created = co.create_namespaced_custom_object(
            "sim.test",
            "v1",
            NS,
            "widgets",
            {"apiVersion": "sim.test/v1", "kind": "Widget", "metadata": {"name": "w"}},  # fmt: skip
        )
        assert created["metadata"]["name"] == "w"
        # The Akri CRDs are not loaded from a custom directory.
        status, _ = error_of(co.list_namespaced_custom_object, GROUP, VERSION, NS, "instances")
        assert status == 404
        api_client.close()
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        urllib3.PoolManager(retries=0).request("GET", server.url + "/version")


def test_a_restart_keeps_the_url_and_the_objects(tmp_path: Path) -> None:
    server = ApiServerSimulator(crd_dir=tmp_path).start()
    try:
        url = server.url
        with server.api_client() as api_client:
            client.CoreV1Api(api_client).create_namespaced_config_map(
                NS, {"metadata": {"name": "cm"}}
            )
        server.stop()
        server.start()
        assert server.url == url
        with server.api_client() as api_client:
            assert (
                client.CoreV1Api(api_client).read_namespaced_config_map("cm", NS).metadata.name
                == "cm"
            )
    finally:
        server.stop()


def test_it_writes_a_kubeconfig_that_load_kube_config_accepts(sim, tmp_path: Path) -> None:
    path = sim.write_kubeconfig(tmp_path / "kc", namespace="team-a")
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=configuration)
    assert configuration.host == sim.url
    with client.ApiClient(configuration) as api_client:
        version = client.VersionApi(api_client).get_code()
        assert version.major == "1"
    assert (
        config.list_kube_config_contexts(config_file=str(path))[1]["context"]["namespace"]
        == "team-a"
    )


def test_it_loads_the_akri_crds_by_default(co) -> None:
    created = create_instance(co, "i-default")
    assert created["kind"] == "Instance"
    listed = co.list_namespaced_custom_object(GROUP, VERSION, NS, "configurations")
    assert listed["kind"] == "ConfigurationList"


# -- create / get / metadata -----------------------------------------------------------------


def test_it_creates_with_201_and_server_owned_metadata(sim, co) -> None:
    before = int(sim.resource_version)
    created = create_instance(co, "i1")
    meta = created["metadata"]
    assert re.fullmatch(r"[0-9a-f-]{36}", meta["uid"])
    assert isinstance(meta["resourceVersion"], str) and int(meta["resourceVersion"]) > before
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["generation"] == 1 and meta["namespace"] == NS
    assert co.get_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1") == created
    assert sim.request_log[-2][0:2] == ("POST", "/apis/akri.sh/v0/namespaces/default/instances")


def test_it_generates_names_from_generate_name(co) -> None:
    body = instance("")
    body["metadata"] = {"generateName": "inst-"}
    created = co.create_namespaced_custom_object(GROUP, VERSION, NS, "instances", body)
    assert re.fullmatch(r"inst-[a-z0-9]{5}", created["metadata"]["name"])


def test_it_answers_409_already_exists_with_a_status_body(co) -> None:
    create_instance(co, "dup")
    status, body = error_of(create_instance, co, "dup")
    assert status == 409
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'instances.akri.sh "dup" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "dup", "group": "akri.sh", "kind": "instances"},
        "code": 409,
    }


def test_it_rejects_bad_creates(co, core) -> None:
    status, body = error_of(co.create_namespaced_custom_object, GROUP, VERSION, NS, "instances",
                            {"apiVersion": "akri.sh/v0", "kind": "Instance", "metadata": {}})  # fmt: skip
    assert (status, body["reason"]) == (422, "Invalid")
    assert "name or generateName is required" in body["message"]
    wrong_ns = instance("x")
    wrong_ns["metadata"]["namespace"] = "other"
    status, body = error_of(
        co.create_namespaced_custom_object, GROUP, VERSION, NS, "instances", wrong_ns
    )
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = error_of(co.create_namespaced_custom_object, GROUP, VERSION, NS, "instances",
                            {"metadata": {"name": "nokind"}})  # fmt: skip
    assert status == 400
    status, body = error_of(core.create_namespaced_pod, NS, pod("Bad_Name"))
    assert status == 422
    status, body = error_of(core.create_namespaced_pod, NS, pod("p", labels={"a": "b c"}))
    assert status == 422


def test_it_answers_404_not_found_with_the_real_message(co, core) -> None:
    status, body = error_of(
        co.get_namespaced_custom_object, GROUP, VERSION, NS, "instances", "nope"
    )
    assert status == 404
    assert body["message"] == 'instances.akri.sh "nope" not found'
    assert body["details"] == {"name": "nope", "group": "akri.sh", "kind": "instances"}
    status, body = error_of(core.read_namespaced_pod, "nope", NS)
    assert body["message"] == 'pods "nope" not found' and body["details"] == {
        "name": "nope",
        "kind": "pods",
    }


def test_it_sets_pod_phase_pending_and_keeps_node_status_on_create(core) -> None:
    created = core.create_namespaced_pod(NS, dict(pod("p"), status={"phase": "Running"}))
    assert created.status.phase == "Pending"
    node = core.create_node(
        {"metadata": {"name": "n1"}, "status": {"capacity": {"akri.sh/x": "2"}}}
    )
    assert node.status.capacity == {"akri.sh/x": "2"}
    assert node.metadata.namespace is None


def test_objects_need_their_namespace_which_can_be_created_and_deleted(co, core) -> None:
    cm = {"metadata": {"name": "cm"}, "data": {"a": "1"}}
    status, body = error_of(core.create_namespaced_config_map, "team-b", cm)
    assert (status, body["reason"], body["message"]) == (
        404, "NotFound", 'namespaces "team-b" not found')  # fmt: skip
    assert body["details"] == {"name": "team-b", "kind": "namespaces"}
    status, _ = error_of(co.create_namespaced_custom_object, GROUP, VERSION, "team-b",
                         "instances", instance("i1"))  # fmt: skip
    assert status == 404
    ns = core.create_namespace({"metadata": {"name": "team-b"}})
    assert ns.status.phase == "Active"
    assert "team-b" in [n.metadata.name for n in core.list_namespace().items]
    core.create_namespaced_config_map("team-b", cm)
    core.delete_namespace("team-b")
    assert error_of(core.read_namespace, "team-b")[0] == 404


def test_the_system_namespaces_exist_from_the_start_and_after_a_reset(sim, core) -> None:
    expected = {"default", "kube-node-lease", "kube-public", "kube-system"}
    assert {n.metadata.name for n in core.list_namespace().items} == expected
    sim.reset()
    assert {n.metadata.name for n in core.list_namespace().items} == expected


# -- list, selectors, pagination -------------------------------------------------------------


def test_it_lists_with_kind_list_and_isolates_namespaces(co, core) -> None:
    core.create_namespace({"metadata": {"name": "other"}})
    create_instance(co, "a")
    co.create_namespaced_custom_object(GROUP, VERSION, "other", "instances", instance("b"))
    listed = co.list_namespaced_custom_object(GROUP, VERSION, NS, "instances")
    assert listed["kind"] == "InstanceList" and listed["apiVersion"] == "akri.sh/v0"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    assert listed["metadata"]["resourceVersion"]
    everywhere = co.list_cluster_custom_object(GROUP, VERSION, "instances")
    assert sorted(i["metadata"]["name"] for i in everywhere["items"]) == ["a", "b"]
    core.create_namespaced_pod(NS, pod("p1"))
    core.create_namespaced_pod("other", pod("p2"))
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items] == ["p1", "p2"]
    assert core.list_namespaced_pod(NS).kind == "PodList"


LABELLED = {
    "p-a": {"app": "x", "tier": "web"},
    "p-b": {"app": "y"},
    "p-c": {"tier": "db", "n": "5"},
}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=x", ["p-a"]),
        ("app==x", ["p-a"]),
        ("app!=x", ["p-b", "p-c"]),
        ("app in (x,y)", ["p-a", "p-b"]),
        ("app notin (x)", ["p-b", "p-c"]),
        ("tier", ["p-a", "p-c"]),
        ("!tier", ["p-b"]),
        ("app=x,tier=web", ["p-a"]),
        ("app in (x, y),!tier", ["p-b"]),
        ("n>3", ["p-c"]),
        ("", ["p-a", "p-b", "p-c"]),
    ],
)
def test_it_filters_by_label_selector(core, selector: str, expected: list[str]) -> None:
    for name, labels in LABELLED.items():
        core.create_namespaced_pod(NS, pod(name, labels=labels))
    found = [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=selector).items]
    assert found == expected


def test_a_malformed_label_selector_is_400(core) -> None:
    assert error_of(core.list_namespaced_pod, NS, label_selector="app in (x")[0] == 400


def test_it_filters_pods_by_field_selector(core) -> None:
    core.create_namespaced_pod(NS, pod("p1", node="n1"))
    core.create_namespaced_pod(NS, pod("p2", node="n2"))
    core.create_namespaced_pod(NS, pod("p3"))
    core.patch_namespaced_pod_status("p2", NS, {"status": {"phase": "Running"}})

    def select(selector: str) -> list[str]:
        return [
            p.metadata.name for p in core.list_namespaced_pod(NS, field_selector=selector).items
        ]

    assert select("spec.nodeName=n1") == ["p1"]
    assert select("spec.nodeName=") == ["p3"]
    assert select("status.phase=Running") == ["p2"]
    assert select("status.phase!=Running,metadata.name!=p3") == ["p1"]
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(
        field_selector="metadata.namespace=default,spec.nodeName=n2").items] == ["p2"]  # fmt: skip
    status, body = error_of(core.list_namespaced_pod, NS, field_selector="spec.bogus=1")
    assert status == 400 and "field label not supported" in body["message"]


def test_crd_selectable_fields_work_in_field_selectors(co, widgets) -> None:
    for name, color in (("w1", "red"), ("w2", "blue")):
        co.create_namespaced_custom_object("sim.test", "v1", NS, widgets, {
            "apiVersion": "sim.test/v1", "kind": "Widget", "metadata": {"name": name},
            "spec": {"color": color}})  # fmt: skip
    listed = co.list_namespaced_custom_object(
        "sim.test", "v1", NS, widgets, field_selector="spec.color=blue"
    )
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w2"]
    status, _ = error_of(co.list_namespaced_custom_object, GROUP, VERSION, NS, "instances",
                         field_selector="spec.shared=true")  # fmt: skip
    assert status == 400


def test_it_paginates_with_limit_and_continue(co) -> None:
    for i in range(5):
        create_instance(co, f"i{i}")
    first = co.list_namespaced_custom_object(GROUP, VERSION, NS, "instances", limit=2)
    assert [i["metadata"]["name"] for i in first["items"]] == ["i0", "i1"]
    assert first["metadata"]["remainingItemCount"] == 3
    seen = [i["metadata"]["name"] for i in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = co.list_namespaced_custom_object(
            GROUP, VERSION, NS, "instances", limit=2, _continue=token
        )
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        seen += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
    assert seen == ["i0", "i1", "i2", "i3", "i4"]


# -- PUT -------------------------------------------------------------------------------------


def test_put_with_a_stale_resource_version_is_409_conflict(co) -> None:
    created = create_instance(co, "i1")
    fresh = dict(created, spec=dict(created["spec"], capacity=3))
    updated = co.replace_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1", fresh)
    assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    assert updated["metadata"]["generation"] == 2
    status, body = error_of(
        co.replace_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1", fresh
    )
    assert (status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        'Operation cannot be fulfilled on instances.akri.sh "i1": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )


def test_a_custom_resource_put_without_resource_version_is_422(co, core) -> None:
    create_instance(co, "i1")
    status, body = error_of(co.replace_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1",
                            instance("i1"))  # fmt: skip
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"] == (
        'instances.akri.sh "i1" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
        "must be specified for an update"
    )
    # Built-in types accept an unconditional PUT.
    core.create_namespaced_config_map(NS, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    replaced = core.replace_namespaced_config_map(
        "cm", NS, {"metadata": {"name": "cm"}, "data": {"a": "2"}}
    )
    assert replaced.data == {"a": "2"}


def test_put_keeps_server_owned_metadata_and_checks_the_name(co) -> None:
    created = create_instance(co, "i1")
    body = json.loads(json.dumps(created))
    body["metadata"].update(uid=created["metadata"]["uid"], creationTimestamp="2000-01-01T00:00:00Z",
                            generation=99, labels={"x": "y"})  # fmt: skip
    updated = co.replace_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1", body)
    assert updated["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]
    assert updated["metadata"]["generation"] == 1  # a label change is metadata only
    assert updated["metadata"]["labels"] == {"x": "y"}
    body = dict(updated, metadata=dict(updated["metadata"], name="other"))
    assert (
        error_of(co.replace_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1", body)[
            0
        ]
        == 400
    )


def test_a_no_op_write_changes_nothing_and_emits_no_event(sim, co) -> None:
    created = create_instance(co, "i1")
    rv = created["metadata"]["resourceVersion"]
    same = co.replace_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1", created)
    assert same["metadata"]["resourceVersion"] == rv
    patched = co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "instances", "i1", {"spec": {"capacity": 2}}
    )
    assert patched["metadata"]["resourceVersion"] == rv
    co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "instances", "i1", {"spec": {"capacity": 5}}
    )
    # Events come in rv order, so the first one after `rv` is the real change.
    events = collect(co.list_namespaced_custom_object, GROUP, VERSION, NS, "instances",
                     resource_version=rv, count=1)  # fmt: skip
    assert [(e["type"], e["raw_object"]["spec"]["capacity"]) for e in events] == [("MODIFIED", 5)]
    assert int(events[0]["raw_object"]["metadata"]["resourceVersion"]) == int(rv) + 1


# -- PATCH -----------------------------------------------------------------------------------


def test_merge_patch_merges_objects_deletes_nulls_and_replaces_lists(co) -> None:
    create_instance(co, "i1", nodes=["a", "b"], deviceUsage={"i1-0": "", "i1-1": "n"})
    patched = co.patch_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1", {
        "spec": {"nodes": ["c"], "deviceUsage": {"i1-0": "n2", "i1-1": None}}})  # fmt: skip
    assert patched["spec"]["nodes"] == ["c"]
    assert patched["spec"]["deviceUsage"] == {"i1-0": "n2"}
    assert patched["spec"]["capacity"] == 2


def test_json_patch_supports_every_operation(co) -> None:
    create_instance(co, "i1", nodes=["a"], deviceUsage={"i1-0": "", "i1-1": ""})
    ops = [
        {"op": "test", "path": "/spec/deviceUsage/i1-0", "value": ""},
        {"op": "replace", "path": "/spec/deviceUsage/i1-0", "value": "n1"},
        {"op": "add", "path": "/spec/nodes/-", "value": "b"},
        {"op": "add", "path": "/spec/nodes/0", "value": "z"},
        {"op": "remove", "path": "/spec/deviceUsage/i1-1"},
        {"op": "copy", "from": "/spec/configurationName", "path": "/spec/cdiName"},
        {"op": "move", "from": "/spec/deviceUsage/i1-0", "path": "/spec/deviceUsage/i1-9"},
        {"op": "add", "path": "/metadata/annotations", "value": {}},
        {"op": "add", "path": "/metadata/annotations/a~1b", "value": "1"},
    ]
    patched = co.patch_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1", ops,
                                                _content_type=JSON_PATCH)  # fmt: skip
    spec = patched["spec"]
    assert spec["deviceUsage"] == {"i1-9": "n1"}
    assert spec["nodes"] == ["z", "a", "b"]
    assert spec["cdiName"] == "cfg"
    assert patched["metadata"]["annotations"] == {"a/b": "1"}


@pytest.mark.parametrize(
    ("ops", "status"),
    [
        ([{"op": "test", "path": "/spec/capacity", "value": 3}], 422),
        ([{"op": "remove", "path": "/spec/missing"}], 422),
        ([{"op": "replace", "path": "/spec/missing", "value": 1}], 422),
        ([{"op": "add", "path": "/spec/nodes/7", "value": "x"}], 422),
        ([{"op": "bogus", "path": "/spec"}], 422),
    ],
)
def test_json_patch_failures_are_422(co, ops: list, status: int) -> None:
    created = create_instance(co, "i1")
    got, body = error_of(co.patch_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1", ops,
                         _content_type=JSON_PATCH)  # fmt: skip
    assert (got, body["reason"], body["kind"]) == (status, "Invalid", "Status")
    unchanged = co.get_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1")
    assert unchanged["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_undecodable_and_non_array_json_patches_are_400(sim, co) -> None:
    create_instance(co, "i1")
    path = "/apis/akri.sh/v0/namespaces/default/instances/i1"
    assert raw(sim, "PATCH", path, b"[{not json", JSON_PATCH).status == 400
    assert raw(sim, "PATCH", path, b'{"op": "add"}', JSON_PATCH).status == 400
    assert raw(sim, "PATCH", path, b"{bad", "application/merge-patch+json").status == 400


def test_strategic_merge_patch_is_415_on_custom_resources_and_merges_built_ins(
    sim, co, core
) -> None:
    create_instance(co, "i1")
    path = "/apis/akri.sh/v0/namespaces/default/instances/i1"
    response = raw(sim, "PATCH", path, b'{"spec": {}}', "application/strategic-merge-patch+json")
    assert response.status == 415
    assert json.loads(response.data)["reason"] == "UnsupportedMediaType"
    apply = raw(
        sim, "PATCH", path + "?fieldManager=me", b"spec: {}", "application/apply-patch+yaml"
    )
    assert apply.status == 415
    assert raw(sim, "PATCH", path, b"{}", "text/plain").status == 415
    # Typed patches with a dict body go out as strategic merge patches.
    core.create_namespaced_pod(NS, pod("p1"))
    core.patch_namespaced_pod_status("p1", NS, {"status": {"conditions": [
        {"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}})  # fmt: skip
    patched = core.patch_namespaced_pod_status("p1", NS, {"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}})  # fmt: skip
    assert [(c.type, c.status) for c in patched.status.conditions] == [
        ("Ready", "True"),
        ("PodScheduled", "True"),
    ]
    assert sim.request_log[-1].content_type == "application/strategic-merge-patch+json"
    labelled = core.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"a": "b"}}})
    assert labelled.metadata.labels == {"a": "b"}


def test_a_patch_carrying_a_stale_resource_version_is_409(co) -> None:
    created = create_instance(co, "i1")
    co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "instances", "i1", {"spec": {"capacity": 4}}
    )
    stale = {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "spec": {"capacity": 5},
    }
    status, body = error_of(
        co.patch_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1", stale
    )
    assert (status, body["reason"]) == (409, "Conflict")
    assert (
        error_of(co.patch_namespaced_custom_object, GROUP, VERSION, NS, "instances", "gone", {})[0]
        == 404
    )


def test_pod_spec_is_immutable_except_images(core) -> None:
    core.create_namespaced_pod(NS, pod("p1"))
    status, body = error_of(core.patch_namespaced_pod, "p1", NS, {"spec": {"nodeName": "n1"}})
    assert (status, body["reason"]) == (422, "Invalid")
    patched = core.patch_namespaced_pod(
        "p1", NS, {"spec": {"containers": [{"name": "c", "image": "alpine"}]}}
    )
    assert patched.spec.containers[0].image == "alpine"


def test_pods_bind_to_nodes_through_the_binding_subresource(core) -> None:
    core.create_namespaced_pod(NS, pod("p1"))
    core.create_namespaced_binding(NS, {"metadata": {"name": "p1"}, "target": {"kind": "Node", "name": "n1"}},
                                   _preload_content=False)  # fmt: skip
    assert core.read_namespaced_pod("p1", NS).spec.node_name == "n1"
    core.create_namespaced_pod(NS, pod("p2"))
    core.create_namespaced_pod_binding("p2", NS, {"metadata": {"name": "p2"}, "target": {"name": "n2"}},
                                       _preload_content=False)  # fmt: skip
    assert core.read_namespaced_pod("p2", NS).spec.node_name == "n2"
    status, body = error_of(core.create_namespaced_pod_binding, "p2", NS,
                            {"metadata": {"name": "p2"}, "target": {"name": "n3"}})  # fmt: skip
    assert (status, body["reason"]) == (409, "Conflict")


# -- status subresource ----------------------------------------------------------------------


def test_status_subresource_of_a_crd_that_declares_it(co, widgets) -> None:
    body = {"apiVersion": "sim.test/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 1}, "status": {"ready": True}}  # fmt: skip
    created = co.create_namespaced_custom_object("sim.test", "v1", NS, widgets, body)
    assert "status" not in created
    main = co.patch_namespaced_custom_object(
        "sim.test", "v1", NS, widgets, "w", {"status": {"ready": True}}
    )
    assert "status" not in main
    status = co.patch_namespaced_custom_object_status("sim.test", "v1", NS, widgets, "w", {
        "spec": {"size": 9}, "metadata": {"labels": {"x": "y"}}, "status": {"ready": True}})  # fmt: skip
    assert status["status"] == {"ready": True}
    assert status["spec"] == {"size": 1} and "labels" not in status["metadata"]
    assert status["metadata"]["generation"] == 1
    replaced = co.replace_namespaced_custom_object_status("sim.test", "v1", NS, widgets, "w",
                                                          dict(status, status={"ready": False}))  # fmt: skip
    assert replaced["status"] == {"ready": False}
    spec_change = co.patch_namespaced_custom_object(
        "sim.test", "v1", NS, widgets, "w", {"spec": {"size": 2}}
    )
    assert spec_change["metadata"]["generation"] == 2 and spec_change["status"] == {"ready": False}


def test_status_is_an_ordinary_field_without_the_subresource(co, gadgets) -> None:
    body = {"apiVersion": "sim.test/v1", "kind": "Gadget", "metadata": {"name": "g1"},
            "status": {"x": 1}}  # fmt: skip
    created = co.create_namespaced_custom_object("sim.test", "v1", NS, gadgets, body)
    assert created["status"] == {"x": 1}
    status, _ = error_of(
        co.get_namespaced_custom_object_status, "sim.test", "v1", NS, gadgets, "g1"
    )
    assert status == 404
    patched = co.patch_namespaced_custom_object(
        "sim.test", "v1", NS, gadgets, "g1", {"status": {"x": 2}}
    )
    assert patched["status"] == {"x": 2}
    assert patched["metadata"]["generation"] == 2


def test_the_akri_crds_prune_undeclared_fields_such_as_status(co) -> None:
    created = co.create_namespaced_custom_object(GROUP, VERSION, NS, "instances",
                                                 dict(instance("i1"), status={"x": 1}))  # fmt: skip
    assert "status" not in created
    patched = co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "instances", "i1", {"status": {"x": 2}, "spec": {"extra": 1}}
    )
    assert "status" not in patched and "extra" not in patched["spec"]
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_built_in_status_subresources(api, core) -> None:
    core.create_namespaced_pod(NS, pod("p1"))
    ignored = core.patch_namespaced_pod("p1", NS, {"status": {"phase": "Running"}})
    assert ignored.status.phase == "Pending"
    running = core.patch_namespaced_pod_status("p1", NS, {"status": {"phase": "Running"}})
    assert running.status.phase == "Running"
    batch = client.BatchV1Api(api)
    job = batch.create_namespaced_job(NS, {"metadata": {"name": "j"}, "spec": {"template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}})  # fmt: skip
    assert job.metadata.generation == 1
    done = batch.patch_namespaced_job_status("j", NS, {"status": {"succeeded": 1}})
    assert done.status.succeeded == 1 and batch.read_namespaced_job("j", NS).status.succeeded == 1
    core.create_node({"metadata": {"name": "n1"}})
    node = core.patch_node_status("n1", {"status": {"allocatable": {"akri.sh/x": "1"}}})
    assert node.status.allocatable == {"akri.sh/x": "1"}


def test_resource_v1_types_are_stored(api) -> None:
    resource = client.ResourceV1Api(api)
    claim = resource.create_namespaced_resource_claim(NS, {
        "metadata": {"name": "c1"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "akri"}}]}}})  # fmt: skip
    assert claim.metadata.uid
    allocated = resource.patch_namespaced_resource_claim_status("c1", NS, {"status": {"reservedFor": [
        {"resource": "pods", "name": "p", "uid": "u1"}]}})  # fmt: skip
    assert allocated.status.reserved_for[0].name == "p"
    resource.create_device_class({"metadata": {"name": "akri"}, "spec": {}})
    resource.create_resource_slice({"metadata": {"name": "s1"}, "spec": {
        "driver": "akri.sh", "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}}})  # fmt: skip
    slices = resource.list_resource_slice(field_selector="spec.nodeName=n1")
    assert [s.metadata.name for s in slices.items] == ["s1"]
    assert [d.metadata.name for d in resource.list_device_class().items] == ["akri"]
    assert resource.delete_namespaced_resource_claim("c1", NS).metadata.name == "c1"


# -- delete, finalizers, preconditions, dry run ----------------------------------------------


def test_delete_returns_200_with_the_object_and_then_404(co, core) -> None:
    create_instance(co, "i1")
    deleted = co.delete_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1")
    assert deleted["metadata"]["name"] == "i1"
    assert (
        error_of(co.delete_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1")[0]
        == 404
    )
    core.create_namespaced_config_map(NS, {"metadata": {"name": "cm"}})
    status = core.delete_namespaced_config_map("cm", NS)
    assert status["kind"] == "Status" and status["status"] == "Success"


def test_finalizers_hold_deletion_until_removed(co) -> None:
    body = instance("i1")
    body["metadata"]["finalizers"] = ["akri.sh/test"]
    created = co.create_namespaced_custom_object(GROUP, VERSION, NS, "instances", body)
    rv = created["metadata"]["resourceVersion"]
    marked = co.delete_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1")
    assert marked["metadata"]["deletionTimestamp"]
    assert marked["metadata"]["generation"] == 2
    again = co.delete_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1")
    assert again["metadata"]["resourceVersion"] == marked["metadata"]["resourceVersion"]
    status, body = error_of(co.patch_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1",
                            {"metadata": {"finalizers": ["akri.sh/test", "new"]}})  # fmt: skip
    assert status == 422
    co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "instances", "i1", {"metadata": {"finalizers": None}}
    )
    assert (
        error_of(co.get_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1")[0] == 404
    )
    events = collect(co.list_namespaced_custom_object, GROUP, VERSION, NS, "instances",
                     resource_version=rv, count=2)  # fmt: skip
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert int(events[1]["raw_object"]["metadata"]["resourceVersion"]) > int(
        events[0]["raw_object"]["metadata"]["resourceVersion"])  # fmt: skip


def test_delete_preconditions_conflict_with_409(co, core) -> None:
    created = create_instance(co, "i1")
    for preconditions in ({"uid": "other"}, {"resourceVersion": "1"}):
        status, body = error_of(co.delete_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1",
                                body={"preconditions": preconditions})  # fmt: skip
        assert (status, body["reason"]) == (409, "Conflict")
        assert body["message"].startswith(
            'Operation cannot be fulfilled on instances.akri.sh "i1": Precondition'
        )
    co.delete_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1", body={
        "preconditions": {"uid": created["metadata"]["uid"],
                          "resourceVersion": created["metadata"]["resourceVersion"]}})  # fmt: skip
    core.create_namespaced_pod(NS, pod("p1"))
    deleted = core.delete_namespaced_pod("p1", NS, body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=core.read_namespaced_pod("p1", NS).metadata.uid)))  # fmt: skip
    assert deleted.metadata.name == "p1"


def test_dry_run_validates_without_storing(co) -> None:
    would = co.create_namespaced_custom_object(
        GROUP, VERSION, NS, "instances", instance("i1"), dry_run="All"
    )
    assert would["metadata"]["name"] == "i1"
    assert (
        error_of(co.get_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1")[0] == 404
    )
    create_instance(co, "i1")
    preview = co.patch_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1", {"spec": {"capacity": 9}},
                                                dry_run="All")  # fmt: skip
    assert preview["spec"]["capacity"] == 9
    assert (
        co.get_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1")["spec"]["capacity"]
        == 2
    )


# -- watch -----------------------------------------------------------------------------------


def test_watch_replays_added_only_without_a_resource_version(sim, co) -> None:
    create_instance(co, "a")
    create_instance(co, "b")
    events = collect(co.list_namespaced_custom_object, GROUP, VERSION, NS, "instances", count=2)
    assert names(events) == [("ADDED", "a"), ("ADDED", "b")]
    listed = co.list_namespaced_custom_object(GROUP, VERSION, NS, "instances")
    rv = listed["metadata"]["resourceVersion"]
    create_instance(co, "c")
    events = collect(co.list_namespaced_custom_object, GROUP, VERSION, NS, "instances",
                     resource_version=rv, count=1)  # fmt: skip
    assert names(events) == [("ADDED", "c")]
    # "0" and "" also mean "start with the current state".
    sim.set_watch_cap(0.2)
    for rv_param in ("0", ""):
        path = (
            f"/apis/akri.sh/v0/namespaces/default/instances?watch=true&resourceVersion={rv_param}"
        )
        lines = raw(sim, "GET", path).data.splitlines()
        assert [json.loads(line)["type"] for line in lines] == ["ADDED"] * 3


@pytest.mark.parametrize("flag", ["1", "t", "T", "TRUE", "true", "True"])
def test_watch_parses_booleans_like_go(sim, flag: str) -> None:
    sim.set_watch_cap(0.01)  # timeoutSeconds=0 means no timeout; the cap ends the stream
    response = raw(sim, "GET", f"/api/v1/namespaces/default/pods?watch={flag}&timeoutSeconds=0")
    assert response.status == 200 and response.headers["Transfer-Encoding"] == "chunked"


def test_watch_resumes_without_duplicates_or_gaps(co) -> None:
    start = create_instance(co, "i1")["metadata"]["resourceVersion"]
    for capacity in range(3, 9):
        co.patch_namespaced_custom_object(
            GROUP, VERSION, NS, "instances", "i1", {"spec": {"capacity": capacity}}
        )
    first = collect(co.list_namespaced_custom_object, GROUP, VERSION, NS, "instances",
                    resource_version=start, count=3)  # fmt: skip
    resume = first[-1]["raw_object"]["metadata"]["resourceVersion"]
    rest = collect(co.list_namespaced_custom_object, GROUP, VERSION, NS, "instances",
                   resource_version=resume, count=3)  # fmt: skip
    capacities = [e["raw_object"]["spec"]["capacity"] for e in first + rest]
    assert capacities == [3, 4, 5, 6, 7, 8]


def test_watch_from_a_compacted_version_gets_410_expired(sim, co) -> None:
    start = create_instance(co, "i1")["metadata"]["resourceVersion"]
    sim.set_history_limit(2)
    for capacity in range(3, 7):
        co.patch_namespaced_custom_object(
            GROUP, VERSION, NS, "instances", "i1", {"spec": {"capacity": capacity}}
        )
    with pytest.raises(ApiException) as info:
        collect(co.list_namespaced_custom_object, GROUP, VERSION, NS, "instances",
                resource_version=start, count=1)  # fmt: skip
    assert info.value.status == 410
    assert re.search(rf"Expired: too old resource version: {start} \(\d+\)", info.value.reason)
    response = raw(
        sim,
        "GET",
        f"/apis/akri.sh/v0/namespaces/default/instances?watch=true&resourceVersion={start}",
    )
    event = json.loads(response.data.splitlines()[0])
    assert event["type"] == "ERROR"
    assert {k: event["object"][k] for k in ("kind", "code", "reason")} == {
        "kind": "Status", "code": 410, "reason": "Expired"}  # fmt: skip


def test_watch_honours_timeout_seconds_and_the_server_cap(sim, core) -> None:
    started = time.monotonic()
    assert collect(core.list_namespaced_pod, NS, count=1, timeout=1) == []
    assert 0.9 <= time.monotonic() - started < 20  # ends by its timeout, not never
    sim.set_watch_cap(0.2)
    started = time.monotonic()
    assert collect(core.list_namespaced_pod, NS, count=1, timeout=30) == []
    assert time.monotonic() - started < 20  # the cap (0.2 s) ended it, not the 30 s timeout


def test_watch_sends_bookmarks_when_allowed(sim, core) -> None:
    sim.bookmark_interval = 0.05
    try:
        w = watch.Watch()
        events = []
        for event in w.stream(
            core.list_namespaced_pod, NS, allow_watch_bookmarks=True, timeout_seconds=2
        ):
            events.append(event)
            w.stop()
    finally:
        sim.bookmark_interval = 1.0
    assert events[0]["type"] == "BOOKMARK"
    assert events[0]["raw_object"]["metadata"]["resourceVersion"] == sim.resource_version


def test_watch_selectors_filter_and_send_transitions(core) -> None:
    core.create_namespaced_pod(NS, pod("p1", labels={"app": "x"}))
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod("p2", labels={"app": "y"}))
    core.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"app": "z"}}})
    core.patch_namespaced_pod("p2", NS, {"metadata": {"labels": {"app": "x"}}})
    core.delete_namespaced_pod("p2", NS)
    events = collect(
        core.list_namespaced_pod, NS, label_selector="app=x", resource_version=rv, count=4
    )
    # A pod's deletion stamps it (MODIFIED) before it goes, as on a real server.
    assert names(events) == [("DELETED", "p1"), ("ADDED", "p2"), ("MODIFIED", "p2"),
                             ("DELETED", "p2")]  # fmt: skip
    assert events[0]["raw_object"]["metadata"]["labels"] == {"app": "x"}  # the last matching state


def test_deleted_events_carry_the_last_state_with_a_new_resource_version(core) -> None:
    created = core.create_namespaced_pod(NS, pod("p1", labels={"k": "v"}))
    core.delete_namespaced_pod("p1", NS)
    events = collect(
        core.list_namespaced_pod, NS, resource_version=created.metadata.resource_version, count=2
    )
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert events[1]["object"].metadata.labels == {"k": "v"}
    assert events[1]["object"].metadata.deletion_grace_period_seconds == 0
    rvs = {e["object"].metadata.resource_version for e in events}
    assert len(rvs | {created.metadata.resource_version}) == 3


def test_concurrent_watchers_and_writers_lose_no_events(sim) -> None:
    writers, per_writer, watchers = 4, 25, 5
    total = writers * per_writer
    start = sim.resource_version
    results: list[list[str]] = [[] for _ in range(watchers)]
    ready = threading.Barrier(watchers + 1)

    def watcher(slot: int) -> None:
        with sim.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            w = watch.Watch()
            ready.wait()
            for event in w.stream(core.list_config_map_for_all_namespaces, resource_version=start,
                                  timeout_seconds=15):  # fmt: skip
                results[slot].append(event["object"].metadata.name)
                if len(results[slot]) >= total:
                    w.stop()

    def writer(slot: int) -> None:
        with sim.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            for i in range(per_writer):
                core.create_namespaced_config_map(
                    f"ns{slot}", {"metadata": {"name": f"cm-{slot}-{i}"}}
                )

    for slot in range(writers):
        sim.ensure_namespace(f"ns{slot}")
    threads = [threading.Thread(target=watcher, args=(i,)) for i in range(watchers)]
    for t in threads:
        t.start()
    ready.wait()
    writer_threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in writer_threads:
        t.start()
    for t in writer_threads + threads:
        t.join(timeout=20)
    expected = sorted(f"cm-{w}-{i}" for w in range(writers) for i in range(per_writer))
    for seen in results:
        assert sorted(seen) == expected and len(seen) == total


def test_drop_watches_cuts_open_streams(sim, core) -> None:
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            w = watch.Watch()
            for _ in w.stream(
                core.list_namespaced_pod, NS, timeout_seconds=10, _request_timeout=15
            ):
                pass
        except Exception as exc:  # the dropped connection surfaces as a urllib3 error
            errors.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    deadline = time.monotonic() + 5
    while sim.drop_watches() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    began = time.monotonic()
    thread.join(timeout=5)
    assert not thread.is_alive() and time.monotonic() - began < 5  # before its own 10 s end
    assert errors and isinstance(errors[0], urllib3.exceptions.HTTPError)


def test_a_clean_drop_ends_the_stream_normally(sim, core) -> None:
    done = threading.Event()

    def consume() -> None:
        for _ in watch.Watch().stream(core.list_namespaced_pod, NS, timeout_seconds=10):
            pass
        done.set()

    thread = threading.Thread(target=consume)
    thread.start()
    deadline = time.monotonic() + 5
    while sim.drop_watches(clean=True) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done.wait(5)
    thread.join(timeout=5)


# -- discovery, CRDs, hooks ------------------------------------------------------------------


def test_discovery_endpoints(sim, api, co) -> None:
    resources = co.get_api_resources(GROUP, VERSION)
    by_name = {r.name: r for r in resources.resources}
    assert by_name["instances"].kind == "Instance" and by_name["instances"].namespaced
    assert by_name["instances"].singular_name == "instance"
    assert "akrii" in by_name["instances"].short_names and "watch" in by_name["instances"].verbs
    core_resources = {r.name for r in client.CoreV1Api(api).get_api_resources().resources}
    assert {"pods", "pods/status", "nodes", "nodes/status", "services", "configmaps", "secrets",
            "namespaces"} <= core_resources  # fmt: skip
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"akri.sh", "batch", "resource.k8s.io", "apiextensions.k8s.io"} <= groups
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    assert json.loads(raw(sim, "GET", "/apis/akri.sh").data)["preferredVersion"]["version"] == "v0"
    assert raw(sim, "GET", "/apis/nope.example/v1").status == 404


def test_the_dynamic_client_works_through_discovery(api) -> None:
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(api)
    instances = dyn.resources.get(api_version="akri.sh/v0", kind="Instance")
    dyn_created = instances.create(body=instance("dyn"), namespace=NS)
    assert dyn_created.metadata.name == "dyn"


def test_crds_created_through_the_api_are_served_at_once(sim, api, co, widgets) -> None:
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition("widgets.sim.test")
    assert any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)
    assert "widgets/status" in {r.name for r in co.get_api_resources("sim.test", "v1").resources}
    bad = json.loads(json.dumps(WIDGET_CRD))
    bad["metadata"]["name"] = "wrong.sim.test"
    assert error_of(client.ApiextensionsV1Api(api).create_custom_resource_definition, bad)[0] == 422


def test_reset_forgets_objects_but_keeps_crds(sim, co, widgets) -> None:
    create_instance(co, "i1")
    sim.reset()
    assert co.list_namespaced_custom_object(GROUP, VERSION, NS, "instances")["items"] == []
    assert co.list_namespaced_custom_object("sim.test", "v1", NS, widgets)["items"] == []


def test_fault_injection_answers_then_recovers(sim, co) -> None:
    create_instance(co, "i1")
    sim.inject_fault("GET", r"/instances/i1$", status=500, times=2)
    for _ in range(2):
        status, body = error_of(
            co.get_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1"
        )
        assert (status, body["reason"]) == (500, "InternalError")
    assert (
        co.get_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1")["metadata"]["name"]
        == "i1"
    )
    sim.inject_fault("PATCH", r"instances", status=409, reason="Conflict")
    assert (
        error_of(co.patch_namespaced_custom_object, GROUP, VERSION, NS, "instances", "i1", {})[1][
            "reason"
        ]
        == "Conflict"
    )
    sim.inject_fault("*", r"instances", status=0, delay=0.2)
    started = time.monotonic()
    co.get_namespaced_custom_object(GROUP, VERSION, NS, "instances", "i1")
    assert time.monotonic() - started >= 0.2


def test_request_log_records_method_path_query_and_content_type(sim, co) -> None:
    create_instance(co, "i1")
    co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "instances", "i1", [], _content_type=JSON_PATCH
    )
    co.list_namespaced_custom_object(GROUP, VERSION, NS, "instances", label_selector="a=b")
    patch, listing = sim.request_log[-2:]
    assert patch == ("PATCH", "/apis/akri.sh/v0/namespaces/default/instances/i1", {}, JSON_PATCH)
    assert listing.method == "GET" and listing.query == {"labelSelector": "a=b"}


def test_direct_accessors_return_copies(sim, co) -> None:
    create_instance(co, "i1")
    obj = sim.get_object("akri.sh/v0/instances", NS, "i1")
    assert obj["spec"]["capacity"] == 2
    obj["spec"]["capacity"] = 99
    assert sim.get_object("instances", NS, "i1")["spec"]["capacity"] == 2
    assert sim.get_object("v1/pods", NS, "missing") is None
    assert [o["metadata"]["name"] for o in sim.list_objects("akri.sh/v0/instances")] == ["i1"]


def test_requests_are_fast(sim) -> None:
    http = urllib3.PoolManager()
    http.request("POST", sim.url + "/api/v1/namespaces/default/configmaps",
                 body=b'{"metadata": {"name": "cm"}}')  # fmt: skip
    started = time.perf_counter()
    for _ in range(200):
        assert (
            http.request("GET", sim.url + "/api/v1/namespaces/default/configmaps/cm").status == 200
        )
    assert (time.perf_counter() - started) / 200 < 0.005


# -- the kube fixture ------------------------------------------------------------------------


def test_the_kube_fixture_gives_a_namespace_and_clients(kube: KubeEnv) -> None:
    assert re.fullmatch(r"t-[a-z0-9]{8}", kube.namespace)
    core = client.CoreV1Api(kube.api_client)
    assert core.read_namespace(kube.namespace).metadata.name == kube.namespace
    assert kube.real is (kube.simulator is None)
    other = client.CoreV1Api(kube.new_client())
    other.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "cm"}})
    assert kube.wait_for(lambda: core.read_namespaced_config_map("cm", kube.namespace))
    with pytest.raises(AssertionError, match="timed out after 0.05s waiting for never"):
        kube.wait_for(lambda: False, timeout=0.05, message="never")
    assert Path(kube.kubeconfig).exists()


def test_stop_ends_open_watches_promptly(tmp_path: Path) -> None:
    server = ApiServerSimulator(crd_dir=tmp_path).start()
    api_client = server.api_client()
    ended = threading.Event()

    def consume() -> None:
        try:
            for _ in watch.Watch().stream(client.CoreV1Api(api_client).list_namespaced_pod, NS,
                                          timeout_seconds=30, _request_timeout=40):  # fmt: skip
                pass
        except Exception:  # a cut connection is the expected way for this stream to end
            pass
        ended.set()

    thread = threading.Thread(target=consume)
    thread.start()
    deadline = time.monotonic() + 5
    while not server.request_log and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    began = time.monotonic()
    server.stop()
    assert ended.wait(3) and time.monotonic() - began < 2
    thread.join(timeout=5)
    api_client.close()


# -- patch and selector algorithms -----------------------------------------------------------


def test_strategic_merge_patch_directives() -> None:
    from agent.simulator.apiserver_patch import strategic_merge_patch

    pod_obj = {
        "metadata": {"finalizers": ["a"]},
        "spec": {"containers": [{"name": "c1", "image": "x"}, {"name": "c2", "image": "y"}]},
    }
    patched = strategic_merge_patch(pod_obj, {
        "metadata": {"finalizers": ["b"]},
        "spec": {"containers": [{"name": "c2", "$patch": "delete"}, {"name": "c3", "image": "z"}],
                 "$setElementOrder/containers": [{"name": "c1"}]}})  # fmt: skip
    assert patched["metadata"]["finalizers"] == ["a", "b"]
    assert [c["name"] for c in patched["spec"]["containers"]] == ["c1", "c3"]
    assert pod_obj["spec"]["containers"][1]["name"] == "c2"  # the input is untouched
    removed = strategic_merge_patch(
        patched, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}
    )
    assert removed["metadata"]["finalizers"] == ["b"]
    replaced = strategic_merge_patch(patched, {"spec": {"$patch": "replace", "containers": []}})
    assert replaced["spec"] == {"containers": []}


def test_label_selector_parsing_rejects_garbage() -> None:
    from agent.simulator.apiserver_select import SelectorError, parse_label_selector

    assert parse_label_selector("a in (x, y), b!=z,!c") == [
        ("a", "in", ("x", "y")), ("b", "!=", ("z",)), ("c", "!exists", ())]  # fmt: skip
    for bad in ("a in ()", "a=b=c", ",", "a in (x", "n>x"):
        with pytest.raises(SelectorError):
            parse_label_selector(bad)
