"""What the validating admission webhook answers, and the owner label's conditional write.

Pods (CREATE): a pod joins the claims it names (``spec.resourceClaims[].resourceClaimName``)
and the Akri Instances it requests (``akri.sh/<instance>``). Joining a claim another queue
owns is refused when that owner opted out of sharing, or when the pod is non-preemptible
(seed 003's resource locking: a foreign non-preemptible pod would keep the owner's claim bound).
Claims of resources that are not accounted, claims with no owner yet, and pods whose queue
cannot be resolved are allowed (with a warning for the last: the webhook never guesses).

ResourceClaims and Instances (CREATE, UPDATE): the owner label may be given at creation, may be
added later only by the writers named in settings (this project's service account, which writes
it on a first bind), and never changed or removed once set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.charges.facts import PodFacts, QueueWorld, Settings
from agent.charges.preempt import preemptibility
from agent.charges.resolve import resolve
from agent.domain.jsonpatch import pointer


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    # For a refusal: the claim, its owner, the pod's queue and the rule (opt-out, locking...).
    claim: str = ""
    owner: str = ""
    queue: str = ""
    rule: str = ""


ALLOW = Verdict(True)


@dataclass(frozen=True)
class Joined:
    """A claim a new pod would use, as the charge cache knows it."""

    kind: str  # "resourceclaim" or "instance"
    namespace: str
    name: str
    owner: str | None
    accounted: bool = True

    @property
    def shown(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def admit_pod(pod: PodFacts, joins: list[Joined], world: QueueWorld, settings: Settings) -> Verdict:
    """May this pod be created, given the owners of the claims it joins?"""
    owned = [j for j in joins if j.owner is not None and j.accounted]
    if not owned:
        return ALLOW
    found = resolve(pod, world, settings.resolvers)
    if found.queue is None:
        note = f"pod {pod.key} has no resolvable queue ({found.why}); sharing not checked"
        return Verdict(True, warnings=(note,))
    foreign = [j for j in owned if j.owner != found.queue]
    for joined in foreign:
        if joined.owner in world.opted_out:
            return Verdict(
                False,
                f"pod {pod.key} of queue {found.queue} may not use {joined.shown}: it is owned "
                f"by queue {joined.owner}, which does not share what it owns (rule: opt-out)",
                claim=joined.shown,
                owner=joined.owner or "",
                queue=found.queue,
                rule="opt-out",
            )
    if foreign:
        verdict = preemptibility(pod)
        if not verdict.preemptible:
            joined = foreign[0]
            return Verdict(
                False,
                f"non-preemptible pod {pod.key} of queue {found.queue} ({verdict.why}) may not "
                f"join {joined.shown}, owned by queue {joined.owner} (rule: resource locking: "
                "a foreign pod that cannot be preempted would keep the claim bound)",
                claim=joined.shown,
                owner=joined.owner or "",
                queue=found.queue,
                rule="resource locking",
            )
    return ALLOW


def admit_owner_label(
    *,
    operation: str,
    old_labels: Mapping[str, str] | None,
    new_labels: Mapping[str, str] | None,
    username: str,
    writers: frozenset[str],
    label_key: str,
    shown: str,
) -> Verdict:
    """The owner label is set once (at creation, or later by a writer) and never changed."""
    new = (new_labels or {}).get(label_key)
    if operation != "UPDATE":
        return ALLOW
    old = (old_labels or {}).get(label_key)
    if old is not None:
        if new == old:
            return ALLOW
        change = "removed" if new is None else f"changed to {new!r}"
        return Verdict(
            False,
            f"{shown} is owned by queue {old}: its owner label {label_key} is immutable "
            f"and cannot be {change}",
            claim=shown,
            owner=old,
            rule="immutable owner label",
        )
    if new is None or username in writers:
        return ALLOW
    return Verdict(
        False,
        f"{shown}: only {', '.join(sorted(writers)) or 'akri-site'} may add the owner label "
        f"{label_key} after creation (user {username!r} may not); set it when creating the object",
        claim=shown,
        rule="owner label set by akri-site only",
    )


def owner_label_patch(
    labels: Mapping[str, str] | None, resource_version: str, label_key: str, queue: str
) -> list[dict]:
    """The create-only write of the owner label, as a JSON patch.

    JSON patch cannot test that a key is absent. With a labels map, test the whole map as seen
    (any label written meanwhile, the owner label above all, fails the write). Without one,
    ``add /metadata/labels`` would replace a map written meanwhile, so test the resourceVersion.
    A failed test comes back as 422: re-read, and adopt the label someone else wrote.
    """
    if labels:
        return [
            {"op": "test", "path": "/metadata/labels", "value": dict(labels)},
            {"op": "add", "path": pointer("metadata", "labels", label_key), "value": queue},
        ]
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/metadata/labels", "value": {label_key: queue}},
    ]
