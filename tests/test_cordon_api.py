"""``/api/cordons/...`` by role, its garbage, and the dashboard's mark wherever an Instance
shows, against the API-server simulator."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, User

from agent.bench.claims import instance_body
from agent.domain.cordon import cordon_of
from agent.kube import cache
from agent.kube.client import AkriApi
from agent.models import AuditEntry, Instance

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAM = "cams-8120fe"
SAYS = "cordoned by u-operator: replacing lens"


@pytest.fixture
def api(kube, settings):
    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig, "NAMESPACE": kube.namespace}
    api = AkriApi(kube.api_client, kube.namespace)
    cache.apply_instance(api.create_instance(instance_body(CAM, 2, "cams", ("node-a",))))
    return api


@pytest.fixture
def login(client):
    def as_role(role: str | None):
        user = User.objects.create_user(f"u-{role}", is_staff=role in ("operator", "admin"))
        if role:
            user.groups.add(Group.objects.get(name=role))
        client.force_login(user)
        return client

    return as_role


def url(kube, name=CAM):
    return f"/instances/{kube.namespace}/{name}/cordon/"


def post(client, kube, body, name=CAM):
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(url(kube, name), data=data, content_type="application/json")


def test_an_operator_cordons_and_uncordons_through_the_api(login, kube, api):
    client = login("operator")

    response = post(client, kube, {"action": "cordon", "reason": "replacing lens"})

    assert response.status_code == 200, response.content
    assert response.json()["says"] == SAYS
    assert response.json()["outcome"] == "done"
    assert cordon_of(api.get_instance(CAM)).describe() == SAYS
    assert client.get(url(kube)).json()["cordoned"] is True
    listed = client.get("/api/cordons/").json()
    assert [(r["instance"], r["says"]) for r in listed["results"]] == [(CAM, SAYS)]
    assert client.get("/api/cordons/?nmespace=x").status_code == 400

    response = post(client, kube, {"action": "uncordon", "reason": "lens in"})

    assert response.status_code == 200
    assert response.json()["cordoned"] is False
    assert cordon_of(api.get_instance(CAM)) is None
    assert list(AuditEntry.objects.order_by("id").values_list("action", "outcome")) == [
        ("cordon", "done"),
        ("uncordon", "done"),
    ]


def test_a_viewer_reads_the_cordon_but_may_not_change_it(login, kube, api):
    client = login("viewer")

    assert client.get(url(kube)).json()["says"] == "not cordoned"
    response = post(client, kube, {"action": "cordon", "reason": "x"})

    assert response.status_code == 403
    assert cordon_of(api.get_instance(CAM)) is None
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.action, entry.outcome) == ("u-viewer", "cordon", "refused")


def test_without_sign_in_nothing_is_read_or_changed(client, kube, api):
    assert client.get(url(kube)).status_code in (401, 403)
    assert post(client, kube, {"action": "cordon"}).status_code in (401, 403)
    assert cordon_of(api.get_instance(CAM)) is None


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("not json", 400),
        ("[1, 2]", 400),
        ({}, 400),
        ({"action": "destroy"}, 400),
        ({"action": ["cordon"]}, 400),
        ({"action": "cordon", "reason": 7}, 400),
        ({"action": "cordon", "reason": "x" * 501}, 400),
        ({"action": "cordon", "reason": "a\u0000b"}, 400),
    ],
)
def test_garbage_gets_a_clear_4xx_and_changes_nothing(login, kube, api, body, code):
    client = login("operator")
    before = api.get_instance(CAM)

    response = post(client, kube, body)

    assert response.status_code == code, response.content
    assert response.json()["detail"]
    assert api.get_instance(CAM) == before
    assert Instance.objects.get(name=CAM).cordon is None
    assert list(AuditEntry.objects.values_list("outcome", flat=True)) == ["refused"]


def test_an_unknown_instance_is_a_404_and_audited(login, kube, api):
    client = login("operator")

    assert client.get(url(kube, "nope")).status_code == 404
    response = post(client, kube, {"action": "cordon", "reason": "x"}, name="nope")

    assert response.status_code == 404
    assert AuditEntry.objects.get().outcome == "refused"


def test_the_dashboard_marks_a_cordoned_instance_where_it_appears(login, kube, api):
    client = login("operator")
    post(client, kube, {"action": "cordon", "reason": "replacing lens"})
    viewer = login("viewer")

    pages = [
        f"/instances/{kube.namespace}/{CAM}/",
        "/instances/",
        "/slots/?configuration=cams",
    ]
    for page in pages:
        response = viewer.get(page)
        assert response.status_code == 200, page
        assert SAYS in response.content.decode(), page
    api_row = viewer.get("/api/instances/").json()["results"][0]
    assert cordon_of({"metadata": {"annotations": {"akri-site.io/cordon": api_row["cordon"]}}})


def test_an_uncordoned_instance_page_says_so(login, kube, api):
    body = login("viewer").get(f"/instances/{kube.namespace}/{CAM}/").content.decode()

    assert "not cordoned" in body
    assert "⛔" not in body
