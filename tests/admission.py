"""Helpers for tests of validating admission webhooks called by an API server (the simulator's
admission chain or a real kube-apiserver): a webhook whose answers a test sets, configurations
registered for a block, and (from ``agent.queues.served``, which the ``allocate`` benchmark and
the demo use too) certificates, the project's own webhook server (``manage.py runweb
--webhook``) and the ValidatingWebhookConfiguration of ``deploy/base/webhook.yaml``.

Everything a helper starts is stopped and joined by the helper's own ``stop``/context exit.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from agent.queues.served import (  # noqa: F401 - the tests' helpers, from one place
    ROOT,
    ProjectWebhook,
    Tls,
    free_port,
    make_tls,
    manifest_configuration,
)

CONFIGS = ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")


# -- a webhook whose answers the test sets --------------------------------------------------------


Answer = Callable[[dict], tuple[int, Any]]


def allow(review: dict) -> tuple[int, Any]:
    return 200, {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": True},
    }


def deny(message: str, code: int = 403) -> Answer:
    def answer(review: dict) -> tuple[int, Any]:
        return 200, {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": review["request"]["uid"],
                "allowed": False,
                "status": {"code": code, "reason": "Forbidden", "message": message},
            },
        }

    return answer


class FakeWebhook:
    """An HTTPS webhook on 127.0.0.1: every review is kept in ``reviews`` and answered by
    ``answer`` (set it any time) after ``delay`` seconds."""

    def __init__(self, tls: Tls) -> None:
        self.tls = tls
        self.reviews: list[dict] = []
        self.answer: Answer = allow
        self.delay = 0.0
        self._released = threading.Event()  # set on stop: a delayed answer ends at once
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with owner._lock:
                    owner._connections.add(self.connection)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                review = json.loads(body)
                owner.reviews.append({**review, "path": self.path})
                if owner.delay:
                    owner._released.wait(owner.delay)
                status, payload = owner.answer(review)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # Handler threads are joined by server_close (after stop cut their connections: an
        # API server keeps its connections to a webhook open).
        self.server.daemon_threads = False
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls.cert), str(tls.key))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="fake-webhook", daemon=True
        )

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/validate"

    def start(self) -> FakeWebhook:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        self.server.shutdown()
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
        self.server.server_close()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the fake webhook did not stop"

    def requests(self) -> list[dict]:
        return [r["request"] for r in self.reviews]


# -- configurations -------------------------------------------------------------------------------


def hook(name: str, url: str, ca_bundle: str, **fields: Any) -> dict:
    """One webhook of a configuration: pods CREATE in any namespace unless ``fields`` say more."""
    body = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {"url": url, "caBundle": ca_bundle},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
    }
    body.update(fields)
    return body


def configuration(name: str, hooks: list[dict]) -> dict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"akri-site/test": "true"}},
        "webhooks": hooks,
    }


def only_namespace(hooks: list[dict], namespace: str) -> list[dict]:
    """``hooks`` asked only about ``namespace``: on a real API server other runs' namespaces
    must never reach this test's webhook (it is cluster-wide)."""
    out = copy.deepcopy(hooks)
    for h in out:
        selector = h.setdefault("namespaceSelector", {})
        expressions = selector.setdefault("matchExpressions", [])
        expressions.append(
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}
        )
    return out


@contextlib.contextmanager
def registered(api_client: client.ApiClient, body: dict) -> Iterator[dict]:
    """``body`` created in the API server for the block, and deleted after it (also on a
    failure: a configuration left on a shared real server would reach this test's webhook)."""
    custom = client.CustomObjectsApi(api_client)
    custom.create_cluster_custom_object(*CONFIGS, body)
    try:
        yield body
    finally:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(*CONFIGS, body["metadata"]["name"])
