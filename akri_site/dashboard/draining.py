"""The cordon and drain page of an Instance (issue 33): preview first, then confirm.

GET shows the Instance's cordon and what a drain would do now, pod by pod (the API server's
dry-run answer: evicted, blocked by which budget, or a broker pod left to the broker rules),
with the queue and owner of each pod; Cancel has the focus. POST (with CSRF) cordons,
uncordons or drains with the operator's reason, re-checking everything on the server, and the
page then says what happened per pod. The work and the audit are ``agent.cordon``'s and
``agent.drain``'s, shared with the management commands and the JSON endpoint.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from kubernetes.client.rest import ApiException

from agent import cordon as cordoning
from agent import drain as draining
from agent.domain.cordon import MAX_REASON
from agent.models import Instance
from akri_site.dashboard.access import can_release, viewer_required
from akri_site.dashboard.cordoning import _refused, cordon_state
from akri_site.dashboard.views import _render

ACTIONS = ("cordon", "uncordon", "drain")


@require_http_methods(["GET", "POST"])
@viewer_required
def instance_drain(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    target = f"{namespace}/{name}"
    if not can_release(request.user):
        if request.method == "POST":  # a forged form: refused, and on the record
            action = request.POST.get("action", "")
            _refused(request, action if action in ACTIONS else "drain", target, "", "no role")
        raise PermissionDenied("Cordoning and draining need the operator role.")
    row = get_object_or_404(Instance, namespace=namespace, name=name)
    if request.method == "POST":
        return _act(request, row)
    try:
        pods = [p.as_dict() for p in draining.preview(namespace, name)]
        problem = ""
    except (ApiException, OSError) as exc:
        pods, problem = [], f"The API server could not be asked ({exc}); nothing is shown."
    return _render(
        request,
        "dashboard/drain_confirm.html",
        instance=row,
        cordon=cordon_state(row),
        pods=pods,
        problem=problem,
        reason_max=MAX_REASON,
        results=None,
    )


def _act(request: HttpRequest, row: Instance) -> HttpResponse:
    here = reverse("dashboard:instance-drain", args=[row.namespace, row.name])
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "")
    target = f"{row.namespace}/{row.name}"
    if action not in ACTIONS:
        _refused(request, "drain", target, reason, f"unknown action {action[:40]!r}")
        messages.error(request, "Nothing was done: choose cordon, uncordon or drain.")
        return redirect(here)
    grace_text = request.POST.get("grace", "").strip()
    try:
        grace = int(grace_text) if grace_text else None
    except ValueError:
        _refused(request, action, target, reason, f"grace {grace_text[:20]!r} is not a number")
        messages.error(request, "Nothing was done: the grace period must be whole seconds.")
        return redirect(here)
    try:
        if action == "cordon":
            result = cordoning.cordon(row.namespace, row.name, user=request.user, reason=reason)
        elif action == "uncordon":
            result = cordoning.uncordon(row.namespace, row.name, user=request.user, reason=reason)
        else:
            pods = draining.drain(
                row.namespace, row.name, user=request.user, reason=reason, grace=grace
            )
            row.refresh_from_db()
            return _render(
                request,
                "dashboard/drain_confirm.html",
                instance=row,
                cordon=cordon_state(row),
                pods=[],
                problem="",
                reason_max=MAX_REASON,
                results=[p.as_dict() for p in pods],
            )
    except (draining.DrainInputError, cordoning.CordonError) as exc:
        messages.error(request, f"Nothing was done: {exc}")
        return redirect(here)
    messages.success(request, f"{row.name}: {result.outcome}: {result.detail}")
    return redirect(here)
