"""Chart data: slot usage and release latency over a time range, downsampled in SQL.

Samples are one row per Configuration x node per minute (``agent.usage``). A range is cut
into at most ``MAX_POINTS`` buckets of whole minutes; the database groups rows by bucket
(``minute / step``, integer division on SQLite and PostgreSQL alike), so 7 days of a 500-node
cluster ship 336 points per series, not 10,080. A bucket with no sample is ``null`` (a gap in
the line, "no data"), never 0. Usage per bucket is the mean over the minutes sampled in it;
latency is the mean over the releases in it and their maximum.

Served as JSON at ``/api/charts/usage/`` and ``/api/charts/release-latency/`` (token or
session, viewer role, like the rest of the API; any other parameter is a 400), and drawn by
``static/dashboard/charts.js`` with uPlot on the overview, Configuration and node pages.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.db.models import BigIntegerField, Count, ExpressionWrapper, F, Max, Sum
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from agent.models import Configuration, Instance, ReleaseSample, UsageSample
from agent.usage import minute_of
from akri_site.dashboard.apiauth import JSON_OBJECT, ApiView, query
from akri_site.dashboard.forms import RANGES, _RangeMixin, known_nodes

MAX_POINTS = 360
SHORT = timedelta(hours=6, minutes=1)
CHART_RANGES = tuple(r for r in RANGES if r[0] != "30d")
DEFAULT_CHART_RANGE = "1h"


class ChartRangeForm(_RangeMixin):
    """The charts' time range (presets 1 h, 6 h, 24 h, 7 d, or custom) and what they show."""

    default_range = DEFAULT_CHART_RANGE
    range = forms.ChoiceField(choices=CHART_RANGES, required=False)
    configuration = forms.CharField(required=False, max_length=253)
    namespace = forms.CharField(required=False, max_length=253)
    node = forms.CharField(required=False, max_length=253)

    def clean_configuration(self) -> str:
        name = self.cleaned_data["configuration"].strip()
        if name and not (
            Configuration.objects.filter(name=name).exists()
            or Instance.objects.filter(configuration_name=name).exists()
            or UsageSample.objects.filter(configuration=name).exists()
        ):
            raise forms.ValidationError(f"No Configuration named “{name}” is known.")
        return name

    def clean_node(self) -> str:
        node = self.cleaned_data["node"].strip()
        if (
            node
            and node not in known_nodes()
            and not UsageSample.objects.filter(node=node).exists()
            and not ReleaseSample.objects.filter(node=node).exists()
        ):
            raise forms.ValidationError(f"No node named “{node}” is known.")
        return node

    def params(self) -> dict[str, str]:
        """The range as URL parameters (what a chart's data request repeats)."""
        data = self.cleaned_data
        out = {"range": data["range"]}
        if data["range"] == "custom":
            out["start"] = self.data.get("start", "")
            if data.get("end"):
                out["end"] = self.data.get("end", "")
        return out


def buckets(start: datetime, end: datetime) -> tuple[int, int, int]:
    """(first bucket, last bucket, step in minutes): [start, end] in MAX_POINTS + 1 or fewer."""
    lo, hi = minute_of(start), minute_of(end)
    step = max(1, math.ceil((hi - lo) / MAX_POINTS))
    return lo // step, hi // step, step


def _bucketed(qs: Any, step: int) -> Any:
    bucket = ExpressionWrapper(F("minute") / step, output_field=BigIntegerField())
    return qs.annotate(bucket=bucket).values("bucket").order_by("bucket")


def _frame(start: datetime, end: datetime, step: int, first: int, last: int) -> dict[str, Any]:
    return {
        "from": start.timestamp(),
        "to": end.timestamp(),
        "step_seconds": step * 60,
        "t": [b * step * 60 for b in range(first, last + 1)],
    }


def usage(
    start: datetime,
    end: datetime | None = None,
    *,
    configuration: str = "",
    namespace: str = "",
    node: str = "",
) -> dict[str, Any]:
    """Held, free and foreign slots over the range: cluster-wide, or as ``node`` sees them."""
    end = end or timezone.now()
    first, last, step = buckets(start, end)
    rows = UsageSample.objects.filter(
        node=node, minute__gte=first * step, minute__lt=(last + 1) * step
    )
    if configuration:
        rows = rows.filter(configuration=configuration)
    if namespace:
        rows = rows.filter(namespace=namespace)
    grouped = _bucketed(rows, step).annotate(
        held=Sum("held"),
        free=Sum("free"),
        foreign=Sum("foreign"),
        minutes=Count("minute", distinct=True),
        n=Count("id"),
    )
    found = {r["bucket"]: r for r in grouped}
    out = _frame(start, end, step, first, last)
    for state in ("held", "free", "foreign"):
        out[state] = [
            round(found[b][state] / found[b]["minutes"], 2) if b in found else None
            for b in range(first, last + 1)
        ]
    out["rows"] = sum(r["n"] for r in found.values())
    latest = UsageSample.objects.filter(node=node)
    if configuration:
        latest = latest.filter(configuration=configuration)
    if namespace:
        latest = latest.filter(namespace=namespace)
    newest = latest.aggregate(m=Max("minute"))["m"]
    out["latest"] = None
    if newest is not None:
        now = latest.filter(minute=newest).aggregate(
            held=Sum("held"), free=Sum("free"), foreign=Sum("foreign")
        )
        out["latest"] = {"at": newest * 60, **now}
    return out


def release_latency(
    start: datetime, end: datetime | None = None, *, node: str = ""
) -> dict[str, Any]:
    """Releases per bucket, their mean and worst latency (ms); all nodes, or ``node``'s."""
    end = end or timezone.now()
    first, last, step = buckets(start, end)
    rows = ReleaseSample.objects.filter(minute__gte=first * step, minute__lt=(last + 1) * step)
    if node:
        rows = rows.filter(node=node)
    grouped = _bucketed(rows, step).annotate(
        releases=Sum("releases"), total=Sum("total_ms"), worst=Max("max_ms"), n=Count("id")
    )
    found = {r["bucket"]: r for r in grouped}
    out = _frame(start, end, step, first, last)
    span = range(first, last + 1)
    out["releases"] = [found[b]["releases"] if b in found else None for b in span]
    out["mean_ms"] = [
        round(found[b]["total"] / found[b]["releases"], 1)
        if b in found and found[b]["releases"]
        else None
        for b in span
    ]
    out["max_ms"] = [round(found[b]["worst"], 1) if b in found else None for b in span]
    out["rows"] = sum(r["n"] for r in found.values())
    return out


# --- the JSON API -------------------------------------------------------------------------------
USAGE_PARAMETERS = frozenset(
    {"range", "start", "end", "configuration", "namespace", "node", "format"}
)
LATENCY_PARAMETERS = frozenset({"range", "start", "end", "node", "format"})


def _validated(request: Any, allowed: frozenset[str]) -> ChartRangeForm:
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        offered = ", ".join(sorted(allowed))
        raise ValidationError(
            {name: [f"Unknown parameter; this endpoint takes: {offered}."] for name in unknown}
        )
    form = ChartRangeForm(request.query_params)
    if not form.is_valid():
        raise ValidationError({k: list(v) for k, v in form.errors.items()})
    return form


RANGE_PARAMETERS = [
    query("range", "A preset range, or `custom` with `start`.", enum=[r for r, _ in CHART_RANGES]),
    query("start", "Custom range start (ISO 8601).", kind=OpenApiTypes.DATETIME),
    query("end", "Custom range end (ISO 8601); now when absent.", kind=OpenApiTypes.DATETIME),
    query("node", "Only this node (a known one)."),
]


@extend_schema(
    parameters=[
        *RANGE_PARAMETERS,
        query("configuration", "Only this Configuration (a known one)."),
        query("namespace", "Only this namespace."),
    ],
    responses=JSON_OBJECT,
    summary="Slot usage over time (held, free, foreign per bucket).",
)
class UsageView(ApiView):
    def get(self, request: Any) -> Response:
        form = _validated(request, USAGE_PARAMETERS)
        start, end = form.window()
        data = form.cleaned_data
        return Response(
            usage(
                start,
                end,
                configuration=data["configuration"],
                namespace=data["namespace"],
                node=data["node"],
            )
        )


@extend_schema(
    parameters=RANGE_PARAMETERS,
    responses=JSON_OBJECT,
    summary="Release latency over time (mean and worst per bucket).",
)
class ReleaseLatencyView(ApiView):
    def get(self, request: Any) -> Response:
        form = _validated(request, LATENCY_PARAMETERS)
        start, end = form.window()
        return Response(release_latency(start, end, node=form.cleaned_data["node"]))


def page_charts(
    request: Any, *, configuration: str = "", namespace: str = "", node: str = ""
) -> dict[str, Any]:
    """A page's chart context: the range form (from the page's URL) and the data URLs."""
    form = ChartRangeForm(
        {k: request.GET[k] for k in ("range", "start", "end") if k in request.GET}
    )
    if not form.is_valid():
        errors = [f"{k}: {' '.join(v)}" for k, v in form.errors.items()]
        return {"chart_form": form, "chart_errors": errors}
    params = form.params()
    shown = {"configuration": configuration, "namespace": namespace, "node": node}
    usage_params = {**params, **{k: v for k, v in shown.items() if v}}
    latency_params = {**params, **({"node": node} if node else {})}
    start, end = form.window()
    return {
        "chart_form": form,
        "chart_start": start,
        "chart_end": end,
        # Short ranges move visibly each minute; a week's chart gains a point per 28 minutes.
        "chart_poll_seconds": 10
        if end is None and (end or timezone.now()) - start <= SHORT
        else 60,
        "usage_url": reverse("api:chart-usage") + "?" + urlencode(usage_params),
        # Latency is per node: a Configuration page shows usage only.
        "latency_url": None
        if configuration
        else reverse("api:chart-release-latency") + "?" + urlencode(latency_params),
    }
