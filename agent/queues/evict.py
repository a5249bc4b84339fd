"""The operator's eviction of foreign pods from an owned claim (seed 003, option 2).

Each pod is re-checked on the server against what the operator confirmed (same pod uid, still
a foreign user of the claim), then evicted through the Eviction API (``pods/eviction``: it
honours PodDisruptionBudgets, unlike a delete). Every attempt leaves an audit row.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import messages
from django.utils import timezone
from kubernetes import client
from kubernetes.client.rest import ApiException

from agent.kube.client import new_api_client, status_of
from agent.models import AuditEntry
from akri_site.dashboard.access import RELEASE_PERMISSION

log = logging.getLogger(__name__)
ACTION = "evict_foreign_pods"


def may_evict(user: Any) -> bool:
    """Operators (who may release slots by hand) and admins."""
    return bool(
        user is not None
        and user.is_authenticated
        and user.is_active
        and user.has_perm(RELEASE_PERMISSION)
    )


def evict_foreign(
    claim: dict[str, Any], confirmed: list[str], *, user: Any, reason: str
) -> list[tuple[int, str]]:
    target = f"{claim['kind']} {claim['namespace']}/{claim['name']}"
    current = {f"{u['pod']}@{u.get('uid', '')}": u for u in claim["users"] if u["foreign"]}
    report: list[tuple[int, str]] = []
    if not confirmed:
        report.append((messages.WARNING, "No pod was confirmed: nothing evicted."))
    api_client = new_api_client() if confirmed else None
    try:
        for ref in confirmed:
            report.append(_one(api_client, target, claim, current.get(ref), ref, user, reason))
    finally:
        if api_client is not None:
            api_client.close()
    return report


def _one(api_client, target, claim, user_row, ref, user, reason) -> tuple[int, str]:
    pod = ref.rsplit("@", 1)[0]
    if user_row is None:
        _audit(user, target, pod, reason, "refused", "no longer a foreign user of the claim")
        return messages.WARNING, f"{pod}: not evicted, it is no longer a foreign user of {target}."
    namespace, _, name = pod.partition("/")
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if user_row.get("uid"):
        body["deleteOptions"] = {"preconditions": {"uid": user_row["uid"]}}
    try:
        _post_eviction(client.CoreV1Api(api_client), name, namespace, body)
    except ApiException as exc:
        code, why, text = status_of(exc)
        detail = f"{code} {why}: {text}".strip()
        _audit(user, target, pod, reason, "failed", detail)
        return messages.ERROR, f"{pod}: eviction failed ({detail})."
    _audit(
        user, target, pod, reason, "done", f"queue {user_row.get('queue')}, owner {claim['owner']}"
    )
    return messages.SUCCESS, f"{pod} (queue {user_row.get('queue')}) evicted from {target}."


def _post_eviction(core: client.CoreV1Api, name: str, namespace: str, body: dict) -> None:
    """policy/v1 Eviction (Kubernetes 1.22+), else policy/v1beta1 as ``kubectl drain`` falls back."""
    try:
        core.create_namespaced_pod_eviction(name, namespace, body)
    except ApiException as exc:
        _, _, text = status_of(exc)
        if exc.status not in (400, 404) or "policy/v1" not in text:
            raise
        core.create_namespaced_pod_eviction(
            name, namespace, {**body, "apiVersion": "policy/v1beta1"}
        )


def _audit(user, target, holder, reason, outcome, detail) -> None:
    AuditEntry.objects.create(
        at=timezone.now(),
        user=user,
        username=user.get_username(),
        action=ACTION,
        target=target,
        holder=holder,
        reason=reason,
        outcome=outcome,
        detail=detail,
    )
