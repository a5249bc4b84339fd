"""Cordon and uncordon over real HTTP: the annotation, its conditions, the cache, the audit,
the claim store's refusal and the management commands."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from agent import cordon as service
from agent.bench.claims import instance_body
from agent.domain.cordon import ANNOTATION, cordon_of
from agent.domain.naming import slot_key
from agent.extender.feed import _state_of
from agent.kube import cache
from agent.kube.claims import ClaimStore, Cordoned
from agent.kube.client import AkriApi
from agent.models import AuditEntry, Instance

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAM = "cams-8120fe"
OTHER = "cams-a19705"
ELSEWHERE = "mics-000001"


@pytest.fixture
def api(kube):
    return AkriApi(kube.api_client, kube.namespace)


@pytest.fixture
def instances(api):
    made = [
        api.create_instance(instance_body(CAM, 2, "cams", ("node-a", "node-b"))),
        api.create_instance(instance_body(OTHER, 2, "cams", ("node-b",))),
        api.create_instance(instance_body(ELSEWHERE, 1, "mics", ("node-a",))),
    ]
    for obj in made:
        cache.apply_instance(obj)
    return made


@pytest.fixture
def cli(kube, monkeypatch):
    """The commands talk to the test's API server."""
    monkeypatch.setattr(service, "new_api_client", lambda: kube.new_client())
    with override_settings(AKRI={**_akri(), "NAMESPACE": kube.namespace}):
        yield


def _akri():
    from django.conf import settings

    return dict(settings.AKRI)


def audit(action=None):
    rows = AuditEntry.objects.order_by("id")
    if action:
        rows = rows.filter(action=action)
    return [(a.username, a.action, a.target.split("/")[-1], a.outcome) for a in rows]


def test_it_cordons_an_instance_in_the_api_server_and_the_cache(api, kube, instances):
    result = service.cordon(kube.namespace, CAM, user="alice", reason="replacing lens", api=api)

    assert (result.outcome, result.detail) == ("done", "cordoned by alice: replacing lens")
    found = cordon_of(api.get_instance(CAM))
    assert (found.by, found.reason) == ("alice", "replacing lens")
    row = Instance.objects.get(name=CAM)
    assert cordon_of({"metadata": {"annotations": {ANNOTATION: row.cordon}}}) == found
    assert _state_of(row).cordon == found  # what the extender reads
    assert audit() == [("alice", "cordon", CAM, "done")]


def test_cordoning_twice_keeps_the_first_cordon_and_says_so(api, kube, instances):
    service.cordon(kube.namespace, CAM, user="alice", reason="replacing lens", api=api)
    rv = api.get_instance(CAM)["metadata"]["resourceVersion"]

    again = service.cordon(kube.namespace, CAM, user="bob", reason="other", api=api)

    assert again.outcome == "unchanged"
    assert again.detail == "already cordoned by alice: replacing lens"
    assert api.get_instance(CAM)["metadata"]["resourceVersion"] == rv
    assert audit()[-1] == ("bob", "cordon", CAM, "unchanged")


def test_uncordon_removes_it_and_is_idempotent(api, kube, instances):
    service.cordon(kube.namespace, CAM, user="alice", reason="lens", api=api)

    done = service.uncordon(kube.namespace, CAM, user="alice", reason="lens in", api=api)
    again = service.uncordon(kube.namespace, CAM, user="alice", api=api)

    assert (done.outcome, done.detail) == ("done", "was cordoned by alice: lens")
    assert (again.outcome, again.detail) == ("unchanged", "was not cordoned")
    assert cordon_of(api.get_instance(CAM)) is None
    assert Instance.objects.get(name=CAM).cordon is None
    assert [a[3] for a in audit("uncordon")] == ["done", "unchanged"]


def test_other_annotations_are_left_alone(api, kube, instances):
    api.patch_instance(
        CAM, [{"op": "add", "path": "/metadata/annotations", "value": {"keep": "me"}}]
    )
    service.cordon(kube.namespace, CAM, user="alice", reason="", api=api)
    service.uncordon(kube.namespace, CAM, user="alice", api=api)

    assert api.get_instance(CAM)["metadata"]["annotations"] == {"keep": "me"}


@pytest.mark.parametrize(
    ("name", "user", "reason", "words"),
    [
        ("no-such-instance", "alice", "x", "does not exist"),
        (CAM, "", "x", "actor must not be empty"),
        (CAM, "alice", "x" * 501, "longer than 500"),
        (CAM, "alice", "bad\x00reason", "control characters"),
        (CAM, "alice", 42, "must be text"),
    ],
)
def test_garbage_is_refused_audited_and_changes_nothing(
    api, kube, instances, name, user, reason, words
):
    before = api.get_instance(CAM)

    with pytest.raises(service.CordonError, match=words) as refused:
        service.cordon(kube.namespace, name, user=user, reason=reason, api=api)

    assert refused.value.outcome == "refused"
    assert api.get_instance(CAM) == before
    assert Instance.objects.get(name=CAM).cordon is None
    assert [a[3] for a in audit("cordon")] == ["refused"]


def test_the_claim_store_refuses_a_free_slot_of_a_cordoned_instance(api, kube, instances):
    store = ClaimStore(api, "agent:node-a")
    store.claim(CAM, slot_key(CAM, 0), "node-a")
    service.cordon(kube.namespace, CAM, user="alice", reason="replacing lens", api=api)

    with pytest.raises(Cordoned, match="cordoned by alice: replacing lens"):
        store.claim(CAM, slot_key(CAM, 1), "node-b")

    # The held slot stays held, and its holder's re-ask still succeeds.
    assert store.claim(CAM, slot_key(CAM, 0), "node-a") == "already ours"
    usage = api.get_instance(CAM)["spec"]["deviceUsage"]
    assert usage == {slot_key(CAM, 0): "node-a", slot_key(CAM, 1): ""}


def test_a_restore_for_a_running_pod_goes_through_a_cordon(api, kube, instances):
    from agent.models import SlotEvent

    store = ClaimStore(api, "agent:node-a")
    service.cordon(kube.namespace, CAM, user="alice", reason="lens", api=api)

    result = store.claim(CAM, slot_key(CAM, 1), "node-a", cause=SlotEvent.Cause.RESTORE)

    assert result == "claimed"
    assert api.get_instance(CAM)["spec"]["deviceUsage"][slot_key(CAM, 1)] == "node-a"


def test_a_claim_decided_from_a_stale_view_is_still_refused(api, kube, instances):
    store = ClaimStore(api, "agent:node-a")
    stale = api.get_instance(CAM)
    service.cordon(kube.namespace, CAM, user="alice", reason="lens", api=api)

    # The stale object says "free, not cordoned": its condition (the slot's "") still holds
    # in the API server, so the write must not go through on it alone.
    with pytest.raises(Cordoned):
        store.claim(CAM, slot_key(CAM, 1), "node-a", current=stale)

    assert api.get_instance(CAM)["spec"]["deviceUsage"][slot_key(CAM, 1)] == ""


def test_the_command_cordons_every_instance_of_a_node(cli, api, instances):
    out = io.StringIO()

    call_command("cordon", "--node", "node-b", "--reason", "rack move", "--user", "ops", stdout=out)

    assert {n for n in (CAM, OTHER) if cordon_of(api.get_instance(n))} == {CAM, OTHER}
    assert cordon_of(api.get_instance(ELSEWHERE)) is None
    assert "done: cordoned by cli:ops: rack move" in out.getvalue()
    call_command("uncordon", "--configuration", "cams", "--user", "ops", stdout=out)
    assert all(cordon_of(api.get_instance(n)) is None for n in (CAM, OTHER, ELSEWHERE))
    assert [a[3] for a in audit()] == ["done", "done", "done", "done"]


def test_the_command_names_what_it_could_not_do(cli, api, instances):
    err = io.StringIO()

    with pytest.raises(CommandError, match="1 of 2 Instances not cordoned"):
        call_command("cordon", CAM, "nope", "--user", "ops", stdout=io.StringIO(), stderr=err)

    assert "nope: refused: Instance nope does not exist" in err.getvalue()
    assert cordon_of(api.get_instance(CAM)) is not None


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--node", "no-such-node"],
        [CAM, "--node", "node-a"],
    ],
)
def test_the_command_refuses_garbage_selections_and_changes_nothing(cli, api, instances, args):
    with pytest.raises(CommandError):
        call_command("cordon", *args, stdout=io.StringIO())

    assert all(cordon_of(api.get_instance(n)) is None for n in (CAM, OTHER, ELSEWHERE))
    assert AuditEntry.objects.count() == 0


def test_a_controller_relisting_after_a_restart_finds_the_cordon(api, kube, instances):
    service.cordon(kube.namespace, CAM, user="alice", reason="lens", api=api)
    Instance.objects.all().delete()  # a fresh controller's empty cache

    cache.apply_listed(kube.namespace, api.list_instances()["items"])

    row = Instance.objects.get(name=CAM)
    assert _state_of(row).cordon.describe() == "cordoned by alice: lens"
    assert Instance.objects.get(name=OTHER).cordon is None
