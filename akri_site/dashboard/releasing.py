"""Release a slot from the slot map, where the operator stands (issue 17).

The same rules as the admin's action (``agent.release``): a confirmation page naming the slot
and its holder with Cancel focused and an optional reason, then a POST that releases only if
the slot still holds the value the operator confirmed, audited whatever happens. Afterwards the
operator lands back on the slot map's view they came from, with a message saying what happened.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from agent import release
from agent.models import Slot
from akri_site.dashboard.access import can_release, viewer_required
from akri_site.dashboard.views import _render

# The slot map's parameters a release may carry back; anything else is dropped, and the path
# is always the slot map's own, so ``back`` cannot send the operator elsewhere.
_MAP_PARAMS = (
    "configuration",
    "namespace",
    "instance",
    "node",
    "state",
    "q",
    "pod",
    "sort",
    "page",
)


def map_url(back: str) -> str:
    """The slot map with the view ``back`` (its query string) names."""
    params = QueryDict(back[:4000])
    kept = [(k, params[k]) for k in _MAP_PARAMS if params.get(k)]
    return reverse("dashboard:slots") + ("?" + urlencode(kept) if kept else "")


@require_http_methods(["GET", "POST"])
@viewer_required
def release_slot(request: HttpRequest, pk: int) -> HttpResponse:
    if not can_release(request.user):
        if request.method == "POST":
            # A forged form (the page offers no Release to this user): refused, and audited as
            # every manual action is, whatever its outcome.
            _audit_refused_post(request, pk)
        raise PermissionDenied("Releasing a slot needs the operator role.")
    back = map_url(request.POST.get("back") or request.GET.get("back") or "")
    if request.method == "POST":
        return _release(request, pk, back)
    slot = get_object_or_404(Slot, pk=pk)
    return _render(
        request,
        "dashboard/release_confirm.html",
        slot=slot,
        back=back,
        back_query=back.partition("?")[2],
        settle_seconds=release.SETTLE_SECONDS,
        **release.confirmation(Slot.objects.filter(pk=slot.pk)),
    )


def _audit_refused_post(request: HttpRequest, pk: int) -> None:
    slot = Slot.objects.filter(pk=pk).select_related("instance").first()
    target = f"{slot.instance.namespace}/{slot.instance.name}/{slot.key}" if slot else f"slot #{pk}"
    release.audit_refusal(
        request.user,
        target,
        request.POST.get("expected", "")[:512],
        request.POST.get("reason", "").strip()[: release.REASON_MAX],
        "needs the operator role",
    )


def _release(request: HttpRequest, pk: int, back: str) -> HttpResponse:
    expected = request.POST.get("expected")
    outcomes = release.release(
        request.user,
        Slot.objects.filter(pk=pk),
        [pk],
        {} if expected is None else {pk: expected},
        request.POST.get("reason", ""),
    )
    for level, text in release.report(outcomes):
        messages.add_message(request, getattr(messages, level.upper()), text)
    return redirect(back)
