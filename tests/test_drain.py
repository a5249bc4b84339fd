"""Drain over real HTTP: the preview, evictions through the Eviction API, a budget that blocks,
broker pods left alone, the audit, and garbage knobs refused with nothing changed."""

from __future__ import annotations

import pytest
from kubernetes import client

from agent import drain as draining
from agent.bench.claims import instance_body
from agent.domain.cordon import cordon_of
from agent.domain.holdings import HOLDS, format_holds
from agent.kube import cache
from agent.kube.claims import ClaimStore
from agent.kube.client import AkriApi
from agent.models import AuditEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAM = "cams-8120fe"


def make_pod(kube, name, holds=(), labels=None, queue=""):
    core = client.CoreV1Api(kube.api_client)
    annotations = {HOLDS: format_holds({f"{kube.namespace}/{s}": "c" for s in holds})}
    labels = dict(labels or {})
    if queue:
        labels["kueue.x-k8s.io/queue-name"] = queue
    body = {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x"}]},
    }
    core.create_namespaced_pod(kube.namespace, body)
    core.patch_namespaced_pod_status(
        name,
        kube.namespace,
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
    )


@pytest.fixture
def world(kube):
    api = AkriApi(kube.api_client, kube.namespace)
    cache.apply_instance(api.create_instance(instance_body(CAM, 3, "cams", ("node-a",))))
    store = ClaimStore(api, "agent:node-a")
    store.claim(CAM, f"{CAM}-0", "node-a")
    store.claim(CAM, f"{CAM}-1", "node-a")
    make_pod(kube, "free-to-go", [f"{CAM}-0"], {"app": "a"}, queue="team-a")
    make_pod(kube, "guarded", [f"{CAM}-1"], {"app": "guarded"})
    make_pod(kube, "broker", labels={"akri.sh/instance": CAM})
    make_pod(kube, "bystander", [], {"app": "other"})
    client.PolicyV1Api(kube.api_client).create_namespaced_pod_disruption_budget(
        kube.namespace,
        {
            "metadata": {"name": "keep-guarded"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    return api


def by_name(pods):
    return {p.name: p for p in pods}


def pod_exists(kube, name):
    try:
        pod = client.CoreV1Api(kube.api_client).read_namespaced_pod(name, kube.namespace)
    except client.ApiException as exc:
        assert exc.status == 404
        return False
    return pod.metadata.deletion_timestamp is None


def test_the_preview_lists_holders_queues_owners_and_what_would_block(kube, world):
    pods = by_name(draining.preview(kube.namespace, CAM, api_client=kube.api_client))

    assert set(pods) == {"free-to-go", "guarded", "broker"}
    assert pods["free-to-go"].outcome == draining.WOULD_EVICT
    assert pods["free-to-go"].queue == "team-a"
    assert pods["free-to-go"].slots == [f"{CAM}-0"]
    assert pods["guarded"].outcome == draining.BLOCKED
    assert "keep-guarded" in pods["guarded"].detail
    assert pods["broker"].outcome == draining.BROKER
    # Nothing was written: every pod still runs, and the Instance is not cordoned.
    assert all(pod_exists(kube, n) for n in ("free-to-go", "guarded", "broker"))
    assert cordon_of(world.get_instance(CAM)) is None
    assert AuditEntry.objects.count() == 0


def test_a_drain_cordons_evicts_the_holders_and_a_budget_blocks_one(kube, world):
    pods = draining.drain(
        kube.namespace,
        CAM,
        user="alice",
        reason="replacing lens",
        grace=0,
        timeout=5,
        api_client=kube.api_client,
    )

    outcomes = {p.name: p.outcome for p in pods}
    assert outcomes == {
        "free-to-go": draining.EVICTED,
        "guarded": draining.BLOCKED,
        "broker": draining.BROKER,
    }
    assert not pod_exists(kube, "free-to-go")
    assert pod_exists(kube, "guarded")
    assert pod_exists(kube, "broker")
    assert pod_exists(kube, "bystander")
    assert cordon_of(world.get_instance(CAM)).describe() == "cordoned by alice: replacing lens"
    rows = list(AuditEntry.objects.order_by("id").values_list("action", "outcome"))
    assert rows[0] == ("cordon", "done")
    assert sorted(rows[1:-1]) == [
        ("drain_evict", "done"),
        ("drain_evict", "refused"),
        ("drain_evict", "unchanged"),
    ]
    assert rows[-1] == ("drain", "done")


def test_a_pod_still_terminating_at_the_timeout_says_so(kube, world):
    pods = draining.drain(
        kube.namespace, CAM, user="alice", reason="", timeout=0.2, api_client=kube.api_client
    )

    assert by_name(pods)["free-to-go"].outcome == draining.TERMINATING


def test_a_pod_gone_since_the_listing_is_reported_gone(kube, world, monkeypatch):
    listed = draining._pods(kube.api_client)
    client.CoreV1Api(kube.api_client).delete_namespaced_pod(
        "free-to-go", kube.namespace, grace_period_seconds=0
    )
    monkeypatch.setattr(draining, "_pods", lambda api_client: listed)

    pods = draining.drain(
        kube.namespace, CAM, user="alice", reason="", grace=0, api_client=kube.api_client
    )

    assert by_name(pods)["free-to-go"].outcome == draining.GONE


@pytest.mark.parametrize(
    ("grace", "timeout", "reason", "user"),
    [
        (-1, 30, "", "alice"),
        ("5", 30, "", "alice"),
        (True, 30, "", "alice"),
        (None, -1, "", "alice"),
        (None, "soon", "", "alice"),
        (None, 99999, "", "alice"),
        (None, 30, "x" * 501, "alice"),
        (None, 30, "", ""),
    ],
)
def test_garbage_knobs_are_refused_audited_and_change_nothing(
    kube, world, grace, timeout, reason, user
):
    with pytest.raises(draining.DrainInputError):
        draining.drain(
            kube.namespace,
            CAM,
            user=user,
            reason=reason,
            grace=grace,
            timeout=timeout,
            api_client=kube.api_client,
        )

    assert cordon_of(world.get_instance(CAM)) is None
    assert all(pod_exists(kube, n) for n in ("free-to-go", "guarded", "broker"))
    assert list(AuditEntry.objects.values_list("action", "outcome")) == [("drain", "refused")]


# --- the command and the JSON endpoint -------------------------------------------------------


@pytest.fixture
def wired(kube, settings, monkeypatch):
    from agent import cordon as cordoning

    settings.AKRI = {**settings.AKRI, "NAMESPACE": kube.namespace}
    monkeypatch.setattr(draining, "new_api_client", lambda: kube.new_client())
    monkeypatch.setattr(cordoning, "new_api_client", lambda: kube.new_client())


def test_the_command_previews_without_changing_anything(kube, world, wired):
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("drain", CAM, "--dry-run", stdout=out)

    text = out.getvalue()
    assert f"{kube.namespace}/free-to-go (node node-a, queue team-a" in text
    assert "would be evicted" in text
    assert "guarded" in text and "blocked by a budget" in text and "keep-guarded" in text
    assert "broker" in text and "left to the broker rules" in text
    assert all(pod_exists(kube, n) for n in ("free-to-go", "guarded", "broker"))
    assert cordon_of(world.get_instance(CAM)) is None


def test_the_command_drains_and_fails_when_a_budget_blocks(kube, world, wired):
    import io

    from django.core.management import CommandError, call_command

    out = io.StringIO()
    with pytest.raises(CommandError, match="1 of 3 pods not evicted"):
        call_command("drain", CAM, "--grace", "0", "--reason", "lens", "--user", "ops", stdout=out)

    assert not pod_exists(kube, "free-to-go")
    assert pod_exists(kube, "guarded")
    assert "free-to-go" in out.getvalue() and ": evicted" in out.getvalue()


def operator_client(role="operator"):
    from django.contrib.auth.models import Group, User
    from django.test import Client

    user = User.objects.create_user(f"u-{role}", is_staff=role != "viewer")
    user.groups.add(Group.objects.get(name=role))
    browser = Client()
    browser.force_login(user)
    return browser


def post(kube, browser, body):
    import json

    url = f"/instances/{kube.namespace}/{CAM}/cordon/"
    return browser.post(url, json.dumps(body), content_type="application/json")


def test_the_endpoint_previews_then_drains(kube, world, wired):
    browser = operator_client()

    preview = post(kube, browser, {"action": "drain", "dry_run": True})
    assert preview.status_code == 200
    outcomes = {p["pod"].split("/")[1]: p["outcome"] for p in preview.json()["pods"]}
    assert outcomes == {
        "free-to-go": "would be evicted",
        "guarded": "blocked by a budget",
        "broker": "left to the broker rules",
    }
    assert pod_exists(kube, "free-to-go")

    done = post(kube, browser, {"action": "drain", "grace": 0, "reason": "lens"})

    assert done.status_code == 200
    outcomes = {p["pod"].split("/")[1]: p["outcome"] for p in done.json()["pods"]}
    assert outcomes["free-to-go"] == "evicted"
    assert not pod_exists(kube, "free-to-go")


@pytest.mark.parametrize(
    "body",
    [
        {"action": "drain", "dry_run": "yes"},
        {"action": "drain", "grace": "0"},
        {"action": "drain", "grace": -5},
        {"action": "drain", "timeout": None},
        {"action": "drain", "reason": ["x"]},
    ],
)
def test_the_endpoint_refuses_garbage_and_changes_nothing(kube, world, wired, body):
    answer = post(kube, operator_client(), body)

    assert answer.status_code == 400, answer.content
    assert answer.json()["detail"]
    assert cordon_of(world.get_instance(CAM)) is None
    assert all(pod_exists(kube, n) for n in ("free-to-go", "guarded", "broker"))
    assert list(AuditEntry.objects.values_list("outcome", flat=True)) == ["refused"]


def test_a_viewer_may_not_drain(kube, world, wired):
    answer = post(kube, operator_client("viewer"), {"action": "drain", "dry_run": False})

    assert answer.status_code == 403
    assert pod_exists(kube, "free-to-go")
    assert AuditEntry.objects.get().outcome == "refused"


# --- the confirmation page -------------------------------------------------------------------


def page(kube):
    return f"/instances/{kube.namespace}/{CAM}/drain/"


def test_the_page_previews_with_cancel_focused_and_changes_nothing(kube, world, wired):
    browser = operator_client()

    body = browser.get(page(kube)).content.decode()

    assert 'id="release-cancel" autofocus' in body
    assert "free-to-go" in body and "would be evicted" in body and "team-a" in body
    assert "blocked by a budget" in body and "keep-guarded" in body
    assert "left to the broker rules" in body
    assert cordon_of(world.get_instance(CAM)) is None
    assert AuditEntry.objects.count() == 0
    assert "Cordon or drain" in browser.get(f"/instances/{kube.namespace}/{CAM}/").content.decode()


def test_the_page_drains_on_confirmation_and_says_what_happened(kube, world, wired):
    browser = operator_client()

    answer = browser.post(page(kube), {"action": "drain", "reason": "replacing lens", "grace": "0"})

    body = answer.content.decode()
    assert answer.status_code == 200
    assert "What happened" in body
    assert "evicted" in body and "blocked by a budget" in body
    assert "cordoned by u-operator: replacing lens" in body
    assert not pod_exists(kube, "free-to-go")


def test_the_page_cordons_and_uncordons(kube, world, wired):
    browser = operator_client()

    browser.post(page(kube), {"action": "cordon", "reason": "lens"})
    assert cordon_of(world.get_instance(CAM)).describe() == "cordoned by u-operator: lens"
    browser.post(page(kube), {"action": "uncordon"})
    assert cordon_of(world.get_instance(CAM)) is None


@pytest.mark.parametrize(
    "form",
    [
        {"action": "explode"},
        {"action": "drain", "grace": "soon"},
        {"action": "cordon", "reason": "x" * 600},
    ],
)
def test_the_page_refuses_garbage_and_changes_nothing(kube, world, wired, form):
    answer = operator_client().post(page(kube), form)

    assert answer.status_code == 302
    assert cordon_of(world.get_instance(CAM)) is None
    assert all(pod_exists(kube, n) for n in ("free-to-go", "guarded", "broker"))
    assert list(AuditEntry.objects.values_list("outcome", flat=True)) == ["refused"]


def test_a_viewer_gets_no_page_and_a_forged_post_is_audited(kube, world, wired):
    browser = operator_client("viewer")

    assert browser.get(page(kube)).status_code == 403
    assert browser.post(page(kube), {"action": "drain"}).status_code == 403
    assert pod_exists(kube, "free-to-go")
    assert AuditEntry.objects.get().outcome == "refused"
    assert (
        "Cordon or drain" not in browser.get(f"/instances/{kube.namespace}/{CAM}/").content.decode()
    )
