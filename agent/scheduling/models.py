"""The extender's last filter verdict per pod (one row per pod, replaced on each filter).

Not history: a pod is filtered again every time the scheduler retries it, and only the latest
word explains why it waits now. Reasons are kept per node up to ``MAX_NODES`` (the rest are
counted by reason), so a 5,000-node cluster does not write a megabyte per retry.
"""

from __future__ import annotations

from django.db import models


class PodVerdict(models.Model):
    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, blank=True)
    at = models.DateTimeField(db_index=True)
    # Nodes that fit (how many; the first few by name).
    fits = models.PositiveIntegerField(default=0)
    fit_nodes = models.JSONField(default=list)
    # node -> reason, for the first MAX_NODES nodes refused; "unresolvable" ones too.
    failed = models.JSONField(default=dict)
    unresolvable = models.JSONField(default=dict)
    # reason -> how many nodes gave it, over every node.
    reasons = models.JSONField(default=dict)
    error = models.TextField(blank=True)
    # The node the extender bound the pod to, when it did.
    bound_to = models.CharField(max_length=253, blank=True)

    MAX_NODES = 50

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="uniq_pod_verdict"),
        ]
        ordering = ["namespace", "name"]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}: {self.fits} fit"

    @property
    def refused(self) -> int:
        return sum(self.reasons.values())
