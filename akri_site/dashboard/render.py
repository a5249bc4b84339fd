"""HTML fragments for the live feed, rendered by the same templates as the pages.

A delta carries both the data (``instances``, ``runs``) and these fragments (``html``,
``runs_html``), so the browser swaps in exactly what a reload would show.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from django.template.loader import get_template
from django.urls import reverse


@cache
def link_prefixes() -> dict[str, str]:
    """Prefixes for links built per row: ``reverse`` per row is too slow for the slot map."""
    root = reverse("dashboard:overview")
    return {
        "node_url": f"{root}nodes/",
        "instance_url": f"{root}instances/",
        "configuration_url": f"{root}configurations/",
        "release_url": reverse("admin:agent_slot_changelist"),
    }


def instances_html(instances: Iterable[Mapping[str, Any]], can_release: bool) -> dict[str, str]:
    template = get_template("dashboard/_instance.html")
    base = {"can_release": can_release, **link_prefixes()}
    return {i["key"]: template.render({**base, "inst": i}) for i in instances}


def runs_html(runs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    template = get_template("dashboard/_run_row.html")
    base = link_prefixes()
    return {str(r["id"]): template.render({**base, "r": r}) for r in runs}
