"""Reads of the verdicts for the dashboard's node page."""

from __future__ import annotations

from typing import Any

from agent.extender.inspect import policy_statuses
from agent.scheduling.models import PodVerdict


def node_context(name: str) -> dict[str, Any]:
    """The node page's scheduling section: policy statuses, and the latest verdicts that
    turned pods away from this node (the newest 20)."""
    refused = []
    for verdict in PodVerdict.objects.filter(bound_to="").order_by("-at")[:500]:
        reason = verdict.unresolvable.get(name) or verdict.failed.get(name)
        if reason:
            refused.append((verdict, reason, name in verdict.unresolvable))
        if len(refused) >= 20:
            break
    return {"policy_statuses": policy_statuses(name), "refused_here": refused}
