"""Request checks that hold for every page, the admin and the API alike."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest


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
