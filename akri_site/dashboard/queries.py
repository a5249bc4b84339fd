"""Read-side helpers of the pages: overview numbers, alerts, history rows, cache freshness.

Plain functions over the ORM cache; views call one of these and render.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from agent.models import (
    Configuration,
    Instance,
    Node,
    ReconcileRun,
    Slot,
    SlotEvent,
    SyncState,
)
from akri_site.dashboard.slotmap import CostlyReuse, StuckRules, iso, stuck_counts, summary
from akri_site.dashboard.sorting import Sorted

RECENT_EVENTS = 50
# Nodes named one by one among the alerts; the rest are one line linking to the Nodes list.
NODE_ALERTS = 10
ALERT_WINDOW = timedelta(hours=1)
# What a reconciliation run shows, on the history page and in the JSON API alike.
RUN_FIELDS = (
    "id",
    "scope",
    "node",
    "trigger",
    "started_at",
    "duration_ms",
    "checked",
    "released",
    "restored",
    "conflicts",
    "errors",
    "detail",
    "task_id",
)


def stale_after() -> float:
    """Seconds without a watcher sync after which the cache is called stale."""
    return float(settings.AKRI.get("STALE_SECONDS", 60))


def run_dict(run: dict[str, Any]) -> dict[str, Any]:
    """A ReconcileRun as the pages and the live feed show it (from ``values()``)."""
    changed = run["released"] + run["restored"]
    if run["errors"]:
        result = "errors"
    elif run["conflicts"]:
        result = "conflicts"
    elif changed:
        result = "changed"
    else:
        result = "nothing"
    return {
        **{k: run[k] for k in RUN_FIELDS if k != "started_at"},
        "started_at": iso(run["started_at"]),
        "result": result,
        "url": reverse("dashboard:run", args=[run["id"]]),
    }


def run_values(qs: QuerySet[ReconcileRun]) -> QuerySet:
    return qs.values(*RUN_FIELDS)


def runs(qs: QuerySet[ReconcileRun]) -> list[dict[str, Any]]:
    return [run_dict(r) for r in run_values(qs)]


def filter_runs(data: dict[str, Any], start: datetime, end: datetime | None) -> QuerySet:
    qs = ReconcileRun.objects.filter(started_at__gte=start)
    if end:
        qs = qs.filter(started_at__lt=end)
    for field in ("scope", "node", "trigger"):
        if data.get(field):
            qs = qs.filter(**{field: data[field]})
    result = data.get("result")
    if result == "changed":
        qs = qs.filter(Q(released__gt=0) | Q(restored__gt=0))
    elif result == "conflicts":
        qs = qs.filter(conflicts__gt=0)
    elif result == "errors":
        qs = qs.filter(errors__gt=0)
    elif result == "nothing":
        qs = qs.filter(released=0, restored=0, conflicts=0, errors=0)
    return qs


def eventful(qs: QuerySet) -> QuerySet:
    """The runs that released, restored, or met a conflict or an error."""
    return qs.filter(Q(released__gt=0) | Q(restored__gt=0) | Q(conflicts__gt=0) | Q(errors__gt=0))


def sync_status(now: datetime | None = None) -> dict[str, Any]:
    """How fresh the cache is: every watcher's last sync, and which are stale."""
    now = now or timezone.now()
    limit = now - timedelta(seconds=stale_after())
    watchers = list(
        SyncState.objects.order_by("owner", "kind").values(
            "owner", "kind", "synced_at", "listing_since"
        )
    )
    stale = [w for w in watchers if w["synced_at"] is None or w["synced_at"] < limit]
    synced = [w["synced_at"] for w in watchers if w["synced_at"] is not None]
    stale_times = [w["synced_at"] for w in stale if w["synced_at"] is not None]
    return {
        "watchers": len(watchers),
        "stale": [
            {"owner": w["owner"], "kind": w["kind"], "synced_at": iso(w["synced_at"])}
            for w in stale
        ],
        "oldest_synced_at": iso(min(synced)) if synced else None,
        # None while nothing is stale, or when the stale watchers never synced at all.
        "stale_since": iso(min(stale_times)) if stale_times else None,
        "stale_after": stale_after(),
        # Relists being written page by page: what the cache shows of these kinds is partial.
        "syncing": [
            {"owner": w["owner"], "kind": w["kind"], "since": iso(w["listing_since"])}
            for w in watchers
            if w["listing_since"] is not None
        ],
    }


def last_run() -> dict[str, Any] | None:
    found = runs(ReconcileRun.objects.order_by("-started_at", "-id")[:1])
    return found[0] if found else None


def recent_events(qs: QuerySet[SlotEvent], limit: int = RECENT_EVENTS) -> list[SlotEvent]:
    return list(qs.select_related("run").order_by("-at", "-id")[:limit])


def _slots(n: int) -> str:
    return "slot holds" if n == 1 else "slots hold"


def alerts(
    now: datetime | None = None, counts: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """What needs a person, worst first. Each alert says what and where, in words.
    ``counts``: ``stuck_counts()`` when the caller has them already."""
    now = now or timezone.now()
    counts = counts if counts is not None else stuck_counts()
    found: list[dict[str, Any]] = []
    for conf in Configuration.objects.exclude(error="").values("namespace", "name", "error"):
        found.append(
            {
                "level": "error",
                "title": f"Configuration {conf['namespace']}/{conf['name']} cannot be used",
                "detail": conf["error"],
                "url": reverse("dashboard:configuration", args=[conf["namespace"], conf["name"]]),
            }
        )
    since = now - ALERT_WINDOW
    errored = ReconcileRun.objects.filter(started_at__gte=since, errors__gt=0)
    if errored.exists():
        found.append(
            {
                "level": "error",
                "title": f"{errored.count()} reconciliation runs with errors in the last hour",
                "detail": "",
                "url": reverse("dashboard:runs") + "?range=1h&result=errors",
            }
        )
    sync = sync_status(now)
    if not sync["watchers"]:
        found.append(
            {
                "level": "warning",
                "title": "No watcher has synced the cache yet",
                "detail": "Is the controller running? What you see may not be the cluster.",
                "url": "",
            }
        )
    for watcher in sync["stale"]:
        when = watcher["synced_at"] or "never"
        found.append(
            {
                "level": "warning",
                "title": f"Stale data: {watcher['owner']} / {watcher['kind']}",
                "detail": f"last synced {when} (older than {sync['stale_after']:.0f} s)",
                "synced_at": watcher["synced_at"],
                "url": "",
            }
        )
    foreign = Slot.objects.filter(level=Slot.Level.FOREIGN)
    n_foreign = counts["foreign"]
    if n_foreign:
        examples = ", ".join(
            f"{key}={value!r}" for key, value in foreign.values_list("key", "value")[:3]
        )
        found.append(
            {
                "level": "warning",
                "title": f"{n_foreign} {_slots(n_foreign)} a value that is not a node "
                "nor C:vdev:node",
                "detail": examples,
                "url": reverse("dashboard:slots") + "?state=foreign",
            }
        )
    conflicts = SlotEvent.objects.filter(at__gte=since, cause=SlotEvent.Cause.CONFLICT).count()
    run_conflicts = ReconcileRun.objects.filter(started_at__gte=since, conflicts__gt=0).count()
    if conflicts or run_conflicts:
        found.append(
            {
                "level": "warning",
                "title": f"Conflicts in the last hour: {conflicts} slot events, "
                f"{run_conflicts} reconciliation runs",
                "detail": "A conflict means two writers raced for a slot; the API server decided.",
                "url": reverse("dashboard:runs") + "?range=1h&result=conflicts",
            }
        )
    not_ready = list(Node.objects.filter(ready=False, deleted=False).values_list("name", flat=True))
    holding = set(
        Slot.objects.filter(holder_node__in=not_ready)
        .order_by()  # the default ordering would make DISTINCT return every row
        .values_list("holder_node", flat=True)
        .distinct()
    )
    for node in sorted(holding)[:NODE_ALERTS]:
        found.append(
            {
                "level": "warning",
                "title": f"Node {node} is not Ready and still holds slots",
                "detail": "Cluster reconciliation frees them after the node-gone grace.",
                "url": reverse("dashboard:node", args=[node]),
            }
        )
    if len(holding) > NODE_ALERTS:
        found.append(
            {
                "level": "warning",
                "title": f"{len(holding) - NODE_ALERTS} more nodes are not Ready and still "
                "hold slots",
                "detail": "Cluster reconciliation frees them after the node-gone grace.",
                "url": reverse("dashboard:nodes") + "?state=not-ready&sort=-held",
            }
        )
    held_surplus = counts["held_surplus"]
    if held_surplus:
        found.append(
            {
                "level": "info",
                "title": f"{held_surplus} {'slot' if held_surplus == 1 else 'slots'} beyond "
                "capacity still held",
                "detail": "Capacity shrank under their holders; they go once released.",
                "url": reverse("dashboard:slots") + "?state=surplus",
            }
        )
    return found


# The overview's "Stuck" box: what each count means and what fixes it.
STUCK_ROWS = (
    ("no-pod", "pod not known past the grace period", "release it if no pod uses the device"),
    ("old", "held longer than {hours:g} h", "release it if its pod no longer needs it"),
    ("foreign", "foreign value", "release it (the value is not ours to read)"),
    ("conflict", "conflict in the last hour", "see who raced for it; release the wrong holder"),
)


def _count_stuck() -> dict[str, Any]:
    rules = StuckRules.at()
    return {"counts": stuck_counts(rules), "mapped": bool(rules.mapped_nodes)}


# A pass over every slot that may be stuck (40,000 at 40,000 Instances), kept like the
# slot counts; the cut-offs move by seconds in the while, the box says when it counted.
_stuck_counts = CostlyReuse(_count_stuck, factor=4)


def stuck(counted: dict[str, Any] | None = None) -> dict[str, Any]:
    """Counts of stuck slots per reason, each with a link to the slot map showing them
    (``counted``: what ``_stuck_counts()`` answered, when the caller has it already)."""
    counted = counted or _stuck_counts()
    counts = counted["counts"]
    hours = settings.AKRI.get("STUCK_AFTER_HOURS", 24.0)
    url = reverse("dashboard:slots") + "?state="
    rows = [
        {
            "kind": kind,
            "label": label.format(hours=hours),
            "fix": fix,
            "count": counts[kind],
            "url": url + kind,
            # Without a slot-to-pod map in this database the pods cannot be known here.
            "untracked": kind == "no-pod" and not counted["mapped"],
        }
        for kind, label, fix in STUCK_ROWS
    ]
    return {"total": counts["stuck"], "url": url + "stuck", "rows": rows}


def visible_per_node() -> dict[str, int]:
    """How many Instances list each node (node lists change seldom: a costly count is
    reused for ten times its cost)."""
    return _visible_per_node()


def _count_visible_per_node() -> dict[str, int]:
    """How many Instances list each node. Counted by the database where it can unnest JSON
    (PostgreSQL): reading every Instance's node list into Python cost seconds at 40,000.
    Equal lists are grouped before they are unnested: a cluster has far fewer distinct node
    lists than Instances, and unnesting each Instance's cost three times as much."""
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(Instance._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT node, SUM(n) FROM "
                f"(SELECT nodes, COUNT(*) AS n FROM {table} GROUP BY nodes) AS lists, "
                "jsonb_array_elements_text(CASE jsonb_typeof(nodes) WHEN 'array' THEN nodes "
                "ELSE '[]'::jsonb END) AS node GROUP BY node"
            )
            return {node: int(n) for node, n in cursor.fetchall()}
    visible: dict[str, int] = {}
    for nodes in Instance.objects.values_list("nodes", flat=True).iterator(2000):
        for node in nodes or []:
            visible[node] = visible.get(node, 0) + 1
    return visible


_visible_per_node = CostlyReuse(_count_visible_per_node, factor=10)


def instances_per_configuration() -> dict[str, int]:
    """How many Instances each Configuration has (kept like the slot counts: a count of the
    whole Instance table)."""
    return _instances_per_configuration()


def _count_instances_per_configuration() -> dict[str, int]:
    return dict(
        Instance.objects.order_by()
        .values_list("configuration_name")
        .annotate(n=Count("id"))
        .values_list("configuration_name", "n")
    )


_instances_per_configuration = CostlyReuse(_count_instances_per_configuration, factor=4)

# Nodes the overview lists; the Nodes list has them all (a thousand rows were 450 KB here).
OVERVIEW_NODE_ROWS = 20


def overview(node_sort: Sorted | None = None) -> dict[str, Any]:
    """The overview's numbers. ``nodes`` is the first OVERVIEW_NODE_ROWS nodes in the order
    ``node_sort`` chose (of ``n_nodes``); the Nodes list has every one."""
    counts = summary()
    configurations = list(
        Configuration.objects.order_by("namespace", "name").values(
            "namespace", "name", "capacity", "unique_devices", "discovery_handler", "error"
        )
    )
    instance_counts = instances_per_configuration()
    visible = visible_per_node()
    empty = {"total": 0, "held": 0, "free": 0, "foreign": 0, "surplus": 0}
    known = {c["name"] for c in configurations}
    for conf in configurations:
        conf["counts"] = counts["configurations"].get(conf["name"], empty)
        conf["instances"] = instance_counts.get(conf["name"], 0)
    # Instances whose Configuration is not (or no longer) in the cache still hold slots.
    orphans = [
        {"name": name, "counts": c, "instances": instance_counts.get(name, 0), "orphan": True}
        for name, c in counts["configurations"].items()
        if name not in known
    ]
    nodes = list(Node.objects.values("name", "ready", "deleted", "not_ready_since"))
    names = {n["name"] for n in nodes}
    nodes += [
        {"name": name, "ready": None, "deleted": False, "not_ready_since": None}
        for name in sorted((set(counts["nodes"]) | set(visible)) - names)
    ]
    for node in nodes:
        node["held"] = counts["nodes"].get(node["name"], {"IL": 0, "CL": 0, "held": 0})
        node["visible"] = visible.get(node["name"], 0)
    nodes_url = reverse("dashboard:nodes")
    if node_sort is not None:
        nodes = node_sort.rows(nodes)
        # The same order on the Nodes list (its "state" stands for the overview's "ready").
        key = "state" if node_sort.key == "ready" else node_sort.key
        nodes_url += f"?sort={'-' if node_sort.descending else ''}{key}"
    counted = _stuck_counts()
    return {
        "summary": counts,
        "configurations": configurations,
        "orphans": orphans,
        "nodes": nodes[:OVERVIEW_NODE_ROWS],
        "n_nodes": len(nodes),
        "nodes_url": nodes_url,
        "n_instances": sum(instance_counts.values()),
        "n_nodes_ready": sum(1 for n in nodes if n["ready"]),
        "last_run": last_run(),
        "alerts": alerts(counts=counted["counts"]),
        "stuck": stuck(counted),
        "sync": sync_status(),
    }
