"""Reading a pod's device requests as the kubelet and the scheduler count them.

A pod's effective request of a resource is the larger of the sum over its containers (sidecar
init containers included) and the peak of its init phase (init containers run one at a time,
before the others, beside the sidecars started before them).
Extended resources cannot be overcommitted, so limits and requests are equal when both are
given; a limit alone also counts as the request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubernetes.utils import parse_quantity

from agent.sharing.policy import Pod, PolicyError

# Kubernetes' quantity grammar (k8s.io/apimachinery resource.Quantity): a signed decimal number
# and one suffix, binary (Ki..Ei), decimal SI (n u m k M G T P E) or an exponent (e3, E-2).
# The client's parser alone is laxer (it strips spaces), so the grammar is checked first.
_QUANTITY = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?")


def quantity(value: Any, resource: str) -> int:
    """A request or capacity of an extended resource as a whole number of units.

    The API server stores quantities in canonical form (``1000`` comes back as ``1k``, and
    ``1Gi`` is a valid request), so every form of the grammar is read. Extended resources are
    counted in whole units and cannot be negative: anything else is a PolicyError, which the
    extender reports as the pod's Error verdict.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PolicyError(f"{resource}: quantity {value!r} is not a Kubernetes quantity")
    if isinstance(value, str) and not _QUANTITY.fullmatch(value):
        raise PolicyError(f"{resource}: quantity {value!r} is not a Kubernetes quantity")
    try:
        parsed = parse_quantity(value)
    except (ValueError, ArithmeticError):
        raise PolicyError(f"{resource}: quantity {value!r} is not a Kubernetes quantity") from None
    if parsed < 0:
        raise PolicyError(f"{resource}: quantity {value!r} is negative")
    if parsed != parsed.to_integral_value():
        raise PolicyError(f"{resource}: quantity {value!r} is not a whole number of units")
    return int(parsed)


def is_extended(resource: str) -> bool:
    """An extended resource (``akri.sh/x``, ``nvidia.com/gpu``): a name with a domain outside
    ``kubernetes.io``. Only these are counted in whole units, and only these cannot be
    overcommitted."""
    domain, slash, _ = resource.rpartition("/")
    if not slash or domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return False
    return not resource.startswith(("requests.", "limits."))


EXTENDED = object()  # requests_of(pod, EXTENDED): every extended resource the pod asks for


def _wanted(name: Any, prefix: Any) -> bool:
    if not isinstance(name, str):
        return False
    return is_extended(name) if prefix is EXTENDED else name.startswith(prefix)


def _container_requests(container: Any, prefix: Any) -> dict[str, int]:
    """Requests of one container for resources named ``prefix...`` (or every extended
    resource); other resources (cpu, memory, anything not ours) are not even parsed."""
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
    return {name: quantity(value, name) for name, value in asked.items() if _wanted(name, prefix)}


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


def requests_of(pod: Pod, prefix: Any = "") -> dict[str, int]:
    """Effective requests of every resource whose name starts with ``prefix`` (> 0 only), or
    of every extended resource with ``prefix=EXTENDED``."""
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


def _parse_requests(pod: Pod, prefix: Any) -> dict[str, int]:
    """What kube-scheduler counts for the pod: the containers' sum, sidecars (init containers
    with ``restartPolicy: Always``, which keep running) added to it, and at least what the
    init phase needs at its peak (each plain init container with the sidecars started before
    it)."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        raise PolicyError("the pod has no spec")
    total: dict[str, int] = {}
    for container in _containers(spec, "containers"):
        for name, count in _container_requests(container, prefix).items():
            total[name] = total.get(name, 0) + count
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for container in _containers(spec, "initContainers"):
        asked = _container_requests(container, prefix)
        if container.get("restartPolicy") == "Always":
            for name, count in asked.items():
                sidecars[name] = sidecars.get(name, 0) + count
                total[name] = total.get(name, 0) + count
            during = dict(sidecars)
        else:
            during = {n: asked.get(n, 0) + sidecars.get(n, 0) for n in {*asked, *sidecars}}
        for name, count in during.items():
            peak[name] = max(peak.get(name, 0), count)
    for name, count in peak.items():
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
