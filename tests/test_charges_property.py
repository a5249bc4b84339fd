"""Random interleavings of binds, unbinds, restarts, replays and stale concurrent writers of
the owner label, against the charge rules of ``agent.charges``.

The "API server" here is a dict of owner labels with a create-only write (what the JSON patch
``test`` gives) and each claim's users in bind order. The engine recomputes the claims an event
touches and writes the owner label when a first bind decides it. After every step: a label once
written never changes (one owner per claim, for every writer), charged plus uncharged devices
equal the devices in use, and the engine's incremental view equals a recompute from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.charges.facts import AKRI, ClaimFacts, PodFacts, QueueWorld, Settings
from agent.charges.owner import ClaimCharge, decide, decide_all, used_total

QUEUES = ("a", "b", "c")
PODS = tuple(
    PodFacts(
        namespace="ns",
        name=f"p{i}",
        uid=f"u{i}",
        labels={"kai.scheduler/queue": QUEUES[i % 3]},
        created=f"2026-01-01T00:00:{i:02d}Z",
    )
    for i in range(6)
)
CLAIMS = ("c0", "c1", "c2")
WORLD = QueueWorld()
LABEL = "akri-site.io/queue"


@dataclass
class Api:
    labels: dict[str, str] = field(default_factory=dict)
    users: dict[str, list[int]] = field(default_factory=lambda: {c: [] for c in CLAIMS})

    def facts(self, claim: str) -> ClaimFacts:
        owner = self.labels.get(claim)
        return ClaimFacts(
            kind=AKRI,
            namespace="ns",
            name=claim,
            resource="cam",
            amount=1 if self.users[claim] else 0,
            labels={LABEL: owner} if owner else {},
            users=tuple(PODS[i] for i in self.users[claim]),
        )

    def create_only(self, claim: str, queue: str) -> bool:
        if claim in self.labels:
            return False
        self.labels[claim] = queue
        return True


@dataclass
class Engine:
    api: Api
    rules: Settings
    view: dict[str, ClaimCharge] = field(default_factory=dict)
    # Claims changed in the API server whose event has not reached this engine yet.
    pending: set[str] = field(default_factory=set)

    def touch(self, claim: str) -> None:
        self.pending.discard(claim)
        charge = decide(self.api.facts(claim), WORLD, self.rules)
        if charge.write_label is not None:
            # Won or lost, the label is now whatever the API server holds: decide again.
            self.api.create_only(claim, charge.write_label)
            charge = decide(self.api.facts(claim), WORLD, self.rules)
        self.view[claim] = charge

    def restart(self) -> None:
        self.view = {}
        for claim in CLAIMS:
            self.touch(claim)


events = st.one_of(
    st.tuples(st.just("bind"), st.integers(0, 3), st.sampled_from(CLAIMS[:2])),
    # A bind this engine hears of only later (its watch lags; another replica may act first).
    st.tuples(st.just("bind-unheard"), st.integers(0, 3), st.sampled_from(CLAIMS[:2])),
    st.tuples(st.just("unbind"), st.integers(0, 3), st.sampled_from(CLAIMS[:2])),
    st.tuples(st.just("restart"), st.just(0), st.just("")),
    st.tuples(st.just("replay"), st.just(0), st.just("")),
    # Another replica decided from what it saw some steps ago and writes now.
    st.tuples(st.just("stale"), st.integers(1, 4), st.sampled_from(CLAIMS)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(events, max_size=40), st.sampled_from(["deduct", "attribute"]))
# A replica that heard of a bind (queue b) the engine did not, and writes after the engine
# wrote queue a for a later first bind: the create-only write must lose.
@example(
    [("bind-unheard", 1, "c0"), ("unbind", 1, "c0"), ("bind", 0, "c0"), ("stale", 3, "c0")],
    "deduct",
)
def test_every_interleaving_keeps_one_owner_and_exact_charges(steps, orphans):
    rules = Settings(orphans=orphans)
    api = Api()
    engine = Engine(api, rules)
    engine.restart()
    history: list[tuple[dict[str, str], dict[str, list[int]]]] = []
    written: dict[str, str] = {}
    last = None
    for what, n, claim in steps:
        history.append((dict(api.labels), {c: list(u) for c, u in api.users.items()}))
        if what == "bind" and n not in api.users[claim]:
            api.users[claim].append(n)
            engine.touch(claim)
        elif what == "bind-unheard" and n not in api.users[claim]:
            api.users[claim].append(n)
            engine.pending.add(claim)
        elif what == "unbind" and n in api.users[claim]:
            api.users[claim].remove(n)
            engine.touch(claim)
        elif what == "restart":
            engine.restart()
        elif what == "replay" and last is not None:
            engine.touch(last)
        elif what == "stale" and len(history) >= n:
            labels, users = history[-n]
            seen = Api(labels=labels, users=users)
            stale = decide(seen.facts(claim), WORLD, rules)
            if stale.write_label and api.create_only(claim, stale.write_label):
                engine.touch(claim)  # the label watch brings the write to the engine
        last = claim or last
        _check(api, engine, rules, written)


def _check(api: Api, engine: Engine, rules: Settings, written: dict[str, str]) -> None:
    for claim, queue in api.labels.items():
        assert written.setdefault(claim, queue) == queue, f"owner of {claim} changed"
    scratch = decide_all((api.facts(c) for c in CLAIMS), WORLD, rules)
    heard = {c.key: c for c in engine.view.values() if c.name not in engine.pending}
    assert heard == {k: c for k, c in scratch.items() if c.name not in engine.pending}
    charged, uncharged = used_total(scratch)
    assert charged + uncharged == sum(1 for c in CLAIMS if api.users[c])
    for charge in scratch.values():
        if charge.owner is not None and not charge.orphan and charge.name not in engine.pending:
            assert api.labels.get(charge.name) == charge.owner
        assert charge.write_label is None or charge.name not in api.labels


@settings(max_examples=200, deadline=None)
@given(st.permutations(range(6)), st.integers(1, 6))
def test_concurrent_first_binds_from_two_queues_yield_one_owner(order, binders):
    """Writers that each saw a different single first bind race; one label wins for all."""
    api = Api()
    views = []
    for i in order[:binders]:
        seen = Api(users={"c0": [i], "c1": [], "c2": []})
        views.append(decide(seen.facts("c0"), WORLD, Settings()))
    winners = [v.write_label for v in views if api.create_only("c0", v.write_label)]
    assert len(winners) == 1
    api.users["c0"] = list(order[:binders])
    for _ in range(3):  # every replica, every restart
        assert decide(api.facts("c0"), WORLD, Settings()).owner == winners[0]
