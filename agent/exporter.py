"""``/metrics`` for the processes that have no web server of their own: the node agent
(``runagent``), the controller (``runcontroller``) and the Celery worker
(``akri_site.celery_metrics``). The web serves its own ``/metrics`` on its port.

prometheus_client does the work: its WSGI exposition app (content negotiation, gzip, the
``name[]`` filter) on its threading WSGI server, in a thread of its own. Around the app, the
two rules of the web's ``/metrics``: only ``/metrics`` answers, and with ``METRICS_TOKEN`` set
the scraper must send it as a bearer token (401 otherwise).

Nothing depends on this server, and in the agent above all Allocate never waits on it. A port
that cannot be had (taken, refused) is one error line naming the port and the setting, and the
process runs on without metrics: exiting would turn a DaemonSet pod into a crash loop that takes
the node's device plugins down for the sake of a scrape. Prometheus shows the target down
instead (alert AkriAgentDown), and the operator reads why in the pod's log.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PATH = "/metrics"
# A client that connects and sends nothing holds a request thread this long at most, so that
# stopping the server (which joins them) is bounded too.
REQUEST_TIMEOUT = 10.0
STOP_TIMEOUT = 15.0

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def bearer_matches(authorization: str, token: str) -> bool:
    """Does an Authorization header carry ``Bearer <token>``? With no token configured, any
    request passes (the web's ``/metrics`` rule). Compared in constant time."""
    if not token:
        return True
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


Health = Callable[[], tuple[bool, str]]  # (alive, why), for a liveness probe at /healthz
HEALTH_PATH = "/healthz"


def guarded(app: WsgiApp, token: str, health: Health | None = None) -> WsgiApp:
    """``app`` at ``/metrics`` only, behind the bearer token when there is one; with
    ``health``, ``/healthz`` too (open, as the kubelet's probes carry no token): 200 or 503
    with the reason in words."""

    def metrics_only(environ: dict[str, Any], start_response: Callable[..., Any]):
        if health is not None and environ.get("PATH_INFO") == HEALTH_PATH:
            alive, why = health()
            return _plain(start_response, "200 OK" if alive else "503 Service Unavailable", why)
        if environ.get("PATH_INFO") != PATH:
            return _plain(start_response, "404 Not Found", "only /metrics is served here")
        if not bearer_matches(environ.get("HTTP_AUTHORIZATION", ""), token):
            challenge = [("WWW-Authenticate", 'Bearer realm="metrics"')]
            return _plain(
                start_response, "401 Unauthorized", "a bearer token is required", challenge
            )
        return app(environ, start_response)

    return metrics_only


def _plain(
    start_response: Callable[..., Any],
    status: str,
    text: str,
    headers: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), *(headers or [])])
    return [f"{text}\n".encode()]


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        # A scrape every 15 to 30 s from each Prometheus: not worth a line each.
        log.debug("metrics: %s " + format, self.address_string(), *args)


class _Server(ThreadingWSGIServer):
    # Request threads are joined on close (prometheus_client's leaves them as daemons), so that
    # a stopped server leaves no thread behind; REQUEST_TIMEOUT bounds the wait.
    daemon_threads = False
    block_on_close = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class MetricsServer:
    """``registry`` served at ``http://address:port/metrics`` from a thread of its own until
    ``stop()``. ``port=0`` takes a free port (see ``port`` once started)."""

    def __init__(
        self,
        registry: Collector = REGISTRY,
        *,
        port: int,
        address: str = "0.0.0.0",
        token: str = "",
        name: str = "metrics",
        health: Health | None = None,
    ) -> None:
        self.registry = registry
        self.health = health
        self.address = address
        self.requested_port = port
        self.token = token
        self.name = name
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Listen and serve; False (and one error line) when the port cannot be had."""
        server_class = _Server6 if ipaddress.ip_address(self.address).version == 6 else _Server
        app = guarded(make_wsgi_app(self.registry), self.token, self.health)
        try:
            self._httpd = make_server(
                self.address, self.requested_port, app, server_class, handler_class=_Handler
            )
        except OSError as exc:
            log.error(
                "%s: /metrics is not served: cannot listen on %s port %d (%s); the %s runs on "
                "without it. Free the port or choose another with METRICS_PORT (0: none).",
                self.name,
                self.address,
                self.requested_port,
                exc.strerror or exc,
                self.name,
            )
            return False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.5},
            name=f"{self.name}-metrics",
            daemon=True,
        )
        self._thread.start()
        log.info("%s: /metrics on %s port %d", self.name, self.address, self.port)
        return True

    @property
    def port(self) -> int:
        """The port listened on (the one the kernel chose, for ``port=0``)."""
        return self._httpd.server_address[1] if self._httpd else self.requested_port

    def stop(self) -> None:
        """Stop listening, finish the scrapes under way, and join every thread."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT)
        httpd.server_close()


def serve(
    name: str, registry: Collector = REGISTRY, health: Health | None = None
) -> MetricsServer | None:
    """The settings' ``/metrics`` server for the process ``name`` (and ``/healthz`` with
    ``health``), started: None when ``METRICS_PORT`` is 0, or when the port could not be had
    (logged)."""
    from django.conf import settings

    if not settings.METRICS_PORT:
        log.info("%s: /metrics is not served (METRICS_PORT=0)", name)
        return None
    server = MetricsServer(
        registry,
        port=settings.METRICS_PORT,
        address=settings.METRICS_ADDRESS,
        token=settings.METRICS_TOKEN,
        name=name,
        health=health,
    )
    return server if server.start() else None
