"""Dashboard pages: check access, validate the filters, read, render.

Every page is server-rendered from the ORM cache; ``static/dashboard/live.js`` keeps it current
over the websocket. Filters, page and time range are GET parameters, so Back and shared links
restore a view; a filter naming nothing known is answered with its message and HTTP 400.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core.paginator import EmptyPage, Page, Paginator
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agent.models import (
    AuditEntry,
    Configuration,
    Instance,
    Node,
    Pod,
    ReconcileRun,
    SlotEvent,
    SlotPodBinding,
)
from agent.scheduling.queries import node_context
from akri_site.dashboard import fragments, queries, slotmap
from akri_site.dashboard.access import can_release, role_of, viewer_required
from akri_site.dashboard.forms import AuditFilterForm, RunFilterForm, SlotFilterForm, known_nodes

# Instances per slot-map page: large enough that a filter to one Configuration or node of a
# big cluster (2,000 Instances) still shows all of it on one page.
SLOT_MAP_PAGE = 2500
RUNS_PAGE = 50
AUDIT_PAGE = 50
RUN_EVENTS_LIMIT = 2000


class BadPage(Exception):
    pass


def _paginate(items: Any, number: int | None, per_page: int) -> Page:
    paginator = Paginator(items, per_page)
    try:
        return paginator.page(number or 1)
    except EmptyPage:
        pages = paginator.num_pages
        there = "there is 1 page" if pages == 1 else f"there are {pages} pages"
        raise BadPage(f"Page {number} does not exist: {there}.") from None


def _page_links(request: HttpRequest, page: Page) -> dict[str, str]:
    """URLs of the neighbouring pages, keeping every other parameter."""

    def url(number: int) -> str:
        params = request.GET.copy()
        params["page"] = str(number)
        return "?" + params.urlencode()

    links = {}
    if page.has_previous():
        links["previous"] = url(page.previous_page_number())
    if page.has_next():
        links["next"] = url(page.next_page_number())
    return links


def page_context(request: HttpRequest, **context: Any) -> dict[str, Any]:
    return {
        "role": role_of(request.user),
        "can_release": can_release(request.user),
        **fragments.link_prefixes(),
        **context,
    }


def _render(request: HttpRequest, template: str, status: int = 200, **context: Any) -> HttpResponse:
    return render(request, template, page_context(request, **context), status=status)


def _errors(form: Any) -> list[str]:
    messages = []
    for field, errors in form.errors.items():
        label = form.fields[field].label if field in form.fields else None
        name = label or field.replace("_", " ")
        messages.extend(f"{name}: {e}" if field != "__all__" else e for e in errors)
    return messages


def _live_query(view: str, filters: dict[str, str]) -> str:
    return urlencode({"view": view, **filters})


def _filter_choices() -> dict[str, list[str]]:
    configurations = set(Configuration.objects.values_list("name", flat=True))
    in_use = Instance.objects.order_by().values_list("configuration_name").distinct()
    configurations.update(name for (name,) in in_use)
    return {"configurations": sorted(configurations), "nodes": sorted(known_nodes())}


@require_GET
@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness for probes: the process answers and its database does."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        return HttpResponse("database unavailable\n", status=503, content_type="text/plain")
    return HttpResponse("ok\n", content_type="text/plain")


@require_GET
@viewer_required
def overview(request: HttpRequest) -> HttpResponse:
    return _render(request, "dashboard/overview.html", live_view="overview", **queries.overview())


@require_GET
@viewer_required
def slot_map(request: HttpRequest) -> HttpResponse:
    form = SlotFilterForm(request.GET)
    context: dict[str, Any] = {"form": form, "choices": _filter_choices(), "live_view": "slots"}
    if not form.is_valid():
        return _render(request, "dashboard/slots.html", 400, errors=_errors(form), **context)
    filters = form.filters()
    rules = slotmap.StuckRules.at()
    try:
        page = _paginate(slotmap.matching(filters, rules), form.cleaned_data["page"], SLOT_MAP_PAGE)
    except BadPage as exc:
        return _render(request, "dashboard/slots.html", 400, errors=[str(exc)], **context)
    instances = slotmap.page_of(page.object_list, filters, rules)
    counts = slotmap.summary()
    groups = slotmap.group_by_configuration(instances, counts)
    return _render(
        request,
        "dashboard/slots.html",
        filters=filters,
        live_query=_live_query("slots", filters),
        page=page,
        links=_page_links(request, page),
        groups=groups,
        grid=fragments.slot_grid(groups, can_release(request.user)),
        shown=sum(len(i["match"]) for i in instances),
        summary=counts,
        instance_total=Instance.objects.count(),
        **context,
    )


def _pods_of(instance: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [s["pod"].split("/", 1) for s in instance["slots"] if s["pod"]]
    pods = {}
    for ns, name in names:
        row = Pod.objects.filter(namespace=ns, name=name).values().first()
        pods[f"{ns}/{name}"] = row
    return pods


@require_GET
@viewer_required
def instance_detail(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    row = get_object_or_404(Instance, namespace=namespace, name=name)
    (data,) = slotmap.serialize(Instance.objects.filter(pk=row.pk))
    filters = {"instance": data["key"]}
    return _render(
        request,
        "dashboard/instance.html",
        instance=row,
        data=data,
        configuration_known=Configuration.objects.filter(
            namespace=namespace, name=row.configuration_name
        ).exists(),
        grid=fragments.slot_grid(
            slotmap.group_by_configuration([data], slotmap.summary()), can_release(request.user)
        ),
        pods=_pods_of(data),
        bindings=SlotPodBinding.objects.filter(namespace=namespace, instance=name).order_by(
            "node", "slot"
        ),
        events=queries.recent_events(SlotEvent.objects.filter(namespace=namespace, instance=name)),
        live_view="slots",
        live_query=_live_query("slots", filters),
    )


@require_GET
@viewer_required
def configuration_detail(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    configuration = get_object_or_404(Configuration, namespace=namespace, name=name)
    instances = slotmap.serialize(
        Instance.objects.filter(namespace=namespace, configuration_name=name)
    )
    return _render(
        request,
        "dashboard/configuration.html",
        configuration=configuration,
        instances=instances,
        counts=slotmap.count_slots(s for i in instances for s in i["slots"]),
        events=queries.recent_events(
            SlotEvent.objects.filter(namespace=namespace, configuration=name)
        ),
        live_view="overview",
        live_query=_live_query("overview", {}),
    )


@require_GET
@viewer_required
def node_detail(request: HttpRequest, name: str) -> HttpResponse:
    node = Node.objects.filter(name=name).first()
    filters = {"node": name}
    instances = slotmap.slot_map(filters)
    if node is None and not instances and not ReconcileRun.objects.filter(node=name).exists():
        raise Http404(f"No node named {name} is known.")
    held = [s for i in instances for s in i["slots"] if s["node"] == name]
    groups = slotmap.group_by_configuration(instances, slotmap.summary())
    return _render(
        request,
        "dashboard/node.html",
        name=name,
        node=node,
        groups=groups,
        grid=fragments.slot_grid(groups, can_release(request.user)),
        held=slotmap.count_slots(held),
        levels={lvl: sum(1 for s in held if s["level"] == lvl) for lvl in ("IL", "CL")},
        pods=Pod.objects.filter(node_name=name).order_by("namespace", "name"),
        bindings=SlotPodBinding.objects.filter(node=name).order_by("instance", "slot"),
        events=queries.recent_events(SlotEvent.objects.filter(node=name)),
        rows=queries.runs(ReconcileRun.objects.filter(node=name).order_by("-started_at")[:10]),
        live_view="slots",
        live_query=_live_query("slots", filters),
        **node_context(name),  # sharing policies and extender verdicts (issue 14)
    )


@require_GET
@viewer_required
def runs(request: HttpRequest) -> HttpResponse:
    form = RunFilterForm(request.GET)
    context: dict[str, Any] = {"form": form, "live_view": "runs"}
    if not form.is_valid():
        return _render(request, "dashboard/runs.html", 400, errors=_errors(form), **context)
    start, end = form.window()
    qs = queries.filter_runs(form.cleaned_data, start, end).order_by("-started_at", "-id")
    try:
        page = _paginate(queries.run_values(qs), form.cleaned_data["page"], RUNS_PAGE)
    except BadPage as exc:
        return _render(request, "dashboard/runs.html", 400, errors=[str(exc)], **context)
    # New runs are appended live only where they would appear: page 1 of an open-ended range.
    appendable = page.number == 1 and end is None
    data = form.cleaned_data
    return _render(
        request,
        "dashboard/runs.html",
        page=page,
        rows=[queries.run_dict(r) for r in page.object_list],
        links=_page_links(request, page),
        start=start,
        end=end,
        appendable=appendable,
        retention_hours=settings.AKRI["RUN_RETENTION_HOURS"],
        run_filters={k: data.get(k) or "" for k in ("scope", "node", "trigger", "result")},
        live_query=_live_query("runs", {}),
        **context,
    )


@require_GET
@viewer_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(ReconcileRun, pk=pk)
    (row,) = queries.runs(ReconcileRun.objects.filter(pk=pk))
    events = list(run.events.order_by("at", "id")[: RUN_EVENTS_LIMIT + 1])
    return _render(
        request,
        "dashboard/run.html",
        run=run,
        row=row,
        events=events[:RUN_EVENTS_LIMIT],
        more_events=len(events) > RUN_EVENTS_LIMIT,
    )


@require_GET
@viewer_required
def audit(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    context: dict[str, Any] = {"form": form}
    if not form.is_valid():
        return _render(request, "dashboard/audit.html", 400, errors=_errors(form), **context)
    start, end = form.window()
    qs = AuditEntry.objects.filter(at__gte=start)
    if end:
        qs = qs.filter(at__lt=end)
    data = form.cleaned_data
    if data.get("user"):
        qs = qs.filter(username=data["user"])
    if data.get("outcome"):
        qs = qs.filter(outcome=data["outcome"])
    try:
        page = _paginate(qs.order_by("-at", "-id"), data["page"], AUDIT_PAGE)
    except BadPage as exc:
        return _render(request, "dashboard/audit.html", 400, errors=[str(exc)], **context)
    return _render(
        request,
        "dashboard/audit.html",
        page=page,
        links=_page_links(request, page),
        start=start,
        end=end,
        **context,
    )
