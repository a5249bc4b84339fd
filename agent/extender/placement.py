"""May this pod go to this node? kube-scheduler's node filters that a bind must not skip.

The extender binds what kube-scheduler sends it, and kube-scheduler sends only nodes that passed
its own filters. ``bind`` checks the same rules again against the objects it has just read from
the API server, so that a bind call (forged, or from a scheduler whose cache was wrong) can never
place a pod where kube-scheduler itself would not have: the pod's ``nodeSelector``, its required
node affinity (NodeAffinity plugin), the node's NoSchedule and NoExecute taints it does not
tolerate (TaintToleration) and a cordoned node (NodeUnschedulable). Preferred affinity only
scores, so it is not a rule here.

Plain Python over the objects' JSON, as ``k8s.io/component-helpers`` decides it: terms of a
required affinity are ORed, the requirements of one term ANDed, and a term with no requirement
matches nothing. Every refusal is a sentence naming the node and the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The taint the node controller puts on a cordoned node; NodeUnschedulable honours a toleration
# of it even before the taint shows.
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def refusal(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """Why ``pod`` may not run on ``node``, in words; "" when it may."""
    spec = _dict(pod.get("spec"))
    meta = _dict(node.get("metadata"))
    name = str(meta.get("name", ""))
    labels = _dict(meta.get("labels"))
    selector = _dict(spec.get("nodeSelector"))
    for key, value in selector.items():
        if labels.get(key) != value:
            return f"node {name} does not match the pod's nodeSelector ({key}={value})"
    required = _dict(_dict(_dict(spec.get("affinity")).get("nodeAffinity"))).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None:
        terms = _list(_dict(required).get("nodeSelectorTerms"))
        if not any(_term_matches(term, name, labels) for term in terms):
            return f"node {name} does not match the pod's required node affinity"
    tolerations = [t for t in _list(spec.get("tolerations")) if isinstance(t, Mapping)]
    node_spec = _dict(node.get("spec"))
    if node_spec.get("unschedulable") and not _tolerated(UNSCHEDULABLE_TAINT, tolerations):
        return f"node {name} is cordoned (unschedulable)"
    for taint in _list(node_spec.get("taints")):
        if not isinstance(taint, Mapping) or taint.get("effect") not in BLOCKING_EFFECTS:
            continue
        if not _tolerated(taint, tolerations):
            shown = f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
            return f"node {name} has the taint {shown}, which the pod does not tolerate"
    return ""


def _term_matches(term: Any, node_name: str, labels: Mapping[str, Any]) -> bool:
    term = _dict(term)
    expressions = _list(term.get("matchExpressions"))
    fields = _list(term.get("matchFields"))
    if not expressions and not fields:
        return False  # an empty term matches no node
    if not all(_requirement(r, labels) for r in expressions):
        return False
    # metadata.name is the one field a node selector may name.
    return all(
        _dict(r).get("key") == "metadata.name" and _requirement(r, {"metadata.name": node_name})
        for r in fields
    )


def _requirement(requirement: Any, labels: Mapping[str, Any]) -> bool:
    requirement = _dict(requirement)
    key = requirement.get("key")
    operator = requirement.get("operator")
    values = [v for v in _list(requirement.get("values")) if isinstance(v, str)]
    present = key in labels
    value = labels.get(key)
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except (TypeError, ValueError):
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an operator kube-scheduler does not know matches nothing


def _tolerated(taint: Mapping[str, Any], tolerations: list[Mapping[str, Any]]) -> bool:
    """Some toleration tolerates ``taint`` (v1.Toleration.ToleratesTaint)."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        if key and key != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            return True
        if operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False
