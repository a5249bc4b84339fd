"""A pod's top owner, as KAI's podgrouper records it.

KAI reads a pod's queue and explicit preemptibility from its *top owner* first (the object at
the top of the pod's ``ownerReferences`` chain: a Job, a PyTorchJob, a Deployment...), then from
the pod. Its podgrouper walks that chain when it makes the pod's PodGroup, copies the top
owner's labels onto the PodGroup, names the top owner in the PodGroup's annotation
``kai.scheduler/top-owner-metadata`` (``run.ai/top-owner-metadata`` before the rename; YAML
with ``group``, ``kind``, ``name``, ``uid``) and points the pod at it with ``pod-group-name``.

We read the same record instead of walking owners through the API server (the webhook and the
charge recompute answer from the cache): a pod's top owner is known from its PodGroup (the
``pod-group-name`` annotation), or, before the podgrouper annotated it, from a PodGroup whose
top owner is one of the pod's own owners (the usual Job -> pod case). A pod whose owner has no
PodGroup yet (the first pod of a new workload) has no known top owner: its own labels decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.charges.facts import PodFacts, QueueWorld

KAI_PODGROUP = "pod-group-name"
TOP_OWNER_KEYS = ("kai.scheduler/top-owner-metadata", "run.ai/top-owner-metadata")


@dataclass(frozen=True)
class TopOwner:
    shown: str  # "Job train-1"
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


def parse_metadata(text: str) -> dict[str, str]:
    """The top-owner annotation's flat YAML (``key: value`` lines), leniently: a line that is
    not ``key: value`` is skipped, quotes around a value are dropped."""
    out = {}
    for line in str(text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and not key.startswith((" ", "-", "#")):
            out[key.strip()] = value.strip().strip("'\"")
    return out


def from_podgroup(labels: Mapping[str, str], annotations: Mapping[str, str]) -> TopOwner | None:
    """The top owner a KAI PodGroup records (None when it names none)."""
    for key in TOP_OWNER_KEYS:
        if annotations.get(key):
            meta = parse_metadata(annotations[key])
            shown = f"{meta.get('kind') or 'owner'} {meta.get('name') or '?'}"
            return TopOwner(shown, meta.get("uid", ""), dict(labels))
    return None


def top_owner(pod: PodFacts, world: QueueWorld | None) -> TopOwner | None:
    """The pod's top owner with its labels, when known (see the module docstring)."""
    if pod.owner_labels:
        return TopOwner("", "", pod.owner_labels)
    if world is None:
        return None
    group = pod.annotations.get(KAI_PODGROUP)
    if group:
        found = world.kai_top_owners_by_podgroup.get((pod.namespace, group))
        if found is not None:
            return found
    for uid in pod.owner_uids:
        found = world.kai_top_owners_by_uid.get(uid)
        if found is not None:
            return found
    return None
