"""The ORM-backed cache of the cluster, and the append-only history.

The API server is the truth. These rows mirror what watches and our own successful writes
have shown; they are never the authority for a claim. History rows (``SlotEvent``,
``ReconcileRun``, ``AuditEntry``) are append-only: nothing edits or deletes them.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import connection, models


class Configuration(models.Model):
    """A mirror of an ``akri.sh/v0`` Configuration."""

    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, blank=True)
    resource_version = models.CharField(max_length=64, blank=True)
    generation = models.BigIntegerField(default=0)
    spec = models.JSONField(default=dict)
    capacity = models.PositiveIntegerField(default=1)
    unique_devices = models.BooleanField(default=True)
    discovery_handler = models.TextField(blank=True)
    # Why this Configuration cannot be used as it is; empty when it is valid.
    error = models.TextField(blank=True)
    deleting = models.BooleanField(default=False)
    created_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="uniq_configuration"),
        ]
        ordering = ["namespace", "name"]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class Instance(models.Model):
    """A mirror of an ``akri.sh/v0`` Instance: one discovered device."""

    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, blank=True)
    resource_version = models.CharField(max_length=64, blank=True)
    # Free text in the object (the CRDs bound no string, nor does Akri): text columns, so that
    # whatever the API server accepts the cache takes, and no long value stops a watch.
    configuration_name = models.TextField(db_index=True)
    cdi_name = models.TextField(blank=True)
    capacity = models.PositiveIntegerField(default=1)
    shared = models.BooleanField(default=False)
    nodes = models.JSONField(default=list)
    broker_properties = models.JSONField(default=dict)
    device_usage = models.JSONField(default=dict)
    # The raw ``akri-site.io/cordon`` annotation (agent.domain.cordon), None when absent: kept
    # as written, so that an unreadable value still cordons everywhere the cache is read.
    cordon = models.TextField(null=True, blank=True)
    deleting = models.BooleanField(default=False)
    # The resourceVersion of our own write applied ahead of the watch. The watch skips events
    # until it echoes this version: they are older, and applying them would step back.
    pending_rv = models.CharField(max_length=64, blank=True)
    pending_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="uniq_instance"),
        ]
        # The slot map's order: a page of a 40,000-Instance cache is read, not sorted.
        indexes = [
            models.Index(
                fields=["configuration_name", "namespace", "name"], name="instance_map_order"
            )
        ]
        ordering = ["namespace", "name"]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def visible_to(node: str) -> models.Q:
    """Instances whose ``nodes`` list ``node``. On PostgreSQL a JSON containment, which the
    GIN index on ``nodes`` answers (a camera every node sees lists a thousand names: a text
    search over 40,000 such lists took seconds); elsewhere the JSON text holds each name
    quoted, a portable "node in nodes"."""
    if connection.features.supports_json_field_contains:
        return models.Q(nodes__contains=[node])
    return models.Q(nodes__icontains=json.dumps(node))


class Slot(models.Model):
    """One ``deviceUsage`` slot of an Instance, as last seen."""

    class Level(models.TextChoices):
        FREE = "free", "free"
        IL = "IL", "Instance level"
        CL = "CL", "Configuration level"
        FOREIGN = "foreign", "foreign value"

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="slots")
    # deviceUsage keys and values are any strings the API server accepts (see Instance).
    key = models.TextField()
    index = models.PositiveIntegerField()
    value = models.TextField(blank=True)
    level = models.CharField(max_length=8, choices=Level.choices, default=Level.FREE)
    holder_node = models.TextField(blank=True, db_index=True)
    vdev = models.TextField(blank=True)
    # Beyond the Instance's capacity: removed once released (capacity shrank under a holder).
    surplus = models.BooleanField(default=False)
    since = models.DateTimeField(null=True, blank=True)
    # The pod holding the slot, when the slot-to-pod map or PodResources knows it.
    pod_namespace = models.CharField(max_length=253, blank=True)
    pod_name = models.CharField(max_length=253, blank=True)
    pod_uid = models.CharField(max_length=64, blank=True)
    container = models.CharField(max_length=253, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["instance", "key"], name="uniq_slot"),
        ]
        # A pod's slots (its page, the pod list's "slots held" column): without it a scan
        # of every slot, 160,000 at 40,000 Instances. Free slots name no pod: left out.
        indexes = [
            models.Index(
                fields=["pod_name", "pod_namespace"],
                condition=~models.Q(pod_name=""),
                name="slot_pod",
            )
        ]
        ordering = ["instance_id", "index"]
        permissions = [("release_slot", "Can release a slot by hand")]

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}"


class SlotEvent(models.Model):
    """One change of one slot. Append-only."""

    class Cause(models.TextChoices):
        ALLOCATE = "allocate", "allocate"
        RELEASE = "release", "release"
        RECONCILE = "reconcile", "reconcile"
        RESTORE = "restore", "restore"
        NODE_GONE = "node_gone", "node gone"
        MANUAL = "manual", "manual release"
        OBSERVED = "observed", "observed change"
        CONFLICT = "conflict", "conflict"

    at = models.DateTimeField(db_index=True)
    namespace = models.CharField(max_length=253)
    instance = models.CharField(max_length=253, db_index=True)
    configuration = models.TextField(blank=True, db_index=True)
    slot = models.TextField(db_index=True)
    before = models.TextField(blank=True)
    after = models.TextField(blank=True)
    cause = models.CharField(max_length=16, choices=Cause.choices)
    actor = models.CharField(max_length=253)
    node = models.CharField(max_length=253, blank=True, db_index=True)
    pod = models.TextField(blank=True)
    detail = models.TextField(blank=True)
    # The Instance's resourceVersion that carries this change.
    resource_version = models.CharField(max_length=64, blank=True)
    run = models.ForeignKey(
        "ReconcileRun", null=True, blank=True, on_delete=models.PROTECT, related_name="events"
    )

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["cause", "at"])]

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.slot} {self.before!r}->{self.after!r} ({self.cause})"


class ReconcileRun(models.Model):
    """One reconciliation pass, node-local or cluster-wide. Append-only once finished."""

    class Scope(models.TextChoices):
        NODE = "node", "node"
        CLUSTER = "cluster", "cluster"

    class Trigger(models.TextChoices):
        EVENT = "event", "event"
        SWEEP = "sweep", "sweep"
        STARTUP = "startup", "start-up"
        MANUAL = "manual", "manual"
        SCHEDULE = "schedule", "schedule"

    scope = models.CharField(max_length=8, choices=Scope.choices)
    node = models.CharField(max_length=253, blank=True, db_index=True)
    trigger = models.CharField(max_length=10, choices=Trigger.choices)
    started_at = models.DateTimeField(db_index=True)
    duration_ms = models.FloatField(default=0)
    checked = models.PositiveIntegerField(default=0)
    released = models.PositiveIntegerField(default=0)
    restored = models.PositiveIntegerField(default=0)
    conflicts = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    detail = models.TextField(blank=True)
    task_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    @staticmethod
    def detail_of(lines: list[str], limit: int) -> str:
        """The ``detail`` text for a run's notes: the first ``limit`` lines, and how many more
        there were (a run over thousands of slots must not write a megabyte row)."""
        shown = lines[:limit]
        if len(lines) > limit:
            shown.append(f"... and {len(lines) - limit} more")
        return "\n".join(shown)

    def __str__(self) -> str:
        return f"{self.scope}:{self.node or 'cluster'} {self.trigger} @ {self.started_at:%H:%M:%S}"


class SlotPodBinding(models.Model):
    """The slot-to-pod map of one node: which pod holds which slot this node claimed.

    Kept in the database so that a restarted agent resumes without leaking or stealing.
    """

    node = models.CharField(max_length=253)
    slot = models.TextField()
    instance = models.CharField(max_length=253)
    namespace = models.CharField(max_length=253)
    # The kubelet device id the slot was allocated under (IL slot key or CL vdev).
    device_id = models.TextField(blank=True)
    resource_name = models.TextField(blank=True)
    pod_namespace = models.CharField(max_length=253, blank=True)
    pod_name = models.CharField(max_length=253, blank=True)
    pod_uid = models.CharField(max_length=64, blank=True)
    container = models.CharField(max_length=253, blank=True)
    allocated_at = models.DateTimeField()
    # Last time PodResources showed the device id in use.
    seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "slot"], name="uniq_binding"),
        ]

    def __str__(self) -> str:
        return f"{self.node}:{self.slot} -> {self.pod_namespace}/{self.pod_name}"


class Node(models.Model):
    """A mirror of a Kubernetes Node (cluster cache)."""

    name = models.CharField(max_length=253, unique=True)
    ready = models.BooleanField(default=False)
    # When the node was last seen Ready; NotReady beyond a grace frees its slots.
    ready_since = models.DateTimeField(null=True, blank=True)
    not_ready_since = models.DateTimeField(null=True, blank=True)
    labels = models.JSONField(default=dict)
    deleted = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Pod(models.Model):
    """A mirror of a Kubernetes Pod that requests ``akri.sh/*`` resources (cluster cache)."""

    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, db_index=True)
    node_name = models.CharField(max_length=253, blank=True, db_index=True)
    phase = models.CharField(max_length=32, blank=True)
    resources = models.JSONField(default=dict)
    deleting = models.BooleanField(default=False)
    # The slots its node's agent says it holds (annotation akri-site.io/holds, see
    # agent.kube.holders): {"<instance namespace>/<slot>": "<container>"}; None: not said.
    holds = models.JSONField(null=True, blank=True, default=None)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="uniq_pod"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class SyncState(models.Model):
    """Where a watcher stands, so that it resumes from the last resourceVersion it saw."""

    owner = models.CharField(max_length=253)
    kind = models.CharField(max_length=64)
    resource_version = models.CharField(max_length=64, blank=True)
    relists = models.PositiveIntegerField(default=0)
    synced_at = models.DateTimeField(null=True, blank=True)
    # Set while a relist is being written page by page: the cache serves what it has so far,
    # and the pages say the counts are partial.
    listing_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "kind"], name="uniq_syncstate"),
        ]

    def __str__(self) -> str:
        return f"{self.owner}/{self.kind}@{self.resource_version}"


class AuditEntry(models.Model):
    """A manual action by a person, whatever its outcome. Append-only."""

    at = models.DateTimeField(db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    username = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=512)
    holder = models.CharField(max_length=512, blank=True)
    reason = models.TextField(blank=True)
    outcome = models.CharField(max_length=16)  # done / refused / failed
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return (
            f"{self.at:%Y-%m-%d %H:%M} {self.username} {self.action} {self.target}: {self.outcome}"
        )

    _TEXT = ("username", "action", "target", "holder", "reason", "outcome", "detail")

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A refused attempt is audited as it was written, garbage included, and PostgreSQL text
        # cannot hold a NUL byte (SQLite can): keep it visible as the four characters \x00.
        for name in self._TEXT:
            value = getattr(self, name)
            if isinstance(value, str) and "\x00" in value:
                setattr(self, name, value.replace("\x00", "\\x00"))
        super().save(*args, **kwargs)


class UsageSample(models.Model):
    """Slot counts of one Configuration at one minute, cluster-wide or as one node sees them.

    ``node`` "" is the Configuration's whole count (each slot once). A row per node counts the
    slots that node holds, and the free and foreign slots of the Instances it sees (a shared
    Instance's free slot counts on every node that sees it). Written by ``agent.usage``; the
    latest sample of a minute replaces the earlier ones, so the table holds one row per
    Configuration x node per minute. Pruned after ``AKRI_USAGE_HISTORY_HOURS``.
    """

    minute = models.BigIntegerField()  # Unix time // 60: integer buckets group the same in SQL
    namespace = models.CharField(max_length=253)
    configuration = models.CharField(max_length=253)
    node = models.CharField(max_length=253, blank=True)
    held = models.PositiveIntegerField(default=0)
    free = models.PositiveIntegerField(default=0)
    foreign = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "configuration", "namespace", "node"], name="uniq_usage_sample"
            ),
        ]
        # The charts read one node ("" = whole cluster) over a time range, or one
        # Configuration's cluster-wide rows: each a range scan on one of these.
        indexes = [
            models.Index(fields=["node", "minute"]),
            models.Index(fields=["configuration", "node", "minute"]),
        ]

    def __str__(self) -> str:
        return f"{self.minute} {self.configuration}@{self.node or 'cluster'}: {self.held} held"


class ReleaseSample(models.Model):
    """Release latencies of one node in one minute: pod seen gone -> its slot free.

    The agent's reconciler adds to its node's row as it releases (the same figure as the
    ``akri_release_latency_seconds`` histogram); a count, a sum and a maximum per minute are
    enough for the chart's mean and worst line and stay one row per node per minute.
    """

    minute = models.BigIntegerField()
    node = models.CharField(max_length=253)
    releases = models.PositiveIntegerField(default=0)
    total_ms = models.FloatField(default=0)
    max_ms = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "minute"], name="uniq_release_sample"),
        ]
        indexes = [models.Index(fields=["minute"])]

    def __str__(self) -> str:
        return f"{self.minute} {self.node}: {self.releases} releases"
