"""The interactive API documentation (issue 17): ``/api/docs/`` (Swagger UI from static files)
over ``/api/schema/``, behind the API's own sign-in, under the site's one CSP."""

from __future__ import annotations

import pytest
import yaml
from django.contrib.auth.models import Group, User
from drf_spectacular.validation import validate_schema

from akri_site.dashboard import tokens
from akri_site.dashboard.sample import make_cluster

pytestmark = pytest.mark.django_db

ENDPOINTS = ["configurations", "instances", "slots", "nodes", "runs", "events"]


@pytest.fixture
def viewer(client):
    make_cluster(instances=2, capacity=2)
    user = User.objects.create_user("vera")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return user


def schema_of(client) -> dict:
    response = client.get("/api/schema/")
    assert response.status_code == 200
    return yaml.safe_load(response.content)


def test_the_schema_validates_and_lists_every_endpoint(client, viewer):
    schema = schema_of(client)

    validate_schema(schema)  # raises on an invalid OpenAPI 3 document
    for name in ENDPOINTS:
        assert f"/api/{name}/" in schema["paths"]
        assert f"/api/{name}/{{id}}/" in schema["paths"]


def test_the_schema_describes_the_filters_the_ordering_and_token_auth(client, viewer):
    schema = schema_of(client)

    slots = schema["paths"]["/api/slots/"]["get"]
    params = {p["name"]: p for p in slots["parameters"]}
    for name in ["state", "level", "node", "namespace", "instance", "configuration", "pod"]:
        assert name in params, name
    assert "stuck" in params["state"]["schema"]["enum"]
    ordering = params["ordering"]
    assert "-since" in ordering["schema"]["items"]["enum"]
    assert "pod_name" in ordering["description"]
    assert {"page", "page_size"} <= set(params)
    token = schema["components"]["securitySchemes"]["tokenAuth"]
    assert token == {
        "type": "apiKey",
        "in": "header",
        "name": "Authorization",
        "description": 'Token-based authentication with required prefix "Token"',
    }
    assert {"tokenAuth": []} in slots["security"]


def test_the_docs_page_serves_swagger_ui_from_static_files(client, viewer):
    response = client.get("/api/docs/")

    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower()
    assert "<script>" not in html  # no inline code: the start-up script is its own request
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert "/api/schema/" in script.content.decode()


def test_the_docs_page_keeps_the_sites_content_security_policy(client, viewer):
    page = client.get("/slots/")
    docs = client.get("/api/docs/")

    assert docs.status_code == 200
    assert docs["Content-Security-Policy"] == page["Content-Security-Policy"]
    assert "'unsafe-inline'" not in docs["Content-Security-Policy"]


def test_the_docs_and_schema_need_the_apis_sign_in(client):
    make_cluster(instances=1, capacity=1)
    for url in ["/api/docs/", "/api/docs/?script=", "/api/schema/"]:
        assert client.get(url).status_code == 401, url
    nobody = User.objects.create_user("nobody")
    client.force_login(nobody)
    assert client.get("/api/docs/").status_code == 403
    client.logout()
    bot = User.objects.create_user("bot")
    bot.groups.add(Group.objects.get(name="viewer"))
    _, key = tokens.issue(bot)
    response = client.get("/api/schema/", HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 200
