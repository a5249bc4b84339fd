"""The admission webhook as the web serves it: ahead of Django, from the in-memory index.

Also the rules the index answers with: Configuration-level requests and KAI's top owner.
"""

from __future__ import annotations

import copy
import json
import socket

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.conf import settings

from agent.models import Configuration, Instance
from agent.queues import fastpath, index, webhook
from agent.queues.models import Charge, InstanceLabels, QueueObject, Refusal, ResourceClaim
from akri_site.asgi import application
from tests import test_queues_webhook as base
from tests.test_queues_webhook import LABEL, POD_REVIEW, post, review

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/webhooks/pods/validate"
owned_claim = base.owned_claim


class Clock:
    """``time.monotonic`` of the index module, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clean_index(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(index.time, "monotonic", clock)
    holder = index.Holder()
    # Rebuilds happen when a test says so, not in a background thread.
    monkeypatch.setattr(holder, "_start_rebuild", lambda: None)
    monkeypatch.setattr(index, "HOLDER", holder)
    webhook.forget_world()
    yield clock
    webhook.forget_world()


def asgi_post(body, method: str = "POST") -> tuple[int, dict, dict]:
    """(status, JSON body, headers) from the ASGI application, as uvicorn would call it."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def call():
        communicator = HttpCommunicator(
            application, method, URL, body=data, headers=[(b"content-type", b"application/json")]
        )
        return await communicator.get_response(timeout=10)

    answer = async_to_sync(call)()
    headers = {k.decode(): v.decode() for k, v in answer["headers"]}
    content = json.loads(answer["body"]) if answer["body"] else {}
    return answer["status"], content, headers


def test_a_fresh_index_answers_without_the_database_and_as_the_database_path(
    owned_claim, monkeypatch
):
    index.HOLDER.rebuild_now()
    denied, allowed = review(priority=1000), review(priority=0)
    with monkeypatch.context() as patched:

        def no_database(*args):
            raise AssertionError("the database path answered")

        patched.setattr(fastpath, "_from_database", no_database)
        patched.setattr(webhook, "DbLookup", no_database)
        fast_denied, fast_allowed = asgi_post(denied), asgi_post(allowed)
    fastpath.REFUSALS.flush()
    assert fast_denied[0] == 200 and fast_denied[1] == post(denied).json()
    assert fast_denied[1]["response"]["allowed"] is False
    assert "owned by queue team-a" in fast_denied[1]["response"]["status"]["message"]
    assert fast_allowed[0] == 200 and fast_allowed[1] == post(allowed).json()
    assert fast_allowed[1]["response"]["allowed"] is True


def test_the_fast_path_records_refusals_in_the_background(owned_claim):
    index.HOLDER.rebuild_now()
    status, body, _ = asgi_post(review(priority=1000))
    assert status == 200 and body["response"]["allowed"] is False
    fastpath.REFUSALS.flush()
    row = Refusal.objects.get()
    assert row.rule == "resource locking" and row.owner == "team-a" and row.name == "trainer-b"


def test_a_stale_index_is_not_used_the_database_answers(owned_claim, clean_index):
    index.HOLDER.rebuild_now()
    # The owner opts out after the index was read.
    QueueObject.objects.create(kind="kai-queue", name="team-a", annotations={})
    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "OPT_OUT": ["team-a"]}
    try:
        webhook.forget_world()
        clean_index.now += index.MAX_AGE + 0.1
        status, body, _ = asgi_post(review(priority=0))
        assert status == 200
        assert body["response"]["allowed"] is False
        assert "(rule: opt-out)" in body["response"]["status"]["message"]
    finally:
        settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "OPT_OUT": []}


def test_an_index_within_its_bound_is_used_and_a_rebuild_sees_the_change(owned_claim, clean_index):
    index.HOLDER.rebuild_now()
    ResourceClaim.objects.filter(name="shared-gpu").update(labels={})
    Charge.objects.all().delete()
    clean_index.now += index.MAX_AGE - 0.1
    status, body, _ = asgi_post(review(priority=1000))
    # Read before the change, inside the stated bound: the old owner still decides.
    assert status == 200 and body["response"]["allowed"] is False
    index.HOLDER.rebuild_now()
    status, body, _ = asgi_post(review(priority=1000))
    assert status == 200 and body["response"]["allowed"] is True


def test_an_absent_index_starts_a_rebuild_and_the_database_answers(owned_claim, monkeypatch):
    started = []
    monkeypatch.setattr(index.HOLDER, "_start_rebuild", lambda: started.append(1))
    status, body, _ = asgi_post(review(priority=1000))
    assert status == 200 and body["response"]["allowed"] is False
    assert started == [1]


def test_a_rebuild_is_due_after_the_refresh_period_but_the_index_still_answers(clean_index):
    holder = index.Holder()
    started = []
    holder._start_rebuild = lambda: started.append(1)
    holder.rebuild_now()
    assert holder.fresh() is not None and started == []
    clean_index.now += index.REFRESH_SECONDS + 0.01
    assert holder.fresh() is not None and started == [1]
    clean_index.now += index.MAX_AGE
    assert holder.fresh() is None and started == [1, 1]


def test_the_fast_path_refuses_malformed_reviews_as_the_view_does():
    index.HOLDER.rebuild_now()
    status, body, _ = asgi_post(b"{not json")
    assert status == 400 and body["error"].startswith("malformed AdmissionReview")
    broken = review()
    broken["request"]["object"]["spec"] = {"containers": "busybox"}
    status, body, _ = asgi_post(broken)
    assert status == 400 and "request.object is not a valid object" in body["error"]
    status, body, _ = asgi_post(b"[" * 100_000 + b"]" * 100_000)
    assert status in (400, 413) and "error" in body


def test_the_fast_path_refuses_a_get_with_405_and_an_oversized_body_with_413(settings):
    status, _, headers = asgi_post(b"", method="GET")
    assert status == 405 and headers["allow"] == "POST"
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 200
    status, body, _ = asgi_post(review())
    assert status == 413 and "larger than this server accepts" in body["error"]


def test_other_paths_still_reach_django():
    async def call():
        communicator = HttpCommunicator(
            application, "GET", "/healthz", headers=[(b"host", b"localhost")]
        )
        return await communicator.get_response(timeout=10)

    assert async_to_sync(call)()["status"] == 200


def test_runweb_workers_share_a_socket_that_python_knows_is_tcp():
    from akri_site.webserve import TcpConfig

    config = TcpConfig("akri_site.asgi:application", host="127.0.0.1", port=0, workers=2)
    sock = config.bind_socket()
    try:
        # asyncio sets TCP_NODELAY on accepted connections only for IPPROTO_TCP sockets.
        assert sock.proto == socket.IPPROTO_TCP and sock.get_inheritable()
        sock.listen()
        with socket.create_connection(sock.getsockname()):
            accepted, _ = sock.accept()
            with accepted:
                assert accepted.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


# --- Configuration-level requests ---------------------------------------------------------------
def cl_review(count: int, priority: int = 1000, queue: str = "team-b") -> dict:
    body = copy.deepcopy(POD_REVIEW)
    pod = body["request"]["object"]
    pod["metadata"]["labels"] = {"kai.scheduler/queue": queue}
    pod["spec"] = {
        "priority": priority,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {
                    "limits": {"akri.sh/cams": str(count)},
                    "requests": {"akri.sh/cams": str(count)},
                },
            }
        ],
    }
    return body


@pytest.fixture
def cams():
    """Configuration ``cams`` (unique devices) with three Instances; cam-a is team-a's."""
    namespace = settings.AKRI["NAMESPACE"]
    Configuration.objects.create(namespace=namespace, name="cams", unique_devices=True)
    for name in ("cams-a", "cams-b", "cams-c"):
        Instance.objects.create(
            namespace=namespace, name=name, configuration_name="cams", capacity=2
        )
    InstanceLabels.objects.create(namespace=namespace, name="cams-a", labels={LABEL: "team-a"})
    return namespace


def through(path: str, body: dict) -> tuple[int, dict]:
    """(status, JSON) from the Django view (the database path) or the fast path's index."""
    if path == "database":
        answer = post(body)
        return answer.status_code, answer.json()
    index.HOLDER.rebuild_now()
    return asgi_post(body)[:2]


@pytest.mark.parametrize("path", ["database", "index"])
def test_a_cl_request_that_only_fits_with_a_foreign_instance_is_refused(cams, path):
    status, answer = through(path, cl_review(3))
    assert status == 200
    result = answer["response"]
    assert result["allowed"] is False
    message = result["status"]["message"]
    assert "Configuration cams (akri.sh/cams: 3)" in message
    assert "only 2 distinct Instances" in message and "cams-a (queue team-a)" in message
    assert "(rule: resource locking)" in message
    fastpath.REFUSALS.flush()
    assert Refusal.objects.get().rule == "resource locking"


@pytest.mark.parametrize("path", ["database", "index"])
def test_a_cl_request_that_fits_elsewhere_is_allowed_with_a_warning(cams, path):
    status, content = through(path, cl_review(2))
    result = content["response"]
    assert status == 200 and result["allowed"] is True
    assert "must not be given cams-a (queue team-a)" in result["warnings"][0]
    assert Refusal.objects.count() == 0


def test_a_preemptible_cl_pod_or_the_owners_own_pod_gets_no_warning(cams):
    assert post(cl_review(3, priority=0)).json()["response"] == {
        "uid": POD_REVIEW["request"]["uid"],
        "allowed": True,
    }
    answer = post(cl_review(3, queue="team-a")).json()["response"]
    assert answer["allowed"] is True and "warnings" not in answer


def test_a_cl_request_against_an_opted_out_owner_counts_slots_without_unique_devices(cams):
    Configuration.objects.filter(name="cams").update(unique_devices=False)
    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "OPT_OUT": ["team-a"]}
    try:
        webhook.forget_world()
        # 6 slots, 2 of them team-a's: 4 open even to a preemptible pod, 5 do not fit.
        assert post(cl_review(4, priority=0)).json()["response"]["allowed"] is True
        refused = post(cl_review(5, priority=0)).json()["response"]
        assert refused["allowed"] is False
        assert "only 4 slots" in refused["status"]["message"]
        assert "(rule: opt-out)" in refused["status"]["message"]
    finally:
        settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "OPT_OUT": []}


def test_an_instance_request_still_names_its_instance(cams):
    body = cl_review(1)
    limits = body["request"]["object"]["spec"]["containers"][0]["resources"]
    limits["limits"] = limits["requests"] = {"akri.sh/cams-a": "1"}
    refused = post(body).json()["response"]
    assert refused["allowed"] is False
    assert (
        f"may not join instance {cams}/cams-a, owned by queue team-a"
        in (refused["status"]["message"])
    )


# --- KAI's top owner ----------------------------------------------------------------------------
TOP_OWNER = "group: batch\nkind: Job\nname: train-7\nuid: job-uid-7\n"


@pytest.fixture
def kai_podgroup():
    """KAI's PodGroup for Job train-7: its labels are the Job's (queue team-b, non-preemptible)."""
    QueueObject.objects.create(
        kind="kai-podgroup",
        namespace="ml",
        name="pg-train-7-job-uid-7",
        target="team-b",
        labels={"kai.scheduler/queue": "team-b", "kai.scheduler/preemptibility": "non-preemptible"},
        annotations={"kai.scheduler/top-owner-metadata": TOP_OWNER},
    )


def owned_pod(**meta) -> dict:
    body = review(priority=0, labels={})
    body["request"]["object"]["metadata"].update(meta)
    return body


@pytest.mark.parametrize("path", ["database", "index"])
def test_a_pod_of_a_job_takes_queue_and_preemptibility_from_its_top_owner(
    owned_claim, kai_podgroup, path
):
    body = owned_pod(
        ownerReferences=[
            {"apiVersion": "batch/v1", "kind": "Job", "name": "train-7", "uid": "job-uid-7"}
        ]
    )
    status, content = through(path, body)
    assert status == 200
    result = content["response"]
    assert result["allowed"] is False
    message = result["status"]["message"]
    assert "of queue team-b" in message
    assert "top owner Job train-7 kai.scheduler/preemptibility=non-preemptible" in message


def test_a_pod_annotated_with_its_podgroup_reads_the_top_owner_from_it(owned_claim, kai_podgroup):
    body = owned_pod(annotations={"pod-group-name": "pg-train-7-job-uid-7"})
    result = post(body).json()["response"]
    assert result["allowed"] is False and "of queue team-b" in result["status"]["message"]


def test_the_top_owners_label_wins_over_the_pods_own(owned_claim, kai_podgroup):
    body = owned_pod(
        labels={"kai.scheduler/queue": "team-a"},
        annotations={"pod-group-name": "pg-train-7-job-uid-7"},
    )
    result = post(body).json()["response"]
    assert result["allowed"] is False and "of queue team-b" in result["status"]["message"]


def test_a_pod_whose_owner_has_no_podgroup_yet_is_decided_by_its_own_labels(
    owned_claim, kai_podgroup
):
    body = owned_pod(
        labels={"kai.scheduler/queue": "team-a"},
        ownerReferences=[{"apiVersion": "batch/v1", "kind": "Job", "name": "new", "uid": "other"}],
    )
    result = post(body).json()["response"]
    assert result == {"uid": POD_REVIEW["request"]["uid"], "allowed": True}
