"""Issue 17, items 3 and 4: release from the slot map, sortable tables, search, pod pages and
the raw YAML of Configurations and Instances; tried as each role."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
import yaml
from django.utils import timezone

from agent.models import (
    AuditEntry,
    Configuration,
    Instance,
    ReconcileRun,
    Slot,
    SlotEvent,
    SlotPodBinding,
)
from agent.queues.models import Charge
from akri_site.dashboard.sample import make_cluster
from tests import test_dashboard_views

# Fixtures: a client signed in with a role; a claim store that records; a real Instance.
login = test_dashboard_views.login
fake_release = test_dashboard_views.fake_release
real_instance = test_dashboard_views.real_instance
run = test_dashboard_views.run  # a run with one event (pod apps/gone, node-b)

pytestmark = pytest.mark.django_db

INSTANCE = "akri-onvif-000000"  # slot 0 held IL by node-a (pod apps/work-0, Running), slot 1 CL


@pytest.fixture
def cluster():
    return make_cluster(instances=10, capacity=4)


def held_slot() -> Slot:
    return Slot.objects.select_related("instance").get(key=f"{INSTANCE}-0")


def text_of(response) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", response.content.decode())))


def order_of_instances(page: str) -> list[str]:
    return re.findall(r'<tr data-instance="default/([^"]+)"', page)


# --- release from the slot map ---------------------------------------------------------------


def test_the_map_confirmation_names_the_slot_its_holder_and_focuses_cancel(login, cluster):
    slot = held_slot()
    client = login("operator")

    response = client.get(f"/slots/{slot.pk}/release/?back=state%3Dheld%26sort%3D-held")

    assert response.status_code == 200
    page = response.content.decode()
    assert f"Release slot {INSTANCE}-0?" in page
    assert "<code>node-a</code>" in page and "apps/work-0" in page
    assert "held by a pod that still runs" in page
    assert re.search(
        r'<a href="/slots/\?state=held&amp;sort=-held" class="button" id="release-cancel" '
        r"autofocus>Cancel</a>",
        page,
    )
    assert 'name="expected" value="node-a"' in page and 'name="reason"' in page
    assert "csrfmiddlewaretoken" in page
    assert held_slot().value == "node-a"  # showing the confirmation changed nothing


def test_an_operator_releases_from_the_map_and_lands_back_on_the_same_view(
    login, cluster, fake_release
):
    slot = held_slot()
    client = login("operator")

    response = client.post(
        f"/slots/{slot.pk}/release/",
        {"expected": "node-a", "reason": "stuck", "back": "state=held&sort=-held&page=1"},
    )

    assert response.status_code == 302
    assert response["Location"] == "/slots/?state=held&sort=-held&page=1"
    assert fake_release == [
        ("default", INSTANCE, f"{INSTANCE}-0", "node-a", "u-operator-True", "stuck")
    ]
    landed = client.get(response["Location"])
    assert landed.status_code == 200
    assert f"Done: Released 1 slot: {INSTANCE}-0." in text_of(landed)


def test_a_viewer_sees_no_release_action_on_the_map_and_cannot_release(
    login, cluster, fake_release
):
    client = login("viewer", staff=True)
    slot = held_slot()

    assert "/release/" not in client.get("/slots/").content.decode()
    assert client.get(f"/slots/{slot.pk}/release/").status_code == 403
    response = client.post(f"/slots/{slot.pk}/release/", {"expected": "node-a"})

    assert response.status_code == 403
    assert fake_release == []
    assert held_slot().value == "node-a"
    # Refused, and on the record like every manual action (issue 31).
    assert AuditEntry.objects.get().outcome == "refused"


def test_a_slot_changed_meanwhile_is_refused_on_the_map(login, cluster, monkeypatch):
    from agent.kube import claims

    def manual_release(namespace, instance, key, expected, *, user, reason):
        raise claims.SlotChanged(key, expected, "node-b")

    monkeypatch.setattr(claims, "manual_release", manual_release)
    client = login("operator")

    response = client.post(
        f"/slots/{held_slot().pk}/release/", {"expected": "node-a", "back": "node=node-a"}
    )

    assert response.status_code == 302 and response["Location"] == "/slots/?node=node-a"
    said = text_of(client.get(response["Location"]))
    assert "Warning: Not released, left as they are:" in said
    assert "changed meanwhile: now 'node-b'" in said


def test_a_map_release_without_a_confirmed_value_is_refused_and_audited(
    login, cluster, fake_release
):
    response = login("operator").post(f"/slots/{held_slot().pk}/release/", {"reason": "x"})

    assert response.status_code == 302
    assert fake_release == []
    entry = AuditEntry.objects.get()
    assert (entry.outcome, entry.target, entry.detail) == (
        "refused",
        f"default/{INSTANCE}/{INSTANCE}-0",
        "no holder value was confirmed",
    )


def test_a_slot_gone_before_the_post_is_refused_and_audited(login, cluster, fake_release):
    slot = held_slot()
    Slot.objects.filter(pk=slot.pk).delete()

    response = login("operator").post(f"/slots/{slot.pk}/release/", {"expected": "node-a"})

    assert response.status_code == 302
    assert fake_release == []
    assert AuditEntry.objects.get().detail == "slot no longer in the cache"


@pytest.mark.parametrize(
    "back", ["https://evil.example/", "//evil.example/x", "next=/admin/&state=held", "a\x00b"]
)
def test_the_way_back_always_leads_to_the_slot_map(login, cluster, fake_release, back):
    response = login("operator").post(
        f"/slots/{held_slot().pk}/release/", {"expected": "node-a", "back": back}
    )

    assert response.status_code in (302, 400)
    if response.status_code == 302:
        assert response["Location"] in ("/slots/", "/slots/?state=held")


def test_the_map_release_goes_through_the_real_claim_store(login, real_instance):
    api, name = real_instance
    slot = Slot.objects.get(key=f"{name}-0")

    response = login("operator").post(
        f"/slots/{slot.pk}/release/", {"expected": "node-a", "reason": "from the map"}
    )

    assert response.status_code == 302
    assert api.get_instance(name)["spec"]["deviceUsage"][f"{name}-0"] == ""
    assert Slot.objects.get(key=f"{name}-0").level == "free"
    entry = AuditEntry.objects.get()
    assert (entry.outcome, entry.reason) == ("done", "from the map")


def test_the_map_refuses_a_slot_changed_meanwhile_on_the_api_server(login, real_instance):
    from agent.kube.claims import ClaimStore

    api, name = real_instance
    client = login("operator")
    slot = Slot.objects.get(key=f"{name}-0")
    assert (
        'name="expected" value="node-a"'
        in client.get(f"/slots/{slot.pk}/release/").content.decode()
    )
    # Meanwhile the pod went away and node-b took the slot.
    ClaimStore(api, "agent:node-a").release(name, f"{name}-0", "node-a")
    ClaimStore(api, "agent:node-b").claim(name, f"{name}-0", "node-b")

    response = client.post(f"/slots/{slot.pk}/release/", {"expected": "node-a"})

    assert response.status_code == 302
    assert "changed meanwhile" in text_of(client.get(response["Location"]))
    assert api.get_instance(name)["spec"]["deviceUsage"][f"{name}-0"] == "node-b"
    assert AuditEntry.objects.get().outcome == "refused"


# --- sortable tables -------------------------------------------------------------------------


def hold(instance: str, slots: int) -> None:
    """Hold the first ``slots`` slots of ``instance`` (the rest free)."""
    for slot in Slot.objects.filter(instance__name=instance).order_by("index"):
        held = slot.index < slots
        slot.level = "IL" if held else "free"
        slot.value = slot.holder_node = "node-a" if held else ""
        slot.save()


def test_the_slot_map_sorts_instances_by_held_slots_in_sql_across_pages(
    login, cluster, monkeypatch
):
    from akri_site.dashboard import views

    for n, held in enumerate([0, 3, 1, 4, 2, 0, 0, 0, 0, 0]):
        hold(f"akri-onvif-{n:06x}", held)
    monkeypatch.setattr(views, "SLOT_MAP_PAGE", 3)
    client = login("viewer")

    first = client.get("/slots/?sort=-held")
    second = client.get("/slots/?sort=-held&page=2")

    assert first.status_code == 200 and second.status_code == 200
    assert order_of_instances(first.content.decode()) == [
        "akri-onvif-000003",
        "akri-onvif-000001",
        "akri-onvif-000004",
    ]
    assert order_of_instances(second.content.decode())[:2] == [
        "akri-onvif-000002",
        "akri-onvif-000000",
    ]
    # The page links keep the sort.
    assert 'href="?sort=-held&amp;page=2"' in first.content.decode()


def test_the_slot_map_header_says_how_it_is_sorted(login, cluster):
    page = login("viewer").get("/slots/?sort=-instance&state=held").content.decode()

    assert order_of_instances(page)[0] == "akri-onvif-000009"
    header = re.search(
        r'<th scope="col" aria-sort="descending"><a class="sort sorted" href="([^"]+)">Instance',
        page,
    )
    assert header, "the Instance column carries aria-sort"
    assert header.group(1) == "?sort=instance&amp;state=held"  # the other direction
    assert "(sorted descending)" in page
    # The "Sort by" list above the map says the same, and offers the others.
    assert '<a href="?sort=instance&amp;state=held" aria-current="true">name' in page
    assert '<a href="?sort=-held&amp;state=held">slots held</a>' in page


def test_the_live_feed_of_a_sorted_page_holds_the_rows_that_page_shows(login, cluster):
    from akri_site.dashboard import consumers

    for n, held in enumerate([0, 3, 1, 4, 2, 0, 0, 0, 0, 0]):
        hold(f"akri-onvif-{n:06x}", held)
    view, filters, page = consumers._validate("slots", {"sort": "-held"})
    message, _ = consumers._snapshot(view, filters, False, page)

    assert filters == {"sort": "-held"}
    assert [i["name"] for i in message["instances"]][:3] == [
        "akri-onvif-000003",
        "akri-onvif-000001",
        "akri-onvif-000004",
    ]
    with pytest.raises(consumers.BadFrame, match="cannot sort by"):
        consumers._validate("slots", {"sort": "pod"})


@pytest.mark.parametrize(
    "url",
    [
        "/slots/?sort=bogus",
        "/slots/?sort=-pod_name",
        "/reconciliation/?sort=detail",
        "/audit/?sort=-reason",
        "/?config_sort=nope",
        "/?node_sort=x",
        "/scheduling/?sort=reasons",
        "/nodes/node-a/?pod_sort=uid",
        "/nodes/node-a/?binding_sort=device",
        f"/instances/default/{INSTANCE}/?binding_sort=x",
        "/configurations/default/akri-onvif/?sort=holders",
    ],
)
def test_an_unknown_sort_is_answered_400_naming_the_keys(login, cluster, url):
    response = login("viewer").get(url)

    assert response.status_code == 400, url
    assert "cannot sort by" in text_of(response)
    assert "sort by one of" in text_of(response)


def make_runs() -> None:
    now = timezone.now()
    for n, released in enumerate([5, 0, 9, 2, 7]):
        ReconcileRun.objects.create(
            scope="node",
            node="node-a",
            trigger="sweep",
            started_at=now - timedelta(minutes=n),
            released=released,
        )


def test_reconciliation_history_sorts_in_sql_across_pages(login, cluster, monkeypatch):
    from akri_site.dashboard import views

    make_runs()
    monkeypatch.setattr(views, "RUNS_PAGE", 2)
    client = login("viewer")

    first = client.get("/reconciliation/?sort=-released")
    second = client.get("/reconciliation/?sort=-released&page=2")

    assert first.status_code == 200 and second.status_code == 200
    assert [r["released"] for r in first.context["rows"]] == [9, 7]
    assert [r["released"] for r in second.context["rows"]] == [5, 2]
    page = first.content.decode()
    assert (
        '<th scope="col" aria-sort="descending"><a class="sort sorted" href="?sort=released">Released'
        in page
    )
    assert "data-appendable" not in page  # new runs are not prepended to another order


def test_audit_log_sorts_by_user(login, cluster):
    for name in ("zoe", "adam", "mia"):
        AuditEntry.objects.create(
            at=timezone.now(), username=name, action="release_slot", target="t", outcome="done"
        )

    response = login("viewer").get("/audit/?sort=user")

    assert response.status_code == 200
    assert [a.username for a in response.context["page"].object_list] == ["adam", "mia", "zoe"]


def test_the_overview_sorts_nodes_by_slots_held(login):
    make_cluster(instances=6, capacity=4, nodes=("node-a", "node-b", "node-c"))
    hold("akri-onvif-000002", 4)  # node-c's Instance: node-a now holds 4 more

    client = login("viewer")
    response = client.get("/?node_sort=-held")

    assert response.status_code == 200
    assert node_rows(response) == ["node-a", "node-b", "node-c"]
    assert node_rows(client.get("/?node_sort=held")) == ["node-c", "node-b", "node-a"]
    assert node_rows(client.get("/?node_sort=-node")) == ["node-c", "node-b", "node-a"]


def node_rows(response) -> list[str]:
    section = response.content.decode().split('aria-labelledby="nodes-h"', 1)[1]
    return re.findall(r'<tr><th scope="row"><a href="/nodes/([^/]+)/">', section)


def test_a_configurations_instances_sort_by_held_slots_in_sql_across_pages(
    login, cluster, monkeypatch
):
    from akri_site.dashboard import views

    for n, held in enumerate([0, 3, 1, 4, 2, 0, 0, 0, 0, 0]):
        hold(f"akri-onvif-{n:06x}", held)
    monkeypatch.setattr(views, "SLOT_MAP_PAGE", 3)
    client = login("viewer")
    url = "/configurations/default/akri-onvif/?sort=-held"

    first, second = client.get(url), client.get(url + "&page=2")

    assert first.status_code == 200 and second.status_code == 200
    pattern = r'<tr><th scope="row"><a href="/instances/default/([^/]+)/">'
    assert re.findall(pattern, first.content.decode()) == [
        "akri-onvif-000003",
        "akri-onvif-000001",
        "akri-onvif-000004",
    ]
    assert re.findall(pattern, second.content.decode())[:2] == [
        "akri-onvif-000002",
        "akri-onvif-000000",
    ]


def test_a_configurations_instances_sort_by_free_slots(login, cluster):
    hold("akri-onvif-000005", 0)

    response = login("viewer").get("/configurations/default/akri-onvif/?sort=-free")

    assert response.status_code == 200
    rows = re.findall(
        r'<tr><th scope="row"><a href="/instances/default/([^/]+)/">', response.content.decode()
    )
    assert rows[0] == "akri-onvif-000005" and len(rows) == 10


# --- search ----------------------------------------------------------------------------------


def test_search_finds_each_kind_grouped(login, cluster):
    response = login("viewer").get("/search/?q=0000")

    assert response.status_code == 200
    groups = {g["kind"]: g for g in response.context["groups"]}
    assert groups["Instances"]["total"] == 10
    assert groups["Configurations"]["total"] == 0
    said = text_of(response)
    assert "akri-onvif-000003" in said


def test_search_finds_nodes_pods_and_configurations(login, cluster):
    client = login("viewer")

    by_node = {g["kind"]: g["total"] for g in client.get("/search/?q=node-").context["groups"]}
    by_pod = client.get("/search/?q=work-1").context["groups"]
    by_conf = client.get("/search/?q=ONVIF").context["groups"]

    assert by_node["Nodes"] == 2
    pods = next(g for g in by_pod if g["kind"] == "Pods")
    assert [i["name"] for i in pods["items"]] == ["apps/work-1"]
    assert pods["items"][0]["url"] == "/pods/apps/work-1/"
    assert next(g for g in by_conf if g["kind"] == "Configurations")["total"] == 1


def test_search_results_are_capped_per_kind(login):
    make_cluster(instances=30, capacity=2)

    response = login("viewer").get("/search/?q=akri-onvif-")

    instances = next(g for g in response.context["groups"] if g["kind"] == "Instances")
    assert (instances["total"], len(instances["items"]), instances["capped"]) == (30, 20, True)
    assert "The first 20 of 30 are shown" in text_of(response)


def test_one_exact_match_goes_straight_to_its_page(login, cluster):
    response = login("viewer").get("/search/?q=akri-onvif-000009")

    assert response.status_code == 302
    assert response["Location"] == "/instances/default/akri-onvif-000009/"


def test_search_escapes_what_was_typed_and_refuses_bad_input(login, cluster):
    client = login("viewer")

    page = client.get("/search/?q=%3Cscript%3Ex%3C/script%3E").content.decode()
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert client.get("/search/?q=a&kind=pods").status_code == 400
    assert client.get("/search/?q=" + "a" * 201).status_code == 400
    assert client.get("/search/").status_code == 200


def test_search_needs_a_role(login, client, cluster):
    assert client.get("/search/?q=a").status_code == 302  # anonymous: to the login page
    assert login(None).get("/search/?q=a").status_code == 403


# --- pod pages -------------------------------------------------------------------------------


def test_a_pods_page_shows_its_slots_bindings_events_and_queue(login, cluster):
    SlotPodBinding.objects.create(
        node="node-a", slot=f"{INSTANCE}-0", instance=INSTANCE, namespace="default",
        pod_namespace="apps", pod_name="work-0", container="main", allocated_at=timezone.now(),
    )  # fmt: skip
    SlotEvent.objects.create(
        at=timezone.now(), namespace="default", instance=INSTANCE, slot=f"{INSTANCE}-0",
        after="node-a", cause="claim", actor="agent:node-a", node="node-a", pod="apps/work-0",
    )  # fmt: skip
    Charge.objects.create(
        kind="instance", namespace="default", name=INSTANCE, resource="akri.sh/x", amount=1,
        owner="team-a", source="label", charged=1,
        users=[{"pod": "apps/work-0", "queue": "team-a", "why": "label"}],
    )  # fmt: skip
    Charge.objects.create(
        kind="instance", namespace="default", name="other", resource="akri.sh/x", amount=1,
        owner="team-b", source="label", users=[{"pod": "apps/work-01", "queue": "team-b"}],
    )  # fmt: skip

    response = login("viewer").get("/pods/apps/work-0/")

    assert response.status_code == 200
    assert [s.key for s in response.context["slots"]] == [f"{INSTANCE}-0"]
    assert len(response.context["bindings"]) == 1 and len(response.context["events"]) == 1
    assert [c.name for c in response.context["charges"]] == [INSTANCE]
    said = text_of(response)
    assert "Running" in said and "holds 1" in said and "team-a" in said
    assert "Release" not in said  # a viewer


def test_a_release_from_an_instance_or_node_page_lands_on_the_map_of_it(login, cluster):
    client = login("operator")
    pk = held_slot().pk

    instance = client.get(f"/instances/default/{INSTANCE}/").content.decode()
    node = client.get("/nodes/node-a/").content.decode()

    assert f'href="/slots/{pk}/release/?back=instance%3Ddefault%252F{INSTANCE}"' in instance
    assert f'href="/slots/{pk}/release/?back=node%3Dnode-a"' in node
    confirm = client.get(f"/slots/{pk}/release/?back=instance%3Ddefault%252F{INSTANCE}")
    assert f'href="/slots/?instance=default%2F{INSTANCE}" class="button" id="release-cancel"' in (
        confirm.content.decode()
    )


def test_an_operator_can_release_from_a_pods_page(login, cluster):
    page = login("operator").get("/pods/apps/work-0/").content.decode()

    assert f'href="/slots/{held_slot().pk}/release/"' in page


def test_an_unknown_pod_is_a_404(login, cluster):
    assert login("viewer").get("/pods/apps/no-such-pod/").status_code == 404


def test_pod_names_link_to_their_pages_from_events_and_node_pages(login, cluster, run):
    client = login("viewer")

    node = client.get("/nodes/node-a/").content.decode()
    assert 'href="/pods/apps/work-0/"' in node  # its pods table
    events = client.get("/nodes/node-b/").content.decode()
    assert 'href="/pods/apps/gone/"' in events  # the event's pod, gone since


# --- YAML ------------------------------------------------------------------------------------


def test_a_configurations_yaml_is_its_object_as_cached(login, cluster):
    Configuration.objects.filter(name="akri-onvif").update(
        uid="u-1", resource_version="42", generation=3,
        spec={"capacity": 4, "discoveryHandler": {"name": "onvif", "discoveryDetails": "<x>"}},
    )  # fmt: skip

    response = login("viewer").get("/configurations/default/akri-onvif/yaml/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "&lt;x&gt;" in page and "<x>" not in page
    text = re.search(r"<pre[^>]*><code>(.*?)</code></pre>", page, re.S).group(1)
    obj = yaml.safe_load(html.unescape(text))
    assert obj["apiVersion"] == "akri.sh/v0" and obj["kind"] == "Configuration"
    assert obj["metadata"] == {
        "name": "akri-onvif", "namespace": "default", "uid": "u-1", "resourceVersion": "42",
        "generation": 3,
    }  # fmt: skip
    assert obj["spec"]["discoveryHandler"]["discoveryDetails"] == "<x>"
    assert list(obj) == ["apiVersion", "kind", "metadata", "spec"]  # kubectl's order


def test_an_instances_yaml_carries_its_spec_and_device_usage(login, cluster):
    Instance.objects.filter(name=INSTANCE).update(
        device_usage={f"{INSTANCE}-0": "node-a", f"{INSTANCE}-1": ""}, cdi_name="akri.sh/c=x"
    )
    client = login("viewer")

    response = client.get(f"/instances/default/{INSTANCE}/yaml/")

    assert response.status_code == 200
    text = re.search(r"<pre[^>]*><code>(.*?)</code></pre>", response.content.decode(), re.S)[1]
    obj = yaml.safe_load(html.unescape(text))
    assert obj["kind"] == "Instance"
    assert obj["spec"]["deviceUsage"] == {f"{INSTANCE}-0": "node-a", f"{INSTANCE}-1": ""}
    assert obj["spec"]["configurationName"] == "akri-onvif" and obj["spec"]["capacity"] == 4
    tabs = client.get(f"/instances/default/{INSTANCE}/").content.decode()
    assert f'href="/instances/default/{INSTANCE}/yaml/"' in tabs
    assert client.get("/instances/default/nothing/yaml/").status_code == 404
