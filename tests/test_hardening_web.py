"""Static files, CSP, password reset, /metrics token and the websocket origin (issue #12)."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.test import Client

from akri_site.asgi import application
from akri_site.dashboard import accounts

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer_client():
    user = User.objects.create_user("vera", password="pw-for-tests-1")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return client


# --- item 5: static files ------------------------------------------------------------------


def _asgi_get(raw_path: str) -> dict:
    """A GET through the project's ASGI application, as Daphne or uvicorn would pass it."""

    async def scenario():
        communicator = HttpCommunicator(
            application, "GET", raw_path, headers=[(b"host", b"127.0.0.1:8000")]
        )
        # Servers hand the application the percent-decoded path.
        communicator.scope["path"] = unquote(raw_path)
        communicator.scope["raw_path"] = raw_path.encode()
        await communicator.send_input({"type": "http.request", "body": b""})
        response = await communicator.receive_output(10)
        response["body"] = b""
        while True:
            part = await communicator.receive_output(10)
            response["body"] += part.get("body", b"")
            if not part.get("more_body"):
                return response

    return async_to_sync(scenario)()


@pytest.mark.parametrize(
    "path",
    [
        "/static/%2e%2e/akri_site/settings.py",
        "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/dashboard/%2e%2e/%2e%2e/manage.py",
        "/static/nothing-here.js",
    ],
)
def test_a_path_out_of_static_is_a_404_not_a_500(path):
    response = _asgi_get(path)

    assert response["status"] == 404
    assert b"SECRET_KEY" not in response["body"]


def test_static_files_are_served_with_their_type():
    response = _asgi_get("/static/dashboard/live.js")

    assert response["status"] == 200
    headers = {name.lower(): value for name, value in response["headers"]}
    assert headers[b"content-type"].startswith(b"text/javascript")
    assert response["body"].startswith(b"// Live dashboard")


# --- item 2: a Content-Security-Policy on every page ----------------------------------------


@pytest.mark.parametrize("path", ["/", "/slots/", "/audit/", "/accounts/login/", "/admin/login/"])
def test_every_page_carries_a_content_security_policy(viewer_client, path):
    response = viewer_client.get(path)

    assert response.status_code == 200
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy


def test_the_dashboard_pages_have_no_inline_scripts_or_styles(viewer_client):
    for path in ("/", "/slots/", "/reconciliation/", "/audit/"):
        html = viewer_client.get(path).content.decode()
        assert "<script>" not in html and "<style" not in html and " style=" not in html, path
        assert " onclick=" not in html, path


# --- item 9: password reset only with mail ---------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/accounts/password_reset/",
        "/accounts/password_reset/done/",
        "/accounts/reset/MQ/set-password/",
        "/accounts/reset/done/",
    ],
)
def test_password_reset_pages_do_not_exist_without_mail(path):
    assert Client().get(path).status_code == 404
    assert Client().post(path, {"email": "a@example.com"}).status_code == 404


def test_password_reset_pages_exist_once_mail_is_configured():
    names = {pattern.name for pattern in accounts.patterns(mail=True)}

    assert names >= accounts.RESET_PAGES
    assert not accounts.RESET_PAGES & {p.name for p in accounts.patterns(mail=False)}


def test_the_admin_login_offers_no_password_reset():
    assert b"password_reset" not in Client().get("/admin/login/").content


# --- item 8: /metrics behind a bearer token ---------------------------------------------------


def test_metrics_want_the_bearer_token_once_one_is_configured(settings):
    settings.METRICS_TOKEN = "s3cret-token"

    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Basic s3cret-token").status_code == 401
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert response.status_code == 200
    assert b"akri_websocket_clients" in response.content


def test_a_refused_scrape_says_how_to_authenticate(settings):
    settings.METRICS_TOKEN = "s3cret-token"

    response = Client().get("/metrics")

    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"akri_" not in response.content


def test_metrics_stay_open_without_a_token(settings):
    settings.METRICS_TOKEN = ""

    assert Client().get("/metrics").status_code == 200


# --- item 4: the websocket origin is scheme, host and port ------------------------------------


def _handshake(origin: bytes, host: bytes = b"127.0.0.1:8000", path: str = "/ws/live/"):
    async def scenario():
        communicator = WebsocketCommunicator(
            application, path, headers=[(b"origin", origin), (b"host", host)]
        )
        result = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return result

    return async_to_sync(scenario)()


@pytest.mark.parametrize(
    "origin",
    [
        b"http://127.0.0.1:9999",  # the report: same host, another port
        b"https://127.0.0.1:8000",  # another scheme
        b"http://127.0.0.1",  # port 80 is another origin
        b"http://localhost:8000",  # another host name, even if allowed
        b"null",
    ],
)
def test_a_websocket_from_another_origin_is_refused(origin):
    connected, code = _handshake(origin)

    assert not connected
    assert code != 4403  # refused by the origin check, before the consumer


def test_a_websocket_from_the_same_origin_reaches_the_consumer():
    # Anonymous: the consumer itself refuses with 4403, so the origin check let it through.
    assert _handshake(b"http://127.0.0.1:8000") == (False, 4403)


def test_a_host_outside_allowed_hosts_is_refused_even_with_a_matching_origin():
    connected, code = _handshake(b"http://evil.example:8000", host=b"evil.example:8000")

    assert not connected and code != 4403


def test_a_trusted_origin_is_let_through(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://akri.example.com"]

    assert _handshake(b"https://akri.example.com")[1] == 4403
