"""The JSON API for scripts (issue 17): tokens, strict filters, ordering."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

from agent.models import ReconcileRun, Slot
from akri_site.dashboard.models import ApiToken
from akri_site.dashboard.sample import make_cluster
from akri_site.dashboard.tokens import digest

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
    assert "new token" in said and "role viewer" in said
    # Stored as a hash and a prefix: the key itself is nowhere in the database.
    row = ApiToken.objects.get(user__username="bot")
    assert row.digest == digest(key) and key.startswith(row.prefix)
    assert key not in {row.digest, row.prefix, row.name}


def test_each_call_makes_a_new_token_and_the_old_ones_keep_working(client, cluster):
    user_with("viewer")
    first, _ = apitoken("bot", "--name", "ci")
    second, _ = apitoken("bot", "--name", "backup")

    listed, _ = apitoken("bot", "--list")

    assert first != second
    assert client.get("/api/nodes/", **auth(first)).status_code == 200
    assert client.get("/api/nodes/", **auth(second)).status_code == 200
    assert "ci" in listed and "backup" in listed
    assert first not in listed and second not in listed  # shown once, never again


def test_a_revoked_token_is_refused_and_the_others_stay(client, cluster):
    user_with("viewer")
    key, _ = apitoken("bot")
    other, _ = apitoken("bot")
    row = ApiToken.objects.get(digest=digest(key))
    assert client.get("/api/nodes/", **auth(key)).status_code == 200  # in use until revoked

    _, said = apitoken("bot", "--revoke", str(row.pk))
    response = client.get("/api/nodes/", **auth(key))  # at once: nothing remembers it

    assert said == f"bot: token {row.pk} revoked"
    assert response.status_code == 401
    assert response.json()["detail"] == "Invalid token."
    assert client.get("/api/nodes/", **auth(other)).status_code == 200
    apitoken("bot", "--revoke-all")
    assert not ApiToken.objects.filter(user__username="bot").exists()


def test_the_command_refuses_users_without_a_role_and_unknown_users():
    user_with(None)

    with pytest.raises(CommandError, match="no dashboard role"):
        apitoken("bot")
    with pytest.raises(CommandError, match="no user 'ghost'"):
        apitoken("ghost")
    assert not ApiToken.objects.exists()


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

    created = client.post(
        "/admin/dashboard/apitoken/add/", {"user": bot.pk, "name": "ci"}, follow=True
    )

    assert created.status_code == 200
    token = ApiToken.objects.get(user=bot)
    shown = [str(m) for m in created.context["messages"]]
    (key,) = [m.split(": ", 1)[1].split(" ")[0] for m in shown if "copy it now" in m]
    assert token.digest == digest(key)
    # The list and the change page never show the key again.
    assert key not in client.get("/admin/dashboard/apitoken/").content.decode()
    assert key not in client.get(f"/admin/dashboard/apitoken/{token.pk}/change/").content.decode()
    assert client.get("/admin/authtoken/tokenproxy/").status_code == 404  # the clear-key admin
    assert client.get("/api/nodes/", **auth(key)).status_code == 200  # the bot's, in use
    revoked = client.post(f"/admin/dashboard/apitoken/{token.pk}/delete/", {"post": "yes"})
    assert revoked.status_code == 302
    assert not ApiToken.objects.filter(pk=token.pk).exists()
    client.logout()  # the bot's script: its token alone
    refused = client.get("/api/nodes/", **auth(key))
    assert refused.status_code == 401 and refused.json()["detail"] == "Invalid token."


def test_operators_cannot_manage_tokens_in_the_admin(client, cluster):
    client.force_login(user_with("operator", name="op", staff=True))

    assert client.get("/admin/dashboard/apitoken/").status_code == 403
    assert client.get("/admin/dashboard/apitoken/add/").status_code == 403


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
