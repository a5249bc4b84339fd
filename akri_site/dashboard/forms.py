"""Filter forms for the pages and the live feed.

Filters come from the URL (so Back and shared links restore them) or from a websocket
``subscribe`` frame; both go through these forms. A value that names nothing known is an error
shown on the page with HTTP 400, never silently ignored: an operator who typos a node name must
not read "0 slots" as "this node holds nothing".
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.utils import timezone
from django_filters.fields import IsoDateTimeField

from agent.models import AuditEntry, Configuration, Instance, Node, ReconcileRun, Slot

STATES = (
    ("", "any state"),
    ("free", "free"),
    ("held", "held"),
    ("foreign", "foreign value"),
    ("surplus", "surplus (beyond capacity)"),
    ("stuck", "stuck (any reason below)"),
    ("no-pod", "stuck: pod not known past the grace period"),
    ("old", "stuck: held long"),
    ("conflict", "stuck: conflict in the last hour"),
)
VIEWS = (("slots", "slot map"), ("overview", "overview"), ("runs", "reconciliation"))
RANGES = (
    ("1h", "last hour"),
    ("6h", "last 6 hours"),
    ("24h", "last 24 hours"),
    ("7d", "last 7 days"),
    ("30d", "last 30 days"),
    ("custom", "custom"),
)
RANGE_DELTAS = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
DEFAULT_RANGE = "24h"


def known_nodes(holders: Iterable[str] | None = None) -> set[str]:
    """Nodes in the node cache, and nodes holding slots (a node gone may still hold some).
    ``holders``: the nodes holding slots when the caller has counted them already."""
    names = set(Node.objects.values_list("name", flat=True))
    if holders is None:
        # order_by(): the model's default ordering would make DISTINCT return every row.
        rows = Slot.objects.exclude(holder_node="").order_by().values_list("holder_node")
        holders = (name for (name,) in rows.distinct())
    names.update(holders)
    return names


def is_known_node(name: str) -> bool:
    """``name in known_nodes()``, in two indexed lookups instead of a scan of every slot."""
    return Node.objects.filter(name=name).exists() or Slot.objects.filter(holder_node=name).exists()


def _visible_to(node: str) -> bool:
    """Does any Instance list ``node``? (Nodes may be missing from the Node cache.)"""
    from akri_site.dashboard.slotmap import visible_to

    return Instance.objects.filter(visible_to(node)).exists()


class _PageMixin(forms.Form):
    page = forms.IntegerField(required=False, min_value=1, max_value=1_000_000)


class SlotFilterForm(_PageMixin):
    """Filters of the slot map and of the live feed."""

    view = forms.ChoiceField(choices=VIEWS, required=False)
    configuration = forms.CharField(required=False, max_length=253)
    namespace = forms.CharField(required=False, max_length=253)
    instance = forms.CharField(required=False, max_length=507, help_text="namespace/name")
    node = forms.CharField(required=False, max_length=253)
    state = forms.ChoiceField(choices=STATES, required=False)
    q = forms.CharField(required=False, max_length=200, label="Instance name contains")
    pod = forms.CharField(
        required=False, max_length=507, label="Pod contains", help_text="namespace/name, or part"
    )
    # The order of Instances (``sorting.SLOT_MAP``): part of the view, so the live feed's page
    # of a sorted map holds the rows the page shows.
    sort = forms.CharField(required=False, max_length=64)

    def clean_sort(self) -> str:
        from akri_site.dashboard.sorting import SLOT_MAP, BadSort

        try:
            chosen = SLOT_MAP.parse({"sort": self.cleaned_data["sort"]})
        except BadSort as exc:
            raise forms.ValidationError(str(exc).removeprefix("sort: ")) from None
        return "" if chosen.is_default else chosen.value

    def clean_configuration(self) -> str:
        name = self.cleaned_data["configuration"].strip()
        if name and not (
            Configuration.objects.filter(name=name).exists()
            or Instance.objects.filter(configuration_name=name).exists()
        ):
            raise forms.ValidationError(f"No Configuration named “{name}” is known.")
        return name

    def clean_namespace(self) -> str:
        ns = self.cleaned_data["namespace"].strip()
        if ns and not (
            Instance.objects.filter(namespace=ns).exists()
            or Configuration.objects.filter(namespace=ns).exists()
        ):
            raise forms.ValidationError(f"No Configuration or Instance in namespace “{ns}”.")
        return ns

    def clean_instance(self) -> str:
        key = self.cleaned_data["instance"].strip()
        if not key:
            return ""
        ns, sep, name = key.partition("/")
        if not sep or not ns or not name:
            raise forms.ValidationError("An Instance is written namespace/name.")
        if not Instance.objects.filter(namespace=ns, name=name).exists():
            raise forms.ValidationError(f"No Instance {key} is known.")
        return key

    def clean_node(self) -> str:
        node = self.cleaned_data["node"].strip()
        if node and not is_known_node(node) and not _visible_to(node):
            raise forms.ValidationError(f"No node named “{node}” is known.")
        return node

    def filters(self) -> dict[str, str]:
        """The non-empty slot filters, in a stable order (also the live subscription)."""
        keys = ("configuration", "namespace", "instance", "node", "state", "q", "pod", "sort")
        return {k: self.cleaned_data[k] for k in keys if self.cleaned_data.get(k)}


def as_utc(value: datetime | None) -> datetime | None:
    """An aware time as the same moment in UTC, or a ValidationError.

    ISO 8601 lets an offset run to +23:59, PostgreSQL's timestamptz only to +15:59 (it answered
    a DataError, a 500); and near year 1 or 9999 the UTC moment may not exist at all (an
    OverflowError when the backend converts it). Converting here turns both into a 400 naming
    the field, and hands every backend a plain UTC value.
    """
    if value is None:
        return None
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise forms.ValidationError(
            "That time is outside the range of dates (years 1 to 9999 in UTC).",
            code="out_of_range",
        ) from None


class UtcDateTimeField(forms.DateTimeField):
    """A form's time field whose value is always UTC (see ``as_utc``)."""

    def to_python(self, value: Any) -> datetime | None:
        return as_utc(super().to_python(value))


class UtcIsoDateTimeField(IsoDateTimeField):
    """django-filter's ISO 8601 field, its value in UTC (see ``as_utc``)."""

    def to_python(self, value: Any) -> datetime | None:
        return as_utc(super().to_python(value))


class _RangeMixin(_PageMixin):
    default_range = DEFAULT_RANGE
    range = forms.ChoiceField(choices=RANGES, required=False)
    start = UtcDateTimeField(required=False, label="From (UTC)")
    end = UtcDateTimeField(required=False, label="To (UTC)")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        start, end = data.get("start"), data.get("end")
        chosen = data.get("range") or ("custom" if start or end else self.default_range)
        data["range"] = chosen
        if chosen == "custom":
            if not start:
                self.add_error("start", "A custom range needs a start time.")
            elif end and end <= start:
                self.add_error("end", "The end of the range must be after its start.")
        return data

    def window(self, now: datetime | None = None) -> tuple[datetime, datetime | None]:
        """(from, to) of the chosen range; ``to`` is None for "until now"."""
        data = self.cleaned_data
        if data["range"] == "custom":
            return data["start"], data.get("end")
        return (now or timezone.now()) - RANGE_DELTAS[data["range"]], None


class RunFilterForm(_RangeMixin):
    RESULTS = (
        ("", "any result"),
        ("changed", "released or restored slots"),
        ("conflicts", "had conflicts"),
        ("errors", "had errors"),
        ("nothing", "changed nothing"),
    )
    scope = forms.ChoiceField(
        choices=[("", "any scope"), *ReconcileRun.Scope.choices], required=False
    )
    trigger = forms.ChoiceField(
        choices=[("", "any trigger"), *ReconcileRun.Trigger.choices], required=False
    )
    node = forms.CharField(required=False, max_length=253)
    result = forms.ChoiceField(choices=RESULTS, required=False)
    # Most runs change nothing (a sweep every 10 s per node): without a result filter, only
    # runs that did something are listed unless ``show=all`` asks for every run.
    show = forms.ChoiceField(
        choices=(("", "runs that did something"), ("all", "all runs")), required=False
    )

    def hides_uneventful(self) -> bool:
        data = self.cleaned_data
        return not data.get("result") and data.get("show") != "all"

    def clean_node(self) -> str:
        node = self.cleaned_data["node"].strip()
        if node and not ReconcileRun.objects.filter(node=node).exists() and not is_known_node(node):
            raise forms.ValidationError(f"No node named “{node}” is known.")
        return node


class AuditFilterForm(_RangeMixin):
    # Manual actions are rare and each matters: look further back by default.
    default_range = "30d"
    OUTCOMES = (("", "any outcome"), ("done", "done"), ("refused", "refused"), ("failed", "failed"))
    user = forms.CharField(required=False, max_length=150)
    outcome = forms.ChoiceField(choices=OUTCOMES, required=False)

    def clean_user(self) -> str:
        name = self.cleaned_data["user"].strip()
        if name and not AuditEntry.objects.filter(username=name).exists():
            raise forms.ValidationError(f"No audit entries by “{name}”.")
        return name
