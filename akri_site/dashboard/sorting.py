"""Sortable tables: each table's whitelist of sort keys, its order, and its header links.

The sort is a URL parameter (``?sort=-held``: a key, ``-`` for descending), so Back and shared
links keep it, like the filters; a key the table does not offer is refused with HTTP 400 and a
message naming the keys it does. Paged tables sort in SQL (``order_by``) so that page 2 follows
page 1; tables that are built whole in Python (the overview's counts) sort the built rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.utils.html import escape
from django.utils.safestring import mark_safe


class BadSort(ValueError):
    pass


@dataclass(frozen=True)
class Sorted:
    """One table's chosen sort: ``key`` and direction, and the table it belongs to."""

    table: Sorting
    key: str
    descending: bool

    @property
    def value(self) -> str:
        return f"-{self.key}" if self.descending else self.key

    @property
    def is_default(self) -> bool:
        return self.value == self.table.default

    def order_by(self, *tiebreak: str) -> list[str]:
        """SQL order: the key's fields in the chosen direction, then ``tiebreak`` (stable pages)."""
        sign = "-" if self.descending else ""
        fields = [f"{sign}{f}" for f in self.table.columns[self.key]]
        return fields + [t for t in tiebreak if t not in self.table.columns[self.key]]

    def apply(self, qs: QuerySet, *tiebreak: str) -> QuerySet:
        return qs.order_by(*self.order_by(*tiebreak))

    def rows(self, rows: Iterable[Any], get: Callable[[Any, str], Any] | None = None) -> list[Any]:
        """Rows built in Python, sorted by ``get(row, field)`` of the key's fields.

        Empty values (None) sort last whatever the direction: "no data" is not a smallest value.
        """
        fields = self.table.columns[self.key]
        rows = list(rows)
        get = get or (dict_get if rows and isinstance(rows[0], Mapping) else attr_get)
        present = [r for r in rows if get(r, fields[0]) is not None]
        missing = [r for r in rows if get(r, fields[0]) is None]
        present.sort(key=lambda r: tuple(_key(get(r, f)) for f in fields), reverse=self.descending)
        return present + missing


def _key(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else (value is None, value)


@dataclass(frozen=True)
class Sorting:
    """A table's sort keys: ``columns`` maps each key to the fields it orders by.

    ``param`` is the URL parameter (``sort``; a page with two tables gives each its own);
    ``default`` is the order without one (``-key`` for descending); keys in ``desc_first``
    sort descending on the first click (counts and times: the largest or newest first).
    """

    param: str
    columns: Mapping[str, tuple[str, ...]]
    default: str
    desc_first: frozenset[str] = frozenset()
    # (key, words) for a "Sort by" list where the columns are not a table's headers.
    labels: tuple[tuple[str, str], ...] = ()

    def parse(self, params: Mapping[str, Any]) -> Sorted:
        raw = params.get(self.param) or self.default
        raw = raw.strip()
        key = raw.removeprefix("-")
        if key not in self.columns:
            offered = ", ".join(sorted(self.columns))
            raise BadSort(
                f"{self.param}: cannot sort by “{raw[:60]}”; sort by one of {offered} "
                "(with - before it for descending)."
            )
        return Sorted(self, key, raw.startswith("-"))

    def link(self, params: QueryDict, current: Sorted, key: str) -> str:
        """The URL query that sorts by ``key``: the other direction if it is the current one,
        else its first direction; every other parameter is kept but the page."""
        descending = not current.descending if key == current.key else key in self.desc_first
        query = params.copy()
        query.pop("page", None)
        query[self.param] = f"-{key}" if descending else key
        return "?" + query.urlencode()


def sortable(*tables: Sorting) -> Callable[..., Callable[..., HttpResponse]]:
    """A view whose ``tables`` sort by their URL parameters: each chosen sort is
    ``request.sorts[param]`` (templates: ``{% sort_th "param" key label %}``), and a sort a
    table does not offer is a 400 page naming the keys it does, before the view runs."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            found, errors = {}, []
            for table in tables:
                try:
                    found[table.param] = table.parse(request.GET)
                except BadSort as exc:
                    errors.append(str(exc))
            if errors:
                return _bad_sort(request, tables, errors)
            request.sorts = found  # type: ignore[attr-defined]
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def _bad_sort(request: HttpRequest, tables: Iterable[Sorting], errors: list[str]) -> HttpResponse:
    from akri_site.dashboard.views import page_context  # the views import this module

    params = request.GET.copy()
    for table in tables:
        params.pop(table.param, None)
    back = request.path + ("?" + params.urlencode() if params else "")
    context = page_context(request, errors=errors, back=back)
    return render(request, "dashboard/bad_sort.html", context, status=400)


def sorted_by(request: HttpRequest, param: str) -> Sorted | None:
    """The sort ``@sortable`` chose for ``param`` on this request, if any."""
    return getattr(request, "sorts", {}).get(param)


def dict_get(row: Mapping[str, Any], field: str) -> Any:
    """``rows()``'s getter for dicts; ``a.b`` reads nested dicts."""
    value: Any = row
    for part in field.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def attr_get(row: Any, field: str) -> Any:
    return getattr(row, field, None)


# The tables of the dashboard. Keys are short words a person can type in the URL.
SLOT_MAP = Sorting(
    "sort",
    {
        "instance": ("namespace", "name"),
        "held": ("n_held",),
        "free": ("n_free",),
        "capacity": ("capacity",),
    },
    default="instance",
    desc_first=frozenset({"held", "free", "capacity"}),
    labels=(
        ("instance", "name"),
        ("held", "slots held"),
        ("free", "slots free"),
        ("capacity", "capacity"),
    ),
)
RUNS = Sorting(
    "sort",
    {
        "started": ("started_at",),
        "scope": ("scope",),
        "node": ("node",),
        "trigger": ("trigger",),
        "duration": ("duration_ms",),
        "checked": ("checked",),
        "released": ("released",),
        "restored": ("restored",),
        "conflicts": ("conflicts",),
        "errors": ("errors",),
    },
    default="-started",
    desc_first=frozenset(
        {"started", "duration", "checked", "released", "restored", "conflicts", "errors"}
    ),
)
AUDIT = Sorting(
    "sort",
    {
        "at": ("at",),
        "user": ("username",),
        "action": ("action",),
        "target": ("target",),
        "holder": ("holder",),
        "outcome": ("outcome",),
    },
    default="-at",
    desc_first=frozenset({"at"}),
)
SCHEDULING = Sorting(
    "sort",
    {"pod": ("namespace", "name"), "at": ("at",), "fits": ("fits",), "bound": ("bound_to",)},
    default="-at",
    desc_first=frozenset({"at", "fits"}),
)
_COUNTS = ("total", "held", "free", "foreign", "surplus")
OVERVIEW_CONFIGURATIONS = Sorting(
    "config_sort",
    {
        "configuration": ("namespace", "name"),
        "instances": ("instances",),
        "capacity": ("capacity",),
        **{k: (f"counts.{k}",) for k in _COUNTS},
    },
    default="configuration",
    desc_first=frozenset({"instances", "capacity", *_COUNTS}),
)
OVERVIEW_NODES = Sorting(
    "node_sort",
    {
        "node": ("name",),
        "ready": ("ready",),
        "visible": ("visible",),
        "il": ("held.IL",),
        "cl": ("held.CL",),
        "held": ("held.held",),
    },
    default="node",
    desc_first=frozenset({"visible", "il", "cl", "held"}),
)
CONFIGURATION_INSTANCES = Sorting(
    "sort",
    {
        "instance": ("name",),
        "shared": ("shared",),
        "capacity": ("capacity",),
        **{k: (f"n_{k}",) for k in ("held", "free", "foreign")},
    },
    default="instance",
    desc_first=frozenset({"capacity", "held", "free", "foreign"}),
)
NODE_PODS = Sorting(
    "pod_sort",
    {"pod": ("namespace", "name"), "phase": ("phase",)},
    default="pod",
)
_BINDING_COLUMNS = {
    "slot": ("slot",),
    "instance": ("instance", "slot"),
    "node": ("node", "slot"),
    "pod": ("pod_namespace", "pod_name"),
    "allocated": ("allocated_at",),
    "seen": ("seen_at",),
}
# A node's bindings read by Instance, an Instance's by node: each page's usual order.
NODE_BINDINGS = Sorting(
    "binding_sort",
    _BINDING_COLUMNS,
    default="instance",
    desc_first=frozenset({"allocated", "seen"}),
)
INSTANCE_BINDINGS = Sorting(
    "binding_sort",
    _BINDING_COLUMNS,
    default="node",
    desc_first=frozenset({"allocated", "seen"}),
)


# The list pages (issue 31). Configurations and nodes are few and sorted as built rows; the
# others sort in SQL.
CONFIGURATION_LIST = Sorting(
    "sort",
    {
        "configuration": ("namespace", "name"),
        "handler": ("discovery_handler", "name"),
        "instances": ("instances",),
        "capacity": ("capacity",),
        **{k: (f"counts.{k}",) for k in ("total", "held", "free", "foreign")},
    },
    default="configuration",
    desc_first=frozenset({"instances", "capacity", "total", "held", "free", "foreign"}),
)
INSTANCE_LIST = Sorting(
    "sort",
    {
        "instance": ("namespace", "name"),
        "configuration": ("configuration_name", "namespace", "name"),
        "capacity": ("capacity",),
        "shared": ("shared",),
        "held": ("n_held",),
        "free": ("n_free",),
        "created": ("created_at",),
    },
    default="instance",
    desc_first=frozenset({"capacity", "held", "free", "created"}),
)
NODE_LIST = Sorting(
    "sort",
    {
        "node": ("name",),
        "state": ("state", "name"),
        "visible": ("visible",),
        "il": ("held.IL",),
        "cl": ("held.CL",),
        "held": ("held.held",),
        "pods": ("pods",),
    },
    default="node",
    desc_first=frozenset({"visible", "il", "cl", "held", "pods"}),
)
POD_LIST = Sorting(
    "sort",
    {
        "pod": ("namespace", "name"),
        "phase": ("phase",),
        "node": ("node_name",),
        "updated": ("updated_at",),
    },
    default="pod",
    desc_first=frozenset({"updated"}),
)
BROKER_LIST = Sorting(
    "sort",
    {
        "broker": ("namespace", "name"),
        "kind": ("kind",),
        "configuration": ("configuration", "instance"),
        "node": ("node",),
        "phase": ("phase",),
        "created": ("created_at",),
    },
    default="broker",
    desc_first=frozenset({"created"}),
)


def sort_header(params: QueryDict, current: Sorted, key: str, label: str, css: str = "") -> str:
    """``<th>`` for one column: see the ``sort_th`` template tag."""
    table = current.table
    href = escape(table.link(params, current, key))
    cls = f' class="{escape(css)}"' if css else ""
    if key != current.key:
        return mark_safe(
            f'<th scope="col"{cls}><a class="sort" href="{href}">{escape(label)}'
            '<span class="sort-mark" aria-hidden="true"> ↕</span></a></th>'
        )
    way = "descending" if current.descending else "ascending"
    arrow = "▼" if current.descending else "▲"
    return mark_safe(
        f'<th scope="col" aria-sort="{way}"{cls}><a class="sort sorted" href="{href}">'
        f'{escape(label)}<span class="sort-mark" aria-hidden="true"> {arrow}</span>'
        f'<span class="visually-hidden"> (sorted {way})</span></a></th>'
    )
