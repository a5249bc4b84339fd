"""``manage.py demo`` as a newcomer meets it: the port, the password, the console, signing out.

The command tests run the demo in a process of its own, on SQLite in a private ``AKRI_VAR_DIR``
(nothing shared with the test database or a demo someone else is running), and read what it
prints with a bound on every wait.
"""

from __future__ import annotations

import http.cookiejar
import io
import logging
import os
import queue
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agent.demo_support import (
    CREDENTIALS_FILE,
    activity_line,
    demo_password,
    forget_previous_cluster,
    port_problem,
)
from agent.models import Configuration, Instance, SlotEvent, SyncState

ROOT = Path(__file__).resolve().parents[1]
BANNER_TIMEOUT = 120.0  # a loaded 2-core machine starts three nodes and Daphne in ~10 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_environ(var_dir: Path) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environ.pop("AKRI_SQLITE_PATH", None)
    environ.pop("LOG_LEVEL", None)
    environ["AKRI_VAR_DIR"] = str(var_dir)
    return environ


class Demo:
    """``manage.py demo`` in a subprocess; its stdout lines arrive on a queue."""

    def __init__(self, var_dir: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "demo", *args],
            cwd=ROOT,
            env=demo_environ(var_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.process.stdout, self.lines.put)).start()
        threading.Thread(target=self._pump, args=(self.process.stderr, self.stderr.append)).start()

    @staticmethod
    def _pump(stream, put) -> None:
        for line in stream:
            put(line)

    def wait_for_line(self, pattern: str, timeout: float = BANNER_TIMEOUT) -> re.Match:
        deadline = time.monotonic() + timeout
        seen = []
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                assert self.process.poll() is None, f"demo exited: {seen} {self.stderr}"
                continue
            seen.append(line)
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"no line like {pattern!r} in {timeout}s: {seen} {self.stderr}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def migrate(var_dir: Path) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=demo_environ(var_dir),
        check=True,
        capture_output=True,
        timeout=300,
    )


def can_sign_in(port: int, username: str, password: str) -> bool:
    """Sign in through the dashboard's form, as a browser would; True when it lets us in."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    url = f"http://127.0.0.1:{port}/accounts/login/"
    page = opener.open(url, timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = {"csrfmiddlewaretoken": token, "username": username, "password": password, "next": "/"}
    request = urllib.request.Request(url, urllib.parse.urlencode(form).encode(), method="POST")
    request.add_header("Referer", url)
    response = opener.open(request, timeout=30)
    return urllib.parse.urlsplit(response.url).path == "/"


# --- the port ---------------------------------------------------------------------------------
def test_a_taken_port_stops_the_demo_before_it_prints_a_url_or_a_login(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "manage.py", "demo", "--port", str(port)],
            cwd=ROOT,
            env=demo_environ(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()}" in result.stderr
    assert re.search(r"scripts/demo --port \d+", result.stderr)
    assert "http://" not in result.stderr and "admin /" not in result.stderr
    # Nothing was set up either: no password was made for a demo that never ran.
    assert not (tmp_path / CREDENTIALS_FILE).exists()


def test_port_problem_is_none_for_a_free_port_and_names_the_holder_of_a_taken_one():
    port = free_port()
    assert port_problem("127.0.0.1", port) is None
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        problem = port_problem("127.0.0.1", port)
    assert problem.startswith(f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()}")
    assert "pytest" in problem or "python" in problem
    assert "unknown host" in port_problem("no-such-host.invalid", port)


# --- the password -----------------------------------------------------------------------------
def test_the_demo_password_is_kept_private_and_stable_until_reset(tmp_path):
    first = demo_password(tmp_path)
    path = tmp_path / CREDENTIALS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert demo_password(tmp_path) == first
    new = demo_password(tmp_path, reset=True)
    assert new != first and demo_password(tmp_path) == new
    assert demo_password(tmp_path, given="chosen-pw") == "chosen-pw"
    assert demo_password(tmp_path) == "chosen-pw"
    path.chmod(0o644)
    path.write_text("{not json")
    replaced = demo_password(tmp_path)
    assert replaced not in ("", "chosen-pw")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_demo_keeps_its_login_across_a_restart_and_allocates_after_it(tmp_path):
    migrate(tmp_path)
    passwords = []
    for run in range(2):
        port = free_port()
        demo = Demo(tmp_path, "--port", str(port), "--nodes", "1", "--pace", "0.2")
        try:
            passwords.append(demo.wait_for_line(r"sign in\s+admin / (\S+)").group(1))
            assert can_sign_in(port, "operator", passwords[-1])
            if run == 1:
                # The previous run's cache is gone: pods get their slots (before, every
                # Allocate after a restart was refused with "Instance ... is gone").
                time.sleep(3)
                assert not [line for line in demo.stderr if "refused" in line], demo.stderr
        finally:
            assert demo.stop() == 0
        assert stat.S_IMODE((tmp_path / CREDENTIALS_FILE).stat().st_mode) == 0o600
    assert passwords[0] == passwords[1]


# --- the console ------------------------------------------------------------------------------
def test_the_activity_line_is_short_and_says_when_nothing_happened():
    assert activity_line("12:03:10", 3, 8, {}) == ("12:03:10  3 of 8 slots held; last 30s: nothing")
    assert activity_line("12:03:40", 5, 8, {"release": 1, "allocate": 3}).endswith(
        "last 30s: 3 allocate, 1 release"
    )


@pytest.mark.django_db
def test_a_403_is_logged_in_one_line_without_a_traceback(client):
    console = next(h for h in logging.getLogger().handlers if h.name == "console")
    output = io.StringIO()
    previous = console.setStream(output)
    try:
        client.force_login(User.objects.create_user("norole"))
        response = client.get("/")
    finally:
        console.setStream(previous)
    assert response.status_code == 403
    text = output.getvalue()
    assert "Forbidden (Permission denied): /" in text
    assert "Traceback" not in text and "PermissionDenied" not in text


@pytest.mark.django_db
def test_a_server_error_keeps_its_traceback():
    from akri_site.logs import ClientErrorsWithoutTraceback

    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("django.request", logging.ERROR, "", 0, "x", (), sys.exc_info())
    record.status_code = 500
    assert ClientErrorsWithoutTraceback().filter(record) and record.exc_info is not None
    record.status_code = 403
    assert ClientErrorsWithoutTraceback().filter(record) and record.exc_info is None


# --- the previous run -------------------------------------------------------------------------
@pytest.mark.django_db
def test_forgetting_the_previous_cluster_keeps_the_history():
    Configuration.objects.create(namespace="default", name="c", resource_version="900")
    Instance.objects.create(namespace="default", name="c-1", configuration_name="c")
    SyncState.objects.create(owner="cluster", kind="instances", resource_version="900")
    SlotEvent.objects.create(at=timezone.now(), namespace="default", instance="c-1", slot="c-1-0")

    assert forget_previous_cluster() >= 3

    assert not Configuration.objects.exists() and not Instance.objects.exists()
    assert not SyncState.objects.exists()
    assert SlotEvent.objects.count() == 1


# --- signing out ------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("logout_url", ["/accounts/logout/", "/admin/logout/"])
def test_signing_out_redirects_to_the_dashboards_sign_in_page(client, logout_url):
    client.force_login(User.objects.create_superuser("ada"))
    response = client.post(logout_url)
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?signed_out=1"
    page = client.get(response["Location"])
    assert "You are signed out." in page.content.decode()
    assert client.get("/").status_code == 302  # signed out for real
