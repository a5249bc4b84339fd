"""The dashboard's websocket: a snapshot on connect, then deltas from ``live.py``.

Frames from the browser (JSON objects with a ``type``):

* ``{"type": "ping"}`` -> ``{"type": "pong", "sync": {...}, "at": ...}`` (cache freshness too,
  so a quiet feed on a stopped controller is shown as stale, not as live);
* ``{"type": "subscribe", "view": "slots", "filters": {"node": "n1", ...}}`` -> a new snapshot
  narrowed to those filters (the slot map's filters; ``view`` is slots/overview/runs);
* ``{"type": "refresh"}`` -> a new snapshot (sent unasked too, when a ``live.delta`` says
  ``reload``: a relist changed more Instances than their rows are worth sending).

Anything else (binary, not JSON, nested too deep, not an object, an unknown type, a bad
filter) gets an ``{"type": "error"}`` frame and closes *this* socket with code 4400; other
sockets carry on. Anonymous users and users without a role are refused before the handshake
completes (4403);
so is everyone while the channel layer cannot be reached (1013: the page retries).

Reconciliation runs are written by processes that do not publish to the channel layer (each
node's agent, in its own database or this one; the cluster pass in a Celery worker), so the
web process watches for them itself: one ``RunWatch`` per process polls the history every
``RUN_POLL_SECONDS`` while a socket of a view that shows runs (the overview, the history, a
run, the audit log) is open, and sends what is new or changed to those sockets as a delta.

An open socket does not outlive what let it in: the user is checked again before every frame
from the browser is answered and every ``AKRI_WS_RECHECK_SECONDS`` (the session still exists
and still names an active user with a role). The socket is closed with 4401 when the session
has ended (signed out, expired, password changed, user deactivated) and with 4403 when the
user's role was taken away; an ``{"type": "error"}`` frame says which first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from importlib import import_module
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qsl

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user
from django.core.paginator import Paginator
from django.db import DatabaseError
from django.db.models import Q
from django.utils import timezone

from agent.metrics import WEBSOCKET_CLIENTS
from agent.models import Instance, ReconcileRun
from akri_site.dashboard import queries
from akri_site.dashboard.access import can_release, can_view
from akri_site.dashboard.forms import SlotFilterForm
from akri_site.dashboard.fragments import instances_html, runs_html
from akri_site.dashboard.live import LIVE_GROUP
from akri_site.dashboard.slotmap import PAGE, iso, matching, narrow, page_of, summary

log = logging.getLogger(__name__)

CLOSE_BAD_FRAME = 4400
CLOSE_SIGNED_OUT = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_UNAVAILABLE = 1013  # "try again later": the channel layer cannot be reached
MAX_FRAME = 16 * 1024
SNAPSHOT_RUNS = 20


# Views whose pages show reconciliation runs (the overview's last run, the history, a run).
RUN_VIEWS = ("overview", "runs")
RUN_POLL_SECONDS = 2.0
# A run row is written when it starts and again when it finishes: rows seen this recently are
# read again, and sent again when their counts changed.
RUN_RECENT_SECONDS = 180.0
RUN_POLL_LIMIT = 200


class RunWatch:
    """This process's watch on the reconciliation history, for its live sockets.

    One query every ``RUN_POLL_SECONDS`` while at least one socket listens (none otherwise),
    whatever the number of sockets: the new rows, and the recent ones again. A process that
    publishes a run itself (``live.publish_run``) may send it twice; the page replaces a run's
    row by id, so that is harmless.
    """

    def __init__(self, interval: float = RUN_POLL_SECONDS) -> None:
        self.interval = interval
        self.sockets: set[LiveConsumer] = set()
        self.task: asyncio.Task | None = None
        self.last_id: int | None = None
        self.recent: dict[int, tuple[float, tuple]] = {}  # id -> (seen at, fingerprint)

    def join(self, socket: LiveConsumer) -> None:
        self.sockets.add(socket)
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            # (A task of another loop: one the tests' communicators left behind.)
            self.task = loop.create_task(self._run())

    def leave(self, socket: LiveConsumer) -> None:
        self.sockets.discard(socket)
        if not self.sockets and self.task is not None:
            self.task.cancel()
            self.task = None
            self.last_id = None  # a later socket starts from its own snapshot
            self.recent.clear()

    async def _run(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                try:
                    rows = await database_sync_to_async(self.poll)()
                except DatabaseError as exc:
                    log.warning("live: cannot read the reconciliation history now: %s", exc)
                    rows = []
                for socket in list(self.sockets) if rows else ():
                    with contextlib.suppress(Exception):  # a socket closing meanwhile
                        await socket.runs_changed(rows)
                await asyncio.sleep(self.interval)

    def poll(self) -> list[dict[str, Any]]:
        """The runs new since the last poll or changed since seen, oldest first."""
        now = time.monotonic()
        if self.last_id is None:
            # The sockets' snapshots carry the latest runs; the newest are read again on the
            # next poll (unknown fingerprints), so that one written meanwhile is not missed.
            newest = list(ReconcileRun.objects.order_by("-id").values_list("id", flat=True)[:20])
            self.last_id = newest[0] if newest else 0
            self.recent = {pk: (now, ()) for pk in newest}
            return []
        self.recent = {k: v for k, v in self.recent.items() if now - v[0] < RUN_RECENT_SECONDS}
        qs = ReconcileRun.objects.filter(Q(pk__gt=self.last_id) | Q(pk__in=list(self.recent)))
        rows = queries.runs(qs.order_by("-id")[:RUN_POLL_LIMIT])
        changed = []
        for row in reversed(rows):
            fingerprint = tuple(row[k] for k in queries.RUN_FIELDS)
            seen = self.recent.get(row["id"])
            if seen is None or seen[1] != fingerprint:
                changed.append(row)
            self.recent[row["id"]] = (seen[0] if seen else now, fingerprint)
            self.last_id = max(self.last_id, row["id"])
        changed.sort(key=lambda r: (r["started_at"] or "", r["id"]))
        return changed


RUN_WATCH = RunWatch()


class BadFrame(Exception):
    """A frame this socket cannot act on; the message is sent to the client."""


def _validate(view: Any, filters: Any) -> tuple[str, dict[str, str], int]:
    if not isinstance(filters, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in filters.items()
    ):
        raise BadFrame("filters must be an object of strings")
    view = filters.get("view", view) or "slots"
    form = SlotFilterForm({**filters, "view": view})
    if not form.is_valid():
        problems = "; ".join(f"{field}: {' '.join(errs)}" for field, errs in form.errors.items())
        raise BadFrame(f"bad filters: {problems}")
    return form.cleaned_data["view"] or "slots", form.filters(), form.cleaned_data["page"] or 1


def _snapshot(
    view: str, filters: dict[str, str], release: bool, page: int = 1
) -> tuple[dict[str, Any], set[str] | None]:
    """The snapshot, and the keys of the Instances on the viewer's page when the view is one
    page of several (deltas for the others are not sent); None: every matching Instance."""
    instances: list[dict[str, Any]] = []
    keys: set[str] | None = None
    if view == "slots":
        paginator = Paginator(matching(filters), PAGE)
        shown = paginator.get_page(page)
        instances = page_of(shown.object_list, filters)
        if paginator.num_pages > 1:
            keys = {row["key"] for row in instances}
    recent = list(
        reversed(queries.runs(ReconcileRun.objects.order_by("-started_at", "-id")[:SNAPSHOT_RUNS]))
    )
    return {
        "type": "snapshot",
        "view": view,
        "page": page,
        "filters": filters,
        "instances": instances,
        "truncated": False,  # the snapshot is the viewer's whole page
        "instance_total": Instance.objects.count(),
        "runs": recent,
        "html": instances_html(instances, release),
        "runs_html": runs_html(recent),
        "summary": summary(),
        "sync": queries.sync_status(),
        "at": iso(timezone.now()),
    }, keys


def recheck(session_key: str | None) -> tuple[int | None, bool]:
    """Is the socket's session still good? ``(close code or None, may release)``.

    Reads the session afresh (the scope's copy was loaded at connect) and lets Django decide
    whether it still names the user: a password change or deactivation ends it too.
    """
    if not session_key:
        return CLOSE_SIGNED_OUT, False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    if not store.exists(session_key):
        return CLOSE_SIGNED_OUT, False
    user = get_user(SimpleNamespace(session=store))
    if not user.is_authenticated:
        return CLOSE_SIGNED_OUT, False
    if not can_view(user):
        return CLOSE_FORBIDDEN, False
    return None, can_release(user)


class SessionRecheck:
    """A websocket consumer that does not outlive what let it in.

    ``start_rechecks()`` (after accept) re-reads the session every ``AKRI_WS_RECHECK_SECONDS``;
    a consumer also calls ``still_allowed()`` before answering a frame. When the session has
    ended the socket gets an error frame and is closed with 4401, when the role is gone with
    4403. ``release`` follows the user's current right to release slots.
    """

    release = False
    session_key: str | None = None
    watchdog: asyncio.Task | None = None
    shut = False  # closed by the re-check
    socket_name = "live"

    def start_rechecks(self) -> None:
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        self.watchdog = asyncio.ensure_future(self._recheck_periodically())

    def stop_rechecks(self) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()

    async def still_allowed(self) -> bool:
        if self.shut:
            return False
        if self.scope.get("session") is None:
            # Mounted without the session middleware (unit tests of the consumer alone).
            return True
        code, self.release = await database_sync_to_async(recheck)(self.session_key)
        if code is None:
            return True
        if self.shut:  # the timer and a frame both found out: close once
            return False
        self.shut = True
        why = "signed out" if code == CLOSE_SIGNED_OUT else "your dashboard role was removed"
        log.info("%s: closing a websocket: %s", self.socket_name, why)
        await self.send_json({"type": "error", "error": why, "close_code": code})
        await self.close(code=code, reason=why)
        await self.disconnect(code)
        return False

    async def _recheck_periodically(self) -> None:
        every = settings.AKRI["WS_RECHECK_SECONDS"]
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(every)
                try:
                    if not await self.still_allowed():
                        return
                except DatabaseError as exc:
                    # An outage is not a sign-out: keep the socket, ask again next time.
                    log.warning(
                        "%s: cannot re-check a websocket's session now: %s", self.socket_name, exc
                    )


class LiveConsumer(SessionRecheck, AsyncJsonWebsocketConsumer):
    view = "slots"
    filters: dict[str, str]
    page = 1
    page_keys: set[str] | None = (
        None  # the Instances on the viewer's page, when it is one of several
    )
    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not await database_sync_to_async(can_view)(user):
            # Before accept: the handshake is refused (HTTP 403 to the browser).
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.filters = {}
        self.release = await database_sync_to_async(can_release)(user)
        # Join before accepting: a socket that cannot get deltas (the channel layer's Redis is
        # down) is refused, so the page says Reconnecting, then Stale, never a false Live.
        try:
            await self.channel_layer.group_add(LIVE_GROUP, self.channel_name)
        except Exception as exc:
            log.warning("live: refusing a websocket, the channel layer is unavailable: %s", exc)
            await self.close(code=CLOSE_UNAVAILABLE)
            return
        self.joined = True
        await self.accept()
        self.start_rechecks()
        WEBSOCKET_CLIENTS.inc()
        query = dict(parse_qsl(self.scope.get("query_string", b"").decode("latin-1")))
        await self._run(self._subscribe, {"view": query.pop("view", "slots"), "filters": query})

    async def disconnect(self, code: int) -> None:
        self.stop_rechecks()
        RUN_WATCH.leave(self)
        if self.joined:
            self.joined = False
            WEBSOCKET_CLIENTS.dec()
            try:
                await self.channel_layer.group_discard(LIVE_GROUP, self.channel_name)
            except Exception as exc:  # the membership expires on its own in Redis
                log.info("live: leaving the group failed: %s", exc)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if await self.still_allowed():
            await self._run(self._dispatch, text_data, bytes_data)

    async def _run(self, handler: Any, *args: Any) -> None:
        try:
            await handler(*args)
        except BadFrame as exc:
            await self._reject(str(exc))

    async def _dispatch(self, text_data: str | None, bytes_data: bytes | None) -> None:
        if text_data is None:
            raise BadFrame("binary frames are not understood")
        if len(text_data) > MAX_FRAME:
            raise BadFrame(f"frame larger than {MAX_FRAME} bytes")
        try:
            content = json.loads(text_data)
        except ValueError:
            raise BadFrame("frame is not JSON") from None
        except RecursionError:
            # A small frame can still nest thousands deep; the parser gives up on the stack.
            raise BadFrame("frame is nested too deep") from None
        if not isinstance(content, dict) or not isinstance(content.get("type"), str):
            raise BadFrame('a frame is a JSON object with a "type"')
        kind = content["type"]
        if kind == "ping":
            await self.send_json(
                {"type": "pong", "sync": await self._sync_status(), "at": iso(timezone.now())}
            )
        elif kind == "subscribe":
            await self._subscribe(content)
        elif kind == "refresh":
            await self._send_snapshot()
        else:
            raise BadFrame(f"unknown frame type {kind[:40]!r}")

    async def _reject(self, message: str) -> None:
        log.info("live: closing a websocket: %s", message)
        await self.send_json({"type": "error", "error": message, "close_code": CLOSE_BAD_FRAME})
        # A close reason is limited to 123 bytes.
        await self.close(
            code=CLOSE_BAD_FRAME, reason=message.encode()[:120].decode(errors="ignore")
        )

    async def _subscribe(self, content: dict[str, Any]) -> None:
        self.view, self.filters, self.page = await database_sync_to_async(_validate)(
            content.get("view"), content.get("filters", {})
        )
        await self._send_snapshot()
        if self.view in RUN_VIEWS:
            RUN_WATCH.join(self)
        else:
            RUN_WATCH.leave(self)

    async def runs_changed(self, runs: list[dict[str, Any]]) -> None:
        """New or changed reconciliation runs, from this process's ``RunWatch``."""
        if not self.shut:
            await self.live_delta({"runs": runs, "at": iso(timezone.now())})

    async def _send_snapshot(self) -> None:
        snapshot = database_sync_to_async(_snapshot)
        message, self.page_keys = await snapshot(self.view, self.filters, self.release, self.page)
        await self.send_json(message)

    @database_sync_to_async
    def _sync_status(self) -> dict[str, Any]:
        return queries.sync_status()

    async def live_delta(self, event: dict[str, Any]) -> None:
        """A ``live.delta`` from the channel layer, narrowed to this socket's filters."""
        if event.get("reload"):
            # Too many Instances changed at once for their rows (a relist): this socket reads
            # its own page again; the snapshot carries the totals and the latest runs.
            if self.shut:
                return
            await self._send_snapshot()
            if not (event.get("runs") or event.get("audit")):
                return
        instances: list[dict[str, Any]] = []
        removed = list(event.get("removed", []))
        if self.view == "slots":
            shown = self.page_keys
            if shown is not None:
                # One page of a large map: only its rows are this socket's business.
                removed = [key for key in removed if key in shown]
            for row in event.get("instances", []):
                if shown is not None and row["key"] not in shown:
                    continue
                narrowed = narrow(row, self.filters)
                if narrowed is None:
                    # No longer (or never) in this view: the page drops it if it shows it.
                    removed.append(row["key"])
                else:
                    instances.append(narrowed)
        runs = event.get("runs", [])
        # Rendered right here: fragments come from the message alone (no database), and a
        # hop to the one sync thread per socket would queue 200 sockets behind each other.
        html, run_rows = instances_html(instances, self.release), runs_html(runs)
        await self.send_json(
            {
                "type": "delta",
                "instances": instances,
                "removed": removed,
                "runs": runs,
                "html": html,
                "runs_html": run_rows,
                "audit": bool(event.get("audit")),
                "summary": event.get("summary"),
                "sync": event.get("sync"),
                "at": event.get("at"),
            }
        )
