"""The scheduler extender's JSON (``k8s.io/kube-scheduler/extender/v1``), read and written.

Keys are the Go field names in PascalCase (the types have no json tags); Go decodes them case-
insensitively, so requests are read that way too. ``nodeCacheCapable`` decides which field
carries the nodes: ``NodeNames`` (names only) when true, ``Nodes`` (a full NodeList) when
false, and the answer must fill the same field: the scheduler reads only that one, and a null
there filters out every node without an error. Anything malformed is a ``BadRequest``, which
the server answers with HTTP 200 and ``Error`` set, as the scheduler expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class BadRequest(ValueError):
    """A request body the extender cannot use; the message goes into ``Error``."""


def _field(body: Mapping[str, Any], name: str) -> Any:
    """The value of ``name`` matched case-insensitively, as Go's decoder does."""
    if name in body:
        return body[name]
    folded = name.lower()
    for key, value in body.items():
        if isinstance(key, str) and key.lower() == folded:
            return value
    return None


@dataclass
class ExtenderArgs:
    pod: dict[str, Any]
    node_names: list[str] | None  # nodeCacheCapable: names only
    nodes: list[dict[str, Any]] | None  # otherwise: full Node objects

    @property
    def names(self) -> list[str]:
        if self.node_names is not None:
            return self.node_names
        return [n["metadata"]["name"] for n in self.nodes or []]


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return value


def parse_args(body: Any) -> ExtenderArgs:
    """ExtenderArgs from a decoded filter or prioritize body."""
    body = _object(body, "the request body")
    pod = _object(_field(body, "Pod"), "Pod")
    meta = _object(pod.get("metadata"), "Pod.metadata")
    if not isinstance(meta.get("name"), str):
        raise BadRequest("Pod.metadata.name must be a string")
    names, nodes = _field(body, "NodeNames"), _field(body, "Nodes")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("NodeNames must be a list of strings")
        return ExtenderArgs(pod, names, None)
    if nodes is None:
        raise BadRequest("neither NodeNames nor Nodes was given")
    items = _object(nodes, "Nodes").get("items") or []
    if not isinstance(items, list):
        raise BadRequest("Nodes.items must be a list")
    for item in items:
        name = (_object(item, "a node").get("metadata") or {}).get("name")
        if not isinstance(name, str):
            raise BadRequest("every node in Nodes.items needs metadata.name")
    return ExtenderArgs(pod, None, items)


def filter_result(
    args: ExtenderArgs | None,
    fits: list[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult echoing the field the request used."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }
    if args is None:
        return result
    if args.node_names is not None:
        result["NodeNames"] = list(fits)
    else:
        keep = set(fits)
        items = [n for n in args.nodes or [] if n["metadata"]["name"] in keep]
        result["Nodes"] = {"metadata": {}, "items": items}
    return result


def priority_list(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"Host": host, "Score": int(score)} for host, score in scores]


@dataclass
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def parse_binding(body: Any) -> BindingArgs:
    body = _object(body, "the request body")
    values = [_field(body, key) for key in ("PodName", "PodNamespace", "PodUID", "Node")]
    for key, value in zip(("PodName", "PodNamespace", "PodUID", "Node"), values, strict=True):
        if not isinstance(value, str) or (key != "PodUID" and not value):
            raise BadRequest(f"{key} must be a non-empty string")
    return BindingArgs(*values)


def binding_result(error: str = "") -> dict[str, Any]:
    return {"Error": error}
