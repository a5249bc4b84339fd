"""The API side of ``bind``: read the pod and the node, write the pod's device annotations,
create the Binding.

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
ATTEMPTS = 3


class BindError(Exception):
    pass


class AlreadyBound(BindError):
    """The pod is bound already (a retried bind, or another binder): nothing was written."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.node = (pod.get("spec") or {}).get("nodeName") or ""
        meta = pod.get("metadata") or {}
        super().__init__(
            f"pod {meta.get('namespace')}/{meta.get('name')} is bound to {self.node} already"
        )


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

    def get_node(self, name: str) -> dict[str, Any]:
        """The Node as the API server has it now (its labels and taints decide the bind)."""
        try:
            response = self.core.read_node(name, _preload_content=False, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                raise BindError(f"node {name} does not exist") from None
            raise BindError(f"cannot read node {name}: {_why(exc)}") from None
        except Exception as exc:
            raise BindError(f"cannot read node {name}: {_why(exc)}") from None
        return json.loads(response.data)

    def annotate(self, pod: dict[str, Any], annotations: Mapping[str, str]) -> None:
        """Write ``annotations`` on a pod that is not bound yet, as a conditional JSON patch
        (its ``test`` op fails on any change we have not seen). On a conflict (409, or 422 for
        a failed ``test``) the pod is read again and the patch made against what it is now:
        anyone may write the pod in between (kube-scheduler's ``PodScheduled`` condition after
        a failed attempt, a controller's label), and retrying with the old resourceVersion
        could only fail again. AlreadyBound when it is bound meanwhile: an assignment never
        lands on a running pod."""
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        for _ in range(ATTEMPTS):
            if (pod.get("spec") or {}).get("nodeName"):
                raise AlreadyBound(pod)
            try:
                self.core.patch_namespaced_pod(
                    name,
                    namespace,
                    _annotation_ops(pod, annotations),
                    _preload_content=False,
                    _request_timeout=TIMEOUT,
                )
                return
            except ApiException as exc:
                if exc.status not in (409, 422):
                    raise BindError(
                        f"cannot annotate pod {namespace}/{name}: {_why(exc)}"
                    ) from None
            except Exception as exc:
                raise BindError(f"cannot annotate pod {namespace}/{name}: {_why(exc)}") from None
            pod = self.get_pod(namespace, name)
        raise BindError(f"cannot annotate pod {namespace}/{name}: it kept changing")

    def unannotate(self, namespace: str, name: str, keys: Iterable[str]) -> None:
        """Remove our annotations again (a merge patch with nulls: absent keys are fine)."""
        body = {"metadata": {"annotations": dict.fromkeys(keys)}}
        try:
            self.core.patch_namespaced_pod(
                name, namespace, body, _preload_content=False, _request_timeout=TIMEOUT
            )
        except Exception as exc:
            raise BindError(f"cannot annotate pod {namespace}/{name}: {_why(exc)}") from None

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
        except ApiException as exc:
            if exc.status == 409:
                current = self.get_pod(namespace, name)
                if (current.get("spec") or {}).get("nodeName"):
                    raise AlreadyBound(current) from None
            raise BindError(f"cannot bind pod {namespace}/{name} to {node}: {_why(exc)}") from None
        except Exception as exc:
            raise BindError(f"cannot bind pod {namespace}/{name} to {node}: {_why(exc)}") from None


def _pointer(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def _annotation_ops(pod: dict[str, Any], annotations: Mapping[str, str]) -> list[dict[str, Any]]:
    meta = pod.get("metadata") or {}
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}
    ]
    if not meta.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.extend({"op": "add", "path": _pointer(k), "value": v} for k, v in annotations.items())
    return ops
