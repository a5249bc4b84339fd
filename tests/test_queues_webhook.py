"""The admission webhook with AdmissionReview bodies shaped as the API server sends them."""

from __future__ import annotations

import copy
import json

import pytest
from django.test import Client

from agent.models import Instance
from agent.queues import webhook
from agent.queues.models import Charge, InstanceLabels, QueueObject, Refusal, ResourceClaim

pytestmark = pytest.mark.django_db
URL = "/webhooks/pods/validate"
LABEL = "akri-site.io/queue"
SA = "system:serviceaccount:akri-site:akri-site-worker"

# As kube-apiserver 1.34 posts it for `kubectl run` of a pod using a shared ResourceClaim.
POD_REVIEW = {
    "kind": "AdmissionReview",
    "apiVersion": "admission.k8s.io/v1",
    "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "trainer-b",
        "namespace": "ml",
        "operation": "CREATE",
        "userInfo": {
            "username": "alice",
            "uid": "014fbff9a07c",
            "groups": ["system:authenticated"],
        },
        "object": {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": "trainer-b",
                "namespace": "ml",
                "labels": {"kai.scheduler/queue": "team-b"},
            },
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"}],
                "priority": 0,
            },
            "status": {},
        },
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    },
}


@pytest.fixture(autouse=True)
def fresh_world():
    webhook.forget_world()
    yield
    webhook.forget_world()


def review(**changes) -> dict:
    body = copy.deepcopy(POD_REVIEW)
    spec = body["request"]["object"]["spec"]
    if "priority" in changes:
        spec["priority"] = changes["priority"]
    if "labels" in changes:
        body["request"]["object"]["metadata"]["labels"] = changes["labels"]
    return body


def post(body, client=None):
    client = client or Client(enforce_csrf_checks=True)
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(URL, data=data, content_type="application/json")


@pytest.fixture
def owned_claim():
    ResourceClaim.objects.create(
        namespace="ml", name="shared-gpu", labels={LABEL: "team-a"}, device_classes=["gpu"]
    )
    Charge.objects.create(
        kind="resourceclaim",
        namespace="ml",
        name="shared-gpu",
        resource="gpu",
        owner="team-a",
        source="label",
        amount=1,
        charged=1,
    )


def test_a_pod_joining_no_owned_claim_is_allowed_and_the_uid_echoed():
    answer = post(review())
    assert answer.status_code == 200
    body = answer.json()
    assert body["kind"] == "AdmissionReview" and body["apiVersion"] == "admission.k8s.io/v1"
    assert body["response"] == {"uid": POD_REVIEW["request"]["uid"], "allowed": True}


def test_a_preemptible_foreign_pod_may_share_an_owned_claim(owned_claim):
    answer = post(review(priority=50))
    assert answer.status_code == 200 and answer.json()["response"]["allowed"] is True


def test_a_non_preemptible_foreign_pod_is_denied_with_claim_owner_and_rule(owned_claim):
    answer = post(review(priority=125))
    assert answer.status_code == 200
    result = answer.json()["response"]
    assert result["allowed"] is False and result["uid"] == POD_REVIEW["request"]["uid"]
    assert result["status"]["code"] == 403
    message = result["status"]["message"]
    for part in ("ml/shared-gpu", "owned by queue team-a", "resource locking", "team-b"):
        assert part in message
    assert Charge.objects.get(name="shared-gpu").owner == "team-a"  # nothing changed
    refusal = Refusal.objects.get()
    assert (refusal.name, refusal.queue, refusal.owner, refusal.rule) == (
        "trainer-b",
        "team-b",
        "team-a",
        "resource locking",
    )


def test_an_opted_out_owner_refuses_every_foreign_pod(owned_claim, settings):
    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "OPT_OUT": ["team-a"]}
    result = post(review(priority=0)).json()["response"]
    assert result["allowed"] is False and "(rule: opt-out)" in result["status"]["message"]


def test_the_owners_own_non_preemptible_pod_is_allowed(owned_claim):
    own = review(priority=1000, labels={"kai.scheduler/queue": "team-a"})
    assert post(own).json()["response"]["allowed"] is True


def test_a_non_preemptible_pod_on_an_owned_akri_instance_is_denied():
    Instance.objects.create(namespace="default", name="cam-8120fe", configuration_name="cam")
    InstanceLabels.objects.create(namespace="default", name="cam-8120fe", labels={LABEL: "team-a"})
    body = review(priority=200)
    spec = body["request"]["object"]["spec"]
    del spec["resourceClaims"]
    spec["containers"][0]["resources"] = {"limits": {"akri.sh/cam-8120fe": "1"}}
    result = post(body).json()["response"]
    assert result["allowed"] is False
    assert "instance default/cam-8120fe" in result["status"]["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("{not json", "malformed AdmissionReview"),
        ("[]", "the body must be a JSON object"),
        ({"kind": "Pod", "apiVersion": "v1"}, "kind must be AdmissionReview"),
        ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}, "request must be"),
        (
            {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}},
            "request.uid must be a non-empty string",
        ),
    ],
)
def test_a_malformed_review_gets_a_clear_400(body, says):
    answer = post(body)
    assert answer.status_code == 400
    assert says in answer.json()["error"]


def test_a_review_without_the_object_it_is_about_gets_a_400():
    body = review()
    body["request"]["object"] = None
    answer = post(body)
    assert answer.status_code == 400 and "request.object is required" in answer.json()["error"]


@pytest.mark.parametrize(
    "spec",
    [
        {"resourceClaims": ["not-an-object"]},
        {"containers": "busybox"},
        {"containers": [{"name": "m", "resources": {"limits": ["akri.sh/x"]}}]},
        "not a spec",
    ],
)
def test_a_pod_object_that_is_not_a_pod_gets_a_clear_400(owned_claim, spec):
    body = review()
    body["request"]["object"]["spec"] = spec
    answer = post(body)
    assert answer.status_code == 400
    assert "request.object is not a valid object" in answer.json()["error"]


def test_a_get_is_refused_with_405():
    assert Client().get(URL).status_code == 405


def label_review(operation, old, new, username="alice"):
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "b1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "namespace": "ml",
            "operation": operation,
            "userInfo": {"username": username},
            "object": {"metadata": {"name": "shared-gpu", "namespace": "ml", "labels": new}},
            "oldObject": None
            if old is None
            else {"metadata": {"name": "shared-gpu", "labels": old}},
        },
    }


def test_the_owner_label_cannot_be_changed_or_removed():
    changed = post(label_review("UPDATE", {LABEL: "team-a"}, {LABEL: "team-b"}, SA)).json()
    assert changed["response"]["allowed"] is False
    assert "owned by queue team-a" in changed["response"]["status"]["message"]
    assert "immutable" in changed["response"]["status"]["message"]
    removed = post(label_review("UPDATE", {LABEL: "team-a"}, {})).json()
    assert removed["response"]["allowed"] is False


def test_only_the_service_account_adds_the_owner_label_after_creation():
    by_user = post(label_review("UPDATE", {}, {LABEL: "team-a"})).json()["response"]
    assert by_user["allowed"] is False and SA in by_user["status"]["message"]
    assert post(label_review("UPDATE", {}, {LABEL: "team-a"}, SA)).json()["response"]["allowed"]
    assert post(label_review("CREATE", None, {LABEL: "team-a"})).json()["response"]["allowed"]


def test_other_resources_are_allowed_untouched():
    body = label_review("UPDATE", {LABEL: "a"}, {LABEL: "b"})
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "configmaps"}
    assert post(body).json()["response"]["allowed"] is True


# A queue object's annotation akri-site.io/opt-out overrides AKRI_QUEUE_OPT_OUT both ways, on
# every queue system's queue kind.
QUEUE_KINDS = [
    QueueObject.Kind.KAI_QUEUE,
    QueueObject.Kind.KUEUE_CLUSTER_QUEUE,
    QueueObject.Kind.VOLCANO_QUEUE,
]


@pytest.mark.parametrize("kind", QUEUE_KINDS)
def test_the_owners_queue_object_opts_it_out_or_back_in(owned_claim, settings, kind):
    foreign = review(priority=0)  # preemptible: only an opt-out keeps it off
    note = QueueObject.objects.create(
        kind=kind, name="team-a", annotations={"akri-site.io/opt-out": "true"}
    )
    webhook.forget_world()
    opted_out = post(foreign).json()["response"]

    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "OPT_OUT": ["team-a"]}
    note.annotations = {"akri-site.io/opt-out": "false"}
    note.save()
    webhook.forget_world()
    back_in = post(foreign).json()["response"]

    assert opted_out["allowed"] is False
    assert "owned by queue team-a" in opted_out["status"]["message"]
    assert "(rule: opt-out)" in opted_out["status"]["message"]
    assert back_in["allowed"] is True
