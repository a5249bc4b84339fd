"""Live Queues page: after a recompute, the current totals go to every Queues websocket.

``publish()`` is called by whoever ran a recompute that changed rows (the controller, the
Celery task); it never raises into them. ``QueuesConsumer`` sends a snapshot on connect and
forwards each update; the page swaps its figures in place (``static/queues/queues.js``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.utils import timezone

from agent.dbthreads import closing_connections
from akri_site.dashboard.access import can_view
from akri_site.dashboard.consumers import SessionRecheck

log = logging.getLogger(__name__)
GROUP = "akri.queues"
CLOSE_BAD_FRAME = 4400
CLOSE_FORBIDDEN = 4403


def snapshot() -> dict[str, Any]:
    from agent.queues import queries

    data = queries.overview()
    return {
        "queues": data["queues"],
        "charged": data["charged"],
        "uncharged_total": data["uncharged_total"],
        "orphans": data["orphans"],
        "problems": data["problems"],
        "claims": data["claims"],
        "at": timezone.now().isoformat(),
    }


# Totals are read over every charge row: at most one update per window, the last one always
# sent (a burst of recomputes costs one read, not one per debounced batch; bench ``scale``).
PUBLISH_SECONDS = 5.0
_publish_lock = threading.Lock()
_last_published = 0.0
_trailing: threading.Timer | None = None


def publish() -> None:
    """Send the current totals soon: now if none went out this window, else at its end."""
    global _trailing
    with _publish_lock:
        wait = _last_published + PUBLISH_SECONDS - time.monotonic()
        if wait > 0:
            if _trailing is None:
                _trailing = threading.Timer(wait, closing_connections(_publish_trailing))
                _trailing.daemon = True
                _trailing.start()
            return
        _mark_published()
    publish_now()


def cancel_pending() -> None:
    """Drop a trailing update not sent yet (the process, or a test, is stopping)."""
    global _trailing
    with _publish_lock:
        if _trailing is not None:
            _trailing.cancel()
            _trailing = None


def _mark_published() -> None:
    global _last_published
    _last_published = time.monotonic()


def _publish_trailing() -> None:
    global _trailing
    with _publish_lock:
        _trailing = None
        _mark_published()
    publish_now()


def publish_now() -> None:
    try:
        layer = get_channel_layer()
        if layer is None:
            return
        message = {"type": "queues.update", **snapshot()}
        send = async_to_sync(layer.group_send)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            send(GROUP, message)
            return
        # An event loop runs in this thread (async code, Playwright's sync API in a test):
        # async_to_sync cannot run here; send from a short-lived thread (as dashboard.live).
        with ThreadPoolExecutor(1, thread_name_prefix="queues-send") as pool:
            pool.submit(send, GROUP, message).result()
    except Exception:
        log.exception("queues: live update not published")


class QueuesConsumer(SessionRecheck, AsyncJsonWebsocketConsumer):
    """The Queues page's socket: a snapshot, then updates; re-checks its session and role as
    the slot map's socket does (4401 signed out, 4403 role removed)."""

    socket_name = "queues"
    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not await database_sync_to_async(can_view)(user):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        self.start_rechecks()
        await self.send_json({"type": "snapshot", **await database_sync_to_async(snapshot)()})

    async def disconnect(self, code: int) -> None:
        self.stop_rechecks()
        if self.joined:
            self.joined = False
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "at": timezone.now().isoformat()})
            return
        await self.send_json({"type": "error", "message": 'only {"type": "ping"} is understood'})
        await self.close(code=CLOSE_BAD_FRAME)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        if not await self.still_allowed():
            return
        try:
            await super().receive(text_data=text_data, bytes_data=bytes_data)
        except (ValueError, RecursionError):
            # RecursionError: a small frame nested thousands deep.
            await self.send_json({"type": "error", "message": "frames must be JSON objects"})
            await self.close(code=CLOSE_BAD_FRAME)

    async def queues_update(self, message: dict[str, Any]) -> None:
        if self.shut:
            return
        await self.send_json({**message, "type": "update"})
