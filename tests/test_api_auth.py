"""Every URL of the JSON API takes the same sign-in (issue 28): walked from the URL resolver, so
an endpoint added later is walked too, with no credentials, a bad token, a token without a
role and a token of each role."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Group, User
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from agent.models import ReconcileRun, SlotEvent
from akri_site.dashboard import tokens
from akri_site.dashboard.access import ROLES
from akri_site.dashboard.sample import make_cluster

pytestmark = pytest.mark.django_db

# Values for the URL parameters of the API; a parameter not here fails the walk, naming it.
SAMPLE_KWARGS = {"format": "json"}


def walk(patterns: list, prefix: str = "", names: tuple[str, ...] = ()) -> Iterator:
    """(route prefix, namespaced name, pattern) of every URL pattern under ``patterns``."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            inner = (*names, pattern.namespace) if pattern.namespace else names
            yield from walk(pattern.url_patterns, route, inner)
        elif isinstance(pattern, URLPattern):
            yield route, ":".join((*names, pattern.name or "")), pattern


def parameters(pattern: URLPattern) -> list[str]:
    converters = getattr(pattern.pattern, "converters", None)
    if converters:
        return list(converters)
    return list(pattern.pattern.regex.groupindex)


def sample_value(pattern: URLPattern, name: str) -> str:
    if name in SAMPLE_KWARGS:
        return SAMPLE_KWARGS[name]
    queryset = getattr(getattr(pattern.callback, "cls", None), "queryset", None)
    if name == "pk" and queryset is not None:
        row = queryset.first()
        assert row is not None, f"no {queryset.model.__name__} row for {pattern}"
        return str(row.pk)
    raise AssertionError(f"{pattern}: add a sample value for its parameter {name!r}")


def api_urls() -> list[str]:
    """Every URL the JSON API serves (``/api/...``), parameters filled in."""
    urls = set()
    for route, name, pattern in walk(get_resolver().url_patterns):
        if not route.startswith("api/"):
            continue
        assert not name.endswith(":") and name, f"{route}: name it, so that it can be walked"
        kwargs = {k: sample_value(pattern, k) for k in parameters(pattern)}
        urls.add(reverse(name, kwargs=kwargs))
    return sorted(urls)


def token_of(role: str | None) -> str:
    user = User.objects.create_user(f"bot-{role or 'none'}")
    if role:
        user.groups.add(Group.objects.get(name=role))
    return tokens.issue(user)[1]


def auth(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Token {key}"}


@pytest.fixture
def world():
    make_cluster(instances=2, capacity=2)
    run = ReconcileRun.objects.create(
        scope="cluster", trigger="schedule", started_at=timezone.now()
    )
    SlotEvent.objects.create(
        at=timezone.now(),
        namespace="default",
        instance="akri-onvif-000000",
        slot="akri-onvif-000000-0",
        cause=SlotEvent.Cause.choices[0][0],
        actor="test",
        run=run,
    )


def test_the_walk_finds_every_kind_of_endpoint(world):
    urls = api_urls()

    for expected in (
        "/api/",
        "/api/instances/",
        "/api/instances.json",
        "/api/schema/",
        "/api/docs/",
        "/api/charts/usage/",
        "/api/queues/",
        "/api/queues/charges/",
        "/api/queues/history/",
    ):
        assert expected in urls
    assert any(u.startswith("/api/events/") and u[len("/api/events/") :] for u in urls)


def test_every_api_url_is_401_without_credentials_or_with_a_bad_token(client, world):
    for url in api_urls():
        bare = client.get(url)
        bad = client.get(url, **auth("0" * 40))

        assert bare.status_code == 401, url
        assert bare["WWW-Authenticate"] == "Token", url
        assert bad.status_code == 401, url


def test_every_api_url_is_403_for_a_token_without_a_role(client, world):
    key = token_of(None)

    for url in api_urls():
        assert client.get(url, **auth(key)).status_code == 403, url


@pytest.mark.parametrize("role", ROLES)
def test_every_api_url_reads_with_a_token_of_each_role_and_writes_nothing(client, world, role):
    key = token_of(role)

    for url in api_urls():
        assert client.get(url, **auth(key)).status_code == 200, url
        assert client.post(url, {}, **auth(key)).status_code == 405, url
