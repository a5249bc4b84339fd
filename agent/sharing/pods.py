"""Reading a pod's device requests as the kubelet and the scheduler count them.

A pod's effective request of a resource is the larger of the sum over its containers and the
largest single init container (init containers run one at a time, before the others).
Extended resources cannot be overcommitted, so limits and requests are equal when both are
given; a limit alone also counts as the request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agent.sharing.policy import Pod, PolicyError

_INTEGER = re.compile(r"[0-9]+")


def quantity(value: Any, resource: str) -> int:
    """A whole-number quantity ("3", 3); anything else is a PolicyError."""
    if isinstance(value, bool):
        raise PolicyError(f"{resource}: quantity {value!r} is not a whole number")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    raise PolicyError(f"{resource}: quantity {value!r} is not a whole number")


def _container_requests(container: Any, prefix: str) -> dict[str, int]:
    """Requests of one container for resources named ``prefix...``; other resources (cpu,
    memory, anything not ours) are not even parsed."""
    if not isinstance(container, Mapping):
        raise PolicyError("a container is not an object")
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise PolicyError("container resources are not an object")
    asked: dict[str, Any] = {}
    for part in ("requests", "limits"):
        values = resources.get(part) or {}
        if not isinstance(values, Mapping):
            raise PolicyError(f"container resources.{part} is not an object")
        asked.update(values)
    return {
        name: quantity(value, name)
        for name, value in asked.items()
        if isinstance(name, str) and name.startswith(prefix)
    }


def _containers(spec: Mapping[str, Any], key: str) -> list[Any]:
    containers = spec.get(key) or []
    if not isinstance(containers, list):
        raise PolicyError(f"spec.{key} is not a list")
    return containers


class PodView(dict):
    """A pod that keeps its parsed requests: the extender asks the policies of thousands of
    nodes about one pod, and parsing it each time would be most of the work. Treat it as
    read-only once built."""

    __slots__ = ("_parsed",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parsed: dict[Any, Any] = {}


def memo(pod: Pod, key: Any, compute: Any) -> Any:
    """``compute()``, kept on a PodView under ``key`` (a policy's reading of the pod, the
    same on every node); computed each time for a plain dict."""
    if not isinstance(pod, PodView):
        return compute()
    found = pod._parsed.get(key)
    if found is None:
        found = pod._parsed[key] = compute()
    return found


def requests_of(pod: Pod, prefix: str = "") -> dict[str, int]:
    """Effective requests of every resource whose name starts with ``prefix`` (> 0 only)."""
    if not isinstance(pod, PodView):
        return _parse_requests(pod, prefix)
    parsed = pod._parsed.get(prefix)
    if parsed is None:
        try:
            parsed = _parse_requests(pod, prefix)
        except PolicyError as exc:
            parsed = exc
        pod._parsed[prefix] = parsed
    if isinstance(parsed, PolicyError):
        raise parsed
    return parsed


def _parse_requests(pod: Pod, prefix: str) -> dict[str, int]:
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        raise PolicyError("the pod has no spec")
    total: dict[str, int] = {}
    for container in _containers(spec, "containers"):
        for name, count in _container_requests(container, prefix).items():
            total[name] = total.get(name, 0) + count
    for container in _containers(spec, "initContainers"):
        for name, count in _container_requests(container, prefix).items():
            total[name] = max(total.get(name, 0), count)
    return {name: count for name, count in total.items() if count > 0}


def uid_of(pod: Pod) -> str:
    meta = pod.get("metadata") or {}
    uid = meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    return str(uid)


def annotations_of(pod: Pod) -> Mapping[str, str]:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return annotations if isinstance(annotations, Mapping) else {}


def is_finished(pod: Pod) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
