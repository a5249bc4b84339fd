"""No sequence of add/sub/allocate/release leaves a node's books wrong (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.sharing.akri_slots import ASSIGNMENT, parse_assignment
from agent.sharing.gpu_cards import GPU_INDEX
from agent.sharing.policy import Code, PolicyError
from tests.sharing_world import configs, gpu_node, instance, pod, policies

CONFIGS = configs(("cam", 2, True), ("gpu", 3, False))
INSTANCES = [
    instance("cam-00000a", ("n1",), 2, {0: "n2"}, "cam"),
    instance("cam-00000b", ("n1",), 2, None, "cam"),
    instance("cam-00000c", ("n1",), 2, None, "cam"),
    instance("gpu-00000a", ("n1",), 3, {2: "n1"}, "gpu"),
    instance("gpu-00000b", ("n1",), 3, None, "gpu"),
]
FREE_IN_USAGE = {s.name: set(s.free_slots()) for s in INSTANCES}
RESOURCES = ["akri.sh/cam", "akri.sh/gpu", "akri.sh/cam-00000b", "akri.sh/gpu-00000a"]

ops = st.lists(
    st.tuples(
        st.sampled_from(["allocate", "release", "add", "sub"]),
        st.integers(0, 5),  # which pod
        st.sampled_from(RESOURCES),
        st.integers(1, 4),
    ),
    max_size=40,
)


def check_akri_books(found: dict) -> None:
    book = found["akri-configuration"].slots
    book.check()
    for uid, by_resource in book.assumed.items():
        for resource, keys in by_resource.items():
            for key in keys:
                owner = key.rpartition("-")[0]
                assert key in FREE_IN_USAGE[owner], f"{uid} assumed {key}, busy in deviceUsage"
            if resource == "akri.sh/cam":
                owners = [k.rpartition("-")[0] for k in keys]
                assert len(set(owners)) == len(owners), "unique devices share an Instance"


@settings(max_examples=200, deadline=None)
@given(ops)
def test_akri_books_stay_consistent(sequence):
    found = policies("n1", INSTANCES, CONFIGS, names=["akri-instance", "akri-configuration"])
    pods: dict[int, dict] = {}
    for op, which, resource, count in sequence:
        subject = pods.setdefault(which, pod({resource: count}, node="n1"))
        asked = next(iter(subject["spec"]["containers"][0]["resources"]["limits"]))
        owner = found["akri-configuration" if "-" not in asked else "akri-instance"]
        if op == "allocate":
            try:
                annotations = owner.allocate(subject)
            except PolicyError:
                assert owner.filter_node(subject)[0] is not Code.SUCCESS
            else:
                meta = subject["metadata"]
                meta["annotations"] = {**meta.get("annotations", {}), **annotations}
                assert parse_assignment(meta["annotations"])[0] == "n1"
        elif op == "release":
            owner.release(subject)
        elif op == "add" and ASSIGNMENT in subject["metadata"].get("annotations", {}):
            owner.add_resource(subject)
        elif op == "sub":
            owner.sub_resource(subject)
        check_akri_books(found)
    for subject in pods.values():
        found["akri-instance"].release(subject)
        found["akri-configuration"].release(subject)
    book = found["akri-configuration"].slots
    assert book.assumed == {} and book._taken == {}
    for state in INSTANCES:
        assert set(book.free(state.name)) == FREE_IN_USAGE[state.name]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["allocate", "release", "add", "sub"]),
            st.integers(0, 5),
            st.sampled_from(["volcano.sh/gpu-memory", "volcano.sh/gpu-number"]),
            st.integers(1, 9000),
        ),
        max_size=40,
    )
)
def test_gpu_cards_never_overbook_and_come_back_idle(sequence):
    found = policies("n1", node_obj=gpu_node("n1", 3, 8000), names=["gpushare", "gpu-number"])
    cards = found["gpushare"].gpus
    pods: dict[int, dict] = {}
    for op, which, resource, amount in sequence:
        amount = amount if resource.endswith("memory") else 1 + amount % 3
        subject = pods.setdefault(which, pod({resource: amount}, node="n1"))
        owner = found["gpushare" if "volcano.sh/gpu-memory" in str(subject) else "gpu-number"]
        if op == "allocate" and not any(
            subject["metadata"]["uid"] in p for p in cards.cards.values()
        ):
            try:
                annotations = owner.allocate(subject)
            except PolicyError:
                assert owner.filter_node(subject)[0] is not Code.SUCCESS
            else:
                subject["metadata"]["annotations"] = annotations
        elif op == "release":
            owner.release(subject)
            # Released is gone (deleted, or its bind failed and no annotation was written):
            # no watch brings that pod back, so the next use of this slot is a new pod. A pod
            # re-added after its card went to someone else would overbook from facts, not
            # from any decision of ours (a hypothesis run found exactly that sequence).
            del pods[which]
        elif op == "add" and GPU_INDEX in subject["metadata"].get("annotations", {}):
            owner.add_resource(subject)
        elif op == "sub":
            owner.sub_resource(subject)
        cards.check()
        for card, users in cards.cards.items():
            if len(users) > 1:
                assert sum(users.values()) <= cards.memory_per_card, f"card {card} overbooked"
    for subject in pods.values():
        found["gpushare"].release(subject)
    assert cards.idle_cards() == [0, 1, 2]


# --- the extender's books as the cache catches up (issue 30 §2) --------------------------------
CAMS = configs(("cam", 1, True))
CAM_NAMES = [f"cam-00000{i}" for i in (1, 2, 3)]
NODES = ("n1", "n2")
ASSUME_S = 30.0

books_ops = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.integers(1, 2), st.sampled_from(NODES)),
        # The agent of the pod's node claims one more of its slots; the cache shows it.
        st.tuples(st.just("claim"), st.integers(0, 9), st.just("")),
        # The pod ends: its agent frees what it claimed; the cache shows it.
        st.tuples(st.just("free"), st.integers(0, 9), st.just("")),
        st.tuples(st.just("tick"), st.sampled_from([1, 5, 29, 31]), st.just("")),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(books_ops)
def test_the_extender_never_assigns_a_slot_an_unsettled_bind_holds(sequence):
    """Binds of one or two unique cameras, the agents' claims reaching the cache one slot at a
    time, pods ending, time passing: through the real ``SchedulerState`` fed cache updates as
    the controller feeds it. The model (stated apart): a bind's slots stay taken until the
    cache has shown every one of them claimed by its node at once, or its assumption times out;
    a slot the cache shows held is taken. Every filter answers as the model does, and no
    allocation hands out a taken slot."""
    import json

    from agent.extender.state import SchedulerState
    from agent.sharing.registry import enabled

    clock = [1000.0]
    state = SchedulerState(
        enabled(["akri-instance", "akri-configuration"]),
        assume_seconds=ASSUME_S,
        clock=lambda: clock[0],
    )
    held: dict[str, str] = {}  # slot key -> the value the cache shows
    binds: list[dict] = []  # uid, node, keys, claimed, deadline, alive

    def publish() -> None:
        state.set_inventory(
            [
                instance(name, NODES, 1, {0: held[f"{name}-0"]} if f"{name}-0" in held else None,
                         "cam")
                for name in CAM_NAMES
            ],
            CAMS,
        )  # fmt: skip
        for b in binds:
            if b["alive"] and all(held.get(k, "").endswith(f":{b['node']}") for k in b["keys"]):
                b["alive"] = False  # the cache shows every claim: the assumption ends

    def taken() -> set[str]:
        reserved = {k for b in binds if b["alive"] and clock[0] < b["deadline"] for k in b["keys"]}
        return reserved | set(held)

    publish()
    for op, n, node in sequence:
        if op == "bind":
            asking = pod({"akri.sh/cam": n})
            free = [f"{name}-0" for name in CAM_NAMES if f"{name}-0" not in taken()]
            decision = state.filter(asking, [node])
            assert (decision.fits == [node]) == (len(free) >= n), (decision, free, binds)
            if decision.fits:
                annotations = state.allocate(asking, node)
                keys = json.loads(annotations[ASSIGNMENT])["slots"]["akri.sh/cam"]
                assert set(keys) <= set(free), f"assigned {keys}, free {free}"
                binds.append(
                    dict(uid=asking["metadata"]["uid"], node=node, keys=keys, claimed=[],
                         deadline=clock[0] + ASSUME_S, alive=True)
                )  # fmt: skip
        elif op == "claim" and binds:
            b = binds[n % len(binds)]
            todo = [k for k in b["keys"] if k not in b["claimed"] and k not in held]
            if todo and b.get("ended") is None:
                b["claimed"].append(todo[0])
                held[todo[0]] = f"C:cam-{len(held)}:{b['node']}"
                publish()
        elif op == "free" and binds:
            b = binds[n % len(binds)]
            b["ended"] = True
            for k in b["claimed"]:
                held.pop(k, None)
            b["claimed"] = []
            publish()
        elif op == "tick":
            clock[0] += n
            for b in binds:
                if clock[0] >= b["deadline"]:
                    b["alive"] = False
