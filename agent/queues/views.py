"""The Queues pages, their JSON API, and the operator's eviction of foreign pods.

Thin views: access check, validate, one query module call, render. The page's figures come
from ``queries``; live updates from ``live`` over ``/ws/queues/``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request

from agent.charges.facts import AKRI, DRA
from agent.queues import evict, queries
from agent.queues.forms import EvictForm, QueueRangeForm
from akri_site.dashboard.access import role_of, viewer_required
from akri_site.dashboard.apiauth import JSON_OBJECT, ApiView, query
from akri_site.dashboard.forms import RANGES

KINDS = (AKRI, DRA)


def _context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {"role": role_of(request.user), "can_evict": evict.may_evict(request.user), **extra}


def _range(request: HttpRequest) -> tuple[QueueRangeForm, dict[str, Any]]:
    form = QueueRangeForm(request.GET or None)
    if request.GET and not form.is_valid():
        return form, {}
    if not request.GET:
        form = QueueRangeForm({})
        form.is_valid()
    start, end = form.window()
    return form, {"start": start, "end": end}


@require_GET
@never_cache
@viewer_required
def queues(request: HttpRequest) -> HttpResponse:
    form, window = _range(request)
    errors = _errors(form)
    history = queries.history(window["start"], window["end"]) if window else None
    refused = queries.refusal_groups(**window) if window else None
    return render(
        request,
        "queues/queues.html",
        _context(
            request,
            form=form,
            errors=errors,
            history=history,
            refused=refused,
            live_feed=True,  # queues.js keeps the figures live over /ws/queues/
            **queries.overview(),
            **window,
        ),
        status=400 if errors else 200,
    )


@require_GET
@never_cache
@viewer_required
def queue_detail(request: HttpRequest, queue: str) -> HttpResponse:
    detail = queries.queue_detail(queue)
    if detail is None:
        raise Http404(f"No queue {queue!r} owns, uses or is charged for anything.")
    form, window = _range(request)
    errors = _errors(form)
    history = queries.history(window["start"], window["end"], queue) if window else None
    return render(
        request,
        "queues/queue.html",
        _context(
            request, form=form, errors=errors, history=history, live_feed=True, **detail, **window
        ),
        status=400 if errors else 200,
    )


@require_GET
@never_cache
@viewer_required
def claim_detail(request: HttpRequest, kind: str, namespace: str, name: str) -> HttpResponse:
    claim = _claim_or_404(kind, namespace, name)
    return render(request, "queues/claim.html", _context(request, claim=claim))


def _claim_or_404(kind: str, namespace: str, name: str) -> dict[str, Any]:
    if kind not in KINDS:
        raise Http404(f"Unknown kind {kind!r}: use {' or '.join(KINDS)}.")
    claim = queries.claim_detail(kind, namespace, name)
    if claim is None:
        raise Http404(f"No {kind} {namespace}/{name} in the charge cache.")
    return claim


def _errors(form: QueueRangeForm) -> list[str]:
    if form.is_bound and not form.is_valid():
        return [f"{field}: {' '.join(errs)}" for field, errs in form.errors.items()]
    return []


@require_http_methods(["GET", "POST"])
@never_cache
@viewer_required
def evict_foreign(request: HttpRequest, kind: str, namespace: str, name: str) -> HttpResponse:
    """Seed 003's second option: the owner evicts the foreign pods keeping its claim bound."""
    if not evict.may_evict(request.user):
        raise PermissionDenied("Evicting pods needs the operator role.")
    claim = _claim_or_404(kind, namespace, name)
    here = reverse("queues:claim", args=[kind, namespace, name])
    if request.method == "GET":
        foreign = [u for u in claim["users"] if u["foreign"]]
        return render(
            request, "queues/evict_confirm.html", _context(request, claim=claim, foreign=foreign)
        )
    form = EvictForm(request.POST)
    form.is_valid()
    report = evict.evict_foreign(
        claim,
        form.confirmed(request.POST),
        user=request.user,
        reason=form.cleaned_data.get("reason", ""),
    )
    for level, text in report:
        messages.add_message(request, level, text)
    return redirect(here)


# --- JSON API ----------------------------------------------------------------------------
# The same sign-in and role as every endpoint under /api/ (a token or the session; 401 without
# credentials or with a bad token, 403 without a role): see ``akri_site.dashboard.apiauth``.
@method_decorator(never_cache, name="dispatch")
@extend_schema(
    responses={200: OpenApiTypes.OBJECT},
    summary="Queues now: owners, usage, charges and the latest refusals.",
)
class QueuesApi(ApiView):
    def get(self, request: Request) -> JsonResponse:
        data = queries.overview()
        data["refusals"] = [
            {
                "at": r.at.isoformat(),
                "pod": f"{r.namespace}/{r.name}",
                "queue": r.queue,
                "claim": r.claim,
                "owner": r.owner,
                "rule": r.rule,
                "message": r.message,
            }
            for r in data["refusals"]
        ]
        return JsonResponse(data)


@method_decorator(never_cache, name="dispatch")
@extend_schema(
    parameters=[
        query("queue", "Only this queue's charges."),
        query("source", "Only charges from this source.", enum=sorted(queries.SOURCES)),
        query("problems", "`1`: only charges with a problem.", enum=["1"]),
    ],
    responses=JSON_OBJECT,
    summary="The current charges, one row per pod or claim.",
)
class ChargesApi(ApiView):
    def get(self, request: Request) -> JsonResponse:
        source = request.GET.get("source", "")
        if source and source not in queries.SOURCES:
            known = ", ".join(sorted(queries.SOURCES))
            return JsonResponse(
                {"detail": f"unknown source {source!r}: use one of {known}"}, status=400
            )
        rows = queries.charges(
            queue=request.GET.get("queue", ""),
            source=source,
            problems=request.GET.get("problems") == "1",
        )
        return JsonResponse({"count": len(rows), "results": rows})


@method_decorator(never_cache, name="dispatch")
@extend_schema(
    parameters=[
        query("range", "A preset range, or `custom` with `start`.", enum=[r for r, _ in RANGES]),
        query("start", "Custom range start (ISO 8601).", kind=OpenApiTypes.DATETIME),
        query("end", "Custom range end (ISO 8601); now when absent.", kind=OpenApiTypes.DATETIME),
        query("queue", "Only this queue."),
    ],
    responses=JSON_OBJECT,
    summary="Charges over time per queue.",
)
class HistoryApi(ApiView):
    def get(self, request: Request) -> JsonResponse:
        form, window = _range(request)
        if not window:
            return JsonResponse({"detail": _errors(form)}, status=400)
        return JsonResponse(
            queries.history(window["start"], window["end"], request.GET.get("queue", ""))
        )


api_queues = QueuesApi.as_view()
api_charges = ChargesApi.as_view()
api_history = HistoryApi.as_view()
