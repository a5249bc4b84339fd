"""Which queue a pod belongs to: pluggable resolvers tried in a configured order.

Each resolver reads the labels a queue system puts on pods and, when that system's CRDs are
installed, its own objects (a PodGroup's ``spec.queue``, a LocalQueue's ``spec.clusterQueue``).
The first resolver that recognises the pod decides. When it names a queue the installed system
does not define, the answer is "no queue" with the reason: charging a queue that does not exist
would be a charge made up, and falling through to the default would hide the typo.

Label keys and rules are KAI's, Kueue's and Volcano's own (see the module constants).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.charges.facts import PodFacts, QueueWorld
from agent.charges.topowner import KAI_PODGROUP, top_owner

KAI_QUEUE = "kai.scheduler/queue"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_CLUSTER_QUEUE = "kueue.x-k8s.io/cluster-queue-name"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"
VOLCANO_JOB_QUEUE = "volcano.sh/queue-name"
# Every key some resolver reads: any other label or annotation with "queue" in its key is
# reported as a likely typo.
KNOWN_KEYS = frozenset(
    {
        KAI_QUEUE,
        KAI_PODGROUP,
        KUEUE_QUEUE,
        KUEUE_CLUSTER_QUEUE,
        "kueue.x-k8s.io/local-queue-name",
        VOLCANO_GROUP,
        VOLCANO_QUEUE,
        VOLCANO_JOB_QUEUE,
    }
)


@dataclass(frozen=True)
class Resolution:
    """A pod's queue (None: it has none we can charge) and how it was found."""

    queue: str | None
    source: str  # the resolver that decided, or "none"
    why: str
    problems: tuple[str, ...] = ()


Resolver = Callable[[PodFacts, QueueWorld], Resolution | None]


def _checked(
    queue: str, known: frozenset[str] | None, system: str, how: str, world: QueueWorld
) -> Resolution:
    if known is None and not world.labels_alone:
        return Resolution(
            None,
            system,
            f"{how}, but {system} is not installed: no queue {queue!r} exists",
            (f"unknown {system} queue {queue!r} ({how}; {system} is not installed)",),
        )
    if known is not None and queue not in known:
        return Resolution(
            None,
            system,
            f"{how}, but {system} has no queue {queue!r}",
            (f"unknown {system} queue {queue!r} ({how})",),
        )
    return Resolution(queue, system, how)


def resolve_kai(pod: PodFacts, world: QueueWorld) -> Resolution | None:
    """KAI: the top owner's then the pod's ``kai.scheduler/queue``, then the PodGroup's queue
    (KAI's podgrouper's order; the top owner as its PodGroup records it, see ``topowner``)."""
    owner = top_owner(pod, world)
    owner_labels = owner.labels if owner is not None else {}
    where_owner = f"top owner {owner.shown}".strip() if owner is not None else "top owner"
    for where, labels in ((where_owner, owner_labels), ("pod", pod.labels)):
        queue = labels.get(KAI_QUEUE)
        if queue:
            how = f"{where} label {KAI_QUEUE}={queue}"
            return _checked(queue, world.kai_queues, "kai", how, world)
    group = pod.annotations.get(KAI_PODGROUP)
    if group:
        queue = world.kai_podgroups.get((pod.namespace, group))
        if queue:
            how = f"KAI PodGroup {group} spec.queue"
            return _checked(queue, world.kai_queues, "kai", how, world)
    return None


def resolve_kueue(pod: PodFacts, world: QueueWorld) -> Resolution | None:
    """Kueue: ``kueue.x-k8s.io/queue-name`` names a LocalQueue, whose ClusterQueue is charged."""
    local = pod.labels.get(KUEUE_QUEUE)
    if not local:
        return None
    how = f"label {KUEUE_QUEUE}={local}"
    if world.kueue_local_queues is None:
        if not world.labels_alone:
            return Resolution(
                None,
                "kueue",
                f"{how}, but Kueue is not installed: no LocalQueue {pod.namespace}/{local} exists",
                (f"unknown Kueue LocalQueue {pod.namespace}/{local} (Kueue is not installed)",),
            )
        # No LocalQueue objects to read: the label Kueue adds after admission, else the name.
        cluster = pod.labels.get(KUEUE_CLUSTER_QUEUE)
        if cluster:
            return Resolution(cluster, "kueue", f"{how}, label {KUEUE_CLUSTER_QUEUE}={cluster}")
        return Resolution(local, "kueue", f"{how} (no LocalQueue objects to read)")
    cluster = world.kueue_local_queues.get((pod.namespace, local))
    if cluster is None:
        return Resolution(
            None,
            "kueue",
            f"{how}, but there is no LocalQueue {pod.namespace}/{local}",
            (f"unknown Kueue LocalQueue {pod.namespace}/{local}",),
        )
    return _checked(cluster, world.kueue_cluster_queues, "kueue", f"{how} -> {cluster}", world)


def resolve_volcano(pod: PodFacts, world: QueueWorld) -> Resolution | None:
    """Volcano: the PodGroup's ``spec.queue``, else the pod's queue-name annotation or label."""
    group = pod.annotations.get(VOLCANO_GROUP)
    if group:
        queue = world.volcano_podgroups.get((pod.namespace, group))
        if queue:
            how = f"Volcano PodGroup {group} spec.queue"
            return _checked(queue, world.volcano_queues, "volcano", how, world)
    for key in (VOLCANO_QUEUE, VOLCANO_JOB_QUEUE):
        queue = pod.annotations.get(key) or pod.labels.get(key)
        if queue:
            return _checked(queue, world.volcano_queues, "volcano", f"{key}={queue}", world)
    return None


def resolve_default(pod: PodFacts, world: QueueWorld) -> Resolution | None:
    if not world.default_queue:
        return None
    return Resolution(world.default_queue, "default", "no queue label: the default queue")


RESOLVERS: dict[str, Resolver] = {
    "kai": resolve_kai,
    "kueue": resolve_kueue,
    "volcano": resolve_volcano,
    "default": resolve_default,
}


def register_resolver(name: str, resolver: Resolver) -> None:
    """Add a resolver that ``AKRI_QUEUE_RESOLVERS`` can name (a plug-in for another system)."""
    RESOLVERS[name] = resolver


def unknown_resolvers(order: tuple[str, ...]) -> list[str]:
    return [name for name in order if name not in RESOLVERS]


def resolve(pod: PodFacts, world: QueueWorld, order: tuple[str, ...]) -> Resolution:
    """The pod's queue by the first resolver in ``order`` that recognises it."""
    typos = suspicious_keys(pod)
    for name in order:
        found = RESOLVERS[name](pod, world)
        if found is not None:
            return _with(found, typos)
    why = "no resolver recognises this pod and there is no default queue"
    return Resolution(None, "none", why, typos)


def suspicious_keys(pod: PodFacts, extra_known: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Labels and annotations that look like a queue label no resolver reads (typos)."""
    known = KNOWN_KEYS | extra_known
    found = []
    for where, mapping in (("label", pod.labels), ("annotation", pod.annotations)):
        for key in mapping:
            if looks_like(key, known):
                found.append(f"{where} {key!r} looks like a queue key no resolver reads (typo?)")
    return tuple(sorted(found))


def looks_like(key: str, known: Iterable[str]) -> bool:
    """Is ``key`` (not itself known) a queue key, or one or two keystrokes from a known one?"""
    return _looks_like(key, frozenset(known))


# Every pod of a cluster carries the same few label keys; comparing each one's keys by edit
# distance again took half of a full recompute (bench ``charges``, 20,000 pods).
@functools.lru_cache(maxsize=4096)
def _looks_like(key: str, known: frozenset[str]) -> bool:
    if key in known:
        return False
    return "queue" in key.lower() or bool(difflib.get_close_matches(key, known, n=1, cutoff=0.85))


def _with(found: Resolution, problems: tuple[str, ...]) -> Resolution:
    if not problems:
        return found
    return Resolution(found.queue, found.source, found.why, found.problems + problems)
