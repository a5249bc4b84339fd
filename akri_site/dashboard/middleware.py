"""Request checks that hold for every page, the admin and the API alike."""

from __future__ import annotations

from collections.abc import Callable

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
