"""Request checks that hold for every page, the admin and the API alike."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.utils.html import escape

from agent.retrying import DATABASE_AWAY

log = logging.getLogger(__name__)


class RejectNulMiddleware:
    """A NUL character in a query parameter is a 400.

    No parameter of ours can contain one, and PostgreSQL refuses it in any text value, so an
    admin filter like ``?level__exact=%00`` would otherwise end as a 500.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if any(
            "\x00" in key or any("\x00" in v for v in values) for key, values in request.GET.lists()
        ):
            return HttpResponseBadRequest("NUL characters are not allowed in query parameters.")
        return self.get_response(request)


class AsyncFileStreamMiddleware:
    """Under ASGI, a streaming response with a synchronous iterator (whitenoise serves static
    files as FileResponse objects over a file) makes Django warn on every request
    ("StreamingHttpResponse must consume synchronous iterators") and read the file in the
    event loop. This hands Django an asynchronous iterator instead, each chunk read in a worker
    thread; the response still closes the file. Requests that came through WSGI (and the test client) are left as
    they are: they consume synchronously.

    It runs in whichever mode Django gives it (the middleware below it are synchronous, so
    synchronous here too): the request's class says how the response will be consumed.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            isinstance(request, ASGIRequest)
            and getattr(response, "streaming", False)
            and not response.is_async
        ):
            response.streaming_content = _read_in_thread(iter(response.streaming_content))
        return response


async def _read_in_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    done = object()
    while True:
        chunk = await sync_to_async(next, thread_sensitive=False)(chunks, done)
        if chunk is done:
            return
        yield chunk


# Self-contained: the site's base template reads the user and the role, which needs the
# database that just failed.
_UNAVAILABLE_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Database unavailable</title></head>
<body><h1>Database unavailable</h1>
<p>The dashboard cannot reach its database right now. This page works again as soon as the
database is back; <a href="{path}">try again</a> in a few seconds.</p></body></html>
"""
RETRY_AFTER_SECONDS = 5


class DatabaseUnavailableMiddleware:
    """A database outage is a 503 "database unavailable", not a 500 with a traceback.

    Every page, the API and ``/metrics`` read the database; while it is away each request
    raised ``OperationalError`` (or ``InterfaceError`` on a dead connection) and Django logged
    a full traceback per request. The outage is one fact, logged as one line per request with
    its cause; the answer says so, in HTML for a browser and JSON for the API, with
    ``Retry-After``. ``/healthz`` checks the database itself and already answers 503.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DATABASE_AWAY):
            return None
        reason = str(exception).strip().splitlines()[0] if str(exception).strip() else ""
        log.warning("database unavailable: %s %s: %s", request.method, request.path, reason)
        if request.path.startswith(("/api/", "/webhooks/")):
            response: HttpResponse = JsonResponse({"detail": "database unavailable"}, status=503)
        elif request.path == "/metrics":
            response = HttpResponse("database unavailable\n", status=503, content_type="text/plain")
        else:
            response = HttpResponse(
                # The database's own message (host names, users) stays in the log.
                _UNAVAILABLE_HTML.format(path=escape(request.get_full_path())),
                status=503,
            )
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        response["Cache-Control"] = "no-store"
        return response
