"""Watched objects into the queue-charge cache rows. Each ``apply_*`` is idempotent and
returns the claim keys (``agent.charges.facts.claim_key``) whose charge the change may move,
or ``None`` when every charge may move (a queue object, a device class)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from agent import dbcopy
from agent.charges.facts import AKRI, DRA, claim_key
from agent.models import Slot
from agent.queues.kinds import DEVICE_CLASSES, RESOURCE_CLAIMS, Watched
from agent.queues.models import DeviceClass, InstanceLabels, QueueObject, QueuePod, ResourceClaim

AKRI_PREFIX = "akri.sh/"
Keys = set[str] | None


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


# --- ResourceClaims and DeviceClasses ------------------------------------------------------
def claim_fields(obj: dict[str, Any]) -> dict[str, Any]:
    meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
    classes = []
    for request in (spec.get("devices") or {}).get("requests") or []:
        exactly = request.get("exactly") or {}
        names = [exactly.get("deviceClassName")] if exactly else []
        names += [sub.get("deviceClassName") for sub in request.get("firstAvailable") or []]
        classes += [n for n in names if n and n not in classes]
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    reserved = [
        {"resource": r.get("resource", ""), "name": r.get("name", ""), "uid": r.get("uid", "")}
        for r in status.get("reservedFor") or []
    ]
    return {
        "uid": meta.get("uid", ""),
        "resource_version": meta.get("resourceVersion", ""),
        "labels": meta.get("labels") or {},
        "device_classes": classes,
        "allocated": len(results),
        "reserved_for": reserved,
        "created": meta.get("creationTimestamp") or "",
    }


def apply_claim(kind: str, obj: dict[str, Any]) -> Keys:
    meta = _meta(obj)
    namespace, name = meta.get("namespace", ""), meta["name"]
    if kind == "DELETED":
        ResourceClaim.objects.filter(namespace=namespace, name=name).delete()
    else:
        ResourceClaim.objects.update_or_create(
            namespace=namespace, name=name, defaults=claim_fields(obj)
        )
    return {claim_key(DRA, namespace, name)}


def replace_claims(items: list[dict[str, Any]]) -> Keys:
    with transaction.atomic():
        ResourceClaim.objects.all().delete()
        ResourceClaim.objects.bulk_create(
            ResourceClaim(
                namespace=_meta(o).get("namespace", ""), name=_meta(o)["name"], **claim_fields(o)
            )
            for o in items
        )
    return None


def apply_device_class(kind: str, obj: dict[str, Any]) -> Keys:
    meta = _meta(obj)
    if kind == "DELETED":
        DeviceClass.objects.filter(name=meta["name"]).delete()
    else:
        DeviceClass.objects.update_or_create(
            name=meta["name"],
            defaults={
                "labels": meta.get("labels") or {},
                "annotations": meta.get("annotations") or {},
            },
        )
    return None


def replace_device_classes(items: list[dict[str, Any]]) -> Keys:
    with transaction.atomic():
        DeviceClass.objects.all().delete()
        for obj in items:
            apply_device_class("ADDED", obj)
    return None


# --- queue systems -------------------------------------------------------------------------
def queue_fields(watched: Watched, obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    return {
        "target": str(spec.get(watched.target) or "") if watched.target else "",
        "annotations": _meta(obj).get("annotations") or {},
        "labels": _meta(obj).get("labels") or {},
    }


def apply_queue_object(watched: Watched, kind: str, obj: dict[str, Any]) -> Keys:
    meta = _meta(obj)
    key = {"kind": watched.kind, "namespace": meta.get("namespace", ""), "name": meta["name"]}
    if kind == "DELETED":
        QueueObject.objects.filter(**key).delete()
    else:
        QueueObject.objects.update_or_create(**key, defaults=queue_fields(watched, obj))
    return None


def replace_queue_objects(watched: Watched, items: list[dict[str, Any]]) -> Keys:
    with transaction.atomic():
        QueueObject.objects.filter(kind=watched.kind).delete()
        QueueObject.objects.bulk_create(
            QueueObject(
                kind=watched.kind,
                namespace=_meta(o).get("namespace", ""),
                name=_meta(o)["name"],
                **queue_fields(watched, o),
            )
            for o in items
        )
    return None


def forget_kind(watched: Watched) -> None:
    """The kind's CRD (or API group) is gone: so are its objects."""
    if watched is RESOURCE_CLAIMS:
        ResourceClaim.objects.all().delete()
    elif watched is DEVICE_CLASSES:
        DeviceClass.objects.all().delete()
    else:
        QueueObject.objects.filter(kind=watched.kind).delete()


# --- pods ----------------------------------------------------------------------------------
def pod_claims(obj: dict[str, Any]) -> list[str]:
    """Names of the ResourceClaims a pod uses: named ones, and generated ones once known."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    names = [c.get("resourceClaimName") for c in spec.get("resourceClaims") or []]
    names += [c.get("resourceClaimName") for c in status.get("resourceClaimStatuses") or []]
    return sorted({n for n in names if n})


def uses_devices(obj: dict[str, Any]) -> bool:
    spec = obj.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for name in {**(resources.get("requests") or {}), **(resources.get("limits") or {})}:
            if name.startswith(AKRI_PREFIX):
                return True
    return False


def pod_fields(obj: dict[str, Any]) -> dict[str, Any]:
    meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
    priority = spec.get("priority")
    return {
        "uid": meta.get("uid", ""),
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "priority": priority if isinstance(priority, int) else None,
        "created": str(meta.get("creationTimestamp") or ""),
        "node_name": spec.get("nodeName") or "",
        "phase": status.get("phase") or "",
        "claims": pod_claims(obj),
        "owners": owner_uids(meta),
        "deleting": bool(meta.get("deletionTimestamp")),
    }


def owner_uids(meta: dict[str, Any]) -> list[str]:
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return []
    return [str(r["uid"]) for r in refs if isinstance(r, dict) and r.get("uid")]


def claims_of_pod(namespace: str, name: str, uid: str, claims: list[str]) -> set[str]:
    keys = {claim_key(DRA, namespace, c) for c in claims}
    held = Slot.objects.filter(pod_namespace=namespace, pod_name=name)
    for ns, instance in held.values_list("instance__namespace", "instance__name"):
        keys.add(claim_key(AKRI, ns, instance))
    return keys


def apply_pod(kind: str, obj: dict[str, Any]) -> Keys:
    meta = _meta(obj)
    namespace, name = meta.get("namespace", ""), meta["name"]
    if kind == "DELETED" or not uses_devices(obj):
        old = QueuePod.objects.filter(namespace=namespace, name=name).first()
        if old is None:
            return set()
        old.delete()
        return claims_of_pod(namespace, name, old.uid, old.claims)
    fields = pod_fields(obj)
    QueuePod.objects.update_or_create(namespace=namespace, name=name, defaults=fields)
    return claims_of_pod(namespace, name, fields["uid"], fields["claims"])


def replace_pods(items: list[dict[str, Any]]) -> Keys:
    return replace_pod_rows(pod_rows(items))


PodRows = dict[tuple[str, str], dict[str, Any]]
# What ``pod_fields`` gives, the columns a relist compares.
POD_COLUMNS = [
    "uid", "labels", "annotations", "priority", "created", "node_name", "phase", "claims",
    "owners", "deleting",
]  # fmt: skip


def pod_rows(items: list[dict[str, Any]]) -> PodRows:
    """The columns of the pods in ``items`` that use devices, by (namespace, name): a relist
    keeps these few, not the pods (and no unsaved model per pod: 40,000 of them were a second
    copy of the controller's pod relist)."""
    return {
        (_meta(o).get("namespace", ""), _meta(o)["name"]): pod_fields(o)
        for o in items
        if uses_devices(o)
    }


def replace_pod_rows(wanted: PodRows) -> Keys:
    """The pod rows become ``wanted``, writing only the rows that differ: every start of the
    controller relists every pod, and on a warm database nearly all are as the cache has them."""
    wanted = dict(wanted)
    columns = POD_COLUMNS
    gone, changed = [], []
    with transaction.atomic():
        rows = QueuePod.objects.values_list("pk", "namespace", "name", *columns)
        for pk, namespace, name, *values in rows.iterator(500):
            fields = wanted.pop((namespace, name), None)
            if fields is None:
                gone.append(pk)
            elif any(fields[k] != v for k, v in zip(columns, values, strict=True)):
                changed.append(QueuePod(pk=pk, namespace=namespace, name=name, **fields))
        for i in range(0, len(gone), 500):
            QueuePod.objects.filter(pk__in=gone[i : i + 500]).delete()
        QueuePod.objects.bulk_update(changed, columns, batch_size=500)
        new = [{"namespace": ns, "name": name, **f} for (ns, name), f in wanted.items()]
        dbcopy.insert_rows(QueuePod, new)
    return None


# --- Instances -----------------------------------------------------------------------------
def store_instance_labels(changes: dict[tuple[str, str], dict[str, str] | None]) -> None:
    """Instances' labels as last seen (None: deleted). Only labelled Instances keep a row."""
    keep = {key: labels for key, labels in changes.items() if labels}
    gone: dict[str, list[str]] = {}
    for (namespace, name), labels in changes.items():
        if not labels:
            gone.setdefault(namespace, []).append(name)
    with transaction.atomic():
        for namespace, names in gone.items():
            for i in range(0, len(names), 500):
                InstanceLabels.objects.filter(
                    namespace=namespace, name__in=names[i : i + 500]
                ).delete()
        for (namespace, name), labels in keep.items():
            InstanceLabels.objects.update_or_create(
                namespace=namespace, name=name, defaults={"labels": labels}
            )
