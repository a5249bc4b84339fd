"""Issue #29, Medium and Low: 500s a viewer could trigger, and what replaced them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.contrib.auth.models import Group, User

from agent.models import Configuration
from akri_site.dashboard.sample import make_cluster
from tests.test_queues_webhook import POD_REVIEW

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster():
    return make_cluster(instances=2, capacity=2)


@pytest.fixture
def viewer_client(client):
    user = User.objects.create_user("round2-viewer")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return client


# --- item 10: timezone offsets, a % in a node name, year 1 ----------------------------------

FAR_OFFSETS = [
    "2026-01-01T00:00:00+16:00",
    "2026-01-01T00:00:00+23:59",
    "2026-01-01T00:00:00-23:59",
]
OUT_OF_RANGE = [
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00",
    "2026-01-01T00:00:00+99:00",
]
TIME_URLS = [
    "/api/runs/?started_after={}",
    "/api/runs/?started_before={}",
    "/api/events/?at_before={}",
    "/api/events/?at_after={}",
    "/api/queues/history/?range=custom&start={}",
    "/queues/?range=custom&start={}",
    "/api/charts/usage/?range=custom&start={}",
]


@pytest.mark.parametrize("url", TIME_URLS)
@pytest.mark.parametrize("stamp", FAR_OFFSETS)
def test_a_time_with_a_far_offset_is_read_as_the_utc_moment_it_names(viewer_client, url, stamp):
    response = viewer_client.get(url.format(stamp.replace("+", "%2B")))
    assert response.status_code == 200, response.content[:300]


@pytest.mark.parametrize("url", TIME_URLS)
@pytest.mark.parametrize("stamp", OUT_OF_RANGE)
def test_a_time_outside_what_utc_can_hold_is_a_400(viewer_client, url, stamp):
    response = viewer_client.get(url.format(stamp.replace("+", "%2B")))
    assert response.status_code == 400, response.content[:300]


def test_the_time_fields_hand_the_database_utc():
    """PostgreSQL refuses offsets beyond +15:59 (a DataError, once a 500): the value reaching
    the query must already be UTC."""
    from akri_site.dashboard.forms import UtcDateTimeField

    value = UtcDateTimeField().clean("2026-01-01T00:00:00+16:00")
    assert value == datetime(2025, 12, 31, 8, 0, tzinfo=UTC)
    assert value.utcoffset().total_seconds() == 0


@pytest.mark.parametrize("node", ["%", "%s", "%(x)s", "node-%d%%"])
@pytest.mark.parametrize("endpoint", ["slots", "runs", "events"])
def test_a_percent_sign_in_the_node_filter_is_a_plain_400(viewer_client, cluster, endpoint, node):
    response = viewer_client.get(f"/api/{endpoint}/", {"node": node})
    assert response.status_code == 400
    assert node in response.json()["node"][0]


def test_a_configuration_from_year_one_renders(viewer_client, cluster):
    Configuration.objects.filter(name="akri-onvif").update(
        created_at=datetime(1, 1, 1, tzinfo=UTC), updated_at=datetime(1, 1, 1, tzinfo=UTC)
    )
    response = viewer_client.get("/configurations/default/akri-onvif/")
    assert response.status_code == 200
    assert b"0001-01-01 00:00:00 UTC" in response.content


@pytest.mark.parametrize(
    "value",
    [
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:30:00-01:00",
        datetime(1, 1, 1, 0, 30),
        # OverflowError on the way to UTC (it was the 500 on a Configuration's page).
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
    ],
)
def test_the_when_filter_shows_a_time_without_a_utc_moment_as_written(value):
    from akri_site.dashboard.templatetags.dashboard import when

    assert "<time" in when(value)


@pytest.mark.parametrize("url", ["/configurations/default/akri-onvif/?range=custom&start={}"])
@pytest.mark.parametrize("stamp", ["0001-01-01T00:00:00", "0001-01-01T00:00:00%2B01:00"])
def test_a_configuration_page_with_a_year_one_range_is_not_a_500(
    viewer_client, cluster, url, stamp
):
    assert viewer_client.get(url.format(stamp)).status_code in (200, 400)


# --- item 10: the charts and the queues are in the OpenAPI schema, and the schema is fuzzed --

ApiOnly = ["/api/charts/usage/", "/api/charts/release-latency/", "/api/queues/"]
ApiOnly += ["/api/queues/charges/", "/api/queues/history/"]


def _schema(client) -> dict:
    import yaml
    from drf_spectacular.validation import validate_schema

    response = client.get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    validate_schema(schema)
    return schema


def test_the_schema_serves_the_charts_and_the_queues(viewer_client, cluster):
    paths = _schema(viewer_client)["paths"]

    for path in ApiOnly:
        assert "get" in paths[path], path
    usage = {p["name"] for p in paths["/api/charts/usage/"]["get"]["parameters"]}
    assert {"range", "start", "end", "node", "configuration", "namespace"} <= usage
    history = {p["name"]: p for p in paths["/api/queues/history/"]["get"]["parameters"]}
    assert history["start"]["schema"]["format"] == "date-time"


# Values a fuzzer reaches first: empty, huge, control characters, format strings, times that
# UTC cannot hold, numbers where text goes and text where numbers go.
GARBAGE = [
    "",
    "%",
    "%(x)s%s%d",
    "\x00",
    "x" * 5000,
    "-1",
    "0",
    "99999999999999999999",
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-23:59",
    "2026-01-01T00:00:00+23:59",
    "2026-13-45T99:99:99",
    "ünïcødé/../..",
    "true",
    "[]",
]


def test_no_parameter_of_the_schema_answers_500_to_garbage(viewer_client, cluster):
    """A bounded fuzz of every GET and every query parameter the schema offers (CI runs it
    with the rest; about 600 requests)."""
    paths = _schema(viewer_client)["paths"]
    tried = 0
    for path, operations in paths.items():
        if "get" not in operations or "{" in path:
            continue
        names = [p["name"] for p in operations["get"].get("parameters", [])]
        for name in names:
            for value in GARBAGE:
                response = viewer_client.get(path, {name: value})
                tried += 1
                assert response.status_code < 500, (path, name, value, response.content[:300])
    assert tried > 300


# --- item 5: queue names come from the queue systems' objects --------------------------------


def _volcano_pod(name: str, queue: str):
    from agent.queues.models import QueuePod

    return QueuePod.objects.create(
        namespace="ml",
        name=name,
        uid=f"uid-{name}",
        annotations={"scheduling.volcano.sh/queue-name": queue},
        created="2026-01-01T00:00:00Z",
    )


def _claim_for(name: str, users: list) -> None:
    from agent.queues.models import ResourceClaim

    ResourceClaim.objects.create(
        namespace="ml",
        name=name,
        device_classes=["gpu"],
        allocated=1,
        reserved_for=[{"resource": "pods", "name": p.name, "uid": p.uid} for p in users],
    )


def _install_volcano(*queues: str) -> None:
    from agent.queues.models import QueueObject, QueueSystem

    QueueSystem.objects.create(kind=QueueObject.Kind.VOLCANO_QUEUE, present=True)
    for name in queues:
        QueueObject.objects.create(kind=QueueObject.Kind.VOLCANO_QUEUE, name=name)


@pytest.mark.parametrize("queue", ["team/a", "a/b/c", "/lead", "trail/", "100%", "x?y#z"])
def test_a_queue_name_with_a_slash_or_symbols_links_and_its_pages_open(viewer_client, queue):
    from django.urls import reverse

    from agent.queues import recompute
    from agent.queues.models import Charge

    _claim_for("shared", [_volcano_pod("p1", queue)])
    recompute.recompute(None)
    assert Charge.objects.get(name="shared").queues == [queue]  # demo mode: labels alone

    assert viewer_client.get("/queues/").status_code == 200
    assert viewer_client.get("/queues/claims/resourceclaim/ml/shared/").status_code == 200
    detail = viewer_client.get(reverse("queues:queue", args=[queue]))
    assert detail.status_code == 200
    assert "ml/shared" in detail.content.decode()


def test_in_production_a_pod_naming_a_queue_no_system_defines_is_charged_to_nobody(
    viewer_client, settings
):
    from agent.queues import recompute
    from agent.queues.models import Charge

    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "LABELS_ALONE": False, "DEFAULT_QUEUE": ""}
    _claim_for("grab", [_volcano_pod("p1", "other-team")])
    recompute.recompute(None)

    charge = Charge.objects.get(name="grab")
    assert charge.queues == [] and charge.owner == ""
    assert any("volcano is not installed" in p for p in charge.problems), charge.problems
    html = viewer_client.get("/queues/claims/resourceclaim/ml/grab/").content.decode()
    assert "volcano is not installed" in html
    assert viewer_client.get("/queues/q/other-team/").status_code == 404


def test_in_production_a_queue_the_installed_volcano_defines_is_charged(settings):
    from agent.queues import recompute
    from agent.queues.models import Charge

    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "LABELS_ALONE": False, "DEFAULT_QUEUE": ""}
    _install_volcano("team-x")
    _claim_for("ok", [_volcano_pod("p1", "team-x")])
    _claim_for("typo", [_volcano_pod("p2", "team-y")])
    recompute.recompute(None)

    assert Charge.objects.get(name="ok").queues == ["team-x"]
    typo = Charge.objects.get(name="typo")
    assert typo.queues == [] and "unknown volcano queue 'team-y'" in " ".join(typo.problems)


def test_production_trusts_no_queue_label_alone_and_development_does():
    from tests.test_hardening_settings import PRODUCTION, _settings_in

    (production,) = _settings_in(PRODUCTION, "AKRI_QUEUES['LABELS_ALONE']")
    (development,) = _settings_in({}, "AKRI_QUEUES['LABELS_ALONE']")
    assert (production, development) == ("False", "True")


def test_the_resolvers_name_no_queue_for_an_absent_system_unless_labels_alone_is_on():
    from agent.charges.facts import PodFacts, QueueWorld
    from agent.charges.resolve import resolve

    order = ("kai", "kueue", "volcano")
    for labels in (
        {"kai.scheduler/queue": "q"},
        {"kueue.x-k8s.io/queue-name": "q"},
        {"scheduling.volcano.sh/queue-name": "q"},
    ):
        pod = PodFacts("ns", "p", labels=labels)
        assert resolve(pod, QueueWorld(labels_alone=False), order).queue is None, labels
        assert resolve(pod, QueueWorld(labels_alone=True), order).queue == "q", labels


# --- item 11: a database outage is a 503 "database unavailable", one log line, no traceback --


@pytest.fixture
def database_away(monkeypatch):
    """Every query from here on fails as a PostgreSQL that went away does."""
    from django.db import OperationalError
    from django.db.backends import utils

    def away(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    def switch_off():
        monkeypatch.setattr(utils.CursorWrapper, "_execute_with_wrappers", away)

    return switch_off


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/", "text/html"),
        ("/slots/", "text/html"),
        ("/queues/", "text/html"),
        ("/configurations/default/akri-onvif/", "text/html"),
        ("/api/slots/", "application/json"),
        ("/api/queues/", "application/json"),
        ("/metrics", "text/plain"),
    ],
)
def test_during_a_database_outage_a_page_says_so_with_503_and_no_traceback(
    viewer_client, cluster, database_away, caplog, path, kind
):
    database_away()
    response = viewer_client.get(path)

    assert response.status_code == 503
    assert response["Content-Type"].startswith(kind)
    assert b"database unavailable" in response.content.lower()
    assert b"Traceback" not in response.content and b"closed the connection" not in response.content
    assert response["Retry-After"]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert any("database unavailable" in r.getMessage() for r in caplog.records)


def test_during_a_database_outage_the_webhook_answers_503_without_a_traceback(
    client, database_away, caplog
):
    import json

    from agent.queues import webhook

    database_away()
    response = client.post(
        "/webhooks/pods/validate", json.dumps(POD_REVIEW), content_type="application/json"
    )
    assert response.status_code == 503
    assert response.json() == {"error": "database unavailable"}
    # The fast path (ahead of Django) answers from the database the same way.
    assert webhook.answer(json.dumps(POD_REVIEW).encode(), None, lambda *a: None)[0] == 503
    assert not [r for r in caplog.records if r.exc_info]


def test_other_errors_still_reach_the_error_handler(viewer_client, monkeypatch):
    from akri_site.dashboard.middleware import DatabaseUnavailableMiddleware

    middleware = DatabaseUnavailableMiddleware(lambda request: None)
    assert middleware.process_exception(None, ValueError("not the database")) is None


# --- item 7: sign-in throttling per user and per address, audited, unlocked by an admin -------

LOGIN = "/accounts/login/"


def _sign_in(client, username: str, password: str, address: str):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)


@pytest.fixture
def accounts(settings):
    settings.AXES_FAILURE_LIMIT = 5
    for name in ("vera", "otto"):
        user = User.objects.create_user(name, password=f"right-{name}-pw")
        user.groups.add(Group.objects.get(name="viewer"))


def _signed_in(response) -> bool:
    return response.status_code == 302 and response["Location"] == "/"


def test_wrong_passwords_lock_the_user_out_from_every_address(client, accounts):
    from agent.models import AuditEntry

    for i in range(4):
        assert _sign_in(client, "vera", f"wrong-{i}", f"10.0.0.{i + 1}").status_code == 200
    # The fifth wrong password locks (AXES_FAILURE_LIMIT), then even the right one is refused.
    assert _sign_in(client, "vera", "wrong-4", "10.0.0.5").status_code == 429
    locked = _sign_in(client, "vera", "right-vera-pw", "10.9.9.9")

    assert locked.status_code == 429
    assert "Sign-in locked" in locked.content.decode()
    assert "_auth_user_id" not in client.session
    entry = AuditEntry.objects.get(action="sign-in locked out")
    assert entry.username == "vera" and entry.outcome == "refused"
    # Another user from another address is not affected.
    assert _signed_in(_sign_in(client, "otto", "right-otto-pw", "10.8.8.8"))


def test_wrong_passwords_from_one_address_lock_that_address_for_every_user(client, accounts):
    for i in range(5):
        _sign_in(client, f"guess-{i}", "wrong", "10.1.1.1")

    assert _sign_in(client, "otto", "right-otto-pw", "10.1.1.1").status_code == 429
    assert _signed_in(_sign_in(client, "otto", "right-otto-pw", "10.2.2.2"))


def test_the_right_password_before_the_limit_signs_in_and_clears_the_count(client, accounts):
    from axes.models import AccessAttempt

    for i in range(4):
        _sign_in(client, "vera", f"wrong-{i}", "10.0.0.1")
    assert _signed_in(_sign_in(client, "vera", "right-vera-pw", "10.0.0.1"))
    assert not AccessAttempt.objects.filter(username="vera").exists()


def test_an_admin_unlocks_a_user_in_the_admin_and_the_unlock_is_audited(client, accounts):
    from axes.models import AccessAttempt

    from agent.models import AuditEntry

    for i in range(5):
        _sign_in(client, "vera", f"wrong-{i}", "10.0.0.1")
    assert _sign_in(client, "vera", "right-vera-pw", "10.0.0.1").status_code == 429

    boss = User.objects.create_user("boss", is_staff=True)
    boss.groups.add(Group.objects.get(name="admin"))
    admin = type(client)()
    admin.force_login(boss)
    listing = admin.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200 and "vera" in listing.content.decode()
    ids = [str(pk) for pk in AccessAttempt.objects.values_list("pk", flat=True)]
    confirm = admin.post(
        "/admin/axes/accessattempt/",
        {"action": "delete_selected", "_selected_action": ids, "post": "yes"},
    )
    assert confirm.status_code == 302

    assert not AccessAttempt.objects.exists()
    assert AuditEntry.objects.filter(action="sign-in unlocked", username="vera").exists()
    assert _signed_in(_sign_in(client, "vera", "right-vera-pw", "10.0.0.1"))


def test_a_viewer_cannot_see_or_lift_lockouts(viewer_client):
    assert viewer_client.get("/admin/axes/accessattempt/").status_code in (302, 403)


@pytest.mark.parametrize(
    "form",
    [
        {},
        {"username": "vera"},
        {"username": "x" * 5000, "password": "y"},
        {"username": "\u202evera", "password": "right-vera-pw"},
        {"username": ["a", "b"], "password": "p"},
    ],
)
def test_a_garbage_sign_in_form_is_a_plain_answer_and_signs_nobody_in(client, accounts, form):
    response = client.post(LOGIN, form, REMOTE_ADDR="10.3.3.3")

    assert response.status_code in (200, 400, 429)
    assert "_auth_user_id" not in client.session


# --- item 8: API tokens hashed, shown once, expiring ----------------------------------------


@pytest.fixture
def bot():
    user = User.objects.create_user("round2-bot")
    user.groups.add(Group.objects.get(name="viewer"))
    return user


def test_an_expired_token_is_a_401_that_says_so(client, bot):
    from datetime import timedelta

    from akri_site.dashboard import tokens

    row, key = tokens.issue(bot, "ci", days=1)
    assert client.get("/api/nodes/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    row.expires_at = row.created_at - timedelta(seconds=1)
    row.save()

    response = client.get("/api/nodes/", HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_tokens_expire_by_default_and_record_their_last_use(client, bot, settings):
    from akri_site.dashboard import tokens
    from akri_site.dashboard.models import ApiToken

    settings.AKRI_API_TOKEN_DAYS = 30
    row, key = tokens.issue(bot)
    assert 29 <= (row.expires_at - row.created_at).days <= 30
    assert row.last_used_at is None
    client.get("/api/nodes/", HTTP_AUTHORIZATION=f"Token {key}")
    assert ApiToken.objects.get(pk=row.pk).last_used_at is not None


@pytest.mark.parametrize(
    "header",
    [
        "Token",
        "Token a b",
        "Token " + "x" * 10000,
        "Token ünïcødé",
        "Token %00",
        "Token \ud800",
        "Bearer abc",
    ],
)
def test_a_garbage_token_header_is_a_401_and_changes_nothing(client, bot, header):
    from akri_site.dashboard import tokens
    from akri_site.dashboard.models import ApiToken

    row, _ = tokens.issue(bot)
    before = list(ApiToken.objects.values())
    try:
        response = client.get("/api/nodes/", HTTP_AUTHORIZATION=header)
    except UnicodeEncodeError:  # the test client cannot send a lone surrogate; no server can
        return
    assert response.status_code == 401
    assert list(ApiToken.objects.values()) == before


def test_the_migration_hashes_old_clear_tokens_and_deletes_them(client, bot):
    import importlib

    from django.apps import apps
    from rest_framework.authtoken.models import Token

    from akri_site.dashboard.models import ApiToken
    from akri_site.dashboard.tokens import digest

    old = Token.objects.create(user=bot)
    migration = importlib.import_module("akri_site.dashboard.migrations.0002_hash_old_tokens")
    migration.hash_old_tokens(apps, None)

    assert not Token.objects.exists()
    row = ApiToken.objects.get(user=bot)
    assert row.digest == digest(old.key) and row.expires_at is not None
    assert client.get("/api/nodes/", HTTP_AUTHORIZATION=f"Token {old.key}").status_code == 200


def test_the_command_refuses_a_negative_expiry(bot):
    from django.core.management import CommandError, call_command

    from akri_site.dashboard.models import ApiToken

    with pytest.raises(CommandError, match="--days"):
        call_command("apitoken", "round2-bot", "--days", "-1")
    assert not ApiToken.objects.exists()


# --- item 9: deploy/'s settings: the port-forward signs in, /metrics ships protected -------


@pytest.fixture
def deployed_web(tmp_path):
    """runweb with the ConfigMap of deploy/ (production), over plain HTTP on a free port."""
    yield from _deployed_runweb(tmp_path, [])


def _deployed_runweb(tmp_path, extra: list[str], scheme: str = "http"):
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from tests.test_deploy_startup import STRONG_KEY, config_env
    from tests.test_web_serving import ROOT, free_port, manage

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AKRI_", "DJANGO_"))}
    env.pop("DATABASE_URL", None)
    env.update(config_env())
    env.update(
        SECRET_KEY=STRONG_KEY,
        DATABASE_URL=f"sqlite:///{tmp_path / 'web.sqlite3'}",
        REDIS_URL=os.environ.get("AKRI_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0",
        METRICS_TOKEN="scrape-token-round2",
        LOG_LEVEL="WARNING",
    )
    assert manage(env, "migrate", "-v0").returncode == 0
    made = manage(
        env,
        "shell",
        "-c",
        "from django.contrib.auth.models import User, Group; "
        "u = User.objects.create_user('vic', password='pw-for-tests-1'); "
        "u.groups.add(Group.objects.get(name='viewer'))",
    )
    assert made.returncode == 0, made.stderr
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runweb", "--workers", "1", "--port", str(port), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    try:
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if scheme == "https":  # the webhook listener: up once it takes a connection
                    socket.create_connection(("127.0.0.1", port), timeout=2).close()
                    break
                probe = urllib.request.Request(
                    f"http://127.0.0.1:{port}/healthz", headers={"Host": f"localhost:{port}"}
                )
                with urllib.request.urlopen(probe, timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "runweb did not answer within 60 s"
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_readme_port_forward_signs_in_over_plain_http(deployed_web):
    import asyncio
    import re

    import aiohttp

    async def scenario() -> None:
        base = f"http://localhost:{deployed_web}"
        # A browser keeps Secure cookies on http://localhost (a secure context); so does this.
        jar = aiohttp.CookieJar(unsafe=True, treat_as_secure_origin=[base])
        async with aiohttp.ClientSession(base, cookie_jar=jar) as session:
            async with session.get("/accounts/login/", allow_redirects=False) as page:
                assert page.status == 200, page.headers.get("Location")
                token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', await page.text())
            form = {"username": "vic", "password": "pw-for-tests-1"}
            form["csrfmiddlewaretoken"] = token.group(1)
            headers = {"Origin": base, "Referer": f"{base}/accounts/login/"}
            async with session.post(
                "/accounts/login/", data=form, headers=headers, allow_redirects=False
            ) as answer:
                assert answer.status == 302, await answer.text()
                assert answer.headers["Location"] == "/"
            async with session.get("/", allow_redirects=False) as overview:
                assert overview.status == 200
            # /metrics wants the Secret's token.
            async with session.get("/metrics") as bare:
                assert bare.status == 401
            auth = {"Authorization": "Bearer scrape-token-round2"}
            async with session.get("/metrics", headers=auth) as scraped:
                assert scraped.status == 200
            # The pages' port serves no admission webhook (the ingress exposes this port).
            review = json.dumps(POD_REVIEW).encode()
            async with session.post("/webhooks/pods/validate", data=review) as hook:
                assert hook.status == 404

    asyncio.run(scenario())


@pytest.fixture
def webhook_listener(tmp_path):
    import subprocess

    key, cert = tmp_path / "tls.key", tmp_path / "tls.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    args = ["--webhook", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    yield from _deployed_runweb(tmp_path, args, scheme="https")


def test_the_webhook_listener_serves_the_webhook_and_nothing_else(webhook_listener):
    import asyncio

    import aiohttp

    async def scenario() -> None:
        base = f"https://127.0.0.1:{webhook_listener}"
        async with aiohttp.ClientSession(base, connector=aiohttp.TCPConnector(ssl=False)) as s:
            review = json.dumps(POD_REVIEW).encode()
            async with s.post("/webhooks/pods/validate", data=review) as hook:
                assert hook.status == 200
                assert (await hook.json())["response"]["uid"] == POD_REVIEW["request"]["uid"]
            for path in ("/", "/accounts/login/", "/admin/", "/api/slots/", "/metrics"):
                async with s.get(path, allow_redirects=False) as other:
                    assert other.status == 404, path

    asyncio.run(scenario())


def test_the_webhook_listener_refuses_plain_http():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="TLS"):
        call_command("runweb", "--webhook", "--workers", "1", "--port", "1")


# --- item 6: refusal rows collapsed and bounded --------------------------------------------


def _refusal(n: int = 0, **fields):
    from django.utils import timezone

    from agent.queues.models import Refusal

    base = dict(operation="CREATE", resource="pods", namespace="ml", name="forged", rule="opt-out")
    return Refusal(at=timezone.now(), message="refused", **{**base, **fields})


def test_a_flood_of_the_same_refusal_is_one_row_with_its_count(viewer_client):
    from django.utils import timezone

    from agent.queues import fastpath, queries
    from agent.queues.models import Refusal

    rows = [_refusal() for _ in range(300)] + [_refusal(name="other")]
    Refusal.objects.bulk_create(fastpath.collapse(rows))

    assert Refusal.objects.count() == 2
    assert Refusal.objects.get(name="forged").repeats == 300
    groups = queries.refusal_groups(timezone.now() - timezone.timedelta(hours=1))
    assert groups["total"] == 301
    assert groups["groups"][0]["count"] == 301
    assert viewer_client.get("/queues/").status_code == 200


def test_refusals_beyond_the_bound_are_pruned_oldest_first(settings):
    from datetime import timedelta

    from django.utils import timezone

    from agent.queues import history
    from agent.queues.models import Refusal

    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "REFUSALS_MAX": 100}
    now = timezone.now()
    Refusal.objects.bulk_create([_refusal(name=f"p{i}") for i in range(250)])
    # Distinct times, p0 the oldest.
    for i, pk in enumerate(Refusal.objects.order_by("id").values_list("pk", flat=True)):
        Refusal.objects.filter(pk=pk).update(at=now - timedelta(seconds=250 - i))

    assert history.prune_samples(now) == 150
    names = set(Refusal.objects.values_list("name", flat=True))
    assert len(names) == 100 and "p249" in names and "p149" not in names and "p150" in names
    assert history.prune_samples(now) == 0


def test_a_user_lists_makes_and_revokes_their_own_tokens(viewer_client, client, bot):
    from akri_site.dashboard import tokens
    from akri_site.dashboard.models import ApiToken
    from akri_site.dashboard.tokens import digest

    others, _ = tokens.issue(bot, "not yours")
    made = viewer_client.post("/accounts/tokens/", {"action": "create", "name": "laptop"})

    assert made.status_code == 201
    key = made.context["new_key"]
    mine = ApiToken.objects.get(digest=digest(key))
    assert mine.name == "laptop" and mine.user.username == "round2-viewer"
    listing = viewer_client.get("/accounts/tokens/").content.decode()
    assert "laptop" in listing and key not in listing and "not yours" not in listing
    assert client.get("/api/nodes/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200

    gone = viewer_client.post("/accounts/tokens/", {"action": "revoke", "token": mine.pk})
    assert gone.status_code == 302
    assert not ApiToken.objects.filter(pk=mine.pk).exists()
    assert client.get("/api/nodes/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401


@pytest.mark.parametrize(
    "form",
    [
        {},
        {"action": "delete-everything"},
        {"action": "revoke"},
        {"action": "revoke", "token": "x"},
        {"action": "revoke", "token": "-1"},
        {"action": "revoke", "token": "OTHER"},
        {"action": "create", "days": "-5"},
        {"action": "create", "days": "nan"},
        {"action": "create", "name": "n" * 500},
    ],
)
def test_garbage_on_the_tokens_page_is_a_400_and_changes_nothing(viewer_client, bot, form):
    from akri_site.dashboard import tokens
    from akri_site.dashboard.models import ApiToken

    others, _ = tokens.issue(bot, "not yours")
    form = {k: (str(others.pk) if v == "OTHER" else v) for k, v in form.items()}
    before = list(ApiToken.objects.values())

    response = viewer_client.post("/accounts/tokens/", form)

    assert response.status_code == 400
    assert list(ApiToken.objects.values()) == before


def test_the_tokens_page_needs_a_signed_in_user_with_a_role(client):
    assert client.get("/accounts/tokens/").status_code == 302
    nobody = User.objects.create_user("no-role")
    client.force_login(nobody)
    assert client.post("/accounts/tokens/", {"action": "create"}).status_code == 403
