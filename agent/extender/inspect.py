"""What the enabled sharing policies say about one node, from the cluster cache alone: for the
dashboard's node page, which must not ask the extender process (the scheduler's path never
waits on the dashboard, nor the dashboard on it).

The cache has no Node capacity, so the GPU policies see no cards here; their lines say so
rather than "no GPUs".
"""

from __future__ import annotations

from django.conf import settings

from agent.extender.feed import _state_of
from agent.models import Configuration, Instance, visible_to
from agent.sharing.policy import ConfigurationInfo, NodeInventory
from agent.sharing.registry import UnknownPolicy, enabled

GPU_POLICIES = {"gpushare", "gpu-number"}


def policy_statuses(node: str, namespace: str | None = None) -> list[tuple[str, str]]:
    """(policy name, status line) for each enabled policy, in settings order."""
    namespace = namespace or settings.AKRI["NAMESPACE"]
    try:
        classes = enabled(settings.AKRI["SHARING_POLICIES"])
    except UnknownPolicy as exc:
        return [("settings", str(exc))]
    rows = Instance.objects.filter(visible_to(node), namespace=namespace, deleting=False)
    instances = tuple(_state_of(row) for row in rows if node in (row.nodes or ()))
    configurations = {
        name: ConfigurationInfo(name, capacity, unique)
        for name, capacity, unique in Configuration.objects.filter(
            namespace=namespace, error="", deleting=False
        ).values_list("name", "capacity", "unique_devices")
    }
    inventory = NodeInventory(name=node, instances=instances, configurations=configurations)
    lines = []
    for cls in classes:
        if cls.name in GPU_POLICIES:
            lines.append((cls.name, "Node capacity is not in the cache; see the extender"))
        else:
            lines.append((cls.name, cls(inventory).status()))
    return lines
