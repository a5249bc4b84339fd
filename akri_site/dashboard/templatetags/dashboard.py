"""Small filters for times and states; cheap, because the slot map calls them per row."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime

register = template.Library()

_ICONS = {"free": "○", "held": "●", "foreign": "⚠", "surplus": "＋"}
_LEVELS = {"IL": "Instance", "CL": "Configuration", "foreign": "?", "free": ""}


def _moment(value: str | datetime | None) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    return parse_datetime(value)


@register.filter
def utc(value: str | datetime | None) -> str:
    """``2026-11-22 05:03:12 UTC``; the browser rewrites it to local time unless UTC is chosen."""
    moment = _moment(value)
    if moment is None:
        return "—"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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
