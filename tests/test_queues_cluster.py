"""Queue charges against the API server: DRA claims and queue objects watched into the cache,
Akri slots charged through the slot-to-pod map, the owner label written create-only."""

from __future__ import annotations

import contextlib
import threading

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from agent.charges.admission import owner_label_patch
from agent.controller import Controller
from agent.kube.client import AkriApi
from agent.kube.watch import CacheSync
from agent.models import Slot
from agent.queues import facts as queue_facts
from agent.queues import recompute
from agent.queues.models import Charge, QueueObject, QueueSystem
from agent.queues.watch import ALL_KINDS, QueueWatch
from tests.queues_world import (
    LABEL,
    claim_body,
    crd_body,
    device_class_body,
    held_instance,
    pod_body,
    reserve,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]


@pytest.fixture
def fast(settings):
    settings.AKRI_QUEUES = {
        **settings.AKRI_QUEUES,
        "DEBOUNCE_SECONDS": 0.05,
        "CRD_RECHECK_SECONDS": 0.2,
        "FULL_MIN_SECONDS": 0.5,
    }
    return settings


def has_dra(kube) -> bool:
    try:
        client.CustomObjectsApi(kube.api_client).list_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", limit=1
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.fixture
def dra(kube):
    if not has_dra(kube):
        pytest.skip("this API server does not serve resource.k8s.io/v1 (DRA): DRA test skipped")
    custom = client.CustomObjectsApi(kube.api_client)
    name = f"gpu-{kube.namespace}.example.com"
    custom.create_cluster_custom_object(
        "resource.k8s.io", "v1", "deviceclasses", device_class_body(name)
    )
    yield name
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", name)


@pytest.fixture
def controller(kube, fast):
    sync = CacheSync(kube.new_client(), kube.namespace, owner="controller", timeout_seconds=5)
    ctl = Controller(kube.new_client(), kube.namespace, sync=sync, timeout_seconds=5)
    sync.start()
    ctl.start()
    yield ctl
    ctl.stop()
    sync.stop()


def create_pod(kube, body):
    return client.CoreV1Api(kube.api_client).create_namespaced_pod(kube.namespace, body).to_dict()


def as_dict(pod) -> dict:
    return {"metadata": {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}}


def test_a_dra_claim_first_bound_by_one_queue_gets_its_owner_label(kube, dra, controller):
    custom = client.CustomObjectsApi(kube.api_client)
    custom.create_namespaced_custom_object(
        "resource.k8s.io", "v1", kube.namespace, "resourceclaims", claim_body("shared", dra)
    )
    pa = create_pod(kube, pod_body("pa", "team-a", claim="shared"))
    pb = create_pod(kube, pod_body("pb", "team-b", claim="shared"))
    reserve(kube.api_client, kube.namespace, "shared", [as_dict(pa)])

    def owned():
        row = Charge.objects.filter(kind="resourceclaim", name="shared").first()
        return row if row is not None and row.source == "label" else None

    row = kube.wait_for(owned, timeout=10, message="the claim's owner from its new label")
    assert (row.owner, row.charged) == ("team-a", 1)
    claim = custom.get_namespaced_custom_object(
        "resource.k8s.io", "v1", kube.namespace, "resourceclaims", "shared"
    )
    assert claim["metadata"]["labels"][LABEL] == "team-a"

    reserve(kube.api_client, kube.namespace, "shared", [as_dict(pa), as_dict(pb)])
    row = kube.wait_for(
        lambda: Charge.objects.filter(name="shared", queues=["team-a", "team-b"]).first(),
        timeout=10,
        message="the second queue's pod on the claim",
    )
    assert (row.owner, row.charged, row.uncharged) == ("team-a", 1, 0)


def test_a_claim_with_no_pods_is_shown_and_charged_to_nobody(kube, dra, controller):
    custom = client.CustomObjectsApi(kube.api_client)
    custom.create_namespaced_custom_object(
        "resource.k8s.io", "v1", kube.namespace, "resourceclaims", claim_body("idle", dra)
    )
    reserve(kube.api_client, kube.namespace, "idle", [])
    row = kube.wait_for(lambda: Charge.objects.filter(name="idle").first(), timeout=10)
    assert (row.owner, row.source, row.charged, row.uncharged) == ("", "no-queue", 0, 1)
    assert "no pod of a known queue" in row.why


def akri_world(kube, sync_client):
    """An Instance with two held slots; the slot-to-pod map names a pod of queue team-a."""
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_instance(held_instance("cam-aaaaaa", "cam", holders=1))
    sync = CacheSync(sync_client, kube.namespace, owner="test", timeout_seconds=5).start()
    try:
        assert sync.wait_synced()
        kube.wait_for(lambda: Slot.objects.filter(value="node-a").exists())
    finally:
        sync.stop()
    pod = create_pod(kube, pod_body("cam-user", "team-a", resource="akri.sh/cam-aaaaaa"))
    Slot.objects.filter(key="cam-aaaaaa-0").update(
        pod_namespace=kube.namespace, pod_name="cam-user", pod_uid=pod["metadata"]["uid"]
    )
    return api, pod


def test_an_akri_slot_is_charged_to_its_pods_queue_and_the_instance_labelled(kube, fast):
    api, pod = akri_world(kube, kube.new_client())
    from agent.queues import cache

    cache.apply_pod("ADDED", client.ApiClient().sanitize_for_serialization(pod))
    outcome = recompute.recompute(None, api_client=kube.api_client)
    assert outcome.labels_written == 1
    assert api.get_instance("cam-aaaaaa")["metadata"]["labels"] == {LABEL: "team-a"}
    row = Charge.objects.get(kind="instance", name="cam-aaaaaa")
    assert (row.owner, row.source, row.charged, row.resource) == ("team-a", "label", 1, "cam")
    again = recompute.recompute(None, api_client=kube.api_client)
    assert again.labels_written == 0 and again.labels_adopted == 0


def test_concurrent_first_writes_of_the_owner_label_leave_exactly_one(kube):
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_instance(held_instance("cam-bbbbbb", "cam", holders=2))
    seen = api.get_instance("cam-bbbbbb")
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def write(queue: str) -> None:
        mine = AkriApi(kube.new_client(), kube.namespace)
        ops = owner_label_patch(
            seen["metadata"].get("labels"), seen["metadata"]["resourceVersion"], LABEL, queue
        )
        barrier.wait()
        try:
            mine.patch_instance("cam-bbbbbb", ops)
            results[queue] = "won"
        except ApiException as exc:
            results[queue] = exc.status

    threads = [threading.Thread(target=write, args=(q,)) for q in ("team-a", "team-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(map(str, results.values())) == ["422", "won"]
    winner = next(q for q, r in results.items() if r == "won")
    assert api.get_instance("cam-bbbbbb")["metadata"]["labels"] == {LABEL: winner}


KAI_CRD = crd_body("scheduling.run.ai", "v2", "queues", "Queue", "Cluster")


def test_queue_objects_are_watched_once_their_crd_appears(kube, fast):
    ext = client.ApiextensionsV1Api(kube.api_client)
    fired: list = []
    watch = QueueWatch(kube.new_client(), fire=fired.append, timeout_seconds=5).start()
    try:
        kube.wait_for(
            lambda: QueueSystem.objects.filter(kind="kai-queue", present=False).exists(),
            message="the absent KAI Queue CRD recorded",
        )
        ext.create_custom_resource_definition(KAI_CRD)
        custom = client.CustomObjectsApi(kube.api_client)
        kube.wait_for(lambda: has_kind(custom), timeout=30, message="the CRD served")
        custom.create_cluster_custom_object(
            "scheduling.run.ai",
            "v2",
            "queues",
            {
                "apiVersion": "scheduling.run.ai/v2",
                "kind": "Queue",
                "metadata": {
                    "name": f"{kube.namespace}-a",
                    "annotations": {"akri-site.io/opt-out": "true"},
                },
                "spec": {},
            },
        )
        kube.wait_for(
            lambda: QueueObject.objects.filter(name=f"{kube.namespace}-a").exists(),
            timeout=10,
            message="the KAI Queue in the cache",
        )
        the_world = queue_facts.world()
        assert f"{kube.namespace}-a" in the_world.kai_queues
        assert f"{kube.namespace}-a" in the_world.opted_out
        # A queue object moves every charge: a full recompute, once the debounce has passed.
        kube.wait_for(lambda: None in fired, message="a full recompute asked for")

        ext.delete_custom_resource_definition(KAI_CRD["metadata"]["name"])
        kube.wait_for(
            lambda: (
                QueueSystem.objects.filter(kind="kai-queue", present=False).exists()
                and not QueueObject.objects.filter(kind="kai-queue").exists()
            ),
            timeout=60,
            message="the KAI queues dropped once their CRD is gone",
        )
    finally:
        watch.stop()
        with contextlib.suppress(ApiException):
            ext.delete_custom_resource_definition(KAI_CRD["metadata"]["name"])


def has_kind(custom) -> bool:
    try:
        custom.list_cluster_custom_object("scheduling.run.ai", "v2", "queues", limit=1)
    except ApiException:
        return False
    return True


def test_an_operator_evicts_the_foreign_pods_of_an_owned_claim(kube, client_as_operator, settings):
    from agent.models import AuditEntry
    from agent.queues import cache
    from agent.queues.models import ResourceClaim

    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig}
    pods = [
        create_pod(kube, pod_body("owner-pod", "team-a", resource="akri.sh/cam-aaaaaa")),
        create_pod(kube, pod_body("guest-pod", "team-b", resource="akri.sh/cam-aaaaaa")),
    ]
    for obj in pods:
        cache.apply_pod("ADDED", client.ApiClient().sanitize_for_serialization(obj))
    ResourceClaim.objects.create(
        namespace=kube.namespace,
        name="shared",
        labels={LABEL: "team-a"},
        device_classes=["gpu"],
        allocated=1,
        reserved_for=[
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
            for p in pods
        ],
    )
    recompute.recompute(None)
    guest = f"{kube.namespace}/guest-pod@{pods[1]['metadata']['uid']}"
    url = f"/queues/claims/resourceclaim/{kube.namespace}/shared/evict/"
    answer = client_as_operator.post(url, {"pods": [guest], "reason": "take it back"})
    assert answer.status_code == 302
    core = client.CoreV1Api(kube.api_client)
    names = {p.metadata.name for p in core.list_namespaced_pod(kube.namespace).items}
    assert names == {"owner-pod"}
    entry = AuditEntry.objects.get(action="evict_foreign_pods")
    assert (entry.outcome, entry.holder, entry.reason) == (
        "done",
        f"{kube.namespace}/guest-pod",
        "take it back",
    )


@pytest.fixture
def client_as_operator(client):
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user("op", is_staff=True)
    user.groups.add(Group.objects.get(name="operator"))
    client.force_login(user)
    return client


def test_the_celery_task_recomputes_writes_labels_and_samples(kube, fast, settings):
    from agent.queues import cache, tasks
    from agent.queues.models import ChargeSample

    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig}
    api, pod = akri_world(kube, kube.new_client())
    cache.apply_pod("ADDED", client.ApiClient().sanitize_for_serialization(pod))
    decided = tasks.recompute_charges.apply(kwargs={"trigger": "schedule"}).get()
    assert decided >= 1
    assert api.get_instance("cam-aaaaaa")["metadata"]["labels"] == {LABEL: "team-a"}
    assert ChargeSample.objects.filter(queue="team-a", resource="cam", charged=1).exists()


def test_the_controller_labels_an_instance_when_its_slot_holders_pod_appears(kube, controller):
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_instance(held_instance("cam-cccccc", "cam", holders=1))
    kube.wait_for(lambda: Slot.objects.filter(key="cam-cccccc-0", value="node-a").exists())
    # What the node agent's slot-to-pod map shows once PodResources names the pod.
    Slot.objects.filter(key="cam-cccccc-0").update(pod_namespace=kube.namespace, pod_name="cam-pod")
    create_pod(kube, pod_body("cam-pod", "team-a", resource="akri.sh/cam-cccccc"))
    kube.wait_for(
        lambda: (
            (api.get_instance("cam-cccccc")["metadata"].get("labels") or {}).get(LABEL) == "team-a"
        ),
        timeout=10,
        message="the owner label written after the pod event",
    )
    row = kube.wait_for(
        lambda: Charge.objects.filter(name="cam-cccccc", source="label").first(), timeout=10
    )
    assert (row.owner, row.charged) == ("team-a", 1)


KAI_PODGROUP_CRD = crd_body("scheduling.run.ai", "v2alpha2", "podgroups", "PodGroup", "Namespaced")


def test_a_pod_of_a_job_is_charged_to_the_queue_its_top_owner_names(kube, fast):
    """KAI reads a pod's queue from its top owner first; its PodGroup records that owner and
    carries its labels, which the watch mirrors and the recompute reads."""
    ext = client.ApiextensionsV1Api(kube.api_client)
    custom = client.CustomObjectsApi(kube.api_client)
    made_crd = True
    try:
        ext.create_custom_resource_definition(KAI_PODGROUP_CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise
        made_crd = False
    watch = QueueWatch(kube.new_client(), fire=lambda keys: None, timeout_seconds=5).start()
    try:
        job = client.BatchV1Api(kube.api_client).create_namespaced_job(
            kube.namespace,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "train-7", "labels": {"kai.scheduler/queue": "team-b"}},
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [{"name": "main", "image": "busybox"}],
                            "restartPolicy": "Never",
                        }
                    }
                },
            },
        )
        uid = job.metadata.uid
        kube.wait_for(
            lambda: QueueSystem.objects.filter(kind="kai-podgroup", present=True).exists(),
            timeout=30,
            message="the KAI PodGroup CRD seen",
        )
        custom.create_namespaced_custom_object(
            "scheduling.run.ai",
            "v2alpha2",
            kube.namespace,
            "podgroups",
            {
                "apiVersion": "scheduling.run.ai/v2alpha2",
                "kind": "PodGroup",
                "metadata": {
                    "name": f"pg-train-7-{uid}",
                    "labels": {"kai.scheduler/queue": "team-b"},
                    "annotations": {
                        "kai.scheduler/top-owner-metadata": (
                            f"group: batch\nkind: Job\nname: train-7\nuid: {uid}\n"
                        )
                    },
                },
                "spec": {"queue": "team-b", "minMember": 1},
            },
        )
        kube.wait_for(
            lambda: (
                QueueObject.objects.filter(kind="kai-podgroup", name=f"pg-train-7-{uid}")
                .exclude(labels={})
                .exists()
            ),
            timeout=15,
            message="the PodGroup and its labels in the cache",
        )
        api = AkriApi(kube.api_client, kube.namespace)
        api.create_instance(held_instance("cam-dddddd", "cam", holders=1))
        sync = CacheSync(kube.new_client(), kube.namespace, owner="test", timeout_seconds=5)
        sync.start()
        try:
            assert sync.wait_synced()
            kube.wait_for(lambda: Slot.objects.filter(key="cam-dddddd-0", value="node-a").exists())
        finally:
            sync.stop()
        body = pod_body("train-7-abcde", resource="akri.sh/cam-dddddd")
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "train-7", "uid": uid}
        ]
        pod = create_pod(kube, body)
        Slot.objects.filter(key="cam-dddddd-0").update(
            pod_namespace=kube.namespace, pod_name="train-7-abcde", pod_uid=pod["metadata"]["uid"]
        )
        from agent.queues import cache

        read = client.CoreV1Api(kube.api_client).read_namespaced_pod(
            "train-7-abcde", kube.namespace
        )
        cache.apply_pod("ADDED", kube.api_client.sanitize_for_serialization(read))
        outcome = recompute.recompute(None, api_client=kube.api_client)
        assert outcome.labels_written == 1
        assert api.get_instance("cam-dddddd")["metadata"]["labels"] == {LABEL: "team-b"}
        row = Charge.objects.get(kind="instance", name="cam-dddddd")
        assert (row.owner, row.charged) == ("team-b", 1)
        assert "top owner Job train-7" in row.users[0]["why"]
    finally:
        watch.stop()
        if made_crd:
            with contextlib.suppress(ApiException):
                ext.delete_custom_resource_definition(KAI_PODGROUP_CRD["metadata"]["name"])


def test_a_crd_found_while_the_watch_stops_starts_no_watcher(kube, fast):
    """The probe thread may find a CRD just as stop() runs: a watcher it started after stop()
    had stopped the others ran on for ever (a deposed controller watching queues)."""
    watch = QueueWatch(kube.new_client(), fire=lambda keys: None, timeout_seconds=5)
    watch.stop()
    threads = list(watch._threads)
    watch._start_watcher(ALL_KINDS[0])
    assert not watch.present(ALL_KINDS[0].kind)
    assert watch._threads == threads
