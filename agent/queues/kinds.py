"""The API objects queue charges watch: where each lives, and how to read it into the cache."""

from __future__ import annotations

from dataclasses import dataclass

from agent.queues.models import QueueObject


@dataclass(frozen=True)
class Watched:
    kind: str  # QueueObject.Kind value, or "resourceclaims" / "deviceclasses"
    group: str
    version: str
    plural: str
    # What spec field names the queue a PodGroup or LocalQueue points at ("" for queues).
    target: str = ""


DRA_GROUP = "resource.k8s.io"
RESOURCE_CLAIMS = Watched("resourceclaims", DRA_GROUP, "v1", "resourceclaims")
DEVICE_CLASSES = Watched("deviceclasses", DRA_GROUP, "v1", "deviceclasses")
K = QueueObject.Kind
QUEUE_KINDS = (
    Watched(K.KAI_QUEUE, "scheduling.run.ai", "v2", "queues"),
    Watched(K.KAI_PODGROUP, "scheduling.run.ai", "v2alpha2", "podgroups", "queue"),
    Watched(K.KUEUE_CLUSTER_QUEUE, "kueue.x-k8s.io", "v1beta2", "clusterqueues"),
    Watched(K.KUEUE_LOCAL_QUEUE, "kueue.x-k8s.io", "v1beta2", "localqueues", "clusterQueue"),
    Watched(K.VOLCANO_QUEUE, "scheduling.volcano.sh", "v1beta1", "queues"),
    Watched(K.VOLCANO_PODGROUP, "scheduling.volcano.sh", "v1beta1", "podgroups", "queue"),
)
ALL_KINDS = (RESOURCE_CLAIMS, DEVICE_CLASSES, *QUEUE_KINDS)
