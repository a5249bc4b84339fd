"""Bad input to the admin is a 4xx or the admin's bad-lookup page, never a 500 (#12, item 6)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agent.models import AuditEntry, Slot
from akri_site.dashboard.sample import make_cluster

pytestmark = pytest.mark.django_db

HUGE = "9223372036854775808"


@pytest.fixture
def admin_client():
    make_cluster(instances=3, capacity=2)
    User.objects.create_superuser("root", password="x" * 12)
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.get(username="root"))
    return client


@pytest.mark.parametrize(
    ("page", "field"),
    [("slotevent", "at"), ("reconcilerun", "started_at"), ("auditentry", "at")],
)
@pytest.mark.parametrize(
    "query",
    [
        {"__year": HUGE},
        {"__year": "-" + HUGE},
        {"__year": "9999"},
        {"__year": "9999", "__month": "12"},
        {"__year": "9999", "__month": "12", "__day": "31"},
        {"__year": "2024", "__month": HUGE},
    ],
)
def test_an_impossible_date_filter_gets_the_bad_lookup_page(admin_client, page, field, query):
    url = f"/admin/agent/{page}/"

    response = admin_client.get(url, {field + k: v for k, v in query.items()})

    assert response.status_code == 302 and response["Location"] == url + "?e=1"
    assert admin_client.get(url + "?e=1").status_code == 200


@pytest.mark.parametrize("selected", ["abc", "1.5", "", HUGE, "-1", "１"])
@pytest.mark.parametrize("confirmed", [False, True])
def test_a_forged_release_selection_is_a_400_and_changes_nothing(admin_client, selected, confirmed):
    held = {s.pk: s.value for s in Slot.objects.all()}
    form = {"action": "release_slots", "_selected_action": selected}
    if confirmed:
        form["post"] = "yes"

    response = admin_client.post("/admin/agent/slot/", form)

    assert response.status_code == 400
    assert {s.pk: s.value for s in Slot.objects.all()} == held
    assert not AuditEntry.objects.exists()


def test_a_real_selection_still_reaches_the_confirmation_page(admin_client):
    slot = Slot.objects.order_by("pk").first()

    response = admin_client.post(
        "/admin/agent/slot/", {"action": "release_slots", "_selected_action": str(slot.pk)}
    )

    assert response.status_code == 200
    assert slot.key in response.content.decode()


@pytest.mark.parametrize(
    "url",
    [
        "/admin/agent/slot/?level__exact=%00",
        "/admin/agent/pod/?phase__exact=a%00b",
        "/admin/agent/slotevent/?cause__exact=%00",
        "/api/slots/?node=%00",
        "/slots/?node=%00",
    ],
)
def test_a_nul_character_in_a_query_is_a_400(admin_client, url):
    assert admin_client.get(url).status_code == 400
