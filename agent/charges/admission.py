"""What the validating admission webhook answers, and the owner label's conditional write.

Pods (CREATE): a pod joins the claims it names (``spec.resourceClaims[].resourceClaimName``)
and the Akri Instances it requests (``akri.sh/<instance>``). Joining a claim another queue
owns is refused when that owner opted out of sharing, or when the pod is non-preemptible
(seed 003's resource locking: a foreign non-preemptible pod would keep the owner's claim bound).
Claims of resources that are not accounted, claims with no owner yet, and pods whose queue
cannot be resolved are allowed (with a warning for the last: the webhook never guesses).

Configuration-level requests (``akri.sh/<configuration>: N``) name no Instance: the agent picks
N of the Configuration's Instances at Allocate, after admission. Such a pod is refused when the
Instances it may join (unowned, its own queue's, not accounted, or another queue's that it may
share) cannot hold N (distinct Instances with ``uniqueDevices``, slots otherwise): it could only
run on Instances the rules forbid it. When they can, it is allowed with a warning naming the
Instances it must not be given; the Queues page shows it if it gets one, and the owner may
evict it.

ResourceClaims and Instances (CREATE, UPDATE): the owner label may be given at creation, may be
added later only by the writers named in settings (this project's service account, which writes
it on a first bind), and never changed or removed once set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.charges.facts import PodFacts, QueueWorld, Settings
from agent.charges.preempt import Preemptibility, preemptibility
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


@dataclass(frozen=True)
class Owned:
    """The Instances of one Configuration that one queue owns."""

    owner: str
    accounted: bool
    instances: int
    capacity: int  # their slots
    names: tuple[str, ...] = ()  # the first few by name, for messages


@dataclass(frozen=True)
class ClRequest:
    """A Configuration-level request: ``count`` devices of ``configuration``, picked at Allocate.

    ``instances`` and ``capacity`` count every Instance of the Configuration; ``owned`` groups
    those with an owner by owner (the others are free to join), so that a decision costs the
    same for a Configuration of three Instances as for one of thousands."""

    configuration: str
    count: int
    unique: bool
    instances: int
    capacity: int
    owned: tuple[Owned, ...] = ()

    @property
    def shown(self) -> str:
        return f"Configuration {self.configuration} (akri.sh/{self.configuration}: {self.count})"


NAMES_SHOWN = 5


def cl_request(
    configuration: str,
    count: int,
    unique: bool,
    instances: Mapping[str, int],
    owners: Mapping[str, str],
    accounted: bool,
) -> ClRequest:
    """A Configuration-level request from its Instances (name -> capacity) and their owners."""
    groups: dict[str, list[str]] = {}
    for name in sorted(owners):
        if name in instances:
            groups.setdefault(owners[name], []).append(name)
    owned = tuple(
        Owned(
            owner,
            accounted,
            len(names),
            sum(instances[n] for n in names),
            tuple(names[:NAMES_SHOWN]),
        )
        for owner, names in sorted(groups.items())
    )
    return ClRequest(configuration, count, unique, len(instances), sum(instances.values()), owned)


def admit_pod(
    pod: PodFacts,
    joins: list[Joined],
    world: QueueWorld,
    settings: Settings,
    cl: Sequence[ClRequest] = (),
) -> Verdict:
    """May this pod be created, given the owners of the claims it joins?"""
    owned = [j for j in joins if j.owner is not None and j.accounted]
    cl_owned = [r for r in cl if any(g.accounted for g in r.owned)]
    if not owned and not cl_owned:
        return ALLOW
    found = resolve(pod, world, settings.resolvers)
    if found.queue is None:
        note = f"pod {pod.key} has no resolvable queue ({found.why}); sharing not checked"
        return Verdict(True, warnings=(note,))
    rule = _Rules(pod, found.queue, world)
    # An opted-out owner is named before resource locking: it refuses every foreign pod.
    first = sorted(owned, key=lambda j: rule.forbidden(j) != "opt-out")
    for joined in first:
        refused = rule.refusal(joined)
        if refused is not None:
            return refused
    warnings = []
    for request in cl_owned:
        verdict = _admit_cl(rule, request)
        if not verdict.allowed:
            return verdict
        warnings += verdict.warnings
    return Verdict(True, warnings=tuple(warnings))


class _Rules:
    """The rules for one pod of a known queue; its preemptibility is read once, when needed."""

    def __init__(self, pod: PodFacts, queue: str, world: QueueWorld) -> None:
        self.pod, self.queue, self.world = pod, queue, world
        self._preempt: Preemptibility | None = None

    @property
    def preempt(self) -> Preemptibility:
        if self._preempt is None:
            self._preempt = preemptibility(self.pod, self.world)
        return self._preempt

    def forbidden(self, joined: Joined | Owned) -> str:
        """The rule that keeps this pod off ``joined`` ("" when it may join)."""
        if joined.owner is None or not joined.accounted or joined.owner == self.queue:
            return ""
        if joined.owner in self.world.opted_out:
            return "opt-out"
        if not self.preempt.preemptible:
            return "resource locking"
        return ""

    def refusal(self, joined: Joined) -> Verdict | None:
        """The refusal of a pod that would join ``joined`` (None: it may)."""
        rule = self.forbidden(joined)
        pod, queue = self.pod, self.queue
        if rule == "opt-out":
            message = (
                f"pod {pod.key} of queue {queue} may not use {joined.shown}: it is owned by "
                f"queue {joined.owner}, which does not share what it owns (rule: opt-out)"
            )
        elif rule == "resource locking":
            message = (
                f"non-preemptible pod {pod.key} of queue {queue} ({self.preempt.why}) may not "
                f"join {joined.shown}, owned by queue {joined.owner} (rule: resource locking: "
                "a foreign pod that cannot be preempted would keep the claim bound)"
            )
        else:
            return None
        return Verdict(
            False, message, claim=joined.shown, owner=joined.owner or "", queue=queue, rule=rule
        )


def _admit_cl(rule: _Rules, request: ClRequest) -> Verdict:
    """A Configuration-level request: refused when the Instances this pod may join cannot hold
    it; allowed with a warning when some Instances of the Configuration are closed to it."""
    closed = [(g, rule.forbidden(g)) for g in request.owned]
    closed = [(g, why) for g, why in closed if why]
    if not closed:
        return ALLOW
    if request.unique:
        room, unit = request.instances - sum(g.instances for g, _ in closed), "distinct Instances"
    else:
        room, unit = request.capacity - sum(g.capacity for g, _ in closed), "slots"
    shown = [f"{n} (queue {g.owner})" for g, _ in closed for n in g.names][:NAMES_SHOWN]
    hidden = sum(g.instances for g, _ in closed) - len(shown)
    names = ", ".join(shown) + (f" and {hidden} more" if hidden > 0 else "")
    # The rules that close them, opt-out first (as for named claims).
    why = ", ".join(sorted({w for _, w in closed}, key=lambda w: w != "opt-out"))
    if room < request.count:
        reasons = []
        if "opt-out" in why:
            reasons.append("by queues that do not share")
        if "resource locking" in why:
            reasons.append(f"by other queues and the pod is non-preemptible, {rule.preempt.why}")
        message = (
            f"pod {rule.pod.key} of queue {rule.queue} asks for {request.shown}, but only "
            f"{max(room, 0)} {unit} of it are open to it: {names} are owned "
            f"{' or '.join(reasons)} (rule: {why})"
        )
        owner = closed[0][0].owner
        return Verdict(False, message, claim=request.shown, owner=owner, queue=rule.queue, rule=why)
    note = (
        f"pod {rule.pod.key} of queue {rule.queue}: {request.shown} is picked at Allocate; it "
        f"must not be given {names} (rule: {why}); if it is, the owner may evict it"
    )
    return Verdict(True, warnings=(note,))


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
