"""A pod's conditions and latest events, read from the API server for the pod and broker pages.

The cache keeps a pod's phase, not why it is there: the conditions (``PodScheduled`` False,
reason ``Unschedulable``, the scheduler's message) and the events (``FailedScheduling``,
``FailedMount``, ``BackOff`` ...) live only on the API server. The pages read them when shown,
with a short timeout and a few seconds of memory (the broker block polls every 3 s), and say
so in words when they cannot: the page itself never fails for it.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime
from kubernetes import client

READ_TIMEOUT = 2.0
CACHE_SECONDS = 3.0
EVENTS_SHOWN = 10
# Conditions worth a line when they are not True, in the order a pod goes through them.
CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")

_lock = threading.Lock()
_cached: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}
_apis: dict[str, client.CoreV1Api] = {}  # by kubeconfig: tests point the web at new servers


def pod_status(namespace: str, name: str) -> dict[str, Any]:
    """``{"conditions": [...], "events": [...], "waiting": [...], "error": ""}``: the pod's
    conditions that are not True, its containers' waiting reasons and its latest events,
    newest first; ``error`` says why they could not be read."""
    key = (settings.AKRI["KUBECONFIG"] or "", namespace, name)
    with _lock:
        hit = _cached.get(key)
        if hit is not None and time.monotonic() - hit[0] < CACHE_SECONDS:
            return hit[1]
    found = _read(namespace, name)
    with _lock:
        if len(_cached) > 500:  # pages of a big cluster: keep the memory bounded
            _cached.clear()
        _cached[key] = (time.monotonic(), found)
    return found


def forget() -> None:
    """Drop what was read (tests; a changed configuration)."""
    with _lock:
        _cached.clear()
        _apis.clear()


def _core() -> client.CoreV1Api:
    from agent.kube.client import new_api_client

    kubeconfig = settings.AKRI["KUBECONFIG"] or ""
    with _lock:
        if kubeconfig not in _apis:
            _apis[kubeconfig] = client.CoreV1Api(new_api_client())
        return _apis[kubeconfig]


def _read(namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = {"conditions": [], "waiting": [], "events": [], "error": ""}
    try:
        core = _core()
        raw = core.read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=READ_TIMEOUT
        )
        pod = json.loads(raw.data)
        events = core.list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}",
            _preload_content=False,
            _request_timeout=READ_TIMEOUT,
        )
        items = json.loads(events.data).get("items") or []
    except client.ApiException as exc:
        found["error"] = (
            "the pod is gone from the API server"
            if exc.status == 404
            else f"the API server answered {exc.status} {exc.reason}"
        )
        return found
    except Exception as exc:  # no API server configured, or none answering
        found["error"] = f"the API server could not be read ({type(exc).__name__})"
        return found
    status = pod.get("status") or {}
    found["conditions"] = _conditions(status)
    found["waiting"] = _waiting(status)
    found["events"] = _events(items)
    return found


def _conditions(status: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [c for c in status.get("conditions") or [] if c.get("status") != "True"]
    rows.sort(key=lambda c: CONDITIONS.index(c["type"]) if c.get("type") in CONDITIONS else 99)
    return [
        {
            "type": c.get("type", ""),
            "status": c.get("status", ""),
            "reason": c.get("reason", ""),
            "message": c.get("message", ""),
            "since": _time(c.get("lastTransitionTime")),
        }
        for c in rows
    ]


def _waiting(status: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for kind in ("initContainerStatuses", "containerStatuses"):
        for c in status.get(kind) or []:
            waiting = (c.get("state") or {}).get("waiting")
            if waiting:
                rows.append(
                    {
                        "container": c.get("name", ""),
                        "reason": waiting.get("reason", ""),
                        "message": waiting.get("message", ""),
                    }
                )
    return rows


def _events(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for e in items:
        meta = e.get("metadata") or {}
        last = _time(
            e.get("lastTimestamp")
            or (e.get("series") or {}).get("lastObservedTime")
            or e.get("eventTime")
            or e.get("firstTimestamp")
            or meta.get("creationTimestamp")
        )
        rows.append(
            {
                "type": e.get("type", ""),
                "reason": e.get("reason", ""),
                "message": e.get("message", ""),
                "count": int(e.get("count") or (e.get("series") or {}).get("count") or 1),
                "last": last,
                "source": (e.get("source") or {}).get("component", "")
                or e.get("reportingComponent", ""),
            }
        )
    rows.sort(key=lambda r: r["last"].timestamp() if r["last"] else 0.0, reverse=True)
    return rows[:EVENTS_SHOWN]


def _time(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    return parse_datetime(value)
