"""What ``manage.py demo`` does around the cluster: its first five minutes, as a newcomer meets them.

- the port is checked before anything is printed, and a taken port names its holder (psutil)
  and how to pick another;
- the demo users' password is kept in ``var/`` (mode 0600) so that it stays the same from one
  run to the next, until ``--reset-password`` asks for a new one;
- the console shows warnings and a short activity line, not the full INFO log (``--verbose``
  or ``LOG_LEVEL`` bring it back), so that the banner printed once everything listens stays
  readable.

Plain functions, so that each can be tested without starting a cluster.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

CREDENTIALS_FILE = "demo-credentials.json"
ACTIVITY_INTERVAL = 30.0


# --- the port ---------------------------------------------------------------------------------
def port_problem(host: str, port: int) -> str | None:
    """Why the demo cannot listen on ``host:port``, or None when it can."""
    try:
        family, address = _bind_address(host, port)
    except socket.gaierror as exc:
        return f"cannot listen on {host}:{port}: unknown host ({exc.strerror})"
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As the web server sets it: a port left in TIME_WAIT by a previous run is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"port {port} on {host} is already in use{_holder(port)}"
        return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


def _bind_address(host: str, port: int) -> tuple[int, tuple]:
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return family, address


def _holder(port: int) -> str:
    """`` by pid N (command, user U)`` for the process listening on ``port``, when visible."""
    try:
        pids = {
            c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        }
    except (psutil.AccessDenied, OSError):
        pids = set()
    pids.discard(None)
    if not pids:
        return " (by a process this user cannot see)"
    described = []
    for pid in sorted(pids):
        try:
            process = psutil.Process(pid)
            command = " ".join(process.cmdline()) or process.name()
            described.append(f"pid {pid} ({_shorten(command)}, user {process.username()})")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            described.append(f"pid {pid}")
    return " by " + ", ".join(described)


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def free_port_near(host: str, port: int, tries: int = 50) -> int | None:
    """The first port after ``port`` the demo could listen on."""
    for candidate in range(port + 1, min(port + 1 + tries, 65536)):
        if port_problem(host, candidate) is None:
            return candidate
    return None


def wait_until_listening(
    host: str, port: int, stop: threading.Event, timeout: float = 120.0
) -> bool:
    """True once something accepts connections on ``host:port`` (False on stop or timeout)."""
    connect_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((connect_host, port), 1):
            return True
        stop.wait(0.1)
    return False


# --- the previous run's cache -------------------------------------------------------------------
def forget_previous_cluster() -> int:
    """Delete the cache of the previous run's simulated cluster; returns the rows deleted.

    Every run starts a new API-server simulator whose resourceVersions start again from 1, so
    the previous run's rows would look newer than everything the new cluster says (the cache
    and the agents ignore older versions, and Allocates failed with "Instance is gone") and
    its watch bookmarks would point into the future. History (slot events, reconciliation
    runs, audit) stays: it is append-only.
    """
    from agent.models import Configuration, Instance, Node, Pod, SlotPodBinding, SyncState

    deleted = 0
    for model in (SlotPodBinding, Pod, Instance, Configuration, Node, SyncState):
        deleted += model.objects.all().delete()[0]
    return deleted


# --- the demo users' password -----------------------------------------------------------------
def demo_password(var_dir: Path, *, given: str | None = None, reset: bool = False) -> str:
    """The password of the demo users: ``given``, else the stored one, else a new one.

    Whatever is returned is stored (mode 0600) for the next run. A stored file that cannot be
    read is replaced by a new password, never a crash.
    """
    path = var_dir / CREDENTIALS_FILE
    password = given or (None if reset else _read_password(path))
    if password is None:
        password = secrets.token_urlsafe(9)
    _write_private(path, json.dumps({"password": password}) + "\n")
    return password


def _read_password(path: Path) -> str | None:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    password = stored.get("password") if isinstance(stored, dict) else None
    return password if isinstance(password, str) and password else None


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a umask or a leftover file must not widen it
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)


# --- the console ------------------------------------------------------------------------------
def quiet_console(verbose: bool) -> bool:
    """Warnings only on the console unless ``verbose`` or ``LOG_LEVEL`` asks for more.

    Quiet, the console also leaves out what is news to no one running the demo: a visitor's
    4xx (Django logs each at WARNING; the visitor sees the page), the web server's two INFO
    lines per websocket, and Allocates refused because another node took the slot first (the
    demo's pods race for the last free slots by design: counted on the activity line instead,
    see ``ExpectedRaces``). Server errors and every other warning still show.
    """
    if verbose or os.environ.get("LOG_LEVEL"):
        return False
    from django.conf import settings

    # In the settings too: loading the ASGI application runs django.setup(), which configures
    # logging again from them.
    settings.LOGGING.setdefault("root", {})["level"] = "WARNING"
    loggers = settings.LOGGING.setdefault("loggers", {})
    loggers["django.request"] = {"level": "ERROR"}  # 5xx are ERROR, and still show
    loggers["uvicorn.error"] = {"level": "WARNING"}  # "connection open" / "closed"
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("django.request").setLevel(logging.ERROR)
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    logging.getLogger("agent.node.plugin").addFilter(EXPECTED_RACES)
    return True


class ExpectedRaces(logging.Filter):
    """Counts, instead of printing, the warnings of Allocates refused because the slot was
    held by another node meanwhile: in the demo several nodes' pods race for the last free
    slots, and the kubelet offers the pod another slot or retries. Any other refusal passes."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or "Allocate" not in str(record.msg):
            return True
        if "held by" not in record.getMessage():
            return True
        with self._lock:
            self._count += 1
        return False

    def take(self) -> int:
        """The refusals counted since the last call."""
        with self._lock:
            count, self._count = self._count, 0
        return count


EXPECTED_RACES = ExpectedRaces()


def activity_line(
    now_text: str, held: int, total: int, causes: dict[str, int], races: int = 0
) -> str:
    """One short line: slots held now, and slot events by cause since the last line."""
    happened = ", ".join(f"{n} {cause}" for cause, n in sorted(causes.items())) or "nothing"
    line = f"{now_text}  {held} of {total} slots held; last {ACTIVITY_INTERVAL:g}s: {happened}"
    if races:
        line += (
            f"; {races} Allocate{'s' if races != 1 else ''} refused because another node took"
            " the slot first (the demo's pods race for the last slots; expected)"
        )
    return line


def current_activity(since: object) -> tuple[int, int, dict[str, int]]:
    """(slots held, slots, slot events by cause since ``since``) from the cache."""
    from django.db.models import Count

    from agent.models import Slot, SlotEvent

    total = Slot.objects.count()
    held = Slot.objects.exclude(level=Slot.Level.FREE).count()
    causes = dict(
        SlotEvent.objects.filter(at__gte=since)
        .values_list("cause")
        .annotate(n=Count("id"))
        .values_list("cause", "n")
    )
    return held, total, causes


def report_activity(write: Callable[[str], None], stop: threading.Event) -> None:
    """Every ACTIVITY_INTERVAL seconds, one activity line until ``stop``."""
    from django.db import connection
    from django.utils import timezone

    since = timezone.now()
    while not stop.wait(ACTIVITY_INTERVAL):
        now = timezone.now()
        try:
            held, total, causes = current_activity(since)
        except Exception as exc:  # noqa: BLE001 - a busy database skips one line, no more
            logging.getLogger(__name__).warning("activity line skipped: %s", exc)
            continue
        finally:
            connection.close()
        since = now
        moment = timezone.localtime(now).strftime("%H:%M:%S")
        write(activity_line(moment, held, total, causes, EXPECTED_RACES.take()))
