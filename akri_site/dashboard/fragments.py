"""HTML for the slot map and the live feed, rendered by one function for both.

The slot map is the one page that grows with the cluster (2,000 Instances x 4 slots must
render in well under half a second), so its rows are built here with plain string formatting
rather than a template per row, which costs ~0.3 ms a row. The live feed sends the very same
rows (``html``, by Instance key), so the browser swaps in exactly what a reload would show.
Every value from the cache goes through ``escape``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from functools import cache
from html import escape
from typing import Any
from urllib.parse import quote

from django.template.loader import get_template
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

_ICONS = {"free": "○", "held": "●", "foreign": "⚠"}
# Why a slot is stuck, in words on the cell (``slotmap.STUCK_KINDS``), and what fixes it.
_STUCK_WORDS = {
    "no-pod": "pod not known past the grace period",
    "old": "held long",
    "foreign": "foreign value",
    "conflict": "conflict in the last hour",
}
# Explained once by the legend above the map (``LEGEND``), not per cell: the map has thousands.
_IL = "IL"
_CL = "CL"
LEGEND = mark_safe(
    '<p class="legend"><span class="state state-free"><span aria-hidden="true">○</span> free</span> '
    '<span class="state state-held"><span aria-hidden="true">●</span> held</span> '
    '<span class="state state-foreign"><span aria-hidden="true">⚠</span> foreign</span>: a value '
    "that is neither a node nor C:vdev:node (left alone). "
    "<strong>IL</strong>: held through the per-Instance device plugin (value = node); "
    "<strong>CL</strong>: held through the per-Configuration plugin for a virtual device "
    "(value = C:vdev:node). Surplus: beyond the Instance's capacity, removed once free. "
    "Faded cells do not match the filters. "
    '<span class="stuck-mark"><span aria-hidden="true">⚑</span> stuck</span>: needs a person '
    "(pod not known past the grace period, held long, foreign value or a recent conflict); "
    "releasing the slot fixes it.</p>"
)


@cache
def link_prefixes() -> dict[str, str]:
    """Prefixes for links built per row: ``reverse`` per row is too slow for the slot map."""
    root = reverse("dashboard:overview")
    return {
        "node_url": f"{root}nodes/",
        "instance_url": f"{root}instances/",
        "configuration_url": f"{root}configurations/",
        "release_url": reverse("dashboard:slots"),
        "slots_url": reverse("dashboard:slots"),
        "pod_url": f"{root}pods/",
    }


def stuck_mark(slot: Mapping[str, Any], can_release: bool, instance_href: str) -> str:
    """The words saying why a slot is stuck, and the one action that fixes it."""
    words = "; ".join(_STUCK_WORDS[k] for k in slot["stuck"])
    out = (
        f'<br><strong class="stuck-mark"><span aria-hidden="true">⚑</span> stuck: {words}</strong>'
    )
    if "conflict" in slot["stuck"]:
        out += f'<br><a class="fix" href="{instance_href}#events">Who raced for it</a>'
    if not can_release:
        out += '<br><span class="meta">An operator can release it.</span>'
    return out


def slot_cell(
    slot: Mapping[str, Any],
    matched: bool,
    can_release: bool,
    instance_href: str = "",
    back: str = "",
) -> str:
    """One slot's cell; ``back`` is the release link's query (``?back=...``: the map's view)."""
    p = link_prefixes()
    state = slot["state"]
    key = escape(slot["key"])
    stuck = slot.get("stuck")
    classes = (
        f"slot {state}"
        + ("" if matched else " dim")
        + (" surplus" if slot["surplus"] else "")
        + (" stuck" if stuck else "")
    )
    out = [
        f'<td data-slot="{key}" data-state="{state}" class="{classes}">',
        f'<span class="state state-{state}"><span aria-hidden="true">{_ICONS[state]}</span> {state}</span>',
    ]
    if slot["surplus"]:
        out.append(
            ' <span class="state state-surplus"><span aria-hidden="true">＋</span> surplus</span>'
        )
    level = slot["level"]
    if level == "IL":
        out.append(f" {_IL}")
    elif level == "CL":
        out.append(f' {_CL} <span class="meta">{escape(slot["vdev"])}</span>')
    elif level == "foreign":
        out.append(f" <code>{escape(slot['value'])}</code>")
    node = slot["node"]
    if node:
        node = escape(node)
        out.append(f'<br><a class="node" href="{p["node_url"]}{node}/">{node}</a>')
    if slot["pod"]:
        # The pod's page: every slot it holds (several containers, IL and CL alike), its queue.
        href = escape(f"{p['pod_url']}{quote(slot['pod'], safe='/')}/")
        pod = f'<a class="pod" href="{href}" title="This pod\'s slots, queue and events">{escape(slot["pod"])}</a>'
        if slot["container"]:
            pod += f" / {escape(slot['container'])}"
        out.append(f"<br>{pod}")
    elif state == "held" and "no-pod" not in (stuck or ()):
        # Past the grace period the stuck mark below says it instead.
        out.append('<br><span class="meta">pod not known yet</span>')
    since = slot["since"]
    if since:
        out.append(f'<br><time datetime="{since}" data-ago>{since[:10]} {since[11:19]} UTC</time>')
    if stuck:
        out.append(stuck_mark(slot, can_release, instance_href))
    if can_release and state != "free":
        out.append(
            f'<br><a class="button small release" data-release '
            f'href="{p["release_url"]}{slot["id"]}/release/{back}" '
            f'aria-label="Release {key}…">Release…</a>'
        )
    out.append("</td>")
    return "".join(out)


NODES_SHOWN = 3  # node names in an Instance's row; a camera every node sees lists 1,000


def nodes_text(nodes: list[str]) -> str:
    """The nodes that can see an Instance, at most NODES_SHOWN named (HTML, escaped)."""
    if not nodes:
        return "no node"
    shown = ", ".join(escape(n) for n in nodes[:NODES_SHOWN])
    more = len(nodes) - NODES_SHOWN
    if more <= 0:
        return shown
    return f'{shown} <span class="meta">and {more} more</span>'


def instance_row(instance: Mapping[str, Any], can_release: bool, back: str = "") -> str:
    """One ``<tr>`` of the grid: the Instance, who can see it, then one cell per slot index."""
    p = link_prefixes()
    key = escape(instance["key"])
    counts = instance["counts"]
    facts = [f"{counts['held']} held", f"{counts['free']} free"]
    if counts["foreign"]:
        facts.append(f"{counts['foreign']} foreign")
    if counts["surplus"]:
        facts.append(f"{counts['surplus']} surplus")
    facts.append("shared" if instance["shared"] else "not shared")
    if instance["deleting"]:
        facts.append("<strong>being deleted</strong>")
    if instance.get("cordon"):
        # In words, not colour: "cordoned by alice: replacing lens".
        facts.append(
            f'<strong class="cordon"><span aria-hidden="true">⛔</span> '
            f"{escape(instance['cordon'])}</strong>"
        )
    nodes = nodes_text(instance["nodes"])
    out = [
        f'<tr data-instance="{key}" data-configuration="{escape(instance["configuration"])}">',
        f'<th scope="row"><a href="{p["instance_url"]}{key}/">{escape(instance["name"])}</a>'
        f'<br><span class="meta">{" · ".join(facts)}</span></th>',
        f'<td class="nodes">{nodes}</td>',
    ]
    match = instance.get("match")
    matched = None if match is None else set(match)
    by_index: dict[int, list[Mapping[str, Any]]] = {}
    for slot in instance["slots"]:
        by_index.setdefault(slot["index"], []).append(slot)
    width = max([instance["capacity"], *(i + 1 for i in by_index)])
    for index in range(width):
        slots = by_index.get(index)
        if not slots:
            out.append('<td class="slot none">—</td>')
            continue
        for slot in slots:
            matches = matched is None or slot["key"] in matched
            out.append(slot_cell(slot, matches, can_release, f"{p['instance_url']}{key}/", back))
    if not instance["slots"]:
        out.append('<td class="empty">no slot rows in the cache yet</td>')
    out.append("</tr>")
    row = "".join(out)
    # A version of the row, so the browser replaces (and highlights) only rows that changed.
    opening = out[0]
    return f'{opening[:-1]} data-v="{zlib.crc32(row.encode()):08x}">{row[len(opening) :]}'


def _count(name: str, which: str, value: int) -> str:
    return f'<span data-count-config="{name}" data-count="{which}">{value}</span>'


# The header's skip link lands on the first slot table of a page (issue 17).
FIRST_TABLE = ' id="first-slot-table" tabindex="-1"'


def release_back(query: str) -> str:
    """The release link's query carrying the slot map's view (filters, sort, page)."""
    return escape(f"?back={quote(query, safe='')}") if query else ""


def slot_grid(
    groups: Iterable[Mapping[str, Any]],
    can_release: bool,
    back: str = "",
    instance_head: str = '<th scope="col">Instance</th>',
) -> SafeString:
    """One section and table per Configuration: rows are Instances, columns slot indexes.

    ``back``: the view's query, carried by release links so the operator lands back on it;
    ``instance_head``: the first column's header (the slot map's is a sort link).
    """
    p = link_prefixes()
    suffix = release_back(back)
    out = []
    for n, group in enumerate(groups, 1):
        name = escape(group["name"])
        c = group["counts"]
        heads = "".join(f'<th scope="col">slot {i}</th>' for i in range(group["columns"]))
        out.append(
            f'<section class="configuration" data-configuration="{name}" '
            f'aria-labelledby="conf-{n}">'
            f'<h2 id="conf-{n}">Configuration <a href="{p["configuration_url"]}'
            f'{escape(group["instances"][0]["namespace"])}/{name}/">{name}</a></h2>'
            f'<p class="counts">All its slots: {_count(name, "total", c["total"])} · '
            f'<span class="state state-held"><span aria-hidden="true">●</span> '
            f"{_count(name, 'held', c['held'])} held</span> · "
            f'<span class="state state-free"><span aria-hidden="true">○</span> '
            f"{_count(name, 'free', c['free'])} free</span> · "
            f'<span class="state state-foreign"><span aria-hidden="true">⚠</span> '
            f"{_count(name, 'foreign', c['foreign'])} foreign</span> · "
            f"{_count(name, 'surplus', c['surplus'])} surplus</p>"
            f'<div class="grid"><table class="slotgrid"{FIRST_TABLE if n == 1 else ""}>'
            f'<caption class="visually-hidden">Slots of Configuration {name}: one row per '
            f"Instance, one column per slot</caption>"
            f'<thead><tr>{instance_head}<th scope="col">Visible to</th>{heads}'
            f"</tr></thead><tbody>"
        )
        out.extend(instance_row(i, can_release, suffix) for i in group["instances"])
        out.append("</tbody></table></div></section>")
    if out:
        out.insert(0, LEGEND)
    return mark_safe("".join(out))  # every value from the cache above is escaped


def instances_html(instances: Iterable[Mapping[str, Any]], can_release: bool) -> dict[str, str]:
    return {i["key"]: instance_row(i, can_release) for i in instances}


def runs_html(runs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    template = get_template("dashboard/_run_row.html")
    base = link_prefixes()
    return {str(r["id"]): template.render({**base, "r": r}) for r in runs}
