"""The facts the charge rules work from: pods, claims and the queue systems' objects.

Everything is frozen and built by the caller (the cache, a test, the webhook's review), so a
decision is a pure function of what it was given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The kinds of claim a queue can own.
AKRI = "instance"  # an Akri Instance: its slots are held by pods
DRA = "resourceclaim"  # a resource.k8s.io/v1 ResourceClaim: reserved for pods


@dataclass(frozen=True)
class PodFacts:
    """What the rules read of one pod."""

    namespace: str
    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    # spec.priority as the API server resolved it from the PriorityClass (None: not set).
    priority: int | None = None
    # metadata.creationTimestamp as RFC 3339 text (sorts in time order), "" when unknown.
    created: str = ""
    # Labels of the pod's top owner (a Job, a PyTorchJob...) when the caller knows them;
    # otherwise read from KAI's PodGroups (``agent.charges.topowner``).
    owner_labels: Mapping[str, str] = field(default_factory=dict)
    # uids of the pod's ownerReferences.
    owner_uids: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class QueueWorld:
    """The queue systems' objects, as far as they exist in the cluster.

    A ``None`` set means that system's CRD is not installed. With ``labels_alone`` (the
    embedded demo, which runs no queue system) its resolver then trusts pod labels; without it
    (production: ``AKRI_QUEUE_LABELS_ALONE`` is off there) it names no queue: a label is any
    string a tenant writes, another team's queue included, and only the queue system's objects
    say which queues exist. An empty set means the CRD exists and has no objects.
    """

    kai_queues: frozenset[str] | None = None
    # KAI PodGroups: (namespace, name) -> spec.queue.
    kai_podgroups: Mapping[tuple[str, str], str] = field(default_factory=dict)
    kueue_cluster_queues: frozenset[str] | None = None
    # Kueue LocalQueues: (namespace, name) -> spec.clusterQueue. None: no LocalQueue CRD.
    kueue_local_queues: Mapping[tuple[str, str], str] | None = None
    volcano_queues: frozenset[str] | None = None
    # Volcano PodGroups: (namespace, name) -> spec.queue.
    volcano_podgroups: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # Queues that refuse to share what they own (settings and queue-object annotations).
    opted_out: frozenset[str] = frozenset()
    # The queue of a pod no resolver places; "" means such a pod has no queue.
    default_queue: str = "default"
    # Top owners recorded by KAI's PodGroups (``agent.charges.topowner.TopOwner``): by the
    # PodGroup's (namespace, name) and by the top owner's uid.
    kai_top_owners_by_podgroup: Mapping[tuple[str, str], Any] = field(default_factory=dict)
    kai_top_owners_by_uid: Mapping[str, Any] = field(default_factory=dict)
    # Trust a queue label when its system's CRD is not installed (see the class docstring).
    labels_alone: bool = True

    def known_queues(self) -> frozenset[str] | None:
        """Every queue some installed queue system defines; None when none is installed."""
        sets = [
            s
            for s in (self.kai_queues, self.kueue_cluster_queues, self.volcano_queues)
            if s is not None
        ]
        if not sets:
            return None
        return frozenset().union(*sets)


@dataclass(frozen=True)
class ClaimFacts:
    """One thing a queue can own: an Akri Instance or a DRA ResourceClaim."""

    kind: str  # AKRI or DRA
    namespace: str
    name: str
    # What is charged: the DRA device class or the Akri Configuration.
    resource: str
    # Devices the claim holds: allocated DRA devices, 1 for an Instance in use.
    amount: int
    labels: Mapping[str, str] = field(default_factory=dict)
    # Pods using it, in bind order (DRA status.reservedFor; Akri slot claim time).
    users: tuple[PodFacts, ...] = ()
    accounted: bool = True
    # Users the caller could not find (a reservedFor entry or slot holder not in the cache).
    unknown_users: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return claim_key(self.kind, self.namespace, self.name)


def claim_key(kind: str, namespace: str, name: str) -> str:
    return f"{kind}:{namespace}/{name}"


@dataclass(frozen=True)
class Settings:
    """The charge rules' settings (from ``AKRI_QUEUE_*``)."""

    label_key: str = "akri-site.io/queue"
    resolvers: tuple[str, ...] = ("kai", "kueue", "volcano", "default")
    orphans: str = "deduct"  # or "attribute"
    # Accounted DRA device classes and Akri Configurations; "*" accounts everything.
    accounted_classes: frozenset[str] = frozenset({"*"})
    accounted_configurations: frozenset[str] = frozenset({"*"})

    def accounts(self, kind: str, resource: str) -> bool:
        listed = self.accounted_configurations if kind == AKRI else self.accounted_classes
        return "*" in listed or resource in listed
