"""Applying what the API server says to the ORM cache, and recording slot history.

Two paths write here: watches (``apply_instance`` with nothing to attribute, so a slot change
is recorded as observed and its cause inferred from the values) and our own successful writes
(the claim store passes the cause, actor and pod it knows). Both are idempotent: applying the
same object twice changes nothing and records nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agent.domain.configspec import InvalidConfiguration, parse_configuration
from agent.domain.slots import UsageKind, parse_usage, slot_views
from agent.models import Configuration, Instance, ReconcileRun, Slot, SlotEvent

log = logging.getLogger(__name__)

_LEVEL = {
    UsageKind.FREE: Slot.Level.FREE,
    UsageKind.NODE: Slot.Level.IL,
    UsageKind.CONFIG: Slot.Level.CL,
    UsageKind.FOREIGN: Slot.Level.FOREIGN,
}


@dataclass(frozen=True)
class Attribution:
    """Who changed a slot and why, when the writer knows it."""

    cause: str
    actor: str
    node: str = ""
    pod: str = ""
    detail: str = ""
    run: ReconcileRun | None = None


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
    attributions: dict[str, Attribution] | None = None,
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
    with transaction.atomic():
        row = Instance.objects.filter(namespace=namespace, name=name).first()
        if row is not None and direct and _not_newer(rv, row.resource_version):
            # The watch got here first (or further): waiting for an echo that has passed
            # would make it skip newer events, and applying would step back.
            return row, False
        if row is not None and not (direct or relist) and row.pending_rv:
            if rv == row.pending_rv:
                Instance.objects.filter(pk=row.pk).update(pending_rv="", pending_at=None)
                row.pending_rv = ""
                return row, False
            age = (now - row.pending_at).total_seconds() if row.pending_at else PENDING_ECHO_SECONDS
            if age < PENDING_ECHO_SECONDS:
                return row, False
        if row is None:
            row = Instance(namespace=namespace, name=name)
        row.uid = meta.get("uid", "")
        row.resource_version = rv
        row.configuration_name = spec.get("configurationName", "")
        row.cdi_name = spec.get("cdiName", "")
        row.capacity = _as_capacity(spec.get("capacity"))
        row.shared = bool(spec.get("shared", False))
        row.nodes = list(spec.get("nodes") or [])
        row.broker_properties = dict(spec.get("brokerProperties") or {})
        row.device_usage = dict(usage)
        row.deleting = bool(meta.get("deletionTimestamp"))
        row.created_at = _created(meta)
        row.pending_rv = rv if direct else ""
        row.pending_at = now if direct else None
        row.save()
        _apply_slots(row, usage, attributions or {}, rv, now)
    return row, True


def _not_newer(rv: str, current: str) -> bool:
    """``rv`` is ``current`` or, when both are integers (etcd's and the simulator's are),
    older. Otherwise resourceVersions are opaque and nothing can be said."""
    if not rv or not current:
        return False
    return rv == current or (rv.isdigit() and current.isdigit() and int(rv) < int(current))


def _as_capacity(value: Any) -> int:
    # Akri allows 0; a malformed value must not crash the sync: treat it as no slots.
    return value if isinstance(value, int) and value >= 0 else 0


def _apply_slots(
    row: Instance,
    usage: dict[str, Any],
    attributions: dict[str, Attribution],
    rv: str,
    now: datetime,
) -> None:
    existing = {slot.key: slot for slot in row.slots.all()}
    seen: set[str] = set()
    for view in slot_views(row.name, row.capacity, usage):
        seen.add(view.key)
        value = view.usage.raw
        slot = existing.get(view.key)
        if slot is None:
            slot = Slot(instance=row, key=view.key, index=view.index, value="")
            before = None
        else:
            before = slot.value
        changed = before != value
        fields = {
            "index": view.index,
            "surplus": view.surplus,
            "level": _LEVEL[view.usage.kind],
            "holder_node": view.usage.node,
            "vdev": view.usage.vdev,
        }
        if changed:
            fields.update(value=value, since=now if value else None)
            fields.update(pod_namespace="", pod_name="", pod_uid="", container="")
        if slot.pk is None or any(getattr(slot, k) != v for k, v in fields.items()):
            for k, v in fields.items():
                setattr(slot, k, v)
            slot.save()
        if changed and (before is not None or value):
            record_change(
                row, view.key, before or "", value, attributions.get(view.key), rv=rv, at=now
            )
    gone = [key for key in existing if key not in seen]
    if gone:
        row.slots.filter(key__in=gone).delete()


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
    if attribution is None:
        attribution = _infer(before, after)
    return SlotEvent.objects.create(
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
        run=attribution.run,
    )


def _infer(before: str, after: str) -> Attribution:
    """Attribute a change seen only through a watch, from the values themselves."""
    old, new = parse_usage(before), parse_usage(after)
    if new.kind in (UsageKind.NODE, UsageKind.CONFIG) and old.kind is UsageKind.FREE:
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


def remove_instance(namespace: str, name: str) -> None:
    """The Instance is gone: its slots go with it (history stays)."""
    Instance.objects.filter(namespace=namespace, name=name).delete()


def replace_all_instances(namespace: str, objects: list[dict[str, Any]]) -> None:
    """After a relist: apply every listed Instance and drop those the list no longer has."""
    names = set()
    for obj in objects:
        apply_instance(obj, relist=True)
        names.add(obj["metadata"]["name"])
    Instance.objects.filter(namespace=namespace).exclude(name__in=names).delete()


def replace_all_configurations(namespace: str, objects: list[dict[str, Any]]) -> None:
    names = set()
    for obj in objects:
        apply_configuration(obj)
        names.add(obj["metadata"]["name"])
    Configuration.objects.filter(namespace=namespace).exclude(name__in=names).delete()
