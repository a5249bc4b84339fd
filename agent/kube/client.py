"""The Kubernetes side: one way to build API clients and to address Akri's objects.

Everything talks to the API server through the official ``kubernetes`` client over HTTP.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.config import incluster_config

GROUP = "akri.sh"
VERSION = "v0"
CONFIGURATIONS = "configurations"
INSTANCES = "instances"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"

# Many watches and plugin threads share one client; urllib3's default pool of 10 would
# make them queue for connections.
POOL_SIZE = 64
# No single read or write of an Instance or Configuration waits longer than this for the API
# server: an Allocate behind a hung request would hold the kubelet (and its lock) for good.
# A timed-out write may still have been applied; callers treat it as unknown (claims.py).
REQUEST_TIMEOUT = 10.0


def new_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A fresh API client: from ``kubeconfig``, else settings/``KUBECONFIG``, else in-cluster."""
    path = kubeconfig if kubeconfig is not None else settings.AKRI["KUBECONFIG"]
    if path:
        # Imported here: the kubeconfig loader brings requests and oauthlib, which a pod that
        # reads its service account never needs (akri_site.deferred).
        from kubernetes.config.kube_config import new_client_from_config

        api = new_client_from_config(config_file=path)
    else:
        configuration = client.Configuration()
        account = settings.AKRI["SERVICE_ACCOUNT_DIR"]
        incluster_config.InClusterConfigLoader(
            token_filename=os.path.join(account, "token"),
            cert_filename=os.path.join(account, "ca.crt"),
        ).load_and_set(configuration)
        api = client.ApiClient(configuration)
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = POOL_SIZE
    return api


def status_of(exc: ApiException) -> tuple[int, str, str]:
    """(code, reason, message) of an API error, from its Status body when it has one."""
    reason, message = exc.reason or "", ""
    try:
        body = json.loads(exc.body or "{}")
        reason = body.get("reason") or reason
        message = body.get("message") or ""
    except (TypeError, ValueError):
        pass
    return int(exc.status or 0), str(reason), message


# Keyword arguments of the typed list calls, as the API server spells them.
_QUERY_NAMES = {
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "limit": "limit",
    "_continue": "continue",
    "watch": "watch",
}


class Requests:
    """Calls through the official client's generic request path (``param_serialize``,
    ``call_api``, ``response_deserialize``), answers as plain dicts.

    Not the typed API classes: importing ``CoreV1Api`` builds about 250 models (some 20 MB in
    every agent process, and the agent's memory is multiplied by the nodes), and every typed
    call is validated by pydantic first, CPU on the Allocate path for arguments we built
    ourselves. Methods keep the typed APIs' names and keywords, so ``ResourceWatcher`` and
    the official ``Watch`` take them as they take the typed ones (a watch of these yields
    each event's dict)."""

    def __init__(self, api_client: client.ApiClient, request_timeout: float = REQUEST_TIMEOUT):
        self.api_client = api_client
        self.request_timeout = request_timeout

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
        **query: Any,
    ) -> Any:
        """The answer as a dict; with ``_preload_content=False`` the open urllib3 response
        (a watch streams it). A non-2xx answer raises ``ApiException`` either way."""
        headers = {"Accept": "application/json"}
        if content_type or body is not None:
            headers["Content-Type"] = content_type or "application/json"
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(_query(query.items())),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        timeout = self.request_timeout if _request_timeout is None else _request_timeout
        if query.get("watch"):
            timeout = None  # a watch ends with its timeoutSeconds, not a read timeout
        response = self.api_client.call_api(*request, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        if not _preload_content:
            return response.response
        response.read()
        return self.api_client.response_deserialize(response, {"2XX": "object"}).data


class AkriApi(Requests):
    """Akri's custom objects in one namespace, as plain dicts."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        super().__init__(api_client, request_timeout)
        self.namespace = namespace
        self._custom: client.CustomObjectsApi | None = None

    @property
    def custom(self) -> client.CustomObjectsApi:
        """The typed custom-objects API on the same client, for callers that want it (the
        benchmarks' bare writes); made on first use, so the agent never loads it."""
        if self._custom is None:
            self._custom = client.CustomObjectsApi(self.api_client)
        return self._custom

    def _path(self, plural: str, name: str = "") -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{plural}"
        return f"{path}/{name}" if name else path

    def get_instance(self, name: str) -> dict[str, Any]:
        return self._call("GET", self._path(INSTANCES, name))

    def list_instances(self, **kwargs: Any) -> Any:
        """A list (or, with ``watch=True`` and ``_preload_content=False``, a watch stream)."""
        return self._call("GET", self._path(INSTANCES), **kwargs)

    def create_instance(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", self._path(INSTANCES), body=body)

    def patch_instance(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch: the conditional write, its ``test`` ops make it fail rather than clobber."""
        return self._call("PATCH", self._path(INSTANCES, name), body=ops, content_type=JSON_PATCH)

    def delete_instance(self, name: str, *, resource_version: str | None = None) -> None:
        body = None
        if resource_version:
            body = {"preconditions": {"resourceVersion": resource_version}}
        self._call("DELETE", self._path(INSTANCES, name), body=body)

    def get_configuration(self, name: str) -> dict[str, Any]:
        return self._call("GET", self._path(CONFIGURATIONS, name))

    def list_configurations(self, **kwargs: Any) -> Any:
        """A list (or, with ``watch=True`` and ``_preload_content=False``, a watch stream)."""
        return self._call("GET", self._path(CONFIGURATIONS), **kwargs)

    def create_configuration(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", self._path(CONFIGURATIONS), body=body)

    def patch_configuration(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        path = self._path(CONFIGURATIONS, name)
        return self._call("PATCH", path, body=ops, content_type=JSON_PATCH)


class CoreApi(Requests):
    """The few core/v1 reads and writes the node agent makes (pods, Secrets, ConfigMaps), and
    the lists the controller watches (pods, nodes, a namespace's pods and Services): the
    typed ``CoreV1Api`` cost 0.4-0.7 s of CPU at every controller start and some 20 MB."""

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        return self._call("GET", "/api/v1/pods", **kwargs)

    def list_node(self, **kwargs: Any) -> Any:
        return self._call("GET", "/api/v1/nodes", **kwargs)

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        return self._call("GET", f"/api/v1/namespaces/{namespace}/pods", **kwargs)

    def list_namespaced_service(self, namespace: str, **kwargs: Any) -> Any:
        return self._call("GET", f"/api/v1/namespaces/{namespace}/services", **kwargs)

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self._call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}", **kwargs)

    def patch_namespaced_pod(
        self, name: str, namespace: str, body: list[dict[str, Any]], **kwargs: Any
    ) -> Any:
        """A JSON patch of one pod."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        return self._call("PATCH", path, body=body, content_type=JSON_PATCH, **kwargs)

    def read_namespaced_secret(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self._call("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}", **kwargs)

    def read_namespaced_config_map(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self._call("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}", **kwargs)


class BatchApi(Requests):
    """The batch/v1 list the broker controller watches (its Jobs)."""

    def list_namespaced_job(self, namespace: str, **kwargs: Any) -> Any:
        return self._call("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs", **kwargs)


def _query(items: Iterable[tuple[str, Any]]) -> Iterable[tuple[str, str]]:
    for key, value in items:
        if value is None or value == "":
            continue
        if key not in _QUERY_NAMES:
            raise TypeError(f"unexpected keyword argument {key!r}")
        if isinstance(value, bool):
            value = "true" if value else "false"
        yield _QUERY_NAMES[key], str(value)
