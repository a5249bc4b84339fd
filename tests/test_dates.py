"""One date format everywhere (issue 17): the ``when`` filter, and no template formats dates
its own way."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from django.template import Context, Template
from django.test import override_settings
from django.utils import formats, timezone

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


def render(source: str, **context) -> str:
    return Template("{% load dashboard %}" + source).render(Context(context))


def test_when_renders_a_time_element_in_the_one_absolute_format():
    moment = datetime(2026, 11, 24, 9, 31, 5, tzinfo=UTC)

    html = render("{{ t|when }}", t=moment)

    assert html == (
        '<time datetime="2026-11-24T09:31:05Z" title="2026-11-24 09:31:05 UTC">'
        "2026-11-24 09:31:05 UTC</time>"
    )


def test_when_converts_other_zones_and_iso_strings_to_utc():
    berlin = datetime(2026, 11, 24, 10, 31, 5, tzinfo=ZoneInfo("Europe/Berlin"))

    assert ">2026-11-24 09:31:05 UTC<" in render("{{ t|when }}", t=berlin)
    assert ">2026-11-24 09:31:05 UTC<" in render("{{ t|when }}", t="2026-11-24T09:31:05+00:00")


def test_when_ago_adds_the_age_and_relative_shows_only_the_age():
    moment = timezone.now() - timedelta(minutes=3, seconds=5)

    with_age = render('{{ t|when:"ago" }}', t=moment)
    relative = render('{{ t|when:"relative" }}', t=moment)

    assert re.search(
        r" data-ago>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(3 min ago\)</time>$", with_age
    )
    assert relative.endswith(" data-relative>3 min ago</time>")
    assert 'title="' + moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") in relative


def test_when_says_a_missing_time_is_missing():
    assert render("{{ t|when }}", t=None) == "—"
    assert render("{{ t|when }}", t="") == "—"


def test_the_admin_shows_datetimes_in_the_same_format():
    moment = datetime(2026, 11, 24, 9, 31, 5, tzinfo=UTC)

    with override_settings(TIME_ZONE="UTC"):
        shown = formats.localize(timezone.localtime(moment))

    assert shown == "2026-11-24 09:31:05 UTC"


def test_no_template_formats_a_date_its_own_way():
    ad_hoc = re.compile(r"\|date:|\{% now |\|utc\b|\|naturaltime|\|timesince")
    offenders = [
        str(path.relative_to(TEMPLATES))
        for path in TEMPLATES.rglob("*.html")
        if ad_hoc.search(path.read_text())
    ]

    assert offenders == []
