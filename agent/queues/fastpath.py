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
import contextlib
import json
import logging
import queue
import threading
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections

from agent.charges.admission import Verdict
from agent.queues import index, webhook
from agent.queues.models import Refusal
from agent.queues.review import Request
from agent.retrying import DATABASE_AWAY, Backoff

log = logging.getLogger(__name__)

PATH = "/webhooks/pods/validate"
JSON_HEADERS = [(b"content-type", b"application/json")]


class RefusalWriter:
    """Refusal rows written in batches by one background thread, off the review's path.

    A batch the database cannot take now (away, restarting, out of connections) is tried again,
    backing off, until it goes in; refusals made meanwhile wait in the queue. A batch it
    refuses for good (a constraint) is logged and dropped: it would hold up every one behind it.
    """

    LIMIT = 10_000  # rows waiting; beyond it refusals are only logged
    RETRY_FIRST = 0.2  # seconds before a failed batch is tried again, doubling...
    RETRY_MAX = 30.0  # ...up to this

    def __init__(self) -> None:
        self._queue: queue.Queue[Refusal | None] = queue.Queue(self.LIMIT)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.dropped = 0
        self.failures = 0  # batches the database could not take at the first try

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
            if self._stopping.is_set():
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="webhook-refusals", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        backoff = Backoff(self.RETRY_FIRST, self.RETRY_MAX)
        while not self._stopping.is_set():
            taken = [self._queue.get()]
            while len(taken) < 500:
                try:
                    taken.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            rows = [row for row in taken if row is not None]  # None: stop() waking us
            try:
                if rows:
                    self._write(rows, backoff)
            finally:
                for _ in taken:
                    self._queue.task_done()
        connections.close_all()

    def _write(self, rows: list[Refusal], backoff: Backoff) -> None:
        while True:
            try:
                close_old_connections()
                Refusal.objects.bulk_create(collapse(rows))  # one transaction: all or none
                backoff.succeeded()
                return
            except DATABASE_AWAY as exc:
                self.failures += 1
                connections.close_all()  # a connection the error broke must not be reused
                delay = backoff.failed()
                log.warning(
                    "webhook: %d refusals not recorded yet (%s); again in %.1f s",
                    len(rows),
                    exc,
                    delay,
                )
                if self._stopping.wait(delay):
                    log.warning("webhook: %d refusals not recorded (stopping)", len(rows))
                    return
            except DatabaseError:
                log.exception("webhook: %d refusals not recorded", len(rows))
                return

    def flush(self) -> None:
        """Wait until every refusal handed over is written (tests, shutdown)."""
        self._queue.join()

    def stop(self, timeout: float = 5.0) -> None:
        """End the writer thread (tests); a batch still failing is given up, and logged."""
        self._stopping.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)


REFUSALS = RefusalWriter()

# What makes two refusals the same one (all but the time).
SAME = ("operation", "resource", "namespace", "name", "username", "queue", "claim", "owner")
SAME += ("rule", "message")


def collapse(rows: list[Refusal]) -> list[Refusal]:
    """Identical refusals of one batch as one row with their count (``repeats``), at the last
    one's time: a flood of the same review costs a row per batch, not a row per review."""
    out: dict[tuple, Refusal] = {}
    for row in rows:
        key = tuple(getattr(row, f) for f in SAME)
        kept = out.get(key)
        if kept is None:
            out[key] = row
        else:
            kept.repeats += row.repeats
            kept.at = max(kept.at, row.at)
    return list(out.values())


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


async def _not_found(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4404})
        return
    if scope["type"] == "http":
        await _send(send, 404, b"not found: this port serves only the admission webhook\n", [])


def webhook_only() -> WebhookApp:
    """The webhook listener's whole application (``runweb --webhook``): the review path, and
    a 404 for anything else: no page, API, admin or websocket is reachable on this port."""
    return WebhookApp(_not_found)


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
