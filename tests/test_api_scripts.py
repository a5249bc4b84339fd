"""The JSON API for scripts (issue 17): tokens, strict filters, ordering."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token

from agent.models import ReconcileRun, Slot
from akri_site.dashboard.sample import make_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster():
    return make_cluster(instances=10, capacity=4)


def user_with(role: str | None, name: str = "bot", staff: bool = False) -> User:
    user = User.objects.create_user(name, is_staff=staff)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def apitoken(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("apitoken", *args, stdout=out, stderr=err)
    return out.getvalue().strip(), err.getvalue().strip()


def auth(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Token {key}"}


# --- tokens -----------------------------------------------------------------------------------


def test_a_viewers_token_reads_the_api_without_a_session(client, cluster):
    user_with("viewer")
    key, said = apitoken("bot")

    response = client.get("/api/slots/?state=held&node=node-a", **auth(key))

    assert response.status_code == 200
    assert response.json()["count"] == 10  # node-a: slot 0 (IL) and 1 (CL) of 5 Instances
    assert "new token, role viewer" in said
    assert Token.objects.get(user__username="bot").key == key


def test_the_command_prints_the_same_token_again_and_reset_replaces_it(client, cluster):
    user_with("viewer")
    first, _ = apitoken("bot")

    again, said = apitoken("bot")
    new, _ = apitoken("bot", "--reset")

    assert again == first and "existing token" in said
    assert new != first
    assert client.get("/api/nodes/", **auth(first)).status_code == 401
    assert client.get("/api/nodes/", **auth(new)).status_code == 200


def test_a_revoked_token_is_refused(client, cluster):
    user_with("viewer")
    key, _ = apitoken("bot")

    _, said = apitoken("bot", "--revoke")
    response = client.get("/api/nodes/", **auth(key))

    assert said == "bot: token revoked"
    assert response.status_code == 401
    assert response.json()["detail"] == "Invalid token."
    assert not Token.objects.filter(user__username="bot").exists()


def test_the_command_refuses_users_without_a_role_and_unknown_users():
    user_with(None)

    with pytest.raises(CommandError, match="no dashboard role"):
        apitoken("bot")
    with pytest.raises(CommandError, match="no user 'ghost'"):
        apitoken("ghost")
    assert not Token.objects.exists()


def test_a_token_carries_exactly_its_users_role(client, cluster):
    user = user_with("viewer")
    key, _ = apitoken("bot")
    user.groups.clear()  # the role taken away after the token was made

    response = client.get("/api/slots/", **auth(key))

    assert response.status_code == 403
    user.is_active = False
    user.save()
    assert client.get("/api/slots/", **auth(key)).status_code == 401


def test_a_token_does_not_open_the_pages_or_write_through_the_api(client, cluster):
    user_with("operator", staff=True)
    key, _ = apitoken("bot")
    slot = Slot.objects.filter(level="IL").first()

    page = client.get("/slots/", **auth(key))
    write = client.delete(f"/api/slots/{slot.pk}/", **auth(key))

    assert page.status_code == 302  # the pages take a session, never a token
    assert write.status_code == 405
    assert Slot.objects.get(pk=slot.pk).value == slot.value


def test_admins_create_and_revoke_tokens_in_the_admin(client, cluster):
    admin = user_with("admin", name="root", staff=True)
    bot = user_with("viewer")
    client.force_login(admin)

    created = client.post("/admin/authtoken/tokenproxy/add/", {"user": bot.pk})

    assert created.status_code == 302
    token = Token.objects.get(user=bot)
    revoked = client.post(f"/admin/authtoken/tokenproxy/{bot.pk}/delete/", {"post": "yes"})
    assert revoked.status_code == 302
    assert not Token.objects.filter(pk=token.pk).exists()


def test_operators_cannot_manage_tokens_in_the_admin(client, cluster):
    client.force_login(user_with("operator", name="op", staff=True))

    assert client.get("/admin/authtoken/tokenproxy/").status_code == 403


# --- strict parameters --------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, field, message",
    [
        ("/api/slots/?nod=node-a", "nod", "Unknown parameter"),
        ("/api/instances/?configuraton=akri-onvif", "configuraton", "Unknown parameter"),
        ("/api/slots/?node=node-z", "node", "No node named “node-z” is known."),
        ("/api/runs/?node=node-z", "node", "No node named “node-z” is known."),
        ("/api/events/?node=node-z", "node", "No node named “node-z” is known."),
        ("/api/slots/?ordering=value", "ordering", "Cannot order by value"),
        ("/api/nodes/?ordering=-name,labels", "ordering", "Cannot order by labels"),
    ],
)
def test_unknown_parameters_nodes_and_orderings_are_a_400_naming_them(
    client, cluster, url, field, message
):
    user_with("viewer")
    key, _ = apitoken("bot")

    response = client.get(url, **auth(key))

    assert response.status_code == 400, response.content
    assert message in " ".join(response.json()[field])


def test_known_nodes_and_paging_parameters_are_accepted(client, cluster):
    user_with("viewer")
    key, _ = apitoken("bot")
    ReconcileRun.objects.create(
        scope="node", node="node-gone", trigger="sweep", started_at="2026-01-01T00:00:00Z"
    )

    slots = client.get("/api/slots/?node=node-b&page=1&page_size=3&format=json", **auth(key))
    runs = client.get("/api/runs/?node=node-gone", **auth(key))

    assert slots.status_code == 200 and len(slots.json()["results"]) == 3
    assert runs.status_code == 200 and runs.json()["count"] == 1


def test_ordering_sorts_the_list_and_keeps_ties_stable(client, cluster):
    user_with("viewer")
    key, _ = apitoken("bot")

    down = client.get("/api/instances/?ordering=-name", **auth(key)).json()["results"]
    by_level = client.get("/api/slots/?ordering=level&page_size=1000", **auth(key)).json()

    names = [i["name"] for i in down]
    assert names == sorted(names, reverse=True) and len(names) == 10
    rows = by_level["results"]
    assert [r["level"] for r in rows] == sorted(r["level"] for r in rows)
    # Within one level, the id decides: the same order on every page.
    free_ids = [r["id"] for r in rows if r["level"] == "free"]
    assert free_ids == sorted(free_ids)


def test_the_stuck_states_filter_the_api_as_the_slot_map(client, cluster):
    user_with("viewer")
    key, _ = apitoken("bot")

    response = client.get("/api/slots/?state=stuck", **auth(key))

    assert response.status_code == 200
    assert [r["key"] for r in response.json()["results"]] == ["akri-onvif-000009-3"]
