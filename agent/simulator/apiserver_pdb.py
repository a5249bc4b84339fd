"""PodDisruptionBudgets for the simulator's ``pods/eviction``, as kube-apiserver applies them.

The real API server refuses an eviction with 429 when the pod's budget allows no disruption
now (``status.disruptionsAllowed``, which the disruption controller keeps), and with 500 when
more than one budget selects the pod. The simulator has no disruption controller, so it works
the number out at eviction time the way that controller does: healthy pods (Running, not
terminating, Ready) among those the budget selects, against ``minAvailable`` or
``maxUnavailable`` (integers or percentages of the selected pods). A pod that is not running
yet, or has already ended or is terminating, is evicted whatever the budget says, as the real
eviction subresource does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from agent.simulator.apiserver_store import ApiError

IGNORE_BUDGET_PHASES = ("Pending", "Succeeded", "Failed")


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A metav1.LabelSelector; in policy/v1 an empty selector selects every pod."""
    labels = labels or {}
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def healthy(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return all(c.get("status") == "True" for c in ready)


def _scaled(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * total / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def desired_healthy(spec: Mapping[str, Any], expected: int) -> int:
    if spec.get("maxUnavailable") is not None:
        return max(0, expected - _scaled(spec["maxUnavailable"], expected, True))
    if spec.get("minAvailable") is not None:
        return _scaled(spec["minAvailable"], expected, True)
    return 0


def check_eviction(
    pod: Mapping[str, Any], budgets: Iterable[Mapping[str, Any]], pods: Iterable[Mapping]
) -> None:
    """Raise the API server's refusal when a budget forbids evicting ``pod`` now."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return
    if (pod.get("status") or {}).get("phase", "Pending") in IGNORE_BUDGET_PHASES:
        return
    labels = meta.get("labels") or {}
    mine = [b for b in budgets if selects((b.get("spec") or {}).get("selector"), labels)]
    if not mine:
        return
    if len(mine) > 1:
        raise ApiError(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource "
            "does not support.",
        )
    budget = mine[0]
    spec = budget.get("spec") or {}
    selected = [
        p for p in pods if selects(spec.get("selector"), (p.get("metadata") or {}).get("labels"))
    ]
    current = sum(1 for p in selected if healthy(p))
    desired = desired_healthy(spec, len(selected))
    if current - desired > 0:
        return
    name = (budget.get("metadata") or {}).get("name", "")
    raise ApiError(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {name} needs {desired} healthy pods and "
                    f"has {current} currently",
                }
            ]
        },
    )
