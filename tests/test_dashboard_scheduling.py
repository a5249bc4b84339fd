"""The dashboard's answer to "why is my pod Pending": the extender's verdicts in words."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agent.scheduling.models import PodVerdict
from agent.scheduling.recorder import verdict_fields
from akri_site.dashboard.sample import make_cluster
from tests.test_dashboard_views import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def login(client):
    def as_role(role: str | None):
        client.force_login(make_user(role, role in ("operator", "admin")))
        return client

    return as_role


@pytest.fixture
def verdicts():
    make_cluster(instances=4, capacity=2)
    waiting = verdict_fields(
        [],
        {"node-a": "3 unique akri-onvif devices requested, 1 of 4 free on node node-a"},
        {"node-b": "3 unique akri-onvif devices requested, node node-b sees 2"},
        "",
    )
    PodVerdict.objects.create(namespace="apps", name="cams-3", at=timezone.now(), **waiting)
    bound = verdict_fields(["node-a"], {}, {}, "")
    PodVerdict.objects.create(
        namespace="apps", name="cams-1", at=timezone.now(), bound_to="node-a", **bound
    )


def test_the_scheduling_page_says_why_each_waiting_pod_waits(login, verdicts):
    response = login("viewer").get("/scheduling/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "apps/cams-3" in page
    assert "waiting: no node fits" in page
    assert "3 unique akri-onvif devices requested, 1 of 4 free on the node" in page
    assert "3 unique akri-onvif devices requested, the node sees 2" in page
    assert "apps/cams-1" not in page  # bound: not waiting


def test_show_all_lists_bound_pods_too(login, verdicts):
    page = login("viewer").get("/scheduling/?show=all").content.decode()

    assert "apps/cams-1" in page and "bound to" in page


def test_the_node_page_shows_policy_statuses_and_pods_turned_away(login, verdicts):
    page = login("viewer").get("/nodes/node-b/").content.decode()

    assert "Sharing policies on this node" in page
    assert "akri-configuration" in page and "akri-instance" in page
    assert "apps/cams-3" in page
    assert "cannot fit: 3 unique akri-onvif devices requested, node node-b sees 2" in page


def test_the_scheduling_page_needs_a_role(client, login, verdicts):
    assert client.get("/scheduling/").status_code == 302
    assert login(None).get("/scheduling/").status_code == 403


def test_an_empty_page_says_so(login):
    page = login("viewer").get("/scheduling/").content.decode()

    assert "No pod is waiting on the extender." in page
