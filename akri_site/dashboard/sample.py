"""Sample cache contents for tests and the slot-map benchmark; never used by the running site.

Rows are written straight into the cache (not through the API server) because the pages only
read the cache; ``bulk_create`` keeps thousands of Instances quick to build.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from agent.models import Configuration, Instance, Node, Pod, Slot, SyncState


def make_cluster(
    instances: int = 4,
    capacity: int = 4,
    nodes: tuple[str, ...] = ("node-a", "node-b"),
    configuration: str = "akri-onvif",
    namespace: str = "default",
    synced: bool = True,
) -> dict[str, Any]:
    """One Configuration with ``instances`` shared Instances of ``capacity`` slots.

    Slot ``i`` of Instance ``n``: index 0 held IL by a node (pod known, Running), index 1 held
    CL, the rest free; every tenth Instance has a foreign value in its last slot.
    """
    now = timezone.now()
    Configuration.objects.create(
        namespace=namespace,
        name=configuration,
        capacity=capacity,
        discovery_handler="onvif",
        spec={"capacity": capacity},
    )
    for name in nodes:
        Node.objects.get_or_create(name=name, defaults={"ready": True, "ready_since": now})
    rows = Instance.objects.bulk_create(
        Instance(
            namespace=namespace,
            name=f"{configuration}-{n:06x}",
            configuration_name=configuration,
            capacity=capacity,
            shared=True,
            nodes=list(nodes),
        )
        for n in range(instances)
    )
    slots, pods = [], []
    for n, inst in enumerate(rows):
        node = nodes[n % len(nodes)]
        for i in range(capacity):
            slot = Slot(instance=inst, key=f"{inst.name}-{i}", index=i)
            if i == 0:
                pod = f"work-{n}"
                slot.value, slot.level, slot.holder_node = node, Slot.Level.IL, node
                slot.since = now - timedelta(minutes=n % 60)
                slot.pod_namespace, slot.pod_name, slot.container = "apps", pod, "main"
                pods.append(
                    Pod(namespace="apps", name=pod, uid=f"uid-{n}", node_name=node, phase="Running")
                )
            elif i == 1 and capacity > 2:
                vdev = f"{configuration}-{n % 8}"
                slot.value, slot.level, slot.holder_node = f"C:{vdev}:{node}", Slot.Level.CL, node
                slot.vdev, slot.since = vdev, now - timedelta(seconds=30)
            elif i == capacity - 1 and n % 10 == 9:
                slot.value, slot.level = "C:broken", Slot.Level.FOREIGN
            slots.append(slot)
    Slot.objects.bulk_create(slots, batch_size=2000)
    Pod.objects.bulk_create(pods, batch_size=2000)
    if synced:
        SyncState.objects.update_or_create(
            owner="controller", kind="Instance", defaults={"synced_at": now}
        )
    return {"instances": rows, "configuration": configuration, "nodes": nodes}
