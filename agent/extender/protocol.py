"""The scheduler extender's JSON (``k8s.io/kube-scheduler/extender/v1``), read and written.

Keys are the Go field names in PascalCase (the types have no json tags); Go decodes them case-
insensitively, so requests are read that way too. ``nodeCacheCapable`` decides which field
carries the nodes: ``NodeNames`` (names only) when true, ``Nodes`` (a full NodeList) when
false, and the answer must fill the same field: the scheduler reads only that one, and a null
there filters out every node without an error. Anything malformed is a ``BadRequest``, which
the server answers with HTTP 200 and ``Error`` set, as the scheduler expects.

Names are checked as the API server checks them (a pod's name and a node's a DNS subdomain of
at most 253 characters, a namespace a DNS label of at most 63): nothing the scheduler sends can
be longer, and what the extender keeps or writes (its books, the verdict rows the dashboard
links by name) must never hold a name no object can have. Node names in ``NodeNames`` are only
checked for length and type, and counted: they are looked up, never stored as given, and a
5,000-node list is checked in microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.domain.naming import is_dns_label, is_dns_subdomain

# Three times the 5,000 nodes Kubernetes is tested to (its scalability thresholds): every name
# is a lookup in the books, so an endless list is work on the scheduler's path.
MAX_NODES = 15_000
MAX_NAME = 253  # a DNS subdomain (pod and node names)
MAX_UID = 64  # UIDs are 36-character UUIDs; the verdict rows keep 64


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


def _shown(value: str) -> str:
    """A name as an error message may quote it: never the whole of an endless one."""
    return repr(value) if len(value) <= 80 else f"{value[:60]!r}... ({len(value)} characters)"


def check_name(value: Any, what: str, *, label: bool = False, empty: bool = False) -> str:
    """``value`` as a Kubernetes object name (a DNS subdomain; with ``label`` a DNS label, as
    namespaces are), or BadRequest in words. ``empty`` accepts ""."""
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a string")
    if not value and empty:
        return value
    limit = 63 if label else MAX_NAME
    if len(value) > limit:
        raise BadRequest(f"{what} is {len(value)} characters long; at most {limit} are allowed")
    valid = is_dns_label(value) if label else is_dns_subdomain(value)
    if not valid:
        kind = "DNS label" if label else "DNS subdomain"
        raise BadRequest(
            f"{what} {_shown(value)} is not a valid name (a lowercase RFC 1123 {kind})"
        )
    return value


def check_uid(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a string")
    if len(value) > MAX_UID:
        raise BadRequest(f"{what} is {len(value)} characters long; at most {MAX_UID} are allowed")
    return value


def _pod(body: Mapping[str, Any]) -> dict[str, Any]:
    pod = _object(_field(body, "Pod"), "Pod")
    meta = _object(pod.get("metadata"), "Pod.metadata")
    check_name(meta.get("name"), "Pod.metadata.name")
    check_name(meta.get("namespace", ""), "Pod.metadata.namespace", label=True, empty=True)
    check_uid(meta.get("uid", ""), "Pod.metadata.uid")
    return pod


def _node_names(names: Any) -> list[str]:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BadRequest("NodeNames must be a list of strings")
    if len(names) > MAX_NODES:
        raise BadRequest(f"NodeNames lists {len(names)} nodes; at most {MAX_NODES} are allowed")
    if names and max(map(len, names)) > MAX_NAME:
        raise BadRequest(f"a node name in NodeNames is longer than {MAX_NAME} characters")
    return names


def parse_args(body: Any) -> ExtenderArgs:
    """ExtenderArgs from a decoded filter or prioritize body."""
    body = _object(body, "the request body")
    pod = _pod(body)
    names, nodes = _field(body, "NodeNames"), _field(body, "Nodes")
    if names is not None:
        return ExtenderArgs(pod, _node_names(names), None)
    if nodes is None:
        raise BadRequest("neither NodeNames nor Nodes was given")
    items = _object(nodes, "Nodes").get("items") or []
    if not isinstance(items, list):
        raise BadRequest("Nodes.items must be a list")
    if len(items) > MAX_NODES:
        raise BadRequest(f"Nodes lists {len(items)} nodes; at most {MAX_NODES} are allowed")
    for item in items:
        name = (_object(item, "a node").get("metadata") or {}).get("name")
        check_name(name, "metadata.name of a node in Nodes.items")
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
    for key, value in zip(
        ("PodName", "PodNamespace", "Node"), values[:2] + values[3:], strict=True
    ):
        if not isinstance(value, str) or not value:
            raise BadRequest(f"{key} must be a non-empty string")
    name, namespace, uid, node = values
    return BindingArgs(
        check_name(name, "PodName"),
        check_name(namespace, "PodNamespace", label=True),
        check_uid(uid if uid is not None else "", "PodUID"),
        check_name(node, "Node"),
    )


def binding_result(error: str = "") -> dict[str, Any]:
    return {"Error": error}
