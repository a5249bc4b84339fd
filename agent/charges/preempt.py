"""Whether a pod may be evicted to free what it holds (KAI's and Volcano's rules).

An explicit statement wins: KAI's ``kai.scheduler/preemptibility`` label (on the top owner or
the pod), then Volcano's ``volcano.sh/preemptable`` (annotation, then label). Without one,
KAI's threshold applies: priority 100 and above is non-preemptible
(``CalculatePreemptibility``), below it preemptible; a pod with no priority is preemptible.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.charges.facts import PodFacts, QueueWorld
from agent.charges.topowner import top_owner

KAI_PREEMPTIBILITY = "kai.scheduler/preemptibility"
VOLCANO_PREEMPTABLE = "volcano.sh/preemptable"
NON_PREEMPTIBLE_PRIORITY = 100


@dataclass(frozen=True)
class Preemptibility:
    preemptible: bool
    why: str


def preemptibility(pod: PodFacts, world: QueueWorld | None = None) -> Preemptibility:
    owner = top_owner(pod, world)
    owner_labels = owner.labels if owner is not None else {}
    where_owner = f"top owner {owner.shown}".strip() if owner is not None else "top owner"
    for where, labels in ((where_owner, owner_labels), ("pod", pod.labels)):
        value = (labels.get(KAI_PREEMPTIBILITY) or "").strip().lower()
        if value in ("preemptible", "non-preemptible"):
            return Preemptibility(value == "preemptible", f"{where} {KAI_PREEMPTIBILITY}={value}")
    for where, mapping in (("annotation", pod.annotations), ("label", pod.labels)):
        value = (mapping.get(VOLCANO_PREEMPTABLE) or "").strip().lower()
        if value in ("true", "false"):
            return Preemptibility(value == "true", f"{where} {VOLCANO_PREEMPTABLE}={value}")
    if pod.priority is not None and pod.priority >= NON_PREEMPTIBLE_PRIORITY:
        return Preemptibility(False, f"priority {pod.priority} >= {NON_PREEMPTIBLE_PRIORITY}")
    shown = "unset" if pod.priority is None else str(pod.priority)
    return Preemptibility(True, f"priority {shown} < {NON_PREEMPTIBLE_PRIORITY}")
