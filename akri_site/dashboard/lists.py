"""A list page per kind (issue 31): Configurations, Instances, nodes, pods and brokers.

Each is sortable by its column headers, filtered by a form and paged, all in the URL (Back and
shared links restore the view); a filter naming nothing known is a 400 with its message, as on
the slot map. They cost what a page shows, not what the cache holds: the long lists
(Instances, pods, brokers) filter, sort and page in SQL and count slots for the shown rows
only; the short ones (Configurations, nodes: a thousand at most) are built whole from the
counts the overview already keeps (``slotmap.summary``, ``queries.visible_per_node``, both
reused for a few times their cost at scale), and the nodes' pods are counted for the shown page
unless they are the order. ``manage.py bench lists`` times each first page at 40,000
Instances; ``python -m akri_site.dashboard.pagebench`` each page cold, due and warm.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET

from agent.brokers.models import Broker
from agent.brokers.queries import last_actions
from agent.models import Configuration, Instance, Node, Pod, Slot, visible_to
from akri_site.dashboard import queries, slotmap
from akri_site.dashboard.access import viewer_required
from akri_site.dashboard.forms import is_known_node
from akri_site.dashboard.sorting import (
    BROKER_LIST,
    CONFIGURATION_LIST,
    INSTANCE_LIST,
    NODE_LIST,
    POD_LIST,
)
from akri_site.dashboard.sorting import sortable as _sortable
from akri_site.dashboard.views import BadPage, _errors, _page_links, _paginate, _render

PAGE = 100
_EMPTY = {"total": 0, "held": 0, "free": 0, "foreign": 0, "surplus": 0}


class _ListForm(forms.Form):
    page = forms.IntegerField(required=False, min_value=1, max_value=1_000_000)
    q = forms.CharField(required=False, max_length=200, label="Name contains")
    sort = forms.CharField(required=False, max_length=64)  # checked by @sortable

    def clean_q(self) -> str:
        return self.cleaned_data["q"].strip()

    def chosen(self) -> dict[str, str]:
        """The filters in use (for the page's words), page and sort left out."""
        skip = {"page", "sort"}
        return {k: v for k, v in self.cleaned_data.items() if v and k not in skip}


def _known_configuration(name: str) -> str:
    name = name.strip()
    if name and not (
        Configuration.objects.filter(name=name).exists()
        or Instance.objects.filter(configuration_name=name).exists()
    ):
        raise forms.ValidationError(f"No Configuration named “{name}” is known.")
    return name


def _known_node(name: str) -> str:
    name = name.strip()
    if name and not is_known_node(name) and not Pod.objects.filter(node_name=name).exists():
        raise forms.ValidationError(f"No node named “{name}” is known.")
    return name


def _named(term: str) -> Q:
    """``namespace/name`` contains ``term`` (a ``/`` ends the namespace, starts the name)."""
    ns, sep, name = term.partition("/")
    if not sep:
        return Q(name__icontains=term)
    return Q(namespace__iendswith=ns, name__istartswith=name)


def _page(request: HttpRequest, form: _ListForm, items: Any) -> dict[str, Any]:
    page = _paginate(items, form.cleaned_data.get("page"), PAGE)
    return {"page": page, "links": _page_links(request, page)}


def _list(
    request: HttpRequest, template: str, form: _ListForm, build: Any, **context: Any
) -> HttpResponse:
    """Validate, build the rows (``build(form)`` -> the page's context), render; a bad filter
    or page is the same page with its message and HTTP 400."""
    context = {"form": form, **context}
    if not form.is_valid():
        return _render(request, template, 400, errors=_errors(form), **context)
    try:
        built = build(form)
    except BadPage as exc:
        return _render(request, template, 400, errors=[str(exc)], **context)
    return _render(request, template, filters=form.chosen(), **built, **context)


# --- Configurations ----------------------------------------------------------------------


class ConfigurationListForm(_ListForm):
    namespace = forms.CharField(required=False, max_length=253)
    status = forms.ChoiceField(
        required=False,
        choices=(("", "any status"), ("valid", "valid"), ("error", "cannot be used")),
    )


@require_GET
@viewer_required
@_sortable(CONFIGURATION_LIST)
def configurations(request: HttpRequest) -> HttpResponse:
    def build(form: ConfigurationListForm) -> dict[str, Any]:
        data = form.cleaned_data
        qs = Configuration.objects.all()
        if data["q"]:
            qs = qs.filter(_named(data["q"]))
        if data["namespace"]:
            qs = qs.filter(namespace=data["namespace"])
        if data["status"] == "error":
            qs = qs.exclude(error="")
        elif data["status"] == "valid":
            qs = qs.filter(error="")
        counts = slotmap.summary()["configurations"]
        per_config = queries.instances_per_configuration()
        rows = list(
            qs.values(
                "namespace", "name", "capacity", "unique_devices", "discovery_handler", "error"
            )
        )
        for row in rows:
            row["instances"] = per_config.get(row["name"], 0)
            row["counts"] = counts.get(row["name"], _EMPTY)
        rows = request.sorts["sort"].rows(rows)
        return _page(request, form, rows)

    return _list(
        request,
        "dashboard/list_configurations.html",
        ConfigurationListForm(request.GET),
        build,
        kind="Configurations",
        words=("Configuration", "Configurations"),
    )


# --- Instances ---------------------------------------------------------------------------


class InstanceListForm(_ListForm):
    configuration = forms.CharField(required=False, max_length=253)
    node = forms.CharField(required=False, max_length=253, label="Seen by node")
    shared = forms.ChoiceField(
        required=False, choices=(("", "shared or not"), ("yes", "shared"), ("no", "not shared"))
    )

    def clean_configuration(self) -> str:
        return _known_configuration(self.cleaned_data["configuration"])

    def clean_node(self) -> str:
        return _known_node(self.cleaned_data["node"])


def _slot_counts(instance_ids: list[int]) -> dict[int, dict[str, int]]:
    """Held, free and foreign slots of the shown Instances, one grouped query."""
    counts: dict[int, dict[str, int]] = {pk: dict(_EMPTY) for pk in instance_ids}
    rows = (
        Slot.objects.filter(instance_id__in=instance_ids)
        .order_by()
        .values_list("instance_id", "level")
        .annotate(n=Count("id"))
    )
    for pk, level, n in rows:
        state = slotmap.slot_state(level)
        counts[pk][state] = counts[pk].get(state, 0) + n
        counts[pk]["total"] += n
    return counts


@require_GET
@viewer_required
@_sortable(INSTANCE_LIST)
def instances(request: HttpRequest) -> HttpResponse:
    def build(form: InstanceListForm) -> dict[str, Any]:
        data = form.cleaned_data
        qs: QuerySet[Instance] = Instance.objects.all()
        if data["q"]:
            qs = qs.filter(_named(data["q"]))
        if data["configuration"]:
            qs = qs.filter(configuration_name=data["configuration"])
        if data["node"]:
            qs = qs.filter(visible_to(data["node"]))
        if data["shared"]:
            qs = qs.filter(shared=data["shared"] == "yes")
        sort = request.sorts["sort"]
        ordered = slotmap.sort_instances(qs, sort)
        paged = _page(request, form, ordered.only(*_INSTANCE_COLUMNS))
        shown = list(paged["page"].object_list)
        counts = _slot_counts([i.pk for i in shown])
        rows = [{"instance": i, "counts": counts[i.pk]} for i in shown]
        return {**paged, "rows": rows}

    return _list(
        request,
        "dashboard/list_instances.html",
        InstanceListForm(request.GET),
        build,
        kind="Instances",
        words=("Instance", "Instances"),
        choices={"configurations": _configuration_names()},
    )


_INSTANCE_COLUMNS = (
    "id",
    "namespace",
    "name",
    "configuration_name",
    "capacity",
    "shared",
    "nodes",
    "created_at",
    "cordon",  # the row says whether it is cordoned: one query per row when left deferred
)


def _configuration_names() -> list[str]:
    names = set(Configuration.objects.values_list("name", flat=True))
    names.update(slotmap.summary()["configurations"])
    return sorted(names)


# --- nodes -------------------------------------------------------------------------------


class NodeListForm(_ListForm):
    state = forms.ChoiceField(
        required=False,
        choices=(
            ("", "any state"),
            ("ready", "Ready"),
            ("not-ready", "NotReady"),
            ("deleted", "deleted"),
            ("unknown", "not in the node cache"),
        ),
    )


def _node_state(row: dict[str, Any]) -> str:
    if row["deleted"]:
        return "deleted"
    if row["ready"] is None:
        return "unknown"
    return "ready" if row["ready"] else "not-ready"


@require_GET
@viewer_required
@_sortable(NODE_LIST)
def nodes(request: HttpRequest) -> HttpResponse:
    def build(form: NodeListForm) -> dict[str, Any]:
        data = form.cleaned_data
        held = slotmap.summary()["nodes"]
        visible = queries.visible_per_node()
        rows = list(Node.objects.values("name", "ready", "deleted", "not_ready_since"))
        known = {r["name"] for r in rows}
        # A node gone from the node cache may still hold slots, or be named by Instances.
        rows += [
            {"name": n, "ready": None, "deleted": False, "not_ready_since": None}
            for n in sorted((set(held) | set(visible)) - known)
        ]
        for row in rows:
            row["state"] = _node_state(row)
            row["held"] = held.get(row["name"], {"IL": 0, "CL": 0, "held": 0})
            row["visible"] = visible.get(row["name"], 0)
        if data["q"]:
            rows = [r for r in rows if data["q"].lower() in r["name"].lower()]
        if data["state"]:
            rows = [r for r in rows if r["state"] == data["state"]]
        sort = request.sorts["sort"]
        # Pods are counted for the shown rows only, unless they are the order: a count over
        # every node's pods was 8 of this page's 80 ms at 1,000 nodes (40,000 pods).
        if sort.key == "pods":
            _count_pods(rows, None)
        paged = _page(request, form, sort.rows(rows))
        shown = paged["page"].object_list
        if sort.key != "pods":
            _count_pods(shown, [r["name"] for r in shown])
        for row in shown:
            row["query"] = urlencode({"node": row["name"]})
        return paged

    return _list(
        request,
        "dashboard/list_nodes.html",
        NodeListForm(request.GET),
        build,
        kind="Nodes",
        words=("node", "nodes"),
        # Each row links three lists by its node: their addresses once, not a reverse() per
        # link (300 a page, 5 ms of its 80 at 1,000 nodes).
        lists={name: reverse(f"dashboard:{name}") for name in ("instances", "slots", "pods")},
    )


def _count_pods(rows: list[dict[str, Any]], names: list[str] | None) -> None:
    """Each row's pods: one grouped query, over ``names`` or (None) every node."""
    pods = Pod.objects.exclude(node_name="")
    if names is not None:
        pods = pods.filter(node_name__in=names)
    counts = dict(pods.order_by().values_list("node_name").annotate(n=Count("id")))
    for row in rows:
        row["pods"] = counts.get(row["name"], 0)


# --- pods --------------------------------------------------------------------------------


class PodListForm(_ListForm):
    q = forms.CharField(required=False, max_length=507, label="Pod contains")
    namespace = forms.CharField(required=False, max_length=253)
    node = forms.CharField(required=False, max_length=253)
    phase = forms.ChoiceField(
        required=False,
        choices=(
            ("", "any phase"),
            ("Pending", "Pending"),
            ("Running", "Running"),
            ("Succeeded", "Succeeded"),
            ("Failed", "Failed"),
            ("Unknown", "Unknown"),
            ("deleting", "being deleted"),
        ),
    )

    def clean_node(self) -> str:
        return _known_node(self.cleaned_data["node"])


@require_GET
@viewer_required
@_sortable(POD_LIST)
def pods(request: HttpRequest) -> HttpResponse:
    def build(form: PodListForm) -> dict[str, Any]:
        data = form.cleaned_data
        qs = Pod.objects.all()
        if data["q"]:
            qs = qs.filter(_named(data["q"]))
        if data["namespace"]:
            qs = qs.filter(namespace=data["namespace"])
        if data["node"]:
            qs = qs.filter(node_name=data["node"])
        if data["phase"] == "deleting":
            qs = qs.filter(deleting=True)
        elif data["phase"]:
            qs = qs.filter(phase=data["phase"])
        ordered = request.sorts["sort"].apply(qs, "namespace", "name", "id")
        paged = _page(request, form, ordered.defer("holds"))
        shown = list(paged["page"].object_list)
        held = _slots_of_pods(shown)
        rows = [{"pod": p, "slots": held.get((p.namespace, p.name), 0)} for p in shown]
        return {**paged, "rows": rows}

    return _list(
        request,
        "dashboard/list_pods.html",
        PodListForm(request.GET),
        build,
        kind="Pods",
        words=("pod", "pods"),
    )


def _slots_of_pods(shown: list[Pod]) -> dict[tuple[str, str], int]:
    """Slots held by the shown pods: one query over the names on this page."""
    if not shown:
        return {}
    rows = (
        Slot.objects.filter(pod_name__in={p.name for p in shown})
        .order_by()
        .values_list("pod_namespace", "pod_name")
        .annotate(n=Count("id"))
    )
    return {(ns, name): n for ns, name, n in rows}


# --- brokers -----------------------------------------------------------------------------


class BrokerListForm(_ListForm):
    kind = forms.ChoiceField(
        required=False,
        choices=(("", "any kind"), ("Pod", "Pod"), ("Job", "Job"), ("Service", "Service")),
    )
    configuration = forms.CharField(required=False, max_length=253)
    node = forms.CharField(required=False, max_length=253)
    phase = forms.ChoiceField(
        required=False,
        choices=(
            ("", "any phase"),
            ("not-running", "not Running (Pods)"),
            ("Pending", "Pending"),
            ("Running", "Running"),
            ("Succeeded", "Succeeded"),
            ("Failed", "Failed"),
        ),
    )

    def clean_configuration(self) -> str:
        return _known_configuration(self.cleaned_data["configuration"])

    def clean_node(self) -> str:
        return _known_node(self.cleaned_data["node"])


@require_GET
@viewer_required
@_sortable(BROKER_LIST)
def brokers(request: HttpRequest) -> HttpResponse:
    def build(form: BrokerListForm) -> dict[str, Any]:
        data = form.cleaned_data
        qs = Broker.objects.all()
        if data["q"]:
            qs = qs.filter(_named(data["q"]))
        for field in ("kind", "configuration", "node"):
            if data[field]:
                qs = qs.filter(**{field: data[field]})
        if data["phase"] == "not-running":
            qs = qs.filter(kind=Broker.Kind.POD).exclude(phase="Running")
        elif data["phase"]:
            qs = qs.filter(phase=data["phase"])
        ordered = request.sorts["sort"].apply(qs, "namespace", "kind", "name", "id")
        paged = _page(request, form, ordered)
        shown = list(paged["page"].object_list)
        by_namespace: dict[str, list[tuple[str, str]]] = {}
        for b in shown:
            by_namespace.setdefault(b.namespace, []).append((b.kind, b.name))
        last: dict[tuple[str, str, str], Any] = {}
        for ns, names in by_namespace.items():
            for (kind, name), action in last_actions(ns, names).items():
                last[(ns, kind, name)] = action
        rows = [{"broker": b, "last": last.get((b.namespace, b.kind, b.name))} for b in shown]
        return {**paged, "rows": rows}

    return _list(
        request,
        "dashboard/list_brokers.html",
        BrokerListForm(request.GET),
        build,
        kind="Brokers",
        words=("broker", "brokers"),
        choices={"configurations": _configuration_names()},
    )
