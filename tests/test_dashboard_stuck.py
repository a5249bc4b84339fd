"""Stuck slots (issue 17): counted on the overview, marked on the slot map, each with its fix."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from agent.models import Pod, Slot, SlotEvent, SlotPodBinding
from akri_site.dashboard.sample import make_cluster
from tests import test_dashboard_views

login = test_dashboard_views.login  # the fixture: a client signed in with a role

pytestmark = pytest.mark.django_db

# make_cluster: slot 0 of each Instance held IL with a known pod, slot 1 held CL with no pod
# since 30 s (past the 20 s grace), the last slot of every tenth Instance a foreign value.
FIRST = "akri-onvif-000000"


@pytest.fixture
def cluster():
    return make_cluster(instances=10, capacity=4)


def map_node_a() -> None:
    """node-a's slot-to-pod map is in this database (as in the demo)."""
    SlotPodBinding.objects.create(
        node="node-a",
        slot=f"{FIRST}-0",
        instance=FIRST,
        namespace="default",
        pod_namespace="apps",
        pod_name="work-0",
        allocated_at=timezone.now(),
    )


def cell(page: str, key: str) -> str:
    found = re.search(rf'<td data-slot="{re.escape(key)}"[^>]*>.*?</td>', page, re.S)
    assert found, f"no cell for {key}"
    return found.group(0)


def test_overview_counts_each_kind_of_stuck_slot_with_a_link_to_them(login, cluster):
    map_node_a()
    Slot.objects.filter(key=f"{FIRST}-0").update(since=timezone.now() - timedelta(days=2))
    SlotEvent.objects.create(
        at=timezone.now(), namespace="default", instance=FIRST, slot=f"{FIRST}-2",
        cause=SlotEvent.Cause.CONFLICT, actor="agent:node-b",
    )  # fmt: skip

    response = login("viewer").get("/")

    assert response.status_code == 200
    page = response.content.decode()
    # CL slots of the node-a Instances (0, 2, 4, 6, 8): held, no pod, past the grace.
    assert '<a href="/slots/?state=no-pod">5 pod not known past the grace period</a>' in page
    assert '<a href="/slots/?state=old">1 held longer than 24 h</a>' in page
    assert '<a href="/slots/?state=foreign">1 foreign value</a>' in page
    assert '<a href="/slots/?state=conflict">1 conflict in the last hour</a>' in page
    assert '<a href="/slots/?state=stuck"><span aria-hidden="true">⚑</span> 8 stuck</a>' in page


def test_overview_says_pods_are_not_tracked_without_a_slot_to_pod_map(login, cluster):
    response = login("viewer").get("/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "pod not known past the grace period: not tracked here" in page
    assert "?state=no-pod" not in page


def test_slot_map_marks_a_slot_whose_pod_is_not_known_and_offers_its_release(login, cluster):
    map_node_a()
    slot = Slot.objects.get(key=f"{FIRST}-1")

    response = login("operator").get("/slots/?state=no-pod")

    assert response.status_code == 200
    page = response.content.decode()
    stuck = cell(page, f"{FIRST}-1")
    assert "stuck" in stuck.split(">", 1)[0]  # the cell's class
    assert "⚑</span> stuck: pod not known past the grace period" in stuck
    assert "pod not known yet" not in stuck  # the mark says it
    assert f'href="/slots/{slot.pk}/release/?back=state%3Dno-pod"' in stuck
    # The held slot with a known pod is shown beside it, not marked.
    assert "stuck:" not in cell(page, f"{FIRST}-0")
    # node-b's slots are not in a map here: its pods cannot be known, so they are not stuck.
    assert 'data-instance="default/akri-onvif-000001"' not in page


def test_viewers_see_the_mark_and_who_can_fix_it_but_no_release_link(login, cluster):
    map_node_a()

    page = login("viewer").get("/slots/?state=stuck").content.decode()

    stuck = cell(page, f"{FIRST}-1")
    assert "An operator can release it." in stuck
    assert "/release/" not in stuck


def test_held_long_follows_the_configured_age(login, cluster):
    Slot.objects.filter(key=f"{FIRST}-0").update(since=timezone.now() - timedelta(hours=3))
    client = login("viewer")

    assert f'data-slot="{FIRST}-0"' not in client.get("/slots/?state=old").content.decode()
    with override_settings(AKRI={**settings.AKRI, "STUCK_AFTER_HOURS": 2}):
        response = client.get("/slots/?state=old")

    assert response.status_code == 200
    assert "stuck: held long" in cell(response.content.decode(), f"{FIRST}-0")


def test_a_recent_conflict_is_marked_with_a_link_to_the_slot_history(login, cluster):
    SlotEvent.objects.create(
        at=timezone.now(), namespace="default", instance=FIRST, slot=f"{FIRST}-2",
        cause=SlotEvent.Cause.CONFLICT, actor="agent:node-b",
    )  # fmt: skip
    SlotEvent.objects.create(
        at=timezone.now() - timedelta(hours=2), namespace="default", instance=FIRST,
        slot=f"{FIRST}-3", cause=SlotEvent.Cause.CONFLICT, actor="agent:node-b",
    )  # fmt: skip

    page = login("viewer").get("/slots/?state=conflict").content.decode()

    conflict = cell(page, f"{FIRST}-2")
    assert "stuck: conflict in the last hour" in conflict
    assert f'href="/instances/default/{FIRST}/#events"' in conflict
    assert "stuck:" not in cell(page, f"{FIRST}-3")  # two hours ago: history, not stuck
    assert page.count('data-instance="') == 1


def test_a_foreign_value_is_marked_stuck(login, cluster):
    page = login("viewer").get("/slots/?state=stuck").content.decode()

    assert "stuck: foreign value" in cell(page, "akri-onvif-000009-3")


def test_an_unknown_stuck_kind_is_a_400(login, cluster):
    response = login("viewer").get("/slots/?state=wedged")

    assert response.status_code == 400
    assert "wedged is not one of the available choices" in response.content.decode()


def test_a_node_whose_agent_says_on_its_pods_what_they_hold_is_tracked(login, cluster):
    # node-a's agent keeps its map in a database of its own but publishes it on its pods
    # (akri-site.io/holds): the controller fills Slot.pod_* from that.
    Pod.objects.create(
        namespace="apps", name="said-0", uid="u0", node_name="node-a", holds={}, resources={}
    )

    page = login("viewer").get("/").content.decode()

    assert '<a href="/slots/?state=no-pod">5 pod not known past the grace period</a>' in page
