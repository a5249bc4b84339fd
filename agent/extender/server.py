"""The extender's HTTP server (aiohttp): ``POST <prefix>/filter``, ``/prioritize``, ``/bind``
and ``GET /healthz``.

The scheduler treats anything but HTTP 200 as a failed call, and a filter failure fails the
pod's whole scheduling attempt; so every answer is 200, and trouble goes into ``Error``
(filter, bind). Prioritize has no error field: a bad body gets an empty list, which the
scheduler reads as "no opinion". Filter and prioritize run on the loop (short CPU work under
the books' lock); bind's API calls run in a thread, each with a timeout.

What a body may be, before anything reads it: at most ``MAX_BODY`` bytes (a larger one is
refused unread, and its connection closed), JSON nested at most ``MAX_DEPTH`` deep. Who may
call: with TLS (``tls``), only a client whose certificate the client CA signed, and with
``client_names`` only one whose certificate names one of them (the ``only_scheduler``
middleware); the TLS handshake itself refuses a client with no certificate.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from agent.extender import protocol
from agent.extender.tls import peer_name
from agent.extender.verbs import Extender

log = logging.getLogger(__name__)

__all__ = ["Extender", "MAX_BODY", "MAX_DEPTH", "make_app", "make_health_app"]

# The largest filter kube-scheduler sends with nodeCacheCapable (the mode deploy/ configures):
# the pod, which the API server stores only up to about 1.5 MiB (etcd's request limit), and
# 5,000 node names of at most 253 characters, quoted and comma-separated: 5,000 x 256 bytes,
# 1.3 MB. That is under 3 MiB; 4 MiB leaves room and keeps a body's decoded objects (a few
# times its size) far below the Deployment's 384Mi. Full Node objects (nodeCacheCapable
# false) take 5-10 kB each, so that mode fits only a few hundred nodes: use NodeNames.
MAX_BODY = 4 * 1024 * 1024
# Kubernetes objects nest about 15 deep (a pod's managedFields are the deepest); the
# ExtenderArgs around them add two. Anything deeper is not a pod.
MAX_DEPTH = 64


class _Malformed(dict):
    """A body that cannot be used; every parser refuses it with ``reason``. ``close``: its
    connection is closed after the answer (the rest of an over-long body is never read)."""

    def __init__(self, reason: str, close: bool = False) -> None:
        super().__init__()
        self.reason = reason
        self.close = close


async def _body(request: web.Request) -> Any:
    """The decoded JSON body, or a _Malformed the handlers answer."""
    too_long = f"the body is over {MAX_BODY // (1024 * 1024)} MiB"
    if request.content_length is not None and request.content_length > MAX_BODY:
        return _Malformed(too_long, close=True)
    try:
        raw = await request.read()  # stops at client_max_size for a body of unstated length
    except web.HTTPRequestEntityTooLarge:
        return _Malformed(too_long, close=True)
    try:
        body = json.loads(raw)
    except RecursionError:
        return _Malformed(f"the body is not JSON nested at most {MAX_DEPTH} deep")
    except (ValueError, UnicodeDecodeError) as exc:
        return _Malformed(f"the body is not JSON: {exc}")
    if too_deep(body, MAX_DEPTH):
        return _Malformed(f"the body is not JSON nested at most {MAX_DEPTH} deep")
    return body


def too_deep(value: Any, limit: int) -> bool:
    """Does ``value`` nest lists and objects more than ``limit`` deep? Without recursion."""
    if not isinstance(value, (dict, list)):
        return False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _answer(result: Any, body: Any = None) -> web.Response:
    response = web.json_response(result)
    if isinstance(body, _Malformed) and body.close:
        response.force_close()
    return response


def only_scheduler(names: Iterable[str]) -> Any:
    """A middleware that answers 403 to a client whose certificate names none of ``names``
    (its subject's common name): the client CA may sign more than the scheduler's."""
    allowed = frozenset(names)

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        name = peer_name(request.transport)
        if name not in allowed:
            log.warning("refused a client whose certificate names %r", name)
            return web.json_response(
                {"Error": f"client certificate {name!r} may not call the extender"}, status=403
            )
        return await handler(request)

    return middleware


def make_app(
    extender: Extender, prefix: str = "", client_names: Iterable[str] = ()
) -> web.Application:
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""

    async def filter_view(request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, _Malformed):
            return _answer(protocol.filter_result(None, [], {}, {}, body.reason), body)
        try:
            return _answer(extender.filter(body))
        except Exception as exc:  # a bug must still answer the scheduler, not 500
            log.exception("filter failed")
            error = f"extender error: {exc}"
            return _answer(protocol.filter_result(None, [], {}, {}, error))

    async def prioritize_view(request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, _Malformed):
            log.warning("bad prioritize request: %s", body.reason)
            return _answer([], body)
        try:
            return _answer(extender.prioritize(body))
        except Exception:
            log.exception("prioritize failed")
            return _answer([])

    async def bind_view(request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, _Malformed):
            return _answer(protocol.binding_result(body.reason), body)
        try:
            result = await asyncio.get_running_loop().run_in_executor(None, extender.bind, body)
        except Exception as exc:
            log.exception("bind failed")
            result = protocol.binding_result(f"extender error: {exc}")
        return _answer(result)

    names = list(client_names)
    app = web.Application(
        client_max_size=MAX_BODY, middlewares=[only_scheduler(names)] if names else []
    )
    app.router.add_post(f"{prefix}/filter", filter_view)
    app.router.add_post(f"{prefix}/prioritize", prioritize_view)
    app.router.add_post(f"{prefix}/bind", bind_view)
    app.router.add_get("/healthz", _healthz)
    return app


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_health_app() -> web.Application:
    """``GET /healthz`` alone, in plain HTTP, for the kubelet's probes: the protocol's port
    asks every client for a certificate, which a probe does not have."""
    app = web.Application(client_max_size=1024)
    app.router.add_get("/healthz", _healthz)
    return app
