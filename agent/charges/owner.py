"""Who owns and pays for each claim (seed 003), and what that adds up to per queue.

Rules, applied to Akri Instances and DRA ResourceClaims alike:

* The owner is the queue named by the claim's owner label (``akri-site.io/queue`` unless
  configured otherwise). The label is immutable once set (the admission webhook holds that).
* Without the label, when every pod using the claim is of one queue, that queue is the owner
  (it holds the first bind) and the label is to be written, create-only, so that every replica
  and every restart agrees from then on. Only a queue that exists gets the label, since it can
  never be taken back: one an installed queue system defines, or, with no queue system
  installed, one a pod's own queue label names. The default queue (``AKRI_QUEUE_DEFAULT``) is
  a setting, not a queue: a pod placed there by default leaves the claim unlabelled.
* Without the label and used by pods of several queues (bound before anyone labelled it: a
  migration, another scheduler, two first binds that landed between two looks) the claim is an
  orphan. Policy ``deduct``: nobody is charged, the devices are deducted from the cluster's
  capacity. Policy ``attribute``: the queue of the earliest-created pod, then the smallest queue
  name, is charged; the same on every run, and nothing is written, so the page still shows it
  as an orphan an operator may label.
* The owner pays for the whole claim whoever else uses it. A claim of a resource that is not
  accounted is shown and never charged. Devices no queue can be charged for (orphans under
  ``deduct``, an owner label naming a queue that does not exist, claims held without pods of a
  known queue) are counted as uncharged, so charged plus uncharged is what is in use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.charges.facts import ClaimFacts, QueueWorld, Settings
from agent.charges.resolve import Resolution, looks_like, resolve

# Where the owner came from.
LABEL = "label"
FIRST_BIND = "first-bind"
ORPHAN_ATTRIBUTED = "orphan-attributed"
ORPHAN_DEDUCTED = "orphan-deducted"
UNUSED = "unused"  # nothing held, nobody to charge
NO_QUEUE = "no-queue"  # held, but no pod of a known queue uses it
ORPHAN_POLICIES = ("deduct", "attribute")


@dataclass(frozen=True)
class UserView:
    pod: str
    uid: str
    queue: str | None
    why: str
    source: str = ""  # the resolver that placed the pod ("default": no queue label of its own)


@dataclass(frozen=True)
class ClaimCharge:
    """The decision for one claim: owner, charge and why."""

    key: str
    kind: str
    namespace: str
    name: str
    resource: str
    amount: int
    accounted: bool
    owner: str | None
    source: str
    charged: int  # devices charged to the owner
    uncharged: int  # accounted devices in use that no queue pays for
    users: tuple[UserView, ...] = ()
    # Owner label to write create-only (a first bind), else None.
    write_label: str | None = None
    problems: tuple[str, ...] = ()
    why: str = ""

    @property
    def queues(self) -> frozenset[str]:
        return frozenset(u.queue for u in self.users if u.queue)

    @property
    def foreign_queues(self) -> frozenset[str]:
        return self.queues - {self.owner} if self.owner else frozenset()

    @property
    def orphan(self) -> bool:
        return self.source in (ORPHAN_ATTRIBUTED, ORPHAN_DEDUCTED)


def label_owner(
    claim: ClaimFacts, world: QueueWorld, settings: Settings
) -> tuple[str | None, tuple[str, ...]]:
    """The owner the claim's label names (None: no usable label) and problems with its labels."""
    problems = [
        f"label {key!r} looks like the owner label {settings.label_key!r} (typo?)"
        for key in sorted(claim.labels)
        if looks_like(key, {settings.label_key})
    ]
    value = claim.labels.get(settings.label_key)
    if value is None:
        return None, tuple(problems)
    if not value.strip():
        problems.append(f"owner label {settings.label_key} is empty")
        return None, tuple(problems)
    return value, tuple(problems)


def decide(claim: ClaimFacts, world: QueueWorld, settings: Settings) -> ClaimCharge:
    """Owner and charge of one claim. Pure: the same facts give the same answer."""
    owner, problems = label_owner(claim, world, settings)
    users = tuple(_user(pod, world, settings) for pod in claim.users)
    problems += tuple(p for pod, res in zip(claim.users, users, strict=True) for p in res[1])
    problems += tuple(f"{u}: pod not known yet" for u in claim.unknown_users)
    views = tuple(view for view, _ in users)
    base = _Base(claim, views, problems)
    if owner is not None:
        return _labelled(base, owner, world)
    queues = {v.queue for v in views if v.queue}
    if claim.amount <= 0:
        return base.result(None, UNUSED, "holds no device: nothing to charge")
    if not queues:
        return base.result(None, NO_QUEUE, "held, but no pod of a known queue uses it")
    if len(queues) == 1:
        (queue,) = queues
        if claim.unknown_users:
            # A user we cannot place may have bound first: decide now, write once it is known.
            why = f"first bound by queue {queue} as far as known; label not written yet"
            return base.result(queue, FIRST_BIND, why)
        if not _exists(queue, views, world):
            why = f"first bound by queue {queue}, which no queue system defines: label not written"
            return base.result(queue, FIRST_BIND, why)
        return base.result(queue, FIRST_BIND, f"first bound by queue {queue}", write=queue)
    return _orphan(base, claim, views, settings)


def _exists(queue: str, users: tuple[UserView, ...], world: QueueWorld) -> bool:
    """May ``queue`` be written as an owner label (which is immutable)?"""
    known = world.known_queues()
    if known is not None:
        return queue in known
    # No queue system to ask: a pod's own queue label is taken at its word.
    return any(u.queue == queue and u.source != "default" for u in users)


@dataclass(frozen=True)
class _Base:
    claim: ClaimFacts
    users: tuple[UserView, ...]
    problems: tuple[str, ...]

    def result(
        self, owner: str | None, source: str, why: str, *, write: str | None = None, pays=True
    ) -> ClaimCharge:
        c = self.claim
        used = max(c.amount, 0) if c.accounted else 0
        charged = used if owner is not None and pays else 0
        note = why if c.accounted else f"{why}; {c.resource} is not accounted: never charged"
        return ClaimCharge(
            key=c.key,
            kind=c.kind,
            namespace=c.namespace,
            name=c.name,
            resource=c.resource,
            amount=max(c.amount, 0),
            accounted=c.accounted,
            owner=owner,
            source=source,
            charged=charged,
            uncharged=used - charged,
            users=self.users,
            write_label=write,
            problems=self.problems,
            why=note,
        )


def _user(pod, world: QueueWorld, settings: Settings) -> tuple[UserView, tuple[str, ...]]:
    found: Resolution = resolve(pod, world, settings.resolvers)
    problems = tuple(f"pod {pod.key}: {p}" for p in found.problems)
    return UserView(pod.key, pod.uid, found.queue, found.why, found.source), problems


def _labelled(base: _Base, owner: str, world: QueueWorld) -> ClaimCharge:
    known = world.known_queues()
    if known is not None and owner not in known:
        why = f"owner label names queue {owner!r}, which no queue system defines: not charged"
        fixed = _Base(base.claim, base.users, base.problems + (f"unknown owner queue {owner!r}",))
        return fixed.result(owner, LABEL, why, pays=False)
    return base.result(owner, LABEL, f"owner label names queue {owner}")


def _orphan(
    base: _Base, claim: ClaimFacts, views: tuple[UserView, ...], settings: Settings
) -> ClaimCharge:
    queues = sorted({v.queue for v in views if v.queue})
    listed = ", ".join(queues)
    if settings.orphans != "attribute":
        return base.result(
            None, ORPHAN_DEDUCTED, f"orphan used by {listed}: deducted, charged to no queue"
        )
    created = {pod.key: pod.created for pod in claim.users}
    # Earliest pod creation, then queue name; a pod with no creation time sorts last.
    first = min(
        (v for v in views if v.queue),
        key=lambda v: (created.get(v.pod) or "\uffff", v.queue or ""),
    )
    why = f"orphan used by {listed}: attributed to {first.queue} (earliest pod {first.pod})"
    return base.result(first.queue, ORPHAN_ATTRIBUTED, why)


def decide_all(
    claims: Iterable[ClaimFacts], world: QueueWorld, settings: Settings
) -> dict[str, ClaimCharge]:
    return {claim.key: decide(claim, world, settings) for claim in claims}


@dataclass
class QueueTotals:
    """What one queue owns, pays, uses of others' and lends to others."""

    queue: str
    charged: dict[str, int] = field(default_factory=dict)  # resource -> devices
    owned: int = 0  # claims owned
    uses_of_others: int = 0  # claims of other owners its pods use
    used_by_others: int = 0  # its claims that other queues' pods use
    orphans: int = 0  # orphans it uses (or is attributed)

    @property
    def total(self) -> int:
        return sum(self.charged.values())


def totals(charges: Iterable[ClaimCharge]) -> dict[str, QueueTotals]:
    """Per queue figures. Only charged devices count as charges; claims are counted as claims."""
    out: dict[str, QueueTotals] = {}

    def of(queue: str) -> QueueTotals:
        return out.setdefault(queue, QueueTotals(queue))

    for charge in charges:
        if charge.owner is not None and not charge.orphan:
            row = of(charge.owner)
            row.owned += 1
            if charge.foreign_queues:
                row.used_by_others += 1
        if charge.owner is not None and charge.charged:
            row = of(charge.owner)
            row.charged[charge.resource] = row.charged.get(charge.resource, 0) + charge.charged
        for queue in charge.queues:
            if charge.orphan:
                of(queue).orphans += 1
            elif charge.owner is not None and queue != charge.owner:
                of(queue).uses_of_others += 1
    return out


def used_total(charges: Mapping[str, ClaimCharge] | Iterable[ClaimCharge]) -> tuple[int, int]:
    """(charged, uncharged) over all claims: their sum is every accounted device in use."""
    values = charges.values() if isinstance(charges, Mapping) else charges
    charged = uncharged = 0
    for charge in values:
        charged += charge.charged
        uncharged += charge.uncharged
    return charged, uncharged
