"""Applying what the API server says to the ORM cache, and recording slot history.

Two paths write here: watches (``apply_instance`` with nothing to attribute, so a slot change
is recorded as observed and its cause inferred from the values) and our own successful writes
(the claim store passes the cause, actor and pod it knows). Both are idempotent: applying the
same object twice changes nothing and records nothing twice.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agent import dbcopy
from agent.domain.configspec import InvalidConfiguration, parse_configuration
from agent.domain.cordon import ANNOTATION as CORDON_ANNOTATION
from agent.domain.slots import UsageKind, parse_usage, slot_views
from agent.models import Configuration, Instance, Node, ReconcileRun, Slot, SlotEvent

log = logging.getLogger(__name__)

_LEVEL = {
    UsageKind.FREE: Slot.Level.FREE,
    UsageKind.NODE: Slot.Level.IL,
    UsageKind.CONFIG: Slot.Level.CL,
    UsageKind.FOREIGN: Slot.Level.FOREIGN,
}


class RunSource(Protocol):
    """A run whose row is written on first need (``agent.node.reconcile.RunBook``). A
    reconciler names it on the release path without waiting for the database: a storm's run
    row, written there, waited seconds for SQLite's write lock, and failed the releases once
    the wait passed the timeout. The row is written before the events that name it
    (``resolve_runs``), outside the transaction that writes them."""

    def ensure_row(self) -> ReconcileRun: ...


@dataclass(frozen=True)
class Attribution:
    """Who changed a slot and why, when the writer knows it."""

    cause: str
    actor: str
    node: str = ""
    pod: str = ""
    detail: str = ""
    run: ReconcileRun | RunSource | None = None


def resolve_runs(attributions: Iterable[Attribution | None]) -> None:
    """Write the rows of the runs these attributions name lazily. Called before the
    transaction that writes their events: a row written inside it and rolled back with it
    would leave its run naming a row that does not exist."""
    for attribution in attributions:
        run = attribution.run if attribution is not None else None
        if run is not None and not isinstance(run, ReconcileRun):
            run.ensure_row()


def _run_row(run: ReconcileRun | RunSource | None) -> ReconcileRun | None:
    if run is None or isinstance(run, ReconcileRun):
        return run
    return run.ensure_row()  # not resolved beforehand: written now, in the caller's transaction


class Attributions(Protocol):
    """Who made each slot change, asked slot by slot as changes are recorded (a dict of
    ``Attribution`` by slot key will do)."""

    def get(self, key: str, default: Any = None) -> Attribution | None: ...


def _created(meta: dict[str, Any]) -> datetime | None:
    stamp = meta.get("creationTimestamp")
    return parse_datetime(stamp) if isinstance(stamp, str) else None


def apply_configuration(obj: dict[str, Any]) -> Configuration:
    """Mirror a Configuration; a malformed one is kept with its error and nothing else changes."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    fields: dict[str, Any] = {
        "uid": meta.get("uid", ""),
        "resource_version": meta.get("resourceVersion", ""),
        "generation": meta.get("generation") or 0,
        "spec": spec,
        "deleting": bool(meta.get("deletionTimestamp")),
        "created_at": _created(meta),
    }
    try:
        parsed = parse_configuration(obj)
    except InvalidConfiguration as exc:
        fields["error"] = str(exc)
    else:
        fields.update(
            error="",
            capacity=parsed.capacity,
            unique_devices=parsed.unique_devices,
            discovery_handler=parsed.handler_name,
        )
    row, _ = Configuration.objects.update_or_create(
        namespace=meta.get("namespace", ""), name=meta["name"], defaults=fields
    )
    return row


def remove_configuration(namespace: str, name: str) -> None:
    Configuration.objects.filter(namespace=namespace, name=name).delete()


# How long our own write may wait for its watch echo before the watch is trusted again
# (the echo can be lost to a relist; the relist itself then carries the newer state).
PENDING_ECHO_SECONDS = 5.0


def apply_instance(
    obj: dict[str, Any],
    attributions: Attributions | None = None,
    *,
    direct: bool = False,
    relist: bool = False,
) -> tuple[Instance, bool]:
    """Mirror an Instance and its slots; record one event per slot whose value changed.

    ``direct`` marks the answer to our own write, applied ahead of the watch. Until the
    watch echoes that version, its events for this Instance are older and are skipped, so
    the cache never steps back. A ``relist`` is the latest state and overrides that wait.
    Returns the row and whether this call applied anything.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = meta["name"]
    namespace = meta.get("namespace", "")
    rv = meta.get("resourceVersion", "")
    usage = spec.get("deviceUsage") or {}
    now = timezone.now()
    fields = _instance_fields(obj, now, direct=direct)
    with transaction.atomic():
        row = _instance_row(namespace, name)
        verdict = _verdict(row, rv, now, direct=direct, relist=relist)
        if verdict is ECHO:
            Instance.objects.filter(pk=row.pk).update(pending_rv="", pending_at=None)
            row.pending_rv = ""
        if verdict is not None:
            return row, False
        if row is None:
            row = Instance.objects.create(namespace=namespace, name=name, **fields)
            existing: dict[str, Slot] = {}
        else:
            # Only what changed (usually a version and one slot value): a full save() would
            # rewrite and re-encode every column of a row that is written on every claim.
            changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
            changed["updated_at"] = now
            for k, v in changed.items():
                setattr(row, k, v)
            Instance.objects.filter(pk=row.pk).update(**changed)
            existing = _slot_rows(row)
        _apply_slots(row, existing, usage, attributions or {}, rv, now)
    return row, True


SKIP, ECHO = "skip", "echo"


def _verdict(
    row: Instance | None, rv: str, now: datetime, *, direct: bool, relist: bool
) -> str | None:
    """Whether version ``rv`` of an Instance is applied over ``row`` (None), skipped
    (``SKIP``), or is the echo of our own write that the row awaits (``ECHO``: its wait ends,
    nothing else changes)."""
    if row is None:
        return None
    if direct and not_newer(rv, row.resource_version):
        # The watch got here first (or further): waiting for an echo that has passed would
        # make it skip newer events, and applying would step back.
        return SKIP
    if not (direct or relist) and row.pending_rv:
        if rv == row.pending_rv:
            return ECHO
        age = (now - row.pending_at).total_seconds() if row.pending_at else PENDING_ECHO_SECONDS
        if age < PENDING_ECHO_SECONDS:
            return SKIP
    return None


def _instance_fields(obj: dict[str, Any], now: datetime, *, direct: bool = False) -> dict:
    """The Instance row's columns (all but namespace and name) for an API object."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    rv = meta.get("resourceVersion", "")
    return {
        "uid": meta.get("uid", ""),
        "resource_version": rv,
        "configuration_name": spec.get("configurationName", ""),
        "cdi_name": spec.get("cdiName", ""),
        "capacity": _as_capacity(spec.get("capacity")),
        "shared": bool(spec.get("shared", False)),
        "nodes": list(spec.get("nodes") or []),
        "broker_properties": dict(spec.get("brokerProperties") or {}),
        "device_usage": dict(spec.get("deviceUsage") or {}),
        "cordon": _cordon_value(meta),
        "deleting": bool(meta.get("deletionTimestamp")),
        "created_at": _created(meta),
        "pending_rv": rv if direct else "",
        "pending_at": now if direct else None,
    }


def _cordon_value(meta: dict[str, Any]) -> str | None:
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict) or CORDON_ANNOTATION not in annotations:
        return None
    return str(annotations[CORDON_ANNOTATION])


# The two lookups every watch event and every claim's answer makes, as plain SQL through
# ``raw()``: the ORM still converts the columns per backend (JSON, dates), but skips compiling
# a query each time, which is most of the cost of these one-row reads (measured on SQLite:
# 0.21 ms -> 0.08 ms each; the applier's work competes with Allocate for the interpreter).
def _instance_row(namespace: str, name: str) -> Instance | None:
    """The row, locked until the transaction ends where the database locks rows. Two
    writers of one Instance (the applier with a watch event, a claim store applying its
    answer inline) each read, decide and write only what differs from what they read; on
    PostgreSQL, unlocked, the second could overwrite the first's version but keep its
    pending echo, and the cache would stay behind the API server (seen in the agent tests).
    SQLite's write transactions (IMMEDIATE) already run one at a time."""
    qn = connection.ops.quote_name
    sql = (
        f"SELECT * FROM {qn(Instance._meta.db_table)} "
        f"WHERE {qn('namespace')} = %s AND {qn('name')} = %s"
    )
    if connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    return next(iter(Instance.objects.raw(sql, [namespace, name])), None)


def _slot_rows(row: Instance) -> dict[str, Slot]:
    qn = connection.ops.quote_name
    sql = f"SELECT * FROM {qn(Slot._meta.db_table)} WHERE {qn('instance_id')} = %s"
    return {slot.key: slot for slot in Slot.objects.raw(sql, [row.pk])}


def not_newer(rv: str, current: str) -> bool:
    """``rv`` is ``current`` or, when both are integers (etcd's and the simulator's are),
    older. Otherwise resourceVersions are opaque and nothing can be said."""
    if not rv or not current:
        return False
    return rv == current or (rv.isdigit() and current.isdigit() and int(rv) < int(current))


def is_newer(rv: str, than: str) -> bool:
    """Both are integers and ``rv`` comes after ``than`` (opaque versions: never)."""
    return rv.isdigit() and than.isdigit() and int(rv) > int(than)


def _as_capacity(value: Any) -> int:
    # Akri allows 0; a malformed value must not crash the sync: treat it as no slots.
    return value if isinstance(value, int) and value >= 0 else 0


def _apply_slots(
    row: Instance,
    existing: dict[str, Slot],
    usage: dict[str, Any],
    attributions: Attributions,
    rv: str,
    now: datetime,
) -> None:
    """Bring the slot rows in line with ``usage``, writing only the rows and columns that
    differ; pod columns are cleared where the value changed (the holder is someone new)."""
    plan, gone = _slot_plan(row, existing, usage, now)
    for key, slot, fields, before, value in plan:
        if slot is None:
            Slot.objects.create(instance=row, key=key, **fields)
        elif fields:
            Slot.objects.filter(pk=slot.pk).update(**fields)
        if before != value and (before is not None or value):
            record_change(row, key, before or "", value, attributions.get(key), rv=rv, at=now)
    if gone:
        Slot.objects.filter(pk__in=[slot.pk for slot in gone]).delete()


SlotStep = tuple[str, "Slot | None", dict[str, Any], "str | None", str]


def _slot_plan(
    row: Instance, existing: dict[str, Slot], usage: dict[str, Any], now: datetime
) -> tuple[list[SlotStep], list[Slot]]:
    """What bringing the slot rows in line with ``usage`` takes: per slot, (key, its row or
    None, the columns to write: those that differ, or all of a new row, the value before (None
    for a new row), the value after); and the rows no longer wanted."""
    steps: list[SlotStep] = []
    seen: set[str] = set()
    for view in slot_views(row.name, row.capacity, usage):
        seen.add(view.key)
        value = view.usage.raw
        slot = existing.get(view.key)
        before = slot.value if slot is not None else None
        derived = _view_columns(view)
        if before == value and _row_columns(slot) == derived:
            # Most slots of a changed Instance are as they were: compared as tuples, without
            # a dict of columns for each.
            steps.append((view.key, slot, {}, before, value))
            continue
        fields = dict(zip(_DERIVED, derived, strict=True))  # as ``_slot_fields``
        if before != value:
            fields.update(value=value, since=now if value else None)
            fields.update(pod_namespace="", pod_name="", pod_uid="", container="")
        if slot is not None:
            fields = {k: v for k, v in fields.items() if getattr(slot, k) != v}
        steps.append((view.key, slot, fields, before, value))
    return steps, [slot for key, slot in existing.items() if key not in seen]


# The slot columns that follow from the Instance (its key, capacity and the slot's value).
_DERIVED = ("index", "surplus", "level", "holder_node", "vdev")
_row_columns = operator.attrgetter(*_DERIVED)


def _view_columns(view: Any) -> tuple[Any, ...]:
    """``_DERIVED`` as the slot view says they should be."""
    return (view.index, view.surplus, _LEVEL[view.usage.kind], view.usage.node, view.usage.vdev)


def _slot_fields(view: Any) -> dict[str, Any]:
    return dict(zip(_DERIVED, _view_columns(view), strict=True))


def record_change(
    row: Instance,
    key: str,
    before: str,
    after: str,
    attribution: Attribution | None,
    *,
    rv: str = "",
    at: datetime | None = None,
) -> SlotEvent:
    """Append one slot event; without an attribution the cause is inferred from the values."""
    return SlotEvent.objects.create(**_event_fields(row, key, before, after, attribution, rv, at))


def _event_fields(
    row: Instance,
    key: str,
    before: str,
    after: str,
    attribution: Attribution | None,
    rv: str,
    at: datetime | None,
) -> dict[str, Any]:
    if attribution is None:
        attribution = _infer(before, after, row)
    return dict(
        at=at or timezone.now(),
        namespace=row.namespace,
        instance=row.name,
        configuration=row.configuration_name,
        slot=key,
        before=before,
        after=after,
        cause=attribution.cause,
        actor=attribution.actor,
        node=attribution.node,
        pod=attribution.pod,
        detail=attribution.detail,
        resource_version=rv,
        run=_run_row(attribution.run),
    )


def _infer(before: str, after: str, row: Instance) -> Attribution:
    """Attribute a change seen only through a watch, from the values themselves.

    A new holder is credited to that node's agent only when it names a node the cluster knows;
    anything else (say ``"" -> "weird-value-123"`` written straight to the API server) is an
    observed change by an unknown writer, not an allocation by an agent that does not exist.
    """
    old, new = parse_usage(before), parse_usage(after)
    if (
        new.kind in (UsageKind.NODE, UsageKind.CONFIG)
        and old.kind is UsageKind.FREE
        and _known_node(new.node, row)
    ):
        return Attribution(
            SlotEvent.Cause.ALLOCATE, f"agent:{new.node}", node=new.node, detail="seen by watch"
        )
    if new.kind is UsageKind.FREE and old.kind in (UsageKind.NODE, UsageKind.CONFIG):
        return Attribution(
            SlotEvent.Cause.RELEASE, "unknown", node=old.node, detail="seen by watch"
        )
    return Attribution(
        SlotEvent.Cause.OBSERVED, "unknown", node=new.node or old.node, detail="seen by watch"
    )


def _known_node(name: str, row: Instance) -> bool:
    """A node this cluster knows: in the Instance's ``spec.nodes`` (where agents put
    themselves), or mirrored from the Node list (the controller's cache)."""
    return name in (row.nodes or []) or Node.objects.filter(name=name).exists()


def remove_instance(namespace: str, name: str) -> None:
    """The Instance is gone: its slots go with it (history stays)."""
    Instance.objects.filter(namespace=namespace, name=name).delete()


Name = tuple[str, str]  # an Instance's namespace and name


class InstanceBatch:
    """Watch events and our writes' answers for many Instances, applied as ``apply_instance``
    and ``remove_instance`` would apply them one after another, in a handful of statements.

    At a thousand changes a second a change must not cost round trips of its own: applied
    one at a time, each took six (its savepoint, the row locked, the row, the slots, the event,
    the savepoint's release), and under load each round trip waits for the database's turn
    on the CPU (5 ms at load 12, 45 ms a change). Here the rows of every Instance the batch
    names are read (and locked) in two statements; the changes are applied to them in
    memory, in order, so several changes of one Instance follow one another as they would
    in the database; ``flush`` then writes what differs: deletions, Instance rows and slot
    rows upserted (grouped by the columns written, so that a column another writer keeps, a
    slot's pod, is never written back as read), and the slot events in one insert. Call
    inside the caller's transaction, which commits the lot."""

    def __init__(self, names: Iterable[Name]) -> None:
        self._rows: dict[Name, Instance | None] = {}
        self._slots: dict[Name, dict[str, Slot]] = {}
        self._dirty: dict[Name, set[str]] = {}  # Instance columns to write
        self._slot_dirty: dict[tuple[Name, str], set[str]] = {}  # by (Instance, slot key)
        self._gone: list[int] = []  # Instance rows to delete
        self._slots_gone: list[int] = []
        self._events: list[SlotEvent] = []
        self._load(set(names))

    def _load(self, names: set[Name]) -> None:
        names -= self._rows.keys()
        by_namespace: dict[str, list[str]] = {}
        for namespace, name in sorted(names):
            by_namespace.setdefault(namespace, []).append(name)
        found: dict[Name, Instance] = {}
        for namespace, some in by_namespace.items():
            rows = Instance.objects.filter(namespace=namespace, name__in=some).order_by("pk")
            if connection.features.has_select_for_update:
                rows = rows.select_for_update()  # see _instance_row
            found.update(((namespace, row.name), row) for row in rows)
        for key in names:
            self._rows[key] = found.get(key)
            self._slots[key] = {}
        by_pk = {row.pk: key for key, row in found.items()}
        if by_pk:
            rows = Slot.objects.filter(instance_id__in=by_pk).values_list(*_SLOT_COLUMNS)
            for values in rows:
                slot = _SlotRead(values)
                self._slots[by_pk[slot.instance_id]][slot.key] = slot

    def apply(
        self, obj: dict[str, Any], attributions: Attributions | None = None, *, direct: bool = False
    ) -> tuple[Instance | None, bool]:
        """As ``apply_instance``: the row (None only if never written) and whether applied."""
        meta = obj.get("metadata") or {}
        name = (meta.get("namespace", ""), meta["name"])
        rv = meta.get("resourceVersion", "")
        now = timezone.now()
        self._load({name})
        row = self._rows[name]
        verdict = _verdict(row, rv, now, direct=direct, relist=False)
        if verdict is ECHO:
            row.pending_rv, row.pending_at = "", None
            self._dirty.setdefault(name, set()).update(("pending_rv", "pending_at"))
        if verdict is not None:
            return row, False
        fields = _instance_fields(obj, now, direct=direct)
        if row is None:
            row = self._rows[name] = Instance(namespace=name[0], name=name[1], **fields)
            self._dirty[name] = {"*"}
        else:
            changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
            for k, v in changed.items():
                setattr(row, k, v)
            self._dirty.setdefault(name, set()).update(changed, ("updated_at",))
        existing = self._slots[name]
        usage = (obj.get("spec") or {}).get("deviceUsage") or {}
        plan, gone = _slot_plan(row, existing, usage, now)
        attributions = attributions or {}
        for key, slot, fields, before, value in plan:
            if slot is None:
                existing[key] = Slot(instance=row, key=key, **fields)
                self._slot_dirty[(name, key)] = {"*"}
            elif fields:
                if isinstance(slot, _SlotRead):
                    slot = existing[key] = slot.model()
                for k, v in fields.items():
                    setattr(slot, k, v)
                self._slot_dirty.setdefault((name, key), set()).update(fields)
            if before != value and (before is not None or value):
                event = _event_fields(row, key, before or "", value, attributions.get(key), rv, now)
                self._events.append(SlotEvent(**event))
        for slot in gone:
            del existing[slot.key]
            self._slot_dirty.pop((name, slot.key), None)
            if slot.pk is not None:
                self._slots_gone.append(slot.pk)
        return row, True

    def remove(self, namespace: str, name: str) -> None:
        """As ``remove_instance``: the row and its slots go, the events recorded stay."""
        name = (namespace, name)
        self._load({name})
        row = self._rows[name]
        if row is not None and row.pk is not None:
            self._gone.append(row.pk)
        self._rows[name], self._slots[name] = None, {}
        self._dirty.pop(name, None)
        for key in [k for k in self._slot_dirty if k[0] == name]:
            del self._slot_dirty[key]

    def flush(self) -> None:
        """Write it all: deletions first (a name deleted and created again is a new row)."""
        if self._gone:
            Instance.objects.filter(pk__in=self._gone).delete()
        if self._slots_gone:
            Slot.objects.filter(pk__in=self._slots_gone).delete()
        rows = [(name, self._rows[name]) for name in self._dirty]
        _upsert(Instance, ["namespace", "name"], rows, self._dirty)
        # A new row has its key now, which its new slots take from it as they are written.
        slots = [(k, self._slots[k[0]][k[1]]) for k in self._slot_dirty]
        _upsert(Slot, ["instance", "key"], slots, self._slot_dirty)
        SlotEvent.objects.bulk_create(self._events, batch_size=BATCH)
        self._gone, self._slots_gone, self._events = [], [], []
        self._dirty, self._slot_dirty = {}, {}


_SLOT_COLUMNS = tuple(f.attname for f in Slot._meta.concrete_fields)


class _SlotRead:
    """A slot row as ``InstanceBatch`` read it: its columns as attributes, made a model
    (``model``) only when it is to be written. An Instance's change rewrites a slot or two of
    its dozens, and a model instance built of every row read was, in a storm of releases,
    about a tenth of the agents' time."""

    __slots__ = ("_values", *_SLOT_COLUMNS)

    def __init__(self, values: tuple[Any, ...]) -> None:
        self._values = values
        for column, value in zip(_SLOT_COLUMNS, values, strict=True):
            setattr(self, column, value)

    @property
    def pk(self) -> int:
        return self.id

    def model(self) -> Slot:
        return Slot.from_db(Slot.objects.db, _SLOT_COLUMNS, self._values)


def _upsert(model: Any, unique: list[str], rows: list[tuple[Any, Any]], dirty: dict) -> None:
    """Write ``rows`` ((key, object) pairs) as upserts on ``unique``, one statement per set
    of columns written (``dirty[key]``; ``{"*"}``: a new row, every column): an upsert writes
    only the columns it names, and a row read, locked or not, must not have others written
    back over a change made since by another writer."""
    groups: dict[frozenset[str], list] = {}
    for key, obj in rows:
        groups.setdefault(frozenset(dirty[key]), []).append(obj)
    every = [f.name for f in model._meta.concrete_fields if not f.primary_key]
    every = [name for name in every if name not in unique]
    for columns, objs in groups.items():
        fields = every if "*" in columns else sorted(columns)
        objs.sort(key=lambda obj: (obj.pk is None, obj.pk or 0))  # rows locked in key order
        known = [obj.pk for obj in objs]
        for obj in objs:
            obj.pk = None  # matched on ``unique``: a key in the insert is a conflict of its own
        model.objects.bulk_create(
            objs,
            batch_size=BATCH,
            update_conflicts=True,
            unique_fields=unique,
            update_fields=fields,
        )
        for obj, pk in zip(objs, known, strict=True):
            if pk is not None:
                obj.pk = pk


# Rows per bulk statement: within every backend's parameter limit (SQLite: 32,766).
BATCH = 500


def replace_all_instances(namespace: str, objects: list[dict[str, Any]]) -> None:
    """After a relist held in one list: drop what the list no longer has, then apply every
    listed Instance (a watch relists page by page: ``apply_listed`` and ``remove_unlisted``)."""
    remove_unlisted(namespace, {obj["metadata"]["name"] for obj in objects})
    for i in range(0, len(objects), BATCH):
        apply_listed(namespace, objects[i : i + BATCH])


def apply_listed(namespace: str, objects: list[dict[str, Any]]) -> set[str]:
    """One page of a relist: at a thousand nodes a relist is tens of thousands of Instances,
    most of them either unchanged (a restart with a warm cache) or new (a first start):
    those are skipped or written in bulk; only an Instance whose version moved goes through
    ``apply_instance``. Looked up by name within the page, so the cost is the page's.
    Returns the names of the Instances written (new or changed)."""
    names = [obj["metadata"]["name"] for obj in objects]
    known = {
        name: (rv, pending)
        for name, rv, pending in Instance.objects.filter(
            namespace=namespace, name__in=names
        ).values_list("name", "resource_version", "pending_rv")
    }
    new, written = [], set()
    for obj in objects:
        name = obj["metadata"]["name"]
        row = known.get(name)
        if row is None:
            new.append(obj)
            written.add(name)
            continue
        moved = row[0] != obj["metadata"].get("resourceVersion", "") or row[1]
        if moved and apply_instance(obj, relist=True)[1]:
            written.add(name)
    if new:
        create_instances(namespace, new)
    return written


def remove_unlisted(namespace: str, listed: set[str], listed_rv: str = "") -> list[str]:
    """The end of a relist: Instances it did not list are gone, unless the cache holds a
    version newer than the list's (``listed_rv``: created or changed after its snapshot, an
    answer to our own write applied meanwhile). Returns the names removed."""
    rows = Instance.objects.filter(namespace=namespace).values_list(
        "pk", "name", "resource_version"
    )
    gone = [
        (pk, name)
        for pk, name, rv in rows.iterator(BATCH)
        if name not in listed and not is_newer(rv, listed_rv)
    ]
    for i in range(0, len(gone), BATCH):
        Instance.objects.filter(pk__in=[pk for pk, _ in gone[i : i + BATCH]]).delete()
    return [name for _, name in gone]


def create_instances(namespace: str, objects: list[dict[str, Any]]) -> None:
    """Mirror Instances the cache does not have yet, with their slots and one event per held
    slot (as ``apply_instance`` records them), in a handful of statements."""
    now = timezone.now()
    with transaction.atomic():
        rows = [
            Instance(
                namespace=namespace, name=obj["metadata"]["name"], **_instance_fields(obj, now)
            )
            for obj in objects
        ]
        dbcopy.insert(Instance, rows)
        if any(row.pk is None for row in rows):  # a backend that returns no keys
            by_name = dict(
                Instance.objects.filter(
                    namespace=namespace, name__in=[row.name for row in rows]
                ).values_list("name", "pk")
            )
            for row in rows:
                row.pk = by_name[row.name]
        slots, events = [], []
        for row in rows:
            for view in slot_views(row.name, row.capacity, row.device_usage):
                value = view.usage.raw
                slots.append(
                    dict(
                        instance_id=row.pk,
                        key=view.key,
                        value=value,
                        since=now if value else None,
                        **_slot_fields(view),
                    )
                )
                if value:
                    fields = _event_fields(
                        row, view.key, "", value, None, row.resource_version, now
                    )
                    run = fields.pop("run")
                    events.append(fields | {"run_id": run.pk if run is not None else None})
        dbcopy.insert_rows(Slot, slots)
        dbcopy.insert_rows(SlotEvent, events)


def replace_all_configurations(namespace: str, objects: list[dict[str, Any]]) -> None:
    names = {obj["metadata"]["name"] for obj in objects}
    Configuration.objects.filter(namespace=namespace).exclude(name__in=names).delete()
    for obj in objects:
        apply_configuration(obj)
