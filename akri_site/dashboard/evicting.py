"""Evict a pod from its page (issue 31): the way to free a device whose pod still runs.

Releasing such a pod's slot frees nothing (its node's agent claims it back at once, never
taking a device from a running pod), so the release confirmation offers this instead. The same
shape as a release: a confirmation naming the pod, its node and the slots it holds, Cancel
focused, an optional reason; the POST evicts through the Eviction API (PodDisruptionBudgets
apply) with the pod's uid as a precondition, so a pod of the same name made since is left
alone; every attempt is audited whatever its outcome, refusals included.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods
from kubernetes.client.rest import ApiException

from agent.models import AuditEntry, Pod, Slot
from agent.release import REASON_MAX
from akri_site.dashboard.access import can_release, viewer_required
from akri_site.dashboard.views import _render

ACTION = "evict_pod"


def audit(request: HttpRequest, pod: str, node: str, reason: str, outcome: str, why: str) -> None:
    AuditEntry.objects.create(
        at=timezone.now(),
        user=request.user if request.user.is_authenticated else None,
        username=request.user.get_username(),
        action=ACTION,
        target=f"pod {pod}",
        holder=node,
        reason=reason,
        outcome=outcome,
        detail=why,
    )


@require_http_methods(["GET", "POST"])
@viewer_required
def evict_pod(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    key = f"{namespace}/{name}"
    reason = request.POST.get("reason", "").strip()[:REASON_MAX]
    if not can_release(request.user):
        if request.method == "POST":  # a forged form: refused, and on the record
            audit(request, key, "", reason, "refused", "needs the operator role")
        raise PermissionDenied("Evicting a pod needs the operator role.")
    pod = Pod.objects.filter(namespace=namespace, name=name).first()
    if request.method == "POST":
        return _evict(request, key, pod, reason)
    if pod is None:
        raise Http404(f"No pod {key} is in the pod cache: nothing to evict.")
    slots = Slot.objects.filter(pod_namespace=namespace, pod_name=name).select_related("instance")
    return _render(
        request,
        "dashboard/evict_confirm.html",
        key=key,
        pod=pod,
        slots=list(slots.order_by("instance__name", "index")),
        reason_max=REASON_MAX,
    )


def _evict(request: HttpRequest, key: str, pod: Pod | None, reason: str) -> HttpResponse:
    from kubernetes import client

    from agent.kube.client import new_api_client, status_of
    from agent.queues.evict import _post_eviction

    here = reverse("dashboard:pod", args=key.split("/", 1))
    confirmed = request.POST.get("uid", "")
    if pod is None or (confirmed and pod.uid and confirmed != pod.uid):
        why = "the pod is gone" if pod is None else "it is another pod of the same name now"
        audit(request, key, pod.node_name if pod else "", reason, "refused", why)
        messages.warning(request, f"Not evicted: {why}. Nothing was changed.")
        return redirect(here)
    namespace, name = key.split("/", 1)
    body: dict = {"apiVersion": "policy/v1", "kind": "Eviction"}
    body["metadata"] = {"name": name, "namespace": namespace}
    if pod.uid:
        body["deleteOptions"] = {"preconditions": {"uid": pod.uid}}
    api_client = new_api_client()
    try:
        _post_eviction(client.CoreV1Api(api_client), name, namespace, body)
    except ApiException as exc:
        code, why, text = status_of(exc)
        detail = f"{code} {why}: {text}".strip()
        audit(request, key, pod.node_name, reason, "failed", detail)
        if code == 429:
            messages.error(
                request, f"Not evicted: a PodDisruptionBudget forbids it now ({detail})."
            )
        else:
            messages.error(request, f"Eviction of {key} failed ({detail}). Nothing was changed.")
        return redirect(here)
    except Exception as exc:  # the API server unreachable: nothing was written
        audit(request, key, pod.node_name, reason, "failed", f"{type(exc).__name__}: {exc}")
        messages.error(request, f"Eviction of {key} failed: the API server did not answer ({exc}).")
        return redirect(here)
    finally:
        api_client.close()
    audit(request, key, pod.node_name, reason, "done", "evicted through the Eviction API")
    messages.success(
        request,
        f"Evicted pod {key}: it stops within its termination grace period, and its node's agent"
        " then frees its slots.",
    )
    return redirect(here)
