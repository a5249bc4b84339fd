"""Small filters for times and states; cheap, because the slot map calls them per row.

Times: one format everywhere. ``{{ t|when }}`` renders a ``<time>`` element whose text is the
absolute time, ``2026-11-24 09:31:05 UTC``; ``static/dashboard/times.js`` rewrites it in the
browser to the viewer's zone (or keeps UTC, by the header's toggle) in the same shape, and adds
the relative age. ``|when:"ago"`` also shows the age in the text (``... (3 min ago)``: columns
where "how long" is the question), ``|when:"relative"`` only the age (absolute in the title).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from agent.domain.cordon import describe_raw
from akri_site.dashboard import fragments

register = template.Library()

_ICONS = {"free": "○", "held": "●", "foreign": "⚠", "surplus": "＋"}
_LEVELS = {"IL": "Instance", "CL": "Configuration", "foreign": "?", "free": ""}


def _moment(value: str | datetime | None) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    return parse_datetime(value)


_WHEN_STYLES = {"": "", "ago": " data-ago", "relative": " data-relative", "clock": " data-clock"}


@register.filter
def when(value: str | datetime | None, style: str = "") -> SafeString | str:
    """``<time datetime="2026-11-24T09:31:05Z">2026-11-24 09:31:05 UTC</time>``; ``—`` when
    missing. ``style``: ``""`` (absolute), ``"ago"`` (absolute and age), ``"relative"`` (age),
    ``"clock"`` (the time of day, ``09:31:05 UTC``: the live mark's "loaded at")."""
    moment = _moment(value)
    if moment is None:
        return "—"
    try:
        moment = moment.astimezone(UTC)
    except (OverflowError, ValueError):
        # Year 1 with a positive offset (or 9999 with a negative one) has no UTC moment; the
        # page shows the value as written instead of failing whole (it was a 500).
        return format_html('<time title="{}">{}</time>', moment.isoformat(), moment.isoformat())
    # Not strftime's %Y: glibc writes year 1 as "1", which no browser parses as a date.
    day = f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
    clock = f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    stamp = f"{day}T{clock}Z"
    absolute = f"{day} {clock} UTC"
    if style == "relative":
        text = ago(moment)
    elif style == "clock":
        text = f"{clock} UTC"
    elif style == "ago":
        text = f"{absolute} ({ago(moment)})"
    else:
        text = absolute
    attrs = _WHEN_STYLES.get(style, "")
    # Only digits, dashes, colons and letters: nothing to escape.
    return mark_safe(f'<time datetime="{stamp}" title="{absolute}"{attrs}>{text}</time>')


@register.simple_tag
def now_when(style: str = "") -> SafeString | str:
    """The current time as ``|when`` renders it ("loaded at", "read at")."""
    return when(timezone.now(), style)


@register.filter
def cordon_says(raw: str | None) -> str:
    """A cached cordon annotation in words: ``cordoned by alice: replacing lens``."""
    return describe_raw(raw)


@register.filter
def ago(value: str | datetime | None) -> str:
    """``42 s ago`` / ``5 min ago`` / ``3 h ago`` / ``2 d ago``; ``never`` when missing."""
    moment = _moment(value)
    if moment is None:
        return "never"
    seconds = max(0, int((timezone.now() - moment).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    if seconds < 172800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


@register.filter
def icon(state: str) -> str:
    return _ICONS.get(state, "")


@register.filter
def level_label(level: str) -> str:
    return _LEVELS.get(level, level)


@register.simple_tag(takes_context=True)
def sort_th(context: Any, param: str, key: str, label: str, css: str = "") -> str:
    """A column header that sorts its table by ``param`` (``sorting.sortable``): a real link,
    ``aria-sort`` on the sorted column and an arrow with words (never colour alone)."""
    from akri_site.dashboard.sorting import sort_header, sorted_by

    request = context.get("request")
    current = sorted_by(request, param) if request is not None else None
    if current is None:  # the same table where it is not sortable (a short "recent" excerpt)
        return format_html('<th scope="col">{}</th>', label)
    return sort_header(request.GET, current, key, label, css)


@register.simple_tag(takes_context=True)
def sorted_rows(context: Any, rows: Any, param: str) -> Any:
    """``rows`` (a list, or a query set read whole) in the order ``param`` chose: for tables
    that are not paged, so sorting the rows shown is sorting them all."""
    from akri_site.dashboard.sorting import sorted_by

    current = sorted_by(context.get("request"), param)
    return rows if current is None else current.rows(rows)


@register.simple_tag(takes_context=True)
def sort_choices(context: Any, current: Any) -> list[dict[str, Any]]:
    """A "Sort by" list for a view whose columns are not one table's headers (the slot map):
    [{key, label, href, current, descending}] for the chosen sort ``current``."""
    request = context.get("request")
    if not current or request is None:
        return []
    return [
        {
            "key": key,
            "label": label,
            "href": current.table.link(request.GET, current, key),
            "current": key == current.key,
            "descending": current.descending,
        }
        for key, label in current.table.labels
    ]


@register.filter
def nodes_text(nodes: list[str]) -> SafeString:
    """An Instance's nodes as the slot map writes them: three named, then how many more."""
    return mark_safe(fragments.nodes_text(list(nodes or [])))  # each name is escaped


@register.simple_tag
def user_role(user: Any) -> str | None:
    """The user's dashboard role (``{% user_role user as role %}``): pages rendered outside the
    views (403, 404) have no ``role`` in their context."""
    from akri_site.dashboard.access import role_of

    return role_of(user)
