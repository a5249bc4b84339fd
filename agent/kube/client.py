"""The Kubernetes side: one way to build API clients and to address Akri's objects.

Everything talks to the API server through the official ``kubernetes`` client over HTTP.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from kubernetes import client, config
from kubernetes.client.rest import ApiException

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
        api = config.new_client_from_config(config_file=path)
    else:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
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


class AkriApi:
    """Akri's custom objects in one namespace, as plain dicts."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api_client)
        self.request_timeout = request_timeout

    def get_instance(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            INSTANCES,
            name,
            _request_timeout=self.request_timeout,
        )

    def list_instances(self, **kwargs: Any) -> dict[str, Any]:
        return self.custom.list_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            INSTANCES,
            **kwargs,
            _request_timeout=self.request_timeout,
        )

    def create_instance(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            INSTANCES,
            body,
            _request_timeout=self.request_timeout,
        )

    def patch_instance(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch: the conditional write, its ``test`` ops make it fail rather than clobber."""
        return self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            INSTANCES,
            name,
            ops,
            _content_type=JSON_PATCH,
            _request_timeout=self.request_timeout,
        )

    def delete_instance(self, name: str, *, resource_version: str | None = None) -> None:
        body = None
        if resource_version:
            body = client.V1DeleteOptions(
                preconditions=client.V1Preconditions(resource_version=resource_version)
            )
        self.custom.delete_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            INSTANCES,
            name,
            body=body,
            _request_timeout=self.request_timeout,
        )

    def get_configuration(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            CONFIGURATIONS,
            name,
            _request_timeout=self.request_timeout,
        )

    def list_configurations(self, **kwargs: Any) -> dict[str, Any]:
        return self.custom.list_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            CONFIGURATIONS,
            **kwargs,
            _request_timeout=self.request_timeout,
        )

    def create_configuration(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            CONFIGURATIONS,
            body,
            _request_timeout=self.request_timeout,
        )

    def patch_configuration(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            CONFIGURATIONS,
            name,
            ops,
            _content_type=JSON_PATCH,
            _request_timeout=self.request_timeout,
        )
