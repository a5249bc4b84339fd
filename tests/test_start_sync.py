"""The controller's start-up sync: relists written in bulk, and on a warm database only what
changed is written (and announced)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agent import controller
from agent.bench.claims import instance_body
from agent.domain.naming import slot_key
from agent.kube.client import AkriApi, BatchApi, CoreApi
from agent.kube.watch import CacheSync
from agent.models import Instance, Node, Slot, SlotEvent, SyncState
from agent.queues import cache as queue_cache
from agent.queues.models import QueuePod


def node_body(name: str, ready: str = "True", **labels: str) -> dict:
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": "2026-01-02T03:04:05Z"}
            ]
        },
    }


def pod_body(name: str, node: str, **labels: str) -> dict:
    return {
        "metadata": {"name": name, "namespace": "apps", "uid": f"uid-{name}", "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {"akri.sh/cam-1": "1"}}}],
        },
        "status": {"phase": "Running"},
    }


@pytest.mark.django_db
def test_a_node_relist_writes_new_and_changed_nodes_and_marks_the_rest_deleted():
    long_ago = timezone.now() - timedelta(days=1)
    Node.objects.create(name="same", ready=True, ready_since=long_ago, labels={"a": "1"})
    Node.objects.create(name="goes-down", ready=True, ready_since=long_ago)
    Node.objects.create(name="gone", ready=True, ready_since=long_ago)
    Node.objects.filter(name="same").update(updated_at=long_ago)

    controller.replace_nodes(
        [node_body("same", a="1"), node_body("goes-down", "False"), node_body("new", b="2")]
    )

    rows = {n.name: n for n in Node.objects.all()}
    assert rows["same"].updated_at == long_ago  # unchanged: not written
    assert rows["same"].ready and rows["same"].ready_since == long_ago
    down = rows["goes-down"]
    assert not down.ready and down.not_ready_since.isoformat() == "2026-01-02T03:04:05+00:00"
    assert rows["new"].ready and rows["new"].labels == {"b": "2"} and not rows["new"].deleted
    assert rows["gone"].deleted and not rows["gone"].ready


@pytest.mark.django_db
def test_a_queue_pod_relist_writes_only_the_rows_that_differ():
    queue_cache.replace_pod_rows(
        queue_cache.pod_rows(
            [pod_body("same", "n1"), pod_body("moves", "n1"), pod_body("gone", "n1")]
        )
    )
    kept = {p.name: p.pk for p in QueuePod.objects.all()}

    queue_cache.replace_pod_rows(
        queue_cache.pod_rows(
            [pod_body("same", "n1"), pod_body("moves", "n2"), pod_body("new", "n3")]
        )
    )

    rows = {p.name: p for p in QueuePod.objects.all()}
    assert sorted(rows) == ["moves", "new", "same"]
    assert rows["same"].pk == kept["same"] and rows["moves"].pk == kept["moves"]
    assert rows["moves"].node_name == "n2" and rows["new"].node_name == "n3"
    assert rows["new"].labels == {} and rows["new"].claims == [] and rows["new"].uid == "uid-new"


@pytest.mark.django_db(transaction=True)
@pytest.mark.kube
def test_a_relist_on_a_warm_cache_writes_and_announces_only_what_changed(kube):
    api = AkriApi(kube.api_client, kube.namespace)
    names = [f"warm-{i:06x}" for i in range(4)]
    for name in names:
        api.create_instance(instance_body(name, 2, configuration="cams"))
    first = CacheSync(kube.new_client(), kube.namespace, owner="warm", timeout_seconds=5).start()
    try:
        assert first.wait_synced()
    finally:
        first.stop()
    assert Slot.objects.filter(instance__name__in=names).count() == 8
    events = SlotEvent.objects.count()
    slot = f"/spec/deviceUsage/{slot_key(names[1], 0)}"
    api.patch_instance(names[1], [{"op": "replace", "path": slot, "value": "node-a"}])
    api.create_instance(instance_body("warm-new000", 1, configuration="cams"))
    # As after the API server's history moved past the stored version: a full relist.
    SyncState.objects.filter(owner="warm").update(resource_version="")
    heard: list[str] = []

    second = CacheSync(kube.new_client(), kube.namespace, owner="warm", timeout_seconds=5)
    second.subscribe(lambda kind, name, obj: heard.append(name) if kind == "instance" else None)
    second.start()
    try:
        assert second.wait_synced()
    finally:
        second.stop()

    assert sorted(heard) == ["", names[1], "warm-new000"]
    assert heard[-1] == ""  # the relist's end, after the Instances it wrote
    assert Slot.objects.get(instance__name=names[1], key=slot_key(names[1], 0)).value == "node-a"
    assert SlotEvent.objects.count() == events + 1
    listed = {
        o["metadata"]["name"]: o["metadata"]["resourceVersion"]
        for o in api.list_instances()["items"]
    }
    assert dict(Instance.objects.values_list("name", "resource_version")) == listed


def test_the_controller_lists_pods_nodes_and_broker_objects_as_plain_dicts(apiserver):
    # Through the generic request path, not the typed CoreV1Api/BatchV1Api (a second of start-up
    # and some 20 MB of models): each list the controller and its broker watches make answers
    # the objects as sent.
    api = apiserver.api_client()
    core, batch = CoreApi(api), BatchApi(api)
    namespace = "h9-raw-lists"
    core._call("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    node = node_body("raw-node-1")
    core._call("POST", "/api/v1/nodes", body=node)
    pod = dict(pod_body("raw-pod-1", "raw-node-1"), metadata={"name": "raw-pod-1"})
    core._call("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
    service = {"metadata": {"name": "raw-svc-1"}, "spec": {"ports": [{"port": 80}]}}
    core._call("POST", f"/api/v1/namespaces/{namespace}/services", body=service)
    job = {
        "metadata": {"name": "raw-job-1"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }
    batch._call("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", body=job)
    try:
        listed = {
            "nodes": core.list_node(limit=500),
            "pods": core.list_namespaced_pod(namespace, limit=500),
            "all pods": core.list_pod_for_all_namespaces(field_selector="spec.nodeName=raw-node-1"),
            "services": core.list_namespaced_service(namespace),
            "jobs": batch.list_namespaced_job(namespace, label_selector=""),
        }
        names = {
            kind: {o["metadata"]["name"] for o in answer["items"]}
            for kind, answer in listed.items()
        }
        assert "raw-node-1" in names["nodes"]
        assert names["pods"] == names["all pods"] == {"raw-pod-1"}
        assert names["services"] == {"raw-svc-1"}
        assert names["jobs"] == {"raw-job-1"}
    finally:
        core._call("DELETE", "/api/v1/nodes/raw-node-1")
        core._call("DELETE", f"/api/v1/namespaces/{namespace}")
