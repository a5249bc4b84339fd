"""Random interleavings of binds, unbinds, restarts, replays, unrelated label writes and stale
concurrent writers of the owner label, against the charge rules of ``agent.charges``.

The "API server" here keeps each claim as an object (labels, resourceVersion; a bind or an
unbind changes the object, as a slot write changes an Instance) and applies every owner-label
write as the real create-only JSON patch (``owner_label_patch``) through the simulator's JSON
patch code: a writer whose view is stale wins or loses exactly as it would against the server,
not by a rule this test restates. The engine recomputes the claims an event touches and writes
the owner label when a first bind decides it. After every step: a label once written never
changes, charged plus uncharged devices equal the devices in use, the engine's incremental view
equals a recompute from scratch, and each claim's owner follows the rules as an independent
oracle states them (label, first bind, orphan deducted or attributed to the earliest-created
pod, then the smallest queue name).

``test_the_create_only_write_against_an_api_server`` then runs the real ``write_label`` (read,
conditional patch, re-read and adopt) against the simulator or a real API server, with another
writer landing between its read and its patch.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.charges.admission import owner_label_patch
from agent.charges.facts import AKRI, ClaimFacts, PodFacts, QueueWorld, Settings
from agent.charges.owner import (
    FIRST_BIND,
    LABEL,
    NO_QUEUE,
    ORPHAN_ATTRIBUTED,
    ORPHAN_DEDUCTED,
    UNUSED,
    ClaimCharge,
    decide,
    decide_all,
    used_total,
)
from agent.simulator.apiserver_patch import PatchError, json_patch

QUEUES = ("a", "b", "c")
# Pods created in pairs at the same second, so that the orphan rule's tie (earliest creation,
# then the smallest queue name) is exercised: (p0 a, p1 b), (p2 c, p3 a), (p4 b, p5 c).
PODS = tuple(
    PodFacts(
        namespace="ns",
        name=f"p{i}",
        uid=f"u{i}",
        labels={"kai.scheduler/queue": QUEUES[i % 3]},
        created=f"2026-01-01T00:00:{i // 2:02d}Z",
    )
    for i in range(6)
)
CLAIMS = ("c0", "c1", "c2")
WORLD = QueueWorld()
OWNER_KEY = "akri-site.io/queue"
# c1 starts with a label of its own, so the write tests the labels map (not the version).
FIRST_LABELS = {"c0": None, "c1": {"app": "cam"}, "c2": None}


def first_objects() -> dict[str, dict]:
    objects = {}
    for claim, labels in FIRST_LABELS.items():
        meta: dict = {"name": claim, "resourceVersion": "1"}
        if labels is not None:
            meta["labels"] = dict(labels)
        objects[claim] = {"metadata": meta}
    return objects


@dataclass
class Api:
    objects: dict[str, dict] = field(default_factory=first_objects)
    users: dict[str, list[int]] = field(default_factory=lambda: {c: [] for c in CLAIMS})
    version: int = 1

    @property
    def labels(self) -> dict[str, str]:
        return {
            claim: labels[OWNER_KEY]
            for claim, obj in self.objects.items()
            if OWNER_KEY in (labels := obj["metadata"].get("labels") or {})
        }

    def snapshot(self) -> Api:
        return Api(copy.deepcopy(self.objects), copy.deepcopy(self.users), self.version)

    def changed(self, claim: str) -> None:
        """Any write to the object (a slot taken or freed, a label) gives it a new version."""
        self.version += 1
        self.objects[claim]["metadata"]["resourceVersion"] = str(self.version)

    def facts(self, claim: str) -> ClaimFacts:
        return ClaimFacts(
            kind=AKRI,
            namespace="ns",
            name=claim,
            resource="cam",
            amount=1 if self.users[claim] else 0,
            labels=dict(self.objects[claim]["metadata"].get("labels") or {}),
            users=tuple(PODS[i] for i in self.users[claim]),
        )

    def write_owner(self, claim: str, seen: Api, queue: str) -> bool:
        """The owner label written as the product writes it, from what the writer saw."""
        meta = seen.objects[claim]["metadata"]
        ops = owner_label_patch(meta.get("labels"), meta["resourceVersion"], OWNER_KEY, queue)
        try:
            self.objects[claim] = json_patch(self.objects[claim], ops)
        except PatchError as exc:
            assert exc.code == 422, exc.message
            return False
        self.changed(claim)
        return True

    def write_other_label(self, claim: str, n: int) -> None:
        """Someone else labels the object (kubectl label, another controller)."""
        meta = self.objects[claim]["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), f"other-{n}": "x"}
        self.changed(claim)


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
            # Read, then the create-only write; won or lost, decide again on what the server
            # holds now (a loss to an unrelated label leaves the write to the next recompute).
            self.api.write_owner(claim, self.api.snapshot(), charge.write_label)
            charge = decide(self.api.facts(claim), WORLD, self.rules)
        self.view[claim] = charge

    def restart(self) -> None:
        self.view = {}
        for claim in CLAIMS:
            self.touch(claim)


events = st.one_of(
    st.tuples(st.just("bind"), st.integers(0, 5), st.sampled_from(CLAIMS[:2])),
    # A bind this engine hears of only later (its watch lags; another replica may act first).
    st.tuples(st.just("bind-unheard"), st.integers(0, 5), st.sampled_from(CLAIMS[:2])),
    st.tuples(st.just("unbind"), st.integers(0, 5), st.sampled_from(CLAIMS[:2])),
    st.tuples(st.just("restart"), st.just(0), st.just("")),
    st.tuples(st.just("replay"), st.just(0), st.just("")),
    # Another replica decided from what it saw some steps ago and writes now.
    st.tuples(st.just("stale"), st.integers(1, 4), st.sampled_from(CLAIMS)),
    # Somebody adds a label of their own (the engine's watch hears of it).
    st.tuples(st.just("other-label"), st.integers(0, 3), st.sampled_from(CLAIMS)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(events, max_size=40), st.sampled_from(["deduct", "attribute"]))
# A replica that heard of a bind (queue b) the engine did not, and writes after the engine
# wrote queue a for a later first bind: the create-only write must lose.
@example(
    [("bind-unheard", 1, "c0"), ("unbind", 1, "c0"), ("bind", 0, "c0"), ("stale", 3, "c0")],
    "deduct",
)
# A replica that saw c1 first bound by queue b writes after p1 left and p0 (queue a) bound
# unheard: c1's labels map is unchanged, so the write lands: b held the first bind.
@example([("bind", 1, "c1"), ("unbind", 1, "c1"), ("bind-unheard", 0, "c1"), ("stale", 3, "c1")],
         "attribute")  # fmt: skip
# Two pods created in the same second, of queues a and b, share c0 before any label: the tie
# goes to the smaller queue name.
@example([("bind-unheard", 1, "c0"), ("bind", 0, "c0"), ("other-label", 0, "c0")], "attribute")
def test_every_interleaving_keeps_one_owner_and_exact_charges(steps, orphans):
    rules = Settings(orphans=orphans)
    api = Api()
    engine = Engine(api, rules)
    engine.restart()
    history: list[Api] = []
    written: dict[str, str] = {}
    last = None
    for what, n, claim in steps:
        history.append(api.snapshot())
        if what == "bind" and n not in api.users[claim]:
            api.users[claim].append(n)
            api.changed(claim)
            engine.touch(claim)
        elif what == "bind-unheard" and n not in api.users[claim]:
            api.users[claim].append(n)
            api.changed(claim)
            engine.pending.add(claim)
        elif what == "unbind" and n in api.users[claim]:
            api.users[claim].remove(n)
            api.changed(claim)
            engine.touch(claim)
        elif what == "restart":
            engine.restart()
        elif what == "replay" and last is not None:
            engine.touch(last)
        elif what == "stale" and len(history) >= n:
            seen = history[-n]
            stale = decide(seen.facts(claim), WORLD, rules)
            if stale.write_label and api.write_owner(claim, seen, stale.write_label):
                engine.touch(claim)  # the label watch brings the write to the engine
        elif what == "other-label":
            api.write_other_label(claim, n)
            engine.touch(claim)
        last = claim or last
        _check(api, engine, rules, written)


def queue_of(i: int) -> str:
    return PODS[i].labels["kai.scheduler/queue"]


def expected_owner(api: Api, claim: str, rules: Settings) -> tuple[str | None, str]:
    """The owner and its source as the rules state them, computed apart from the engine."""
    label = api.labels.get(claim)
    if label is not None:
        return label, LABEL
    users = api.users[claim]
    if not users:
        return None, UNUSED
    queues = {queue_of(i) for i in users}
    if len(queues) == 1:
        return queues.pop(), FIRST_BIND
    if rules.orphans == "deduct":
        return None, ORPHAN_DEDUCTED
    earliest = min((PODS[i].created, queue_of(i)) for i in users)
    return earliest[1], ORPHAN_ATTRIBUTED


def _check(api: Api, engine: Engine, rules: Settings, written: dict[str, str]) -> None:
    for claim, queue in api.labels.items():
        assert written.setdefault(claim, queue) == queue, f"owner of {claim} changed"
    scratch = decide_all((api.facts(c) for c in CLAIMS), WORLD, rules)
    heard = {c.key: c for c in engine.view.values() if c.name not in engine.pending}
    assert heard == {k: c for k, c in scratch.items() if c.name not in engine.pending}
    charged, uncharged = used_total(scratch)
    assert charged + uncharged == sum(1 for c in CLAIMS if api.users[c])
    for charge in scratch.values():
        assert (charge.owner, charge.source) == expected_owner(api, charge.name, rules)
        assert charge.source != NO_QUEUE  # every pod here has a queue
        pays = charge.owner is not None and bool(api.users[charge.name])
        assert (charge.charged, charge.uncharged) == ((1, 0) if pays else (0, charge.amount))
        if charge.owner is not None and not charge.orphan and charge.name not in engine.pending:
            assert api.labels.get(charge.name) == charge.owner
        assert charge.write_label is None or charge.name not in api.labels
        if charge.orphan:
            assert charge.write_label is None  # an orphan's label is left to an operator


@settings(max_examples=200, deadline=None)
@given(st.permutations(range(6)), st.integers(1, 6), st.sampled_from(CLAIMS[:2]))
def test_concurrent_first_binds_from_several_queues_yield_one_owner(order, binders, claim):
    """Writers that each read the object before any of them wrote, and each saw a different
    single first bind, race; the first write wins for all, every other write fails."""
    api = Api()
    seen = api.snapshot()
    views = []
    for i in order[:binders]:
        their = seen.snapshot()
        their.users[claim] = [i]
        views.append((their, decide(their.facts(claim), WORLD, Settings())))
    wins = [v.write_label for their, v in views if api.write_owner(claim, their, v.write_label)]
    assert wins == [views[0][1].write_label]
    api.users[claim] = list(order[:binders])
    for _ in range(3):  # every replica, every restart
        assert decide(api.facts(claim), WORLD, Settings()).owner == wins[0]


# --- the real write against an API server -----------------------------------------------------
RACERS = st.sampled_from(["none", "owner", "other", "owner-same"])


@pytest.mark.django_db
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    first_labels=st.sampled_from([None, {"app": "cam"}]),
    racer=RACERS,
    ours=st.sampled_from(QUEUES),
    theirs=st.sampled_from(QUEUES),
)
def test_the_create_only_write_against_an_api_server(
    kube, monkeypatch, first_labels, racer, ours, theirs
):
    """``write_label`` reads, patches create-only and adopts on a loss; another writer lands
    between its read and its patch: an owner label (theirs), an unrelated label, or nothing."""
    from kubernetes import client

    from agent.kube.client import GROUP, INSTANCES, VERSION
    from agent.queues import labels as labels_module

    custom = client.CustomObjectsApi(kube.api_client)
    name = f"cam-{next(_names)}"
    meta: dict = {"name": name}
    if first_labels is not None:
        meta["labels"] = dict(first_labels)
    body = {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": meta,
        "spec": {"configurationName": "cam", "cdiName": "akri.sh/cam=x", "capacity": 2},
    }
    args = (GROUP, VERSION, kube.namespace, INSTANCES)
    custom.create_namespaced_custom_object(*args, body)
    racer_label = {"owner": theirs, "owner-same": ours, "other": None}.get(racer)

    real_patch = labels_module.LabelTarget.patch

    def patch_after_the_racer(target, ops):
        if racer != "none":
            now = custom.get_namespaced_custom_object(*args, name)["metadata"]
            labels = dict(now.get("labels") or {})
            labels.update({OWNER_KEY: racer_label} if racer_label else {"other": "x"})
            custom.patch_namespaced_custom_object(*args, name, {"metadata": {"labels": labels}})
        return real_patch(target, ops)

    monkeypatch.setattr(labels_module.LabelTarget, "patch", patch_after_the_racer)
    pod = PodFacts("ns", "p", uid="u", labels={"kai.scheduler/queue": ours}, created="t")
    facts = ClaimFacts(AKRI, kube.namespace, name, "cam", 1, dict(first_labels or {}), (pod,))
    charge = decide(facts, WORLD, Settings())
    assert charge.write_label == ours

    after, what = labels_module.write_label(kube.api_client, facts, charge, WORLD, Settings())

    held = custom.get_namespaced_custom_object(*args, name)["metadata"].get("labels") or {}
    if racer == "none":
        assert (what, held.get(OWNER_KEY), after.source) == ("written", ours, LABEL)
    elif racer_label is not None:
        # Lost to another owner label: adopted, whichever queue it names.
        assert (what, held.get(OWNER_KEY), after.owner) == ("adopted", racer_label, racer_label)
        assert after.source == LABEL and after.write_label is None
    else:
        # Lost to an unrelated label: nothing of ours written, the write asked for again.
        assert (what, held.get(OWNER_KEY), after.write_label) == ("adopted", None, ours)
        monkeypatch.setattr(labels_module.LabelTarget, "patch", real_patch)
        again, what = labels_module.write_label(kube.api_client, facts, after, WORLD, Settings())
        held = custom.get_namespaced_custom_object(*args, name)["metadata"]["labels"]
        assert (what, held[OWNER_KEY], held["other"], again.owner) == ("written", ours, "x", ours)
    monkeypatch.undo()


_names = iter(range(10**6))
