"""The websocket origin check: the page that opens the socket must be this very site.

Channels' ``AllowedHostsOriginValidator`` matches the Origin's host name against
``ALLOWED_HOSTS`` and ignores scheme and port, so a page served by anything else on the same
host (``http://127.0.0.1:9999``) could open a socket with the user's cookies. Here the Origin
must equal the scheme, host and port the browser used to reach us (the ``Host`` header, itself
in ``ALLOWED_HOSTS``), or be listed in ``CSRF_TRUSTED_ORIGINS`` -- the rule Django's CSRF check
applies to forms.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from channels.security.websocket import OriginValidator, WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def _secure(scope: dict[str, Any]) -> bool:
    if scope.get("scheme") in ("wss", "https"):
        return True
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        # "HTTP_X_FORWARDED_PROTO" -> b"x-forwarded-proto"
        name = proxy[0].removeprefix("HTTP_").lower().replace("_", "-").encode()
        return (_header(scope, name) or "").split(",")[0].strip() == proxy[1]
    return False


class SameOriginValidator(OriginValidator):
    """Let a websocket through only when its Origin is this site's own origin."""

    def __init__(self, application: Any) -> None:
        super().__init__(application, [])

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if self.same_origin(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    def same_origin(self, scope: dict[str, Any]) -> bool:
        origin, host = _header(scope, b"origin"), _header(scope, b"host")
        if not origin or not host:
            return False
        domain, _ = split_domain_port(host)
        if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            return False
        own = f"{'https' if _secure(scope) else 'http'}://{host}"
        parsed = urlparse(origin.lower())
        return any(
            self.match_allowed_origin(parsed, pattern)
            for pattern in (own.lower(), *settings.CSRF_TRUSTED_ORIGINS)
        )
