"""The Queues pages, their JSON API and /metrics figures, from a charge cache filled through
the real recompute (no API server: labels are not written)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from agent.models import AuditEntry
from agent.queues import history, recompute
from agent.queues.models import Charge, ChargeSample, QueuePod, ResourceClaim

pytestmark = pytest.mark.django_db
LABEL = "akri-site.io/queue"


def pod(name: str, queue: str, priority: int = 0, **labels) -> QueuePod:
    return QueuePod.objects.create(
        namespace="ml",
        name=name,
        uid=f"uid-{name}",
        labels={"kai.scheduler/queue": queue, **labels} if queue else labels,
        priority=priority,
        created=f"2026-01-01T00:00:0{len(name) % 10}Z",
    )


def claim(name: str, users: list[QueuePod], label: str | None = None, classes=("gpu",)):
    return ResourceClaim.objects.create(
        namespace="ml",
        name=name,
        labels={LABEL: label} if label else {},
        device_classes=list(classes),
        allocated=1,
        reserved_for=[{"resource": "pods", "name": p.name, "uid": p.uid} for p in users],
    )


@pytest.fixture
def world():
    a1, b1, b2 = pod("a1", "team-a"), pod("b1", "team-b", priority=125), pod("b2", "team-b")
    typo = pod("t1", "", **{"kai.scheduler/queu": "team-c"})
    claim("shared", [a1, b1], label="team-a")
    claim("orphan", [a1, b2])
    claim("idle", [])
    claim("typo", [typo])
    recompute.recompute(None)
    history.sample()


@pytest.fixture
def login(client):
    def as_role(role: str | None):
        user = User.objects.create_user(f"u-{role}", is_staff=role in ("operator", "admin"))
        if role:
            user.groups.add(Group.objects.get(name=role))
        client.force_login(user)
        return client

    return as_role


def test_the_queues_page_shows_owners_charges_orphans_and_problems(login, world):
    page = login("viewer").get("/queues/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-queue="team-a"' in html and 'data-queue="team-b"' in html
    assert Charge.objects.get(name="shared").owner == "team-a"
    assert Charge.objects.get(name="orphan").source == "orphan-deducted"
    assert 'data-figure="orphans">1<' in html
    assert "queue-history" in html  # the chart's data


def test_a_queue_page_lists_what_it_owns_and_what_others_use(login, world):
    html = login("viewer").get("/queues/q/team-a/").content.decode()
    assert "ml/shared" in html and "team-b</a> (foreign)" in html


def test_an_unknown_queue_is_a_404_that_says_so(login, world):
    page = login("viewer").get("/queues/q/nope/")
    assert page.status_code == 404


def test_a_claim_page_drills_down_to_pods_queues_and_preemptibility(login, world):
    html = login("viewer").get("/queues/claims/resourceclaim/ml/shared/").content.decode()
    assert "ml/b1" in html and "priority 125 &gt;= 100" in html and "(foreign)" in html


def test_a_label_typo_and_a_claim_with_no_pods_are_explained(login, world):
    typo = Charge.objects.get(name="typo")
    assert typo.owner == "default" and any("typo" in p for p in typo.problems)
    idle = Charge.objects.get(name="idle")
    assert (idle.owner, idle.charged, idle.uncharged) == ("", 0, 1)
    html = login("viewer").get("/queues/claims/resourceclaim/ml/typo/").content.decode()
    assert "kai.scheduler/queu" in html and "typo?" in html


def test_a_bad_range_is_a_400_with_its_message(login, world):
    page = login("viewer").get("/queues/?range=custom")
    assert page.status_code == 400 and "A custom range needs a start time." in page.content.decode()


def test_the_json_api_needs_a_role_and_gives_the_page_figures(client, login, world):
    assert client.get("/api/queues/").status_code == 401  # as the rest of the API
    viewer = login("viewer")
    body = viewer.get("/api/queues/").json()
    assert {q["queue"] for q in body["queues"]} >= {"team-a", "team-b"}
    assert body["orphans"] == 1
    orphans = viewer.get("/api/queues/charges/?source=orphan-deducted").json()
    assert [c["name"] for c in orphans["results"]] == ["orphan"]
    assert viewer.get("/api/queues/charges/?source=bogus").status_code == 400
    history = viewer.get("/api/queues/history/?range=1h").json()
    assert history["t"] and history["series"]


def test_metrics_carry_the_queue_charges(client, world):
    text = client.get("/metrics").content.decode()
    assert 'akri_queue_charge{queue="team-a",resource="gpu"} 1.0' in text
    assert 'akri_queue_uncharged{resource="gpu"}' in text


def test_viewers_may_not_evict_and_operators_see_the_confirmation(login, world):
    url = "/queues/claims/resourceclaim/ml/shared/evict/"
    assert login("viewer").post(url, {"pods": ["ml/b1@uid-b1"]}).status_code == 403
    page = login("operator").get(url)
    assert page.status_code == 200 and "ml/b1" in page.content.decode()
    assert not AuditEntry.objects.exists()


def test_samples_past_their_retention_are_pruned(world, settings):
    old = timezone.now() - timedelta(hours=settings.AKRI_QUEUES["HISTORY_HOURS"] + 1)
    ChargeSample.objects.create(at=old, queue="team-a", resource="gpu", charged=1)
    kept = ChargeSample.objects.exclude(at=old).count()
    assert history.prune_samples() == 1
    assert ChargeSample.objects.count() == kept


def test_a_burst_of_two_thousand_claims_recomputes_by_key(world):
    """Keys of a debounce window after a burst: looked up in bounded chunks, not one OR."""
    ResourceClaim.objects.bulk_create(
        ResourceClaim(namespace=f"ns{i % 3}", name=f"c{i}", device_classes=["gpu"])
        for i in range(2000)
    )
    keys = [f"resourceclaim:ns{i % 3}/c{i}" for i in range(2000)]
    outcome = recompute.recompute(keys)
    assert outcome.decided == 2000
    assert Charge.objects.filter(source="unused").count() == 2000


def test_an_incremental_recompute_ends_where_a_full_one_does(world):
    def rows():
        return sorted(
            Charge.objects.values_list("kind", "namespace", "name", "owner", "source", "digest")
        )

    b2 = QueuePod.objects.get(name="b2")
    shared = ResourceClaim.objects.get(name="shared")
    shared.reserved_for = shared.reserved_for + [{"resource": "pods", "name": "b2", "uid": b2.uid}]
    shared.save()
    ResourceClaim.objects.filter(name="idle").delete()
    recompute.recompute(["resourceclaim:ml/shared", "resourceclaim:ml/idle"])
    incremental = rows()
    assert ("resourceclaim", "ml", "idle") not in {r[:3] for r in incremental}
    recompute.recompute(None)
    assert rows() == incremental


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_publishes_sends_one_now_and_one_at_the_window_end(monkeypatch):
    import time

    from agent.queues import live

    sent: list[float] = []
    monkeypatch.setattr(live, "publish_now", lambda: sent.append(time.monotonic()))
    monkeypatch.setattr(live, "_last_published", 0.0)
    monkeypatch.setattr(live, "PUBLISH_SECONDS", 0.2)
    started = time.monotonic()
    for _ in range(5):
        live.publish()
    assert len(sent) == 1
    deadline = time.monotonic() + 5
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sent) == 2 and sent[1] - started >= 0.2


def test_keys_keep_their_short_window_while_a_full_recompute_waits():
    import threading

    from agent.queues.watch import Debouncer

    fired: list = []
    done = threading.Event()

    def fire(keys):
        fired.append(keys)
        if keys == ["k"]:
            done.set()

    debouncer = Debouncer(fire, 0.01, full_every=60)
    debouncer.mark(None)
    deadline = threading.Event()
    deadline.wait(0.1)
    debouncer.mark(None)  # within the minute: postponed
    debouncer.mark({"k"})
    assert done.wait(5), fired
    assert fired == [None, ["k"]]
    debouncer.flush()  # the postponed full one, now
    assert fired[-1] is None


@pytest.mark.parametrize("kind", ["kai-queue", "kueue-clusterqueue", "volcano-queue"])
def test_a_queue_page_says_whether_its_queue_object_opted_it_out(login, world, settings, kind):
    """The annotation on the queue system's object wins over AKRI_QUEUE_OPT_OUT, both ways."""
    from agent.queues.models import QueueObject

    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "OPT_OUT": ["team-b"]}
    QueueObject.objects.create(
        kind=kind, name="team-a", annotations={"akri-site.io/opt-out": "true"}
    )
    QueueObject.objects.create(
        kind=kind, name="team-b", annotations={"akri-site.io/opt-out": "false"}
    )
    client = login("viewer")

    team_a = client.get("/queues/q/team-a/").content.decode()
    team_b = client.get("/queues/q/team-b/").content.decode()

    assert "<strong>opted out</strong>" in team_a
    assert "<strong>opted out</strong>" not in team_b
    assert "shares what it owns with preemptible pods of other queues" in team_b
