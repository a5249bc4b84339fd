"""The cache as the charge rules' facts: settings, the queue systems, claims and their pods.

``gather(keys)`` reads the named claims (every claim when ``keys`` is None) with their users in
bind order: a DRA claim's ``status.reservedFor``, an Instance's held slots by claim time with
the pods the agents' slot-to-pod map names. A full pass reads every pod once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db.models import Q

from agent.charges.facts import AKRI, DRA, ClaimFacts, PodFacts, QueueWorld, Settings
from agent.charges.topowner import from_podgroup
from agent.models import Instance, Slot
from agent.queues.models import (
    DeviceClass,
    InstanceLabels,
    QueueObject,
    QueuePod,
    QueueSystem,
    ResourceClaim,
)

OPT_OUT_ANNOTATION = "akri-site.io/opt-out"
ACCOUNTED_ANNOTATION = "akri-site.io/accounted"
K = QueueObject.Kind
POD_FIELDS = (
    "namespace",
    "name",
    "uid",
    "labels",
    "annotations",
    "priority",
    "created",
    "owners",
)


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

    present = set(QueueSystem.objects.filter(present=True).values_list("kind", flat=True))
    by_kind: dict[str, list[tuple[str, str, str, dict]]] = defaultdict(list)
    by_podgroup, by_uid = {}, {}
    for row in QueueObject.objects.values_list(
        "kind", "namespace", "name", "target", "annotations", "labels"
    ):
        by_kind[row[0]].append(row[1:5])
        if row[0] == K.KAI_PODGROUP:
            owner = from_podgroup(row[5] or {}, row[4] or {})
            if owner is not None:
                by_podgroup[(row[1], row[2])] = owner
                if owner.uid:
                    by_uid[owner.uid] = owner

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
        kai_top_owners_by_podgroup=by_podgroup,
        kai_top_owners_by_uid=by_uid,
        labels_alone=settings.AKRI_QUEUES["LABELS_ALONE"],
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
        owner_uids=tuple(row["owners"] or ()),
    )


def _pod_row(row: tuple) -> PodFacts:
    """A pod from ``values_list(*POD_FIELDS)``."""
    return PodFacts(
        *row[:3], row[3] or {}, row[4] or {}, row[5], row[6], owner_uids=tuple(row[7] or ())
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
        pod = _pod_row(row)
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


def by_pairs(qs, pairs, **extra) -> list:
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
        by_pairs(ResourceClaim.objects.all(), pairs),
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
        (row[0], row[1]): _pod_row(row)
        for row in _values(by_pairs(QueuePod.objects.all(), names), *POD_FIELDS)
    }


def _akri_facts(pairs, the_rules: Settings, every_pod) -> list[ClaimFacts]:
    held = Slot.objects.exclude(value="").order_by("since", "index")
    if pairs is not None:
        ids = {row[0] for row in _values(by_pairs(Instance.objects.all(), pairs), "id")}
        held = held.filter(instance_id__in=ids)
    slots: dict[int, list[tuple]] = defaultdict(list)
    for slot in held.values_list(
        "instance_id", "key", "holder_node", "pod_namespace", "pod_name", "pod_uid"
    ):
        slots[slot[0]].append(slot[1:])
    labels = _instance_labels(pairs)
    # An Instance that holds nothing and names no owner has nothing to charge or show: only
    # the others are read (a large cluster's free Instances stay out of every pass).
    in_use = Slot.objects.exclude(value="").values("instance_id")
    if pairs is not None:
        in_use = in_use.filter(instance_id__in=ids)
    wanted = Instance.objects.filter(Q(pk__in=in_use) | _named(labels))
    rows = wanted.values_list("id", "namespace", "name", "configuration_name")
    names = {(s[2], s[3]) for rows_ in slots.values() for s in rows_ if s[3]}
    pods = every_pod[1] if every_pod is not None else _pods_by_name(names)
    return [_akri_claim(row, slots.get(row[0], []), pods, labels, the_rules) for row in rows]


def _named(labels: dict[tuple[str, str], dict]) -> Q:
    """Instances with an owner label row, by namespace (a handful: labels are written once)."""
    by_namespace: dict[str, list[str]] = defaultdict(list)
    for namespace, name in labels:
        by_namespace[namespace].append(name)
    q = Q(pk__in=[])
    for namespace, names in by_namespace.items():
        q |= Q(namespace=namespace, name__in=names)
    return q


def _instance_labels(pairs) -> dict[tuple[str, str], dict]:
    rows = _values(by_pairs(InstanceLabels.objects.all(), pairs), "namespace", "name", "labels")
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
