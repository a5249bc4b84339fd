"""Who leads: the Leases of the controller and beat, read for the dashboard.

Read from the API server (the truth), with a short timeout and a few seconds of memory so that
an overview refresh never waits on a slow API server more than once in a while.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime
from kubernetes import client
from kubernetes.client.rest import ApiException

from agent.leader import LEASES

CACHE_SECONDS = 5.0
READ_TIMEOUT = 1.5

_lock = threading.Lock()
_cached: tuple[float, list[dict[str, Any]]] | None = None
_api: client.CoordinationV1Api | None = None


def leaders() -> list[dict[str, Any]]:
    """One row per elected component: holder (or why it is unknown), renewed, expired."""
    global _cached
    with _lock:
        if _cached is not None and time.monotonic() - _cached[0] < CACHE_SECONDS:
            return _cached[1]
        rows = _read_all()
        _cached = (time.monotonic(), rows)
        return rows


def forget() -> None:
    """Drop the remembered answer (tests, and after a configuration change)."""
    global _cached, _api
    with _lock:
        _cached, _api = None, None


def _read_all() -> list[dict[str, Any]]:
    namespace = settings.AKRI["NAMESPACE"]
    try:
        api = _coordination()
    except Exception as exc:  # no kubeconfig and not in a cluster: say so, do not fail the page
        return [
            _row(component, name, error=f"no API server: {exc}")
            for component, name in LEASES.items()
        ]
    return [_read(api, namespace, component, name) for component, name in LEASES.items()]


def _coordination() -> client.CoordinationV1Api:
    global _api
    if _api is None:
        from agent.kube.client import new_api_client

        _api = client.CoordinationV1Api(new_api_client())
    return _api


def _read(
    api: client.CoordinationV1Api, namespace: str, component: str, name: str
) -> dict[str, Any]:
    try:
        response = api.read_namespaced_lease(
            name, namespace, _preload_content=False, _request_timeout=READ_TIMEOUT
        )
    except ApiException as exc:
        if exc.status == 404:
            return _row(component, name, error="no Lease yet (no replica has campaigned)")
        return _row(component, name, error=f"API error {exc.status} {exc.reason}")
    except Exception as exc:
        return _row(component, name, error=f"API server unreachable: {type(exc).__name__}")
    spec = json.loads(response.data).get("spec") or {}
    renewed = parse_datetime(spec.get("renewTime") or "")
    duration = float(spec.get("leaseDurationSeconds") or 0)
    holder = spec.get("holderIdentity") or ""
    expired = renewed is None or _now() - renewed > dt.timedelta(seconds=duration)
    return _row(
        component, name, holder=holder, renewed=renewed, expired=expired or not holder,
        transitions=int(spec.get("leaseTransitions") or 0),
    )  # fmt: skip


def _row(component: str, lease: str, **fields: Any) -> dict[str, Any]:
    row = {"component": component, "lease": lease, "holder": "", "renewed": None}
    row.update({"expired": True, "transitions": 0, "error": ""})
    row.update(fields)
    return row


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
