"""Production settings refuse an insecure setup and pass ``check --deploy`` (issue #12, item 2).

Each case starts ``manage.py`` in a subprocess with an environment of its own: settings are
read once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STRONG = "b7Qe2kN9xV4mR8tY1pL6sD3fG5hJ0wZcAqEuIoPaSdFgHjKlZxCvBnM"
DEV_KEY = "akri-site-insecure-development-key-change-me"
# A database that is never connected to: configuration checks need none.
PRODUCTION = {
    "DATABASE_URL": "postgres://akri@db.invalid:5432/akri",
    "SECRET_KEY": STRONG,
    "ALLOWED_HOSTS": "akri.example.com",
    "METRICS_TOKEN": "scrape-token-for-tests",
}
CLEARED = (
    "DATABASE_URL",
    "REDIS_URL",
    "AKRI_ENV",
    "SECRET_KEY",
    "SECRET_KEY_FILE",
    "DEBUG",
    # Set for the test process only (Playwright); production never sets it.
    "DJANGO_ALLOW_ASYNC_UNSAFE",
    "AKRI_WEB_PROCESS",
)


def manage(*args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(overrides)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_in_the_production_configuration():
    done = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"SECRET_KEY": ""}, "SECRET_KEY must be set"),
        ({"SECRET_KEY": "abc"}, "SECRET_KEY is too weak"),
        ({"SECRET_KEY": "a" * 60}, "SECRET_KEY is too weak"),
        ({"SECRET_KEY": DEV_KEY}, "SECRET_KEY is a publicly known development key"),
        ({"DEBUG": "true"}, "DEBUG=true is refused in production"),
    ],
)
def test_production_refuses_to_start_insecurely_with_one_line(overrides, message):
    done = manage("check", **{**PRODUCTION, **overrides})

    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"akri-site: configuration error: {message}"), line


def test_a_garbage_gc_freeze_setting_stops_start_up_with_one_line():
    done = manage("check", AKRI_CONTROLLER_GC_FREEZE="sometimes")

    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        "akri-site: configuration error: AKRI_CONTROLLER_GC_FREEZE='sometimes' is not a boolean "
        "(use one of: true, false, 1, 0, yes, no)"
    ), line


def test_redis_alone_means_production_too():
    done = manage("check", REDIS_URL="redis://127.0.0.1:6379/2")

    assert done.returncode == 1
    assert "SECRET_KEY must be set" in done.stderr


def test_a_secret_may_come_from_a_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(STRONG + "\n")
    overrides = {**PRODUCTION, "SECRET_KEY_FILE": str(secret)}
    del overrides["SECRET_KEY"]

    done = manage("check", **overrides)

    assert done.returncode == 0, done.stderr


def test_the_embedded_default_still_starts_with_the_development_key():
    done = manage("check")

    assert done.returncode == 0, done.stderr


def test_an_explicit_development_flag_allows_postgres_without_a_secret():
    done = manage("check", DATABASE_URL=PRODUCTION["DATABASE_URL"], AKRI_ENV="development")

    assert done.returncode == 0, done.stderr


def _settings_in(env: dict[str, str], *names: str) -> list[str]:
    code = "from django.conf import settings; " + "; ".join(
        f"print(repr(settings.{name}))" for name in names
    )
    done = manage("shell", "--no-imports", "-c", code, **env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()


@pytest.mark.parametrize("header", ["X-Forwarded-Proto", "HTTP_X_FORWARDED_PROTO"])
def test_the_proxy_ssl_header_is_named_in_the_environment(header):
    (value,) = _settings_in(
        {**PRODUCTION, "SECURE_PROXY_SSL_HEADER": header}, "SECURE_PROXY_SSL_HEADER"
    )

    assert value == "('HTTP_X_FORWARDED_PROTO', 'https')"


def test_production_turns_on_https_rules_that_development_leaves_off():
    names = ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT")

    assert _settings_in(PRODUCTION, *names, "SECURE_HSTS_SECONDS") == [
        "True",
        "True",
        "True",
        "31536000",
    ]
    assert _settings_in({}, *names, "SECURE_HSTS_SECONDS") == ["False", "False", "False", "0"]


def test_the_web_bounds_its_database_connections_with_a_pool_and_the_others_do_not():
    """Under ASGI each request has a thread of its own; persistent connections stayed with
    them until PostgreSQL ran out (issue 29 §2). The web's processes use a bounded pool."""
    web = {**PRODUCTION, "AKRI_WEB_PROCESS": "true"}
    (options, age) = _settings_in(
        web, "DATABASES['default']['OPTIONS']", "DATABASES['default']['CONN_MAX_AGE']"
    )
    assert "'pool': {'min_size': 1, 'max_size': 4, 'timeout': 10}" in options
    assert age == "0"
    (sized,) = _settings_in(
        {**web, "AKRI_WEB_DB_CONNECTIONS": "8"}, "DATABASES['default']['OPTIONS']['pool']"
    )
    assert "'max_size': 8" in sized
    (other,) = _settings_in(PRODUCTION, "DATABASES['default'].get('OPTIONS', {})")
    assert "pool" not in other
    refused = manage("check", **{**web, "AKRI_WEB_DB_CONNECTIONS": "0"})
    assert refused.returncode != 0
    assert "AKRI_WEB_DB_CONNECTIONS" in refused.stderr
