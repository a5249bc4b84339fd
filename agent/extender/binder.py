"""The API side of ``bind``: read the pod, write its device annotations, create the Binding.

Annotations go on first, then the Binding: once a pod is bound the kubelet may admit it at
once, and the agent's Allocate must find its assignment already there. Every call carries a
timeout, so a slow API server makes ``bind`` fail with a message, never hang the scheduler.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

TIMEOUT = 5.0


class BindError(Exception):
    pass


def _why(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        try:
            return json.loads(exc.body).get("message") or exc.reason
        except (TypeError, ValueError, AttributeError):
            return f"{exc.status} {exc.reason}"
    return str(exc)


class Binder:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api_client)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            response = self.core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=TIMEOUT
            )
        except Exception as exc:
            raise BindError(f"cannot read pod {namespace}/{name}: {_why(exc)}") from None
        return json.loads(response.data)

    def annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        try:
            self.core.patch_namespaced_pod(
                name, namespace, body, _preload_content=False, _request_timeout=TIMEOUT
            )
        except Exception as exc:
            raise BindError(f"cannot annotate pod {namespace}/{name}: {_why(exc)}") from None

    def unannotate(self, namespace: str, name: str, keys: Iterable[str]) -> None:
        self.annotate(namespace, name, dict.fromkeys(keys))

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            # Raw answer: the client's model for it rejects the Status the server returns.
            self.core.create_namespaced_pod_binding(
                name, namespace, body, _preload_content=False, _request_timeout=TIMEOUT
            )
        except Exception as exc:
            raise BindError(f"cannot bind pod {namespace}/{name} to {node}: {_why(exc)}") from None
