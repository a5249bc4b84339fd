"""The admission webhook served ahead of Django, on the event loop.

``WebhookApp`` wraps the ASGI application (``akri_site.asgi``, so ``runweb``, the demo and the
deployment's webhook container all serve it this way) and answers ``POST /webhooks/pods/validate``
itself: the body is read, the review decided from the in-memory index (``agent.queues.index``)
without a query, and the answer written. Everything else goes to Django untouched.

Why: a review through Django's middleware, a sync view on the one thread per process and two or
three ORM queries cost about a millisecond of CPU; 50 reviews in flight then queue for tens of
milliseconds (bench ``webhook``, target p99 <= 20 ms). Decided from the index, a review costs
tens of microseconds beyond HTTP parsing.

What stays the same: the rules and answers (``webhook.answer``: the view calls the same
function); malformed bodies get the same 400s, an oversized one the same 413. When the index is
not fresh (``index.MAX_AGE``) the review is answered from the database in a worker thread,
exactly as the view does. Refusals are recorded by a background writer (in batches): a review
never waits on a database write, and, as before, a failure to record never changes the answer.
What Django would have added and the webhook does not need: sessions, CSRF (the view was exempt),
the host check (the API server calls the Service by its DNS name) and the HTTPS redirect (the
API server always calls over TLS).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections

from agent.charges.admission import Verdict
from agent.queues import index, webhook
from agent.queues.models import Refusal
from agent.queues.review import Request

log = logging.getLogger(__name__)

PATH = "/webhooks/pods/validate"
JSON_HEADERS = [(b"content-type", b"application/json")]


class RefusalWriter:
    """Refusal rows written in batches by one background thread, off the review's path."""

    LIMIT = 10_000  # rows waiting; beyond it refusals are only logged

    def __init__(self) -> None:
        self._queue: queue.Queue[Refusal] = queue.Queue(self.LIMIT)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0

    def __call__(self, review: Request, verdict: Verdict) -> None:
        try:
            self._queue.put_nowait(webhook.refusal_row(review, verdict))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "webhook: %d refusals not recorded (the writer is behind)", self.dropped
                )
            return
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="webhook-refusals", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            rows = [self._queue.get()]
            while len(rows) < 500:
                try:
                    rows.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                close_old_connections()
                Refusal.objects.bulk_create(rows)
            except DatabaseError:
                log.exception("webhook: %d refusals not recorded", len(rows))
            finally:
                for _ in rows:
                    self._queue.task_done()

    def flush(self) -> None:
        """Wait until every refusal handed over is written (tests, shutdown)."""
        self._queue.join()


REFUSALS = RefusalWriter()


def _from_database(body: bytes) -> tuple[int, dict[str, Any]]:
    close_old_connections()
    try:
        return webhook.answer(body, None, REFUSALS)
    finally:
        close_old_connections()


async def review(body: bytes) -> tuple[int, dict[str, Any]]:
    """The answer to one review body: from a fresh index on the loop, else from the database."""
    fresh = index.HOLDER.fresh()
    if fresh is not None:
        return webhook.answer(body, fresh, REFUSALS)
    return await asyncio.to_thread(_from_database, body)


class WebhookApp:
    """ASGI: ``POST /webhooks/pods/validate`` here, everything else to ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _send(send, 405, b"", [(b"allow", b"POST")])
            return
        body = await _body(receive, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        if body is None:
            status, payload = 413, {"error": webhook.TOO_BIG}
        else:
            status, payload = await review(body)
        await _send(send, status, json.dumps(payload).encode(), JSON_HEADERS)


async def _body(receive: Any, limit: int | None) -> bytes | None:
    """The request body, or None when it is larger than ``limit``."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(send: Any, status: int, body: bytes, headers: list) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
