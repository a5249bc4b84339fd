"""The queue-charge side of the cache, and the charge history.

Mirrors (``ResourceClaim``, ``DeviceClass``, ``QueueObject``, ``QueuePod``, ``InstanceLabels``)
follow the API server through the controller's watches and are never the authority. ``Charge``
holds the current decision per claim (recomputed, replaced); ``ChargeSample`` is the history,
one row per queue and resource per interval, pruned after its retention.
"""

from __future__ import annotations

from django.db import models


class DeviceClass(models.Model):
    """A mirror of a ``resource.k8s.io/v1`` DeviceClass."""

    name = models.CharField(max_length=253, unique=True)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict)

    def __str__(self) -> str:
        return self.name


class ResourceClaim(models.Model):
    """A mirror of a ``resource.k8s.io/v1`` ResourceClaim: what the charge rules read."""

    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, blank=True)
    resource_version = models.CharField(max_length=64, blank=True)
    labels = models.JSONField(default=dict)
    # Device classes its requests name, in request order.
    device_classes = models.JSONField(default=list)
    # Devices allocated (status.allocation.devices.results); 0 while unallocated.
    allocated = models.PositiveIntegerField(default=0)
    # status.reservedFor, in order: [{"resource", "name", "uid"}].
    reserved_for = models.JSONField(default=list)
    created = models.CharField(max_length=40, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="uniq_resourceclaim"),
        ]
        ordering = ["namespace", "name"]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class QueueObject(models.Model):
    """One object of a queue system (KAI, Kueue, Volcano)."""

    class Kind(models.TextChoices):
        KAI_QUEUE = "kai-queue", "KAI Queue"
        KAI_PODGROUP = "kai-podgroup", "KAI PodGroup"
        KUEUE_CLUSTER_QUEUE = "kueue-clusterqueue", "Kueue ClusterQueue"
        KUEUE_LOCAL_QUEUE = "kueue-localqueue", "Kueue LocalQueue"
        VOLCANO_QUEUE = "volcano-queue", "Volcano Queue"
        VOLCANO_PODGROUP = "volcano-podgroup", "Volcano PodGroup"

    kind = models.CharField(max_length=24, choices=Kind.choices)
    namespace = models.CharField(max_length=253, blank=True)
    name = models.CharField(max_length=253)
    # spec.queue of a PodGroup, spec.clusterQueue of a LocalQueue; "" for queues.
    target = models.CharField(max_length=253, blank=True)
    annotations = models.JSONField(default=dict)
    # A KAI PodGroup carries its top owner's labels (see agent.charges.topowner).
    labels = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "namespace", "name"], name="uniq_queueobject"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


class QueueSystem(models.Model):
    """Whether a queue system's CRD is served: absent ones are re-checked periodically."""

    kind = models.CharField(max_length=24, unique=True)
    present = models.BooleanField(default=False)
    checked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.kind}: {'present' if self.present else 'absent'}"


class QueuePod(models.Model):
    """A pod that uses Akri resources or DRA claims: what the queue resolvers read of it."""

    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, db_index=True)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict)
    priority = models.IntegerField(null=True, blank=True)
    created = models.CharField(max_length=40, blank=True)
    node_name = models.CharField(max_length=253, blank=True)
    phase = models.CharField(max_length=32, blank=True)
    # Names of the ResourceClaims it uses (named directly or generated from a template).
    claims = models.JSONField(default=list)
    # uids of its ownerReferences (its top owner is looked up by them).
    owners = models.JSONField(default=list)
    deleting = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="uniq_queuepod"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class InstanceLabels(models.Model):
    """An Akri Instance's labels (the agent's cache keeps no labels): its owner label."""

    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    labels = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="uniq_instancelabels"),
        ]


class Charge(models.Model):
    """The current owner and charge of one claim (an Instance or a ResourceClaim)."""

    kind = models.CharField(max_length=16)  # "instance" or "resourceclaim"
    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    resource = models.CharField(max_length=512)
    amount = models.PositiveIntegerField(default=0)
    accounted = models.BooleanField(default=True)
    owner = models.CharField(max_length=253, blank=True, db_index=True)
    source = models.CharField(max_length=24)
    charged = models.PositiveIntegerField(default=0)
    uncharged = models.PositiveIntegerField(default=0)
    # [{"pod", "uid", "queue", "why"}] in bind order.
    users = models.JSONField(default=list)
    # Queues of the users (for filtering and the "used by others" figures).
    queues = models.JSONField(default=list)
    problems = models.JSONField(default=list)
    why = models.TextField(blank=True)
    # A digest of the fields above: a full recompute compares it, not thousands of JSON rows.
    digest = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "namespace", "name"], name="uniq_charge"),
        ]
        ordering = ["kind", "namespace", "name"]

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name} -> {self.owner or '-'}"


class ChargeSample(models.Model):
    """One queue's charge for one resource in one interval. Queue "" holds what no queue pays."""

    at = models.DateTimeField(db_index=True)
    queue = models.CharField(max_length=253, blank=True)
    resource = models.CharField(max_length=512)
    charged = models.PositiveIntegerField(default=0)
    owned = models.PositiveIntegerField(default=0)
    uses_of_others = models.PositiveIntegerField(default=0)
    used_by_others = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["at", "queue", "resource"], name="uniq_chargesample"),
        ]
        ordering = ["at", "queue", "resource"]

    def __str__(self) -> str:
        return f"{self.at:%H:%M} {self.queue or '(uncharged)'} {self.resource}={self.charged}"


class Refusal(models.Model):
    """One request the admission webhook refused, with its rule. Append-only; pruned with the
    charge history."""

    at = models.DateTimeField(db_index=True)
    operation = models.CharField(max_length=16)
    resource = models.CharField(max_length=64)
    namespace = models.CharField(max_length=253, blank=True)
    name = models.CharField(max_length=253, blank=True)
    username = models.CharField(max_length=253, blank=True)
    queue = models.CharField(max_length=253, blank=True)
    claim = models.CharField(max_length=600, blank=True)
    owner = models.CharField(max_length=253, blank=True)
    rule = models.CharField(max_length=64)
    message = models.TextField()
    # Identical refusals written together (one batch of the webhook's writer) are one row:
    # a flood of the same forged review is a count, not thousands of rows (issue 29 item 6).
    repeats = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.resource} {self.namespace}/{self.name}: {self.rule}"
