"""Recompute queue charges from the cache, write owner labels, keep the charge history.

``recompute(keys)`` decides the named claims (all of them when ``keys`` is None) with the
rules of ``agent.charges``, writes the changed ``Charge`` rows, and, for a first bind, writes
the owner label to the API server create-only (``owner_label_patch``). A write that loses the
race (422: the label or the map changed) re-reads the object and adopts what is there, so
every replica and every restart ends on the one label the API server holds. ``sample()``
records one ``ChargeSample`` row per queue and resource for the current interval.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from kubernetes import client
from kubernetes.client.rest import ApiException

from agent.charges.admission import owner_label_patch
from agent.charges.facts import AKRI, DRA, ClaimFacts, PodFacts, QueueWorld, Settings
from agent.charges.owner import ClaimCharge, decide, totals
from agent.kube.client import GROUP, INSTANCES, JSON_PATCH, VERSION
from agent.models import Instance, Slot
from agent.queues.kinds import RESOURCE_CLAIMS
from agent.queues.models import (
    Charge,
    ChargeSample,
    DeviceClass,
    InstanceLabels,
    QueueObject,
    QueuePod,
    Refusal,
    ResourceClaim,
)

log = logging.getLogger(__name__)
OPT_OUT_ANNOTATION = "akri-site.io/opt-out"
ACCOUNTED_ANNOTATION = "akri-site.io/accounted"
K = QueueObject.Kind
POD_FIELDS = ("namespace", "name", "uid", "labels", "annotations", "priority", "created")


def rules() -> Settings:
    conf = settings.AKRI_QUEUES
    return Settings(
        label_key=conf["LABEL_KEY"],
        resolvers=tuple(conf["RESOLVERS"]),
        orphans=conf["ORPHANS"],
        accounted_classes=frozenset(conf["ACCOUNTED_CLASSES"]),
        accounted_configurations=frozenset(conf["ACCOUNTED_CONFIGURATIONS"]),
    )


def world() -> QueueWorld:
    """The queue systems as the cache holds them (None for a system whose CRD is absent)."""
    from agent.queues.models import QueueSystem

    present = set(QueueSystem.objects.filter(present=True).values_list("kind", flat=True))
    by_kind: dict[str, list[tuple[str, str, str, dict]]] = defaultdict(list)
    for row in QueueObject.objects.values_list(
        "kind", "namespace", "name", "target", "annotations"
    ):
        by_kind[row[0]].append(row[1:])

    def names(kind: str) -> frozenset[str] | None:
        return frozenset(n for _, n, _, _ in by_kind[kind]) if kind in present else None

    def targets(kind: str) -> dict[tuple[str, str], str]:
        return {(ns, n): t for ns, n, t, _ in by_kind[kind] if t}

    opted = set(settings.AKRI_QUEUES["OPT_OUT"])
    for kind in (K.KAI_QUEUE, K.KUEUE_CLUSTER_QUEUE, K.VOLCANO_QUEUE):
        for _, name, _, notes in by_kind[kind]:
            value = str((notes or {}).get(OPT_OUT_ANNOTATION, "")).lower()
            if value == "true":
                opted.add(name)
            elif value == "false":
                opted.discard(name)
    return QueueWorld(
        kai_queues=names(K.KAI_QUEUE),
        kai_podgroups=targets(K.KAI_PODGROUP),
        kueue_cluster_queues=names(K.KUEUE_CLUSTER_QUEUE),
        kueue_local_queues=targets(K.KUEUE_LOCAL_QUEUE) if K.KUEUE_LOCAL_QUEUE in present else None,
        volcano_queues=names(K.VOLCANO_QUEUE),
        volcano_podgroups=targets(K.VOLCANO_PODGROUP),
        opted_out=frozenset(opted),
        default_queue=settings.AKRI_QUEUES["DEFAULT_QUEUE"],
    )


def _pod(row: dict[str, Any]) -> PodFacts:
    return PodFacts(
        row["namespace"],
        row["name"],
        row["uid"],
        row["labels"] or {},
        row["annotations"] or {},
        row["priority"],
        row["created"],
    )


def class_accounted(the_rules: Settings) -> dict[str, bool]:
    """Device classes whose annotation overrides the accounted list."""
    out = {}
    for name, notes in DeviceClass.objects.values_list("name", "annotations"):
        value = str((notes or {}).get(ACCOUNTED_ANNOTATION, "")).lower()
        if value in ("true", "false"):
            out[name] = value == "true"
    return out


def _accounted(the_rules: Settings, classes: list[str], overrides: dict[str, bool]) -> bool:
    return all(overrides.get(c, the_rules.accounts(DRA, c)) for c in classes)


def gather(keys: Iterable[str] | None, the_rules: Settings) -> list[ClaimFacts]:
    wanted = None if keys is None else set(keys)
    dra, akri = _split(wanted)
    # A full pass reads every pod once; a narrow one only the pods its claims name.
    pods = None if wanted is not None else _all_pods()
    return _dra_facts(dra, the_rules, pods) + _akri_facts(akri, the_rules, pods)


def _all_pods() -> tuple[dict[str, PodFacts], dict[tuple[str, str], PodFacts]]:
    by_uid, by_name = {}, {}
    for row in QueuePod.objects.values_list(*POD_FIELDS):
        pod = PodFacts(*row[:3], row[3] or {}, row[4] or {}, row[5], row[6])
        by_uid[pod.uid] = by_name[(pod.namespace, pod.name)] = pod
    return by_uid, by_name


def _split(wanted: set[str] | None) -> tuple[Any, Any]:
    if wanted is None:
        return None, None
    dra, akri = [], []
    for key in wanted:
        kind, _, rest = key.partition(":")
        namespace, _, name = rest.partition("/")
        (dra if kind == DRA else akri).append((namespace, name))
    return dra, akri


CHUNK = 500


def _by_pairs(qs, pairs, **extra) -> list:
    """``qs`` narrowed to (namespace, name) pairs, as querysets of ``name IN`` per namespace in
    bounded chunks: an OR of a burst's thousand pairs goes past SQLite's expression depth and
    grows badly on PostgreSQL."""
    if pairs is None:
        return [qs]
    names: dict[str, list[str]] = defaultdict(list)
    for namespace, name in pairs:
        names[namespace].append(name)
    return [
        qs.filter(namespace=namespace, name__in=chosen[i : i + CHUNK], **extra)
        for namespace, chosen in names.items()
        for i in range(0, len(chosen), CHUNK)
    ]


def _values(querysets: list, *fields: str) -> list[tuple]:
    return [row for qs in querysets for row in qs.values_list(*fields)]


def _dra_facts(pairs, the_rules: Settings, every_pod) -> list[ClaimFacts]:
    rows = _values(
        _by_pairs(ResourceClaim.objects.all(), pairs),
        "namespace",
        "name",
        "labels",
        "device_classes",
        "allocated",
        "reserved_for",
    )
    uids = {r["uid"] for row in rows for r in row[5] if r.get("resource") == "pods"}
    pods = every_pod[0] if every_pod is not None else _pods_by_uid(uids)
    overrides = class_accounted(the_rules)
    out = []
    for namespace, name, labels, classes, allocated, reserved in rows:
        users, unknown = [], []
        for entry in reserved:
            if entry.get("resource") != "pods":
                unknown.append(f"{entry.get('resource')} {entry.get('name')} (not a pod)")
            elif entry.get("uid") in pods:
                users.append(pods[entry["uid"]])
            else:
                unknown.append(f"pod {namespace}/{entry.get('name')}")
        out.append(
            ClaimFacts(
                DRA,
                namespace,
                name,
                "+".join(classes) or "(no device class)",
                allocated,
                labels or {},
                tuple(users),
                _accounted(the_rules, classes, overrides),
                tuple(unknown),
            )
        )
    return out


def _pods_by_uid(uids: set[str]) -> dict[str, PodFacts]:
    qs = QueuePod.objects.filter(uid__in=uids)
    return {row["uid"]: _pod(row) for row in qs.values(*POD_FIELDS)}


def _pods_by_name(names: set[tuple[str, str]]) -> dict[tuple[str, str], PodFacts]:
    return {
        (row[0], row[1]): PodFacts(*row[:3], row[3] or {}, row[4] or {}, row[5], row[6])
        for row in _values(_by_pairs(QueuePod.objects.all(), names), *POD_FIELDS)
    }


def _akri_facts(pairs, the_rules: Settings, every_pod) -> list[ClaimFacts]:
    rows = _values(
        _by_pairs(Instance.objects.all(), pairs), "id", "namespace", "name", "configuration_name"
    )
    ids = {row[0] for row in rows}
    slots: dict[int, list[tuple]] = defaultdict(list)
    held = Slot.objects.exclude(value="").order_by("since", "index")
    if pairs is not None:
        held = held.filter(instance_id__in=ids)
    for slot in held.values_list(
        "instance_id", "key", "holder_node", "pod_namespace", "pod_name", "pod_uid"
    ):
        slots[slot[0]].append(slot[1:])
    names = {(s[2], s[3]) for rows_ in slots.values() for s in rows_ if s[3]}
    pods = every_pod[1] if every_pod is not None else _pods_by_name(names)
    labels = _instance_labels(pairs)
    return [_akri_claim(row, slots.get(row[0], []), pods, labels, the_rules) for row in rows]


def _instance_labels(pairs) -> dict[tuple[str, str], dict]:
    rows = _values(_by_pairs(InstanceLabels.objects.all(), pairs), "namespace", "name", "labels")
    return {(ns, n): labels for ns, n, labels in rows}


def _akri_claim(row, slots, pods, labels, the_rules: Settings) -> ClaimFacts:
    _, namespace, name, configuration = row
    users, seen, unknown = [], set(), []
    for key, node, pod_ns, pod_name, pod_uid in slots:
        pod = pods.get((pod_ns, pod_name)) if pod_name else None
        if pod is None or (pod_uid and pod.uid and pod_uid != pod.uid):
            unknown.append(f"slot {key} held by {node or 'a holder'}")
        elif pod.key not in seen:
            seen.add(pod.key)
            users.append(pod)
    return ClaimFacts(
        AKRI,
        namespace,
        name,
        configuration,
        1 if slots else 0,
        labels.get((namespace, name)) or {},
        tuple(users),
        the_rules.accounts(AKRI, configuration),
        tuple(unknown),
    )


# --- persisting ------------------------------------------------------------------------------
CHARGE_FIELDS = (
    "resource",
    "amount",
    "accounted",
    "owner",
    "source",
    "charged",
    "uncharged",
    "users",
    "queues",
    "problems",
    "why",
)


def _row_values(charge: ClaimCharge) -> dict[str, Any]:
    return {
        "resource": charge.resource,
        "amount": charge.amount,
        "accounted": charge.accounted,
        "owner": charge.owner or "",
        "source": charge.source,
        "charged": charge.charged,
        "uncharged": charge.uncharged,
        "users": [
            {"pod": u.pod, "uid": u.uid, "queue": u.queue or "", "why": u.why} for u in charge.users
        ],
        "queues": sorted(charge.queues),
        "problems": list(charge.problems),
        "why": charge.why,
    }


def store(charges: dict[str, ClaimCharge], *, full: bool) -> int:
    """Write changed Charge rows (and drop rows of vanished claims on a full pass); how many."""
    wanted = {(c.kind, c.namespace, c.name): _row_values(c) for c in charges.values()}
    existing = Charge.objects.all()
    if not full:
        existing = existing.filter(pk__in=_pks(wanted))
    rows = {
        (kind, namespace, name): (pk, digest)
        for pk, kind, namespace, name, digest in existing.values_list(
            "pk", "kind", "namespace", "name", "digest"
        )
    }
    create, update = [], []
    now = timezone.now()
    for key, values in wanted.items():
        found = rows.pop(key, None)
        values["digest"] = _digest(values)
        if found is None:
            create.append(Charge(kind=key[0], namespace=key[1], name=key[2], **values))
        elif found[1] != values["digest"]:
            update.append(Charge(pk=found[0], updated_at=now, **values))
    with transaction.atomic():
        Charge.objects.bulk_create(create, batch_size=500)
        Charge.objects.bulk_update(update, [*CHARGE_FIELDS, "digest", "updated_at"], batch_size=500)
        if full and rows:
            Charge.objects.filter(pk__in=[pk for pk, _ in rows.values()]).delete()
    return len(create) + len(update) + (len(rows) if full else 0)


def _digest(values: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(values, sort_keys=True).encode(), digest_size=16).hexdigest()


def _pks(wanted: dict[tuple[str, str, str], Any]) -> list[int]:
    by_kind: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for kind, namespace, name in wanted:
        by_kind[kind].add((namespace, name))
    return [
        pk
        for kind, pairs in by_kind.items()
        for qs in _by_pairs(Charge.objects.all(), pairs, kind=kind)
        for pk in qs.values_list("pk", flat=True)
    ]


def drop_vanished(keys: Iterable[str], decided: dict[str, ClaimCharge]) -> None:
    """Named claims the cache no longer has: their charge rows go."""
    for key in keys:
        if key in decided:
            continue
        kind, _, rest = key.partition(":")
        namespace, _, name = rest.partition("/")
        Charge.objects.filter(kind=kind, namespace=namespace, name=name).delete()


@dataclass
class Outcome:
    decided: int = 0
    written: int = 0
    labels_written: int = 0
    labels_adopted: int = 0
    label_errors: list[str] = field(default_factory=list)


def recompute(
    keys: Iterable[str] | None = None, *, api_client: client.ApiClient | None = None
) -> Outcome:
    """Decide the claims named by ``keys`` (all when None), write labels, store the rows."""
    keys = None if keys is None else list(keys)
    the_rules, the_world = rules(), world()
    claims = gather(keys, the_rules)
    decided = {c.key: decide(c, the_world, the_rules) for c in claims}
    outcome = Outcome(decided=len(decided))
    if api_client is not None:
        by_key = {c.key: c for c in claims}
        for key, charge in list(decided.items()):
            if charge.write_label:
                decided[key] = _write_label(
                    api_client, by_key[key], charge, the_world, the_rules, outcome
                )
    if keys is not None:
        drop_vanished(keys, decided)
    outcome.written = store(decided, full=keys is None)
    return outcome


# --- the owner label -------------------------------------------------------------------------
def _write_label(
    api_client: client.ApiClient,
    claim: ClaimFacts,
    charge: ClaimCharge,
    the_world: QueueWorld,
    the_rules: Settings,
    outcome: Outcome,
) -> ClaimCharge:
    target = LabelTarget(api_client, claim)
    try:
        current = target.read()
        labels = (current.get("metadata") or {}).get("labels") or {}
        if the_rules.label_key not in labels:
            rv = current["metadata"].get("resourceVersion", "")
            ops = owner_label_patch(labels, rv, the_rules.label_key, charge.write_label)
            try:
                current = target.patch(ops)
                outcome.labels_written += 1
            except ApiException as exc:
                if exc.status != 422:
                    raise
                current = target.read()  # lost the race: adopt what is there now
                outcome.labels_adopted += 1
    except ApiException as exc:
        outcome.label_errors.append(f"{claim.key}: {exc.status} {exc.reason}")
        log.warning("queues: owner label of %s not written (%s)", claim.key, exc.status)
        return charge
    labels = (current.get("metadata") or {}).get("labels") or {}
    target.remember(labels)
    fresh = ClaimFacts(**{**claim.__dict__, "labels": labels})
    return decide(fresh, the_world, the_rules)


class LabelTarget:
    """The API object behind a claim: an Instance or a ResourceClaim, as plain dicts."""

    def __init__(self, api_client: client.ApiClient, claim: ClaimFacts) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.claim = claim
        if claim.kind == DRA:
            self.path = (RESOURCE_CLAIMS.group, RESOURCE_CLAIMS.version, claim.namespace)
            self.plural = RESOURCE_CLAIMS.plural
        else:
            self.path = (GROUP, VERSION, claim.namespace)
            self.plural = INSTANCES

    def read(self) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(*self.path, self.plural, self.claim.name)

    def patch(self, ops: list[dict]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(
            *self.path, self.plural, self.claim.name, ops, _content_type=JSON_PATCH
        )

    def remember(self, labels: dict[str, str]) -> None:
        """Ahead of the watch, so that the next recompute does not try the write again."""
        c = self.claim
        if c.kind == DRA:
            ResourceClaim.objects.filter(namespace=c.namespace, name=c.name).update(labels=labels)
        else:
            InstanceLabels.objects.update_or_create(
                namespace=c.namespace, name=c.name, defaults={"labels": labels}
            )


# --- history ---------------------------------------------------------------------------------
def interval_start(now: datetime, seconds: float) -> datetime:
    epoch = now.timestamp()
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=now.tzinfo)


def sample(now: datetime | None = None) -> int:
    """Record this interval's charges: one row per queue and resource (queue "" = uncharged)."""
    seconds = float(settings.AKRI_QUEUES["SAMPLE_SECONDS"])
    at = interval_start(now or timezone.now(), seconds)
    rows = {}
    for row in queue_totals().values():
        for resource, charged in row["charged"].items() or [("", 0)]:
            rows[(row["queue"], resource)] = {
                "charged": charged,
                "owned": row["owned"],
                "uses_of_others": row["uses_of_others"],
                "used_by_others": row["used_by_others"],
            }
    for resource, uncharged in uncharged_by_resource().items():
        rows[("", resource)] = {"charged": uncharged}
    with transaction.atomic():
        ChargeSample.objects.filter(at=at).delete()
        ChargeSample.objects.bulk_create(
            ChargeSample(at=at, queue=q, resource=r, **values) for (q, r), values in rows.items()
        )
    return len(rows)


def current_charges() -> list[ClaimCharge]:
    """The stored decisions, as the domain's objects (for totals)."""
    from agent.charges.owner import UserView

    out = []
    for row in Charge.objects.all():
        out.append(
            ClaimCharge(
                key=f"{row.kind}:{row.namespace}/{row.name}",
                kind=row.kind,
                namespace=row.namespace,
                name=row.name,
                resource=row.resource,
                amount=row.amount,
                accounted=row.accounted,
                owner=row.owner or None,
                source=row.source,
                charged=row.charged,
                uncharged=row.uncharged,
                users=tuple(
                    UserView(u["pod"], u.get("uid", ""), u.get("queue") or None, u.get("why", ""))
                    for u in row.users
                ),
                problems=tuple(row.problems),
                why=row.why,
            )
        )
    return out


def queue_totals() -> dict[str, dict[str, Any]]:
    """Per queue: charged devices per resource, claims owned, used of others, lent, orphans."""
    out = {}
    for queue, row in sorted(totals(current_charges()).items()):
        out[queue] = {
            "queue": queue,
            "charged": dict(sorted(row.charged.items())),
            "total": row.total,
            "owned": row.owned,
            "uses_of_others": row.uses_of_others,
            "used_by_others": row.used_by_others,
            "orphans": row.orphans,
        }
    return out


def uncharged_by_resource() -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for resource, uncharged in Charge.objects.filter(uncharged__gt=0).values_list(
        "resource", "uncharged"
    ):
        out[resource] += uncharged
    return dict(out)


def prune_samples(now: datetime | None = None) -> int:
    """Drop samples past ``AKRI_QUEUE_HISTORY_HOURS``, in batches (as ``agent.retention``)."""
    hours = float(settings.AKRI_QUEUES["HISTORY_HOURS"])
    cutoff = (now or timezone.now()) - timedelta(hours=hours)
    deleted = 0
    for model in (ChargeSample, Refusal):
        while True:
            batch = list(model.objects.filter(at__lt=cutoff).values_list("pk", flat=True)[:500])
            if not batch:
                break
            deleted += model.objects.filter(pk__in=batch).delete()[0]
    return deleted
