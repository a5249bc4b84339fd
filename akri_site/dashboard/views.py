"""Dashboard pages: check access, validate the filters, read, render.

Every page is server-rendered from the ORM cache; ``static/dashboard/live.js`` keeps it current
over the websocket. Filters, page and time range are GET parameters, so Back and shared links
restore a view; a filter naming nothing known is answered with its message and HTTP 400.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.paginator import EmptyPage, Page, Paginator
from django.db import connection
from django.db.models import Count, QuerySet
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
    Slot,
    SlotEvent,
    SlotPodBinding,
)
from agent.scheduling.queries import node_context
from akri_site.dashboard import charts, fragments, queries, slotmap
from akri_site.dashboard.access import can_release, role_of, viewer_required
from akri_site.dashboard.forms import AuditFilterForm, RunFilterForm, SlotFilterForm, known_nodes
from akri_site.dashboard.sorting import (
    AUDIT,
    CONFIGURATION_INSTANCES,
    INSTANCE_BINDINGS,
    NODE_BINDINGS,
    NODE_PODS,
    OVERVIEW_CONFIGURATIONS,
    OVERVIEW_NODES,
    RUNS,
    SLOT_MAP,
    sort_header,
    sortable,
)

# A cache with more Instances than one page opens on a summary per Configuration and per
# node, above the first page.
SLOT_MAP_PAGE = slotmap.PAGE
RUNS_PAGE = 50
AUDIT_PAGE = 50
RUN_EVENTS_LIMIT = 2000
# Slot events per page on the node, Instance and Configuration pages.
EVENTS_PAGE = 50


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


def _page_of_request(request: HttpRequest, items: Any, per_page: int) -> Page:
    """The page ``?page=`` asks for; BadPage when it is not a page number or past the end."""
    raw = request.GET.get("page", "1")
    if not raw.isdigit() or not 1 <= int(raw) <= 1_000_000:
        raise BadPage(f"page must be a whole number from 1, not “{raw[:40]}”.")
    return _paginate(items, int(raw), per_page)


def _page_links(
    request: HttpRequest, page: Page, key: str = "page", anchor: str = ""
) -> dict[str, str]:
    """URLs of the neighbouring pages, keeping every other parameter."""

    def url(number: int) -> str:
        params = request.GET.copy()
        params[key] = str(number)
        return "?" + params.urlencode() + anchor

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


def _live_query(view: str, filters: dict[str, str], page: int = 1) -> str:
    """The live feed's subscription: the view, its filters and, past the first, its page."""
    return urlencode({"view": view, **filters, **({"page": page} if page > 1 else {})})


# Past this many nodes the node filter is a text field, not a list of every node (a thousand
# options were 56 KB of the slot map); an unknown name is answered with its message.
NODE_CHOICES = 100


def _filter_choices(counts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The filters' choices; ``counts`` (a ``slotmap.summary()``) names the Configurations
    and holder nodes in use already, which spares two scans of a large cache. ``nodes`` is
    None when there are more than NODE_CHOICES."""
    configurations = set(Configuration.objects.values_list("name", flat=True))
    if counts is None:
        in_use = Instance.objects.order_by().values_list("configuration_name").distinct()
        configurations.update(name for (name,) in in_use)
        nodes = known_nodes()
    else:
        configurations.update(counts["configurations"])
        nodes = known_nodes(counts["nodes"])
    return {
        "configurations": sorted(configurations),
        "nodes": sorted(nodes) if len(nodes) <= NODE_CHOICES else None,
        "n_nodes": len(nodes),
    }


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
@sortable(OVERVIEW_CONFIGURATIONS, OVERVIEW_NODES)
def overview(request: HttpRequest) -> HttpResponse:
    chart = charts.page_charts(request)
    return _render(
        request,
        "dashboard/overview.html",
        400 if "chart_errors" in chart else 200,
        live_view="overview",
        # The socket's view too: counts and runs (consumers.RunWatch), no slot rows (it used to
        # subscribe to the slot map's first page, which this page never shows).
        live_query=_live_query("overview", {}),
        **chart,
        **queries.overview(request.sorts["node_sort"]),
    )


@require_GET
@viewer_required
def slot_map(request: HttpRequest) -> HttpResponse:
    form = SlotFilterForm(request.GET)
    counts = slotmap.summary()
    context: dict[str, Any] = {
        "form": form,
        "choices": _filter_choices(counts),
        "live_view": "slots",
    }
    if not form.is_valid():
        return _render(request, "dashboard/slots.html", 400, errors=_errors(form), **context)
    filters = form.filters()
    rules = slotmap.StuckRules.at()
    try:
        page = _paginate(slotmap.matching(filters, rules), form.cleaned_data["page"], SLOT_MAP_PAGE)
    except BadPage as exc:
        return _render(request, "dashboard/slots.html", 400, errors=[str(exc)], **context)
    instances = slotmap.page_of(page.object_list, filters, rules)
    sort = SLOT_MAP.parse(filters)
    groups = slotmap.group_by_configuration(instances, counts)
    return _render(
        request,
        "dashboard/slots.html",
        filters=filters,
        filter_words={k: v for k, v in filters.items() if k != "sort"},
        live_query=_live_query("slots", filters, page.number),
        page=page,
        links=_page_links(request, page),
        groups=groups,
        grid=fragments.slot_grid(
            groups,
            can_release(request.user),
            back=request.GET.urlencode(),  # a release lands back on this view
            instance_head=sort_header(request.GET, sort, "instance", "Instance"),
        ),
        sorted_by=sort,
        shown=sum(len(i["match"]) for i in instances),
        summary=counts,
        summary_from=SLOT_MAP_PAGE,
        summary_nodes=_most_held(counts["nodes"]),
        # Unfiltered, the pages count every Instance already (a count of 40,000 rows).
        instance_total=page.paginator.count if not filters else Instance.objects.count(),
        **context,
    )


# Nodes the slot map's summary names (the most held first); the Nodes list has them all.
SUMMARY_NODES = 48


def _most_held(nodes: dict[str, dict[str, int]]) -> list[tuple[str, dict[str, int]]]:
    """The SUMMARY_NODES nodes holding the most slots, by name where they hold as many."""
    return sorted(nodes.items(), key=lambda item: (-item[1]["held"], item[0]))[:SUMMARY_NODES]


def _object_events(
    request: HttpRequest, qs: QuerySet[SlotEvent], chart: dict[str, Any]
) -> dict[str, Any]:
    """One page (``events_page``) of an object's slot events in the page's time range (the
    charts' ``range``), newest first: a busy node's page never grows without bound."""
    if "chart_errors" in chart:
        return {"events": []}
    try:
        number = _EVENTS_PAGE_FIELD.clean(request.GET.get("events_page"))
    except ValidationError as exc:
        return {"events": [], "events_errors": [f"events page: {' '.join(exc.messages)}"]}
    qs = qs.filter(at__gte=chart["chart_start"])
    if chart["chart_end"]:
        qs = qs.filter(at__lt=chart["chart_end"])
    try:
        page = _paginate(qs.select_related("run").order_by("-at", "-id"), number, EVENTS_PAGE)
    except BadPage as exc:
        return {"events": [], "events_errors": [f"events: {exc}"]}
    return {
        "events": list(page.object_list),
        "events_page": page,
        "events_links": _page_links(request, page, "events_page", "#events"),
    }


_EVENTS_PAGE_FIELD = forms.IntegerField(required=False, min_value=1, max_value=1_000_000)


def _status(context: dict[str, Any]) -> int:
    return 400 if context.get("chart_errors") or context.get("events_errors") else 200


def _pods_of(instance: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [s["pod"].split("/", 1) for s in instance["slots"] if s["pod"]]
    pods = {}
    for ns, name in names:
        row = Pod.objects.filter(namespace=ns, name=name).values().first()
        pods[f"{ns}/{name}"] = row
    return pods


@require_GET
@viewer_required
@sortable(INSTANCE_BINDINGS)
def instance_detail(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    row = get_object_or_404(Instance, namespace=namespace, name=name)
    (data,) = slotmap.serialize(Instance.objects.filter(pk=row.pk))
    filters = {"instance": data["key"]}
    chart = charts.page_charts(request)  # no chart here: the events' time range
    events = _object_events(
        request, SlotEvent.objects.filter(namespace=namespace, instance=name), chart
    )
    return _render(
        request,
        "dashboard/instance.html",
        _status({**chart, **events}),
        **chart,
        **events,
        instance=row,
        data=data,
        configuration_known=Configuration.objects.filter(
            namespace=namespace, name=row.configuration_name
        ).exists(),
        grid=fragments.slot_grid(
            slotmap.group_by_configuration([data], slotmap.summary()),
            can_release(request.user),
            back=urlencode(filters),  # a release lands on the map of this Instance
        ),
        pods=_pods_of(data),
        bindings=SlotPodBinding.objects.filter(namespace=namespace, instance=name).order_by(
            "node", "slot"
        ),
        live_view="slots",
        live_query=_live_query("slots", filters),
    )


@require_GET
@viewer_required
@sortable(CONFIGURATION_INSTANCES)
def configuration_detail(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    configuration = get_object_or_404(Configuration, namespace=namespace, name=name)
    # One page of its Instances (a Configuration of a thousand-node cluster has tens of
    # thousands); the counts are the whole Configuration's, from the slot summary.
    rows = Instance.objects.filter(namespace=namespace, configuration_name=name)
    try:
        ordered = slotmap.sort_instances(rows, request.sorts["sort"])
        page = _page_of_request(request, ordered, SLOT_MAP_PAGE)
    except BadPage as exc:
        return _render(request, "400.html", 400, message=str(exc))
    instances = slotmap.page_of(page.object_list, {})
    empty = {"total": 0, "held": 0, "free": 0, "foreign": 0, "surplus": 0}
    chart = charts.page_charts(request, configuration=name, namespace=namespace)
    events = _object_events(
        request, SlotEvent.objects.filter(namespace=namespace, configuration=name), chart
    )
    return _render(
        request,
        "dashboard/configuration.html",
        _status({**chart, **events}),
        **events,
        chart_scope=f"Configuration {name}",
        chart_usage_caption=f"of {namespace}/{name}",
        **chart,
        configuration=configuration,
        instances=instances,
        page=page,
        links=_page_links(request, page),
        counts=slotmap.summary()["configurations"].get(name, empty),
        live_view="overview",
        live_query=_live_query("overview", {}),
    )


@require_GET
@viewer_required
@sortable(NODE_PODS, NODE_BINDINGS)
def node_detail(request: HttpRequest, name: str) -> HttpResponse:
    node = Node.objects.filter(name=name).first()
    filters = {"node": name}
    rules = slotmap.StuckRules.at()
    try:
        page = _page_of_request(request, slotmap.matching(filters, rules), SLOT_MAP_PAGE)
    except BadPage as exc:
        return _render(request, "400.html", 400, message=str(exc))
    instances = slotmap.page_of(page.object_list, filters, rules)
    if node is None and not instances and not ReconcileRun.objects.filter(node=name).exists():
        raise Http404(f"No node named {name} is known.")
    # What it holds, counted in SQL over every page.
    held_levels = dict(
        Slot.objects.filter(holder_node=name, level__in=slotmap.HELD_LEVELS)
        .order_by()
        .values_list("level")
        .annotate(n=Count("id"))
    )
    counts = slotmap.summary()
    groups = slotmap.group_by_configuration(instances, counts)
    chart = charts.page_charts(request, node=name)
    events = _object_events(request, SlotEvent.objects.filter(node=name), chart)
    return _render(
        request,
        "dashboard/node.html",
        _status({**chart, **events}),
        **events,
        chart_scope=f"node {name}",
        chart_node=name,
        chart_usage_caption=f"as {name} sees them (held by it; free and foreign on the Instances it sees)",
        **chart,
        name=name,
        node=node,
        groups=groups,
        grid=fragments.slot_grid(groups, can_release(request.user), back=urlencode(filters)),
        held={"held": sum(held_levels.values())},
        levels={lvl: held_levels.get(lvl, 0) for lvl in ("IL", "CL")},
        page=page,
        links=_page_links(request, page),
        pods=Pod.objects.filter(node_name=name).order_by("namespace", "name"),
        bindings=SlotPodBinding.objects.filter(node=name).order_by("instance", "slot"),
        rows=queries.runs(ReconcileRun.objects.filter(node=name).order_by("-started_at")[:10]),
        live_view="slots",
        live_query=_live_query("slots", filters, page.number),
        **node_context(name),  # sharing policies and extender verdicts (issue 14)
    )


@require_GET
@viewer_required
@sortable(RUNS)
def runs(request: HttpRequest) -> HttpResponse:
    form = RunFilterForm(request.GET)
    context: dict[str, Any] = {"form": form, "live_view": "runs"}
    if not form.is_valid():
        return _render(request, "dashboard/runs.html", 400, errors=_errors(form), **context)
    start, end = form.window()
    qs = queries.filter_runs(form.cleaned_data, start, end).order_by("-started_at", "-id")
    hidden = None
    if form.hides_uneventful():
        everything = qs
        qs = queries.eventful(qs)
        hidden = everything.count() - qs.count()
    try:
        ordered = request.sorts["sort"].apply(qs, "-id")
        page = _paginate(queries.run_values(ordered), form.cleaned_data["page"], RUNS_PAGE)
    except BadPage as exc:
        return _render(request, "dashboard/runs.html", 400, errors=[str(exc)], **context)
    # New runs are appended live only where they would appear: page 1 of an open-ended range,
    # newest first.
    appendable = page.number == 1 and end is None and request.sorts["sort"].is_default
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
        hidden=hidden,
        toggle_url=_toggle_url(request, "show", None if hidden is None else "all"),
        live_query=_live_query("runs", {}),
        **context,
    )


def _toggle_url(request: HttpRequest, key: str, value: str | None) -> str:
    """This page's URL with ``key`` set to ``value`` (removed when None), back on page 1."""
    params = request.GET.copy()
    params.pop("page", None)
    params.pop(key, None)
    if value is not None:
        params[key] = value
    return "?" + params.urlencode() if params else request.path


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
        # Live: the facts and events are fetched again when this run changes (live.js).
        live_view="runs",
        live_query=_live_query("runs", {}),
    )


@require_GET
@viewer_required
@sortable(AUDIT)
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
        page = _paginate(request.sorts["sort"].apply(qs, "-id"), data["page"], AUDIT_PAGE)
    except BadPage as exc:
        return _render(request, "dashboard/audit.html", 400, errors=[str(exc)], **context)
    return _render(
        request,
        "dashboard/audit.html",
        page=page,
        links=_page_links(request, page),
        start=start,
        end=end,
        # Live: the list is fetched again when an audit entry is written (live.js).
        live_view="runs",
        live_query=_live_query("runs", {}),
        **context,
    )
