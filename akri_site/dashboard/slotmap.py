"""The slot map: every Instance's slots as plain dicts, for pages, the live feed and tests.

One shape serves the server-rendered page and the websocket (``live.py``), so that a delta
applied in the browser shows exactly what a reload would. Reads are two queries whatever the
number of Instances (``values()`` and no per-row lookups): the map must stay fast at thousands
of Instances.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from agent.domain.cordon import describe_raw
from agent.models import Instance, Pod, Slot, SlotEvent, SlotPodBinding, visible_to
from akri_site.dashboard.sorting import SLOT_MAP, Sorted

log = logging.getLogger(__name__)

HELD_LEVELS = (Slot.Level.IL, Slot.Level.CL)
_INSTANCE_FIELDS = (
    "id",
    "namespace",
    "name",
    "configuration_name",
    "capacity",
    "shared",
    "nodes",
    "deleting",
    "cordon",
)
_SLOT_FIELDS = (
    "id",
    "instance_id",
    "key",
    "index",
    "value",
    "level",
    "holder_node",
    "vdev",
    "surplus",
    "since",
    "pod_namespace",
    "pod_name",
    "pod_uid",
    "container",
)


def iso(moment: datetime | None) -> str | None:
    """UTC ISO 8601 with a Z, the one time format the pages and the feed carry."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def slot_state(level: str, surplus: bool = False) -> str:
    """free / held / foreign: what an operator asks first. Surplus is a separate flag."""
    if level in HELD_LEVELS:
        return "held"
    if level == Slot.Level.FOREIGN:
        return "foreign"
    return "free"


# Why a slot needs a person, in the words the map and the overview use. Each is also a value
# of the ``state`` filter; ``stuck`` is any of them.
STUCK_KINDS = {
    "no-pod": "pod not known",
    "old": "held long",
    "foreign": "foreign value",
    "conflict": "recent conflict",
}
CONFLICT_WINDOW = timedelta(hours=1)
# Instances per slot-map page (400 slots at 4 each): what a screen shows and a server renders
# in tens of milliseconds at any cluster size, in about 110 KB (200 were past the 200 KB a
# page may weigh). The live feed of a page carries only its rows.
PAGE = 100


@dataclass(frozen=True)
class StuckRules:
    """When a slot is stuck, as of one moment: the SQL side (``query``) and the Python side
    (``reasons``) read the same cut-offs, so the map selects exactly what it marks.

    Cut-offs are whole seconds because the slot dicts carry ``since`` to the second.
    """

    grace_before: datetime
    old_before: datetime
    # Nodes whose slot-to-pod map reaches this database: only their slots can be "pod not
    # known". An agent sharing it keeps its map here; one with a database of its own says on
    # its pods what they hold (Pod.holds, which the controller turns into Slot.pod_*). Nodes
    # of neither kind (Akri's own agents) never fill Slot.pod_*.
    mapped_nodes: frozenset[str]
    # (namespace, slot key) of the slots with a conflict event in the last CONFLICT_WINDOW.
    conflicted: frozenset[tuple[str, str]]
    # The cut-offs as the slot dicts write times, made once: the map checks thousands of slots.
    grace_iso: str = field(init=False)
    old_iso: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "grace_iso", iso(self.grace_before))
        object.__setattr__(self, "old_iso", iso(self.old_before))

    @classmethod
    def at(cls, now: datetime | None = None) -> StuckRules:
        now = (now or timezone.now()).replace(microsecond=0)
        conf = settings.AKRI
        mapped = set(SlotPodBinding.objects.order_by().values_list("node", flat=True).distinct())
        publishing = Pod.objects.filter(holds__isnull=False).exclude(node_name="").order_by()
        mapped.update(publishing.values_list("node_name", flat=True).distinct())
        conflicts = SlotEvent.objects.filter(
            cause=SlotEvent.Cause.CONFLICT, at__gte=now - CONFLICT_WINDOW
        ).order_by()
        return cls(
            grace_before=now - timedelta(seconds=conf.get("SLOT_GRACE_SECONDS", 20.0)),
            old_before=now - timedelta(hours=conf.get("STUCK_AFTER_HOURS", 24.0)),
            mapped_nodes=frozenset(mapped),
            conflicted=frozenset(conflicts.values_list("namespace", "slot").distinct()),
        )

    def reasons(self, slot: Mapping[str, Any], namespace: str) -> list[str]:
        """The STUCK_KINDS that apply to one slot dict of ``_slot_dict``."""
        found = []
        state, since = slot["state"], slot["since"]
        if state == "held" and since:
            unbound = not slot["pod"] and slot["node"] in self.mapped_nodes
            if unbound and since < self.grace_iso:
                found.append("no-pod")
            if since < self.old_iso:
                found.append("old")
        elif state == "foreign":
            found.append("foreign")
        if (namespace, slot["key"]) in self.conflicted:
            found.append("conflict")
        return found

    def query(self, kind: str) -> Q:
        """Slots of one STUCK_KINDS kind, or of any (``stuck``), in SQL."""
        if kind == "stuck":
            found = Q(pk__in=[])
            for each in STUCK_KINDS:
                found |= self.query(each)
            return found
        if kind == "no-pod":
            return Q(
                level__in=HELD_LEVELS,
                pod_name="",
                holder_node__in=sorted(self.mapped_nodes),
                since__lt=self.grace_before,
            )
        if kind == "old":
            return Q(level__in=HELD_LEVELS, since__lt=self.old_before)
        if kind == "foreign":
            return Q(level=Slot.Level.FOREIGN)
        keys: dict[str, list[str]] = defaultdict(list)
        for namespace, key in self.conflicted:
            keys[namespace].append(key)
        found = Q(pk__in=[])
        for namespace, in_ns in keys.items():
            found |= Q(instance__namespace=namespace, key__in=sorted(in_ns))
        return found


STUCK_STATES = ("stuck", *STUCK_KINDS)


def _slot_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    pod = f"{row['pod_namespace']}/{row['pod_name']}" if row["pod_name"] else ""
    return {
        "id": row["id"],
        "key": row["key"],
        "index": row["index"],
        "value": row["value"],
        "level": row["level"],
        "state": slot_state(row["level"]),
        "node": row["holder_node"],
        "vdev": row["vdev"],
        "surplus": row["surplus"],
        "since": iso(row["since"]),
        "pod": pod,
        "pod_uid": row["pod_uid"],
        "container": row["container"],
    }


def instance_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def parse_instance_refs(refs: Iterable[int | str]) -> tuple[set[int], set[tuple[str, str]]]:
    """Split Instance references into ids and (namespace, name) keys.

    ``"ns/name"`` is a key; a bare ``"name"`` is in the watched namespace (``AKRI["NAMESPACE"]``).
    """
    ids: set[int] = set()
    keys: set[tuple[str, str]] = set()
    default_ns = settings.AKRI.get("NAMESPACE", "default")
    for ref in refs:
        if isinstance(ref, int) and not isinstance(ref, bool):
            ids.add(ref)
        elif isinstance(ref, str) and ref:
            ns, sep, name = ref.partition("/")
            keys.add((ns, name) if sep else (default_ns, ref))
        else:
            raise TypeError(f"an Instance reference is an id or 'namespace/name', not {ref!r}")
    return ids, keys


def refs_query(ids: set[int], keys: set[tuple[str, str]]) -> Q:
    """The Instances named by ids and keys: one ``name IN (...)`` per namespace, so the
    query grows linearly (one OR'ed condition per key grew as N² on PostgreSQL, and past 500
    keys went beyond SQLite's expression depth, dropping the whole update)."""
    query = Q(pk__in=ids) if ids else Q(pk__in=[])
    names: dict[str, list[str]] = defaultdict(list)
    for ns, name in keys:
        names[ns].append(name)
    for ns, in_ns in names.items():
        query |= Q(namespace=ns, name__in=sorted(in_ns))
    return query


def serialize(
    instances: QuerySet[Instance], rules: StuckRules | None = None
) -> list[dict[str, Any]]:
    """All slots of the given Instances, ordered by Configuration, namespace, name, slot index.

    Each slot carries ``stuck``: the STUCK_KINDS that apply to it now (or as of ``rules``).
    """
    rules = rules or StuckRules.at()
    rows = list(
        instances.order_by("configuration_name", "namespace", "name").values(*_INSTANCE_FIELDS)
    )
    slots: dict[int, list[dict[str, Any]]] = defaultdict(list)
    slot_rows = (
        Slot.objects.filter(instance__in=instances.values("pk"))
        .order_by("instance_id", "index", "key")
        .values(*_SLOT_FIELDS)
    )
    for slot in slot_rows:
        slots[slot["instance_id"]].append(_slot_dict(slot))
    result = []
    for row in rows:
        own = slots.get(row["id"], [])
        for slot in own:
            slot["stuck"] = rules.reasons(slot, row["namespace"])
        result.append(
            {
                "id": row["id"],
                "key": instance_key(row["namespace"], row["name"]),
                "namespace": row["namespace"],
                "name": row["name"],
                "configuration": row["configuration_name"],
                "capacity": row["capacity"],
                "shared": row["shared"],
                "nodes": list(row["nodes"] or []),
                "deleting": row["deleting"],
                "cordon": describe_raw(row["cordon"]),
                "counts": count_slots(own),
                "slots": own,
            }
        )
    return result


def count_slots(slots: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts = {"total": 0, "held": 0, "free": 0, "foreign": 0, "surplus": 0}
    for slot in slots:
        counts["total"] += 1
        counts[slot["state"]] += 1
        counts["surplus"] += bool(slot["surplus"])
    return counts


def base_queryset(filters: Mapping[str, str]) -> QuerySet[Instance]:
    """The SQL part of the filters: which Instances can match at all."""
    qs = Instance.objects.all()
    if filters.get("configuration"):
        qs = qs.filter(configuration_name=filters["configuration"])
    if filters.get("namespace"):
        qs = qs.filter(namespace=filters["namespace"])
    if filters.get("instance"):
        ns, _, name = filters["instance"].partition("/")
        qs = qs.filter(namespace=ns, name=name)
    if filters.get("q"):
        qs = qs.filter(name__icontains=filters["q"])
    if filters.get("pod"):
        held = Slot.objects.filter(pod_slots_query(filters["pod"]), instance=OuterRef("pk"))
        qs = qs.filter(Exists(held))
    return qs


def pod_slots_query(term: str) -> Q:
    """Slots whose pod, written ``namespace/name``, contains ``term`` (any case): the SQL
    side of ``pod_matches``. Names hold no ``/``, so a term with one ends the namespace and
    starts the name."""
    ns, sep, name = term.partition("/")
    if not sep:
        match = Q(pod_name__icontains=term) | Q(pod_namespace__icontains=term)
    elif "/" in name:
        return Q(pk__in=[])
    else:
        match = Q(pod_namespace__iendswith=ns, pod_name__istartswith=name)
    return match & ~Q(pod_name="")


def pod_matches(term: str, pod: str) -> bool:
    """Does the slot's pod (``namespace/name``, or empty) contain ``term``?"""
    return bool(pod) and term.lower() in pod.lower()


def slot_matches(
    slot: Mapping[str, Any], instance: Mapping[str, Any], f: Mapping[str, str]
) -> bool:
    state = f.get("state")
    if state == "surplus":
        if not slot["surplus"]:
            return False
    elif state == "stuck":
        if not slot["stuck"]:
            return False
    elif state in STUCK_KINDS and state != "foreign":
        if state not in slot["stuck"]:
            return False
    elif state and slot["state"] != state:
        return False
    if f.get("pod") and not pod_matches(f["pod"], slot["pod"]):
        return False
    node = f.get("node")
    # A node's view: what it holds, and what it could take (the slots of the Instances it can
    # see that no other node holds). Slots held by others stay in the row, faded, as context.
    if not node or slot["node"] == node:
        return True
    return node in instance["nodes"] and slot["state"] != "held"


def narrow(instance: Mapping[str, Any], f: Mapping[str, str]) -> dict[str, Any] | None:
    """The Instance if any of it matches ``f``, with ``match``: the keys of matching slots.

    All slots stay in ``slots``: the map shows a matching slot beside its neighbours, which
    often explain it (a node that cannot get a slot because the others are held).
    """
    for key in ("configuration", "namespace"):
        wanted = f.get(key)
        if wanted and instance[key] != wanted:
            return None
    if f.get("instance") and instance["key"] != f["instance"]:
        return None
    if f.get("q") and f["q"].lower() not in instance["name"].lower():
        return None
    match = [s["key"] for s in instance["slots"] if slot_matches(s, instance, f)]
    # An Instance with no slot rows yet still belongs to an unfiltered view and to the view
    # of a node that can see it.
    empty_ok = not instance["slots"] and not f.get("state") and not f.get("pod")
    if match or (empty_ok and (not f.get("node") or f["node"] in instance["nodes"])):
        return {**instance, "match": match}
    return None


def matching(filters: Mapping[str, str], rules: StuckRules | None = None) -> QuerySet[Instance]:
    """Exactly the Instances ``narrow`` keeps, selected in SQL and in slot-map order, so that
    a page or a snapshot reads only the rows it shows: at 40,000 Instances, serializing them
    all to show one page cost seconds whatever the page held.

    For the stuck states, ``narrow`` agrees when its slots were serialized with the same
    ``rules`` (the page passes one to both). ``filters["sort"]`` orders the Instances within
    each Configuration (``sorting.SLOT_MAP``), in SQL so that pages follow each other."""
    qs = base_queryset(filters)
    state, pod, node = filters.get("state"), filters.get("pod"), filters.get("node")
    wanted = Q()
    if state == "surplus":
        wanted &= Q(surplus=True)
    elif state in STUCK_STATES and state != "foreign":
        wanted &= (rules or StuckRules.at()).query(state)
    elif state == "held":
        wanted &= Q(level__in=HELD_LEVELS)
    elif state:
        wanted &= Q(level=Slot.Level.FOREIGN if state == "foreign" else Slot.Level.FREE)
    if pod:
        wanted &= pod_slots_query(pod)
    slots = Slot.objects.filter(instance=OuterRef("pk"))
    if node:
        visible = visible_to(node)
        takeable = Exists(slots.filter(wanted).exclude(level__in=HELD_LEVELS))
        condition = Q(Exists(slots.filter(wanted, holder_node=node))) | (visible & Q(takeable))
        if not (state or pod):
            condition |= visible & ~Q(Exists(slots))
        qs = qs.filter(condition)
    elif state or pod:
        qs = qs.filter(Exists(slots.filter(wanted)))
    sort = SLOT_MAP.parse(filters)
    if sort.is_default:
        return qs.order_by("configuration_name", "namespace", "name")
    return _with_counts(qs, sort).order_by(
        "configuration_name", *sort.order_by("namespace", "name")
    )


_COUNTED_LEVELS = {
    "held": HELD_LEVELS,
    "free": (Slot.Level.FREE,),
    "foreign": (Slot.Level.FOREIGN,),
}


def _with_counts(qs: QuerySet[Instance], sort: Sorted) -> QuerySet[Instance]:
    """The Instances with the slot count ``sort`` orders by (``n_held``, ...), if it needs one."""
    levels = _COUNTED_LEVELS.get(sort.key)
    if levels is None:
        return qs
    return qs.annotate(**{f"n_{sort.key}": Count("slots", filter=Q(slots__level__in=levels))})


def sort_instances(qs: QuerySet[Instance], sort: Sorted) -> QuerySet[Instance]:
    """A Configuration's Instances in the order ``sort`` (``sorting.CONFIGURATION_INSTANCES``)
    chose, in SQL so that its pages follow each other."""
    return _with_counts(qs, sort).order_by(*sort.order_by("namespace", "name", "id"))


def narrowed(
    instances: QuerySet[Instance], filters: Mapping[str, str], rules: StuckRules | None = None
) -> list[dict[str, Any]]:
    """The given Instances serialized, each with the keys of its slots matching ``filters``."""
    result = []
    for instance in serialize(instances, rules):
        row = narrow(instance, filters)
        if row is not None:
            result.append(row)
    return result


def slot_map(filters: Mapping[str, str]) -> list[dict[str, Any]]:
    """The Instances matching ``filters``, each with the keys of its matching slots."""
    rules = StuckRules.at()
    return narrowed(matching(filters, rules), filters, rules)


def page_of(
    qs: QuerySet[Instance], filters: Mapping[str, str], rules: StuckRules | None = None
) -> list[dict[str, Any]]:
    """A slice of ``matching()`` (a page), serialized and narrowed, in the slice's order."""
    ids = list(qs.values_list("pk", flat=True))
    place = {pk: n for n, pk in enumerate(ids)}
    rows = narrowed(Instance.objects.filter(pk__in=ids), filters, rules)
    return sorted(rows, key=lambda row: place[row["id"]])


def columns(instances: Iterable[Mapping[str, Any]]) -> int:
    """Slot columns a grid needs: capacity, or more when surplus slots remain."""
    width = 0
    for instance in instances:
        width = max(width, instance["capacity"], *(s["index"] + 1 for s in instance["slots"]))
    return width


def group_by_configuration(
    instances: list[dict[str, Any]], counts: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """[{name, instances, shown, counts}] in the order of the (already sorted) Instances.

    ``counts`` is ``summary()``; without it each group counts only the Instances given.
    """
    groups: dict[str, dict[str, Any]] = {}
    for instance in instances:
        name = instance["configuration"]
        if name not in groups:
            whole = (counts or {}).get("configurations", {}).get(name)
            groups[name] = {"name": name, "instances": [], "shown": 0, "counts": whole}
        group = groups[name]
        group["instances"].append(instance)
        group["shown"] += len(instance.get("match", instance["slots"]))
    for group in groups.values():
        if group["counts"] is None:
            group["counts"] = count_slots(s for i in group["instances"] for s in i["slots"])
        group["columns"] = columns(group["instances"])
    return list(groups.values())


def stuck_counts(rules: StuckRules | None = None) -> dict[str, int]:
    """Slots of each STUCK_KINDS kind over the whole cache (a slot may count in several),
    and ``held_surplus``: slots beyond capacity still held. One pass over the slots that
    can be stuck (held, foreign, or named by a conflict), not a count per kind: each of
    those scanned all 160,000 slots of a 40,000-Instance cache."""
    rules = rules or StuckRules.at()
    kinds = {f"n{i}": kind for i, kind in enumerate(STUCK_STATES)}
    counted = Slot.objects.filter(
        Q(level__in=(*HELD_LEVELS, Slot.Level.FOREIGN)) | rules.query("conflict")
    ).aggregate(
        held_surplus=Count("id", filter=Q(surplus=True) & ~Q(level=Slot.Level.FREE)),
        **{alias: Count("id", filter=rules.query(kind)) for alias, kind in kinds.items()},
    )
    return {
        **{kind: counted[alias] for alias, kind in kinds.items()},
        "held_surplus": counted["held_surplus"],
    }


class CostlyReuse:
    """Wraps a read of the whole cache so that an answer which took a while (hundreds of
    milliseconds or more at 40,000 Instances) is reused for ``factor`` times its cost: the
    slot map, the overview and every live delta ask for such counts, and at that size each
    would otherwise recount the whole table. Cheap answers (any cluster of a few thousand
    Instances, and every test) are always computed afresh.

    In the web's processes (``refresh_in_background``, set by ``warmup.warm_up`` at start-up,
    which also counts once before the first request) an answer past its time is still served
    while one thread counts again, so that no page waits for a count of the whole cache: each
    such count cost a request 100-300 ms at 40,000 Instances. An answer is served that way for
    at most STALE_SECONDS past its time (a recount that fails or hangs); after that the request
    counts itself, as everywhere else."""

    CHEAP_SECONDS = 0.05
    STALE_SECONDS = 30.0
    refresh_in_background = False
    _all: list[CostlyReuse] = []

    def __init__(self, fn: Any, factor: float) -> None:
        self.fn, self.factor = fn, factor
        self._lock = threading.Lock()
        self._at, self._cost, self._value = float("-inf"), 0.0, None
        self._refresher: threading.Thread | None = None
        CostlyReuse._all.append(self)

    def forget(self) -> None:
        with self._lock:
            self._at, self._cost, self._value = float("-inf"), 0.0, None

    @classmethod
    def forget_all(cls) -> None:
        """Drop every kept answer. For tests: on a loaded machine a small count can take
        longer than CHEAP_SECONDS, and its answer must not outlive the test's database."""
        for reuse in cls._all:
            reuse.forget()

    @classmethod
    def expire_all(cls) -> None:
        """Make every kept answer due, as time does (the page bench's "once they expire")."""
        for reuse in cls._all:
            with reuse._lock:
                reuse._at = min(reuse._at, time.monotonic() - reuse.factor * reuse._cost)

    def __call__(self) -> Any:
        with self._lock:
            at, cost, value = self._at, self._cost, self._value
            age = time.monotonic() - at
            kept = cost >= self.CHEAP_SECONDS and age < self.factor * cost
            stale = (
                not kept
                and cost >= self.CHEAP_SECONDS
                and self.refresh_in_background
                and age < self.factor * cost + self.STALE_SECONDS
            )
            if stale:
                self._start_refresh()
        if kept or stale:  # a recount replaces the kept answer, never changes it: copy unlocked
            return copy.deepcopy(value)
        return copy.deepcopy(self._count())

    def _count(self) -> Any:
        started = time.monotonic()
        value = self.fn()
        with self._lock:
            self._at, self._cost, self._value = started, time.monotonic() - started, value
        return value

    def _start_refresh(self) -> None:
        """One recount at a time, in a thread of its own (called with the lock held)."""
        if self._refresher is not None and self._refresher.is_alive():
            return
        self._refresher = threading.Thread(
            target=self._refresh, name="dashboard-count-refresh", daemon=True
        )
        self._refresher.start()

    def _refresh(self) -> None:
        from django.db import connection

        try:
            self._count()
        except Exception:
            log.exception("recounting %s failed; the kept answer is served meanwhile", self.fn)
        finally:
            connection.close()  # the thread's own connection (or the pool's, given back)

    def join(self, timeout: float | None = None) -> None:
        """Wait for a recount under way (tests)."""
        refresher = self._refresher
        if refresher is not None:
            refresher.join(timeout)


def summary() -> dict[str, Any]:
    """Slot counts per Configuration and per holder node, over the whole cache."""
    return _summary()


def _count_summary() -> dict[str, Any]:
    per_config: dict[str, dict[str, int]] = {}
    per_node: dict[str, dict[str, int]] = {}
    totals = {"total": 0, "held": 0, "free": 0, "foreign": 0, "surplus": 0}
    rows = Slot.objects.values(
        "instance__configuration_name", "level", "surplus", "holder_node"
    ).annotate(n=Count("id"))
    for row in rows:
        state = slot_state(row["level"])
        config = per_config.setdefault(
            row["instance__configuration_name"],
            {"total": 0, "held": 0, "free": 0, "foreign": 0, "surplus": 0},
        )
        for bucket in (config, totals):
            bucket["total"] += row["n"]
            bucket[state] += row["n"]
            if row["surplus"]:
                bucket["surplus"] += row["n"]
        if state == "held" and row["holder_node"]:
            node = per_node.setdefault(row["holder_node"], {"IL": 0, "CL": 0, "held": 0})
            node[row["level"]] += row["n"]
            node["held"] += row["n"]
    return {
        "totals": totals,
        "configurations": dict(sorted(per_config.items())),
        "nodes": dict(sorted(per_node.items())),
    }


_summary = CostlyReuse(_count_summary, factor=4)
