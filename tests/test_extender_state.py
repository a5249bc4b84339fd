"""The extender's books without HTTP: assumptions made at bind, and when they end."""

from __future__ import annotations

import json

from agent.extender.retry import Retrier
from agent.extender.state import GONE_GRACE, SchedulerState
from agent.sharing.akri_slots import ASSIGNMENT, CONSUMED
from agent.sharing.gpu_cards import GPU_INDEX, GPU_MEMORY
from agent.sharing.registry import enabled
from tests.sharing_world import assigned, configs, gpu_node, instance, pod

CAM = configs(("cam", 1, True))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state_with(instances, clock=None) -> SchedulerState:
    state = SchedulerState(
        enabled(["akri-instance", "akri-configuration"]),
        assume_seconds=30,
        clock=clock or Clock(),
    )
    state.set_inventory(instances, CAM)
    return state


def test_two_pods_scheduled_back_to_back_do_not_both_get_the_last_slot():
    state = state_with([instance("cam-000001", ("n1",), 1, configuration="cam")])
    first, second = pod({"akri.sh/cam": 1}), pod({"akri.sh/cam": 1})

    assert state.filter(first, ["n1"]).fits == ["n1"]
    state.allocate(first, "n1")
    decision = state.filter(second, ["n1"])

    assert decision.fits == []
    assert decision.failed == {"n1": "1 unique cam devices requested, 0 of 1 free on node n1"}


def test_a_shared_instance_assigned_on_one_node_is_taken_on_every_node_that_sees_it():
    shared = instance("cam-000001", ("n1", "n2"), 1, configuration="cam")
    state = state_with([shared])
    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == ["n1", "n2"]

    state.allocate(pod({"akri.sh/cam": 1}), "n1")

    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == []


def test_the_assumption_ends_when_the_cache_shows_the_agents_claim():
    state = state_with([instance("cam-000001", ("n1", "n2"), 1, configuration="cam")])
    bound = pod({"akri.sh/cam": 1})
    state.allocate(bound, "n1")
    assert state.assumptions

    claimed = instance("cam-000001", ("n1", "n2"), 1, {0: "C:cam-0:n1"}, "cam")
    state.set_inventory([claimed], CAM)

    assert state.assumptions == {}
    assert state.filter(pod({"akri.sh/cam": 1}), ["n2"]).fits == []  # held, per deviceUsage


def test_an_assignment_the_agent_never_claims_times_out():
    clock = Clock()
    state = state_with([instance("cam-000001", ("n1",), 1, configuration="cam")], clock)
    state.allocate(pod({"akri.sh/cam": 1}), "n1")

    clock.now += 29
    assert state.filter(pod({"akri.sh/cam": 1}), ["n1"]).fits == []
    clock.now += 2
    assert state.filter(pod({"akri.sh/cam": 1}), ["n1"]).fits == ["n1"]
    assert state.assumptions == {}


def test_a_failed_binding_gives_the_slots_back_on_every_node():
    state = state_with([instance("cam-000001", ("n1", "n2"), 1, configuration="cam")])
    bound = pod({"akri.sh/cam": 1})
    state.allocate(bound, "n1")

    state.release(bound, "n1")

    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == ["n1", "n2"]


def test_a_pod_the_feed_shows_consumed_keeps_its_slot_until_the_claim_shows():
    # The agent marks the assignment consumed just before it claims: a relist in between
    # must not make the slot look free.
    shared = instance("cam-000001", ("n1", "n2"), 1, configuration="cam")
    state = state_with([shared])
    bound = pod({"akri.sh/cam": 1})
    annotations = state.allocate(bound, "n1")
    consumed = {**annotations, CONSUMED: json.dumps({"akri.sh/cam": 1})}
    bound["metadata"]["annotations"] = consumed
    bound["spec"]["nodeName"] = "n1"

    state.set_pods([bound])

    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == []
    claimed = instance("cam-000001", ("n1", "n2"), 1, {0: "C:cam-0:n1"}, "cam")
    state.set_inventory([claimed], CAM)
    assert state.assumptions == {}
    assert state.filter(pod({"akri.sh/cam": 1}), ["n1", "n2"]).fits == []


def test_a_pod_in_the_feed_and_in_the_assumptions_counts_once():
    state = state_with([instance("cam-000001", ("n1",), 2, configuration="cam")])
    bound = pod({"akri.sh/cam-000001": 1})
    bound["metadata"]["annotations"] = state.allocate(bound, "n1")
    bound["spec"]["nodeName"] = "n1"

    state.set_pods([bound])

    assert state.filter(pod({"akri.sh/cam-000001": 1}), ["n1"]).fits == ["n1"]
    assert state.filter(pod({"akri.sh/cam-000001": 2}), ["n1"]).fits == []


def test_a_pod_we_cannot_read_is_an_error_not_an_exception():
    state = state_with([instance("cam-000001", ("n1",), 1, configuration="cam")])
    broken = pod({"akri.sh/cam": "lots"})

    decision = state.filter(broken, ["n1"])

    assert decision.fits == [] and "not a Kubernetes quantity" in decision.error


def test_spreading_and_packing_score_free_room_opposite_ways():
    state = state_with(
        [
            instance("cam-000001", ("n1",), 1, configuration="cam"),
            instance("cam-000002", ("n2",), 1, {0: "n9"}, "cam"),
            instance("cam-000003", ("n2",), 1, configuration="cam"),
        ]
    )
    asking = pod({"akri.sh/cam": 1})

    assert state.scores(asking, ["n1", "n2"], pack=False) == [("n1", 10), ("n2", 5)]
    assert state.scores(asking, ["n1", "n2"], pack=True) == [("n1", 0), ("n2", 5)]
    assert state.filter(asking, ["n1"]).fits == ["n1"]


def test_a_pod_bound_with_two_slots_keeps_the_unclaimed_one_taken_until_every_claim_shows():
    """Issue 30: the agent claims a pod's slots one Instance at a time, so the cache may show
    the claim of one and not yet the other. The other must still count as taken, or the next
    pod is assigned it too and fails admission at its kubelet."""
    shared = [instance(f"cam-00000{i}", ("n1", "n2"), 1, configuration="cam") for i in (1, 2)]
    state = state_with(shared)
    annotations = state.allocate(pod({"akri.sh/cam": 2}), "n1")
    assigned = json.loads(annotations[ASSIGNMENT])["slots"]["akri.sh/cam"]
    claimed, unclaimed = sorted(assigned)

    def cache_showing(held: set[str]) -> list:
        return [
            instance(
                f"cam-00000{i}",
                ("n1", "n2"),
                1,
                {0: "C:cam-0:n1"} if f"cam-00000{i}-0" in held else None,
                "cam",
            )
            for i in (1, 2)
        ]

    state.set_inventory(cache_showing({claimed}), CAM)

    assert state.assumptions, "dropped while a slot is still unclaimed"
    decision = state.filter(pod({"akri.sh/cam": 1}), ["n2"])
    assert decision.fits == []
    assert decision.failed == {"n2": "1 unique cam devices requested, 0 of 2 free on node n2"}
    assert state.filter(pod({"akri.sh/cam-000002": 1}), ["n2"]).fits == []

    state.set_inventory(cache_showing({claimed, unclaimed}), CAM)

    assert state.assumptions == {}
    assert state.filter(pod({"akri.sh/cam": 1}), ["n2"]).fits == []  # held, per deviceUsage


# --- the pod watch (agent.extender.feed.PodFeed) -------------------------------------------------
def gpu_state(clock: Clock) -> SchedulerState:
    state = SchedulerState(enabled(["gpushare"]), assume_seconds=30, clock=clock)
    state.set_inventory([], {})
    state.set_node("g1", gpu_node("g1", 1, 1000))
    return state


def bound(body: dict, node: str, annotations: dict[str, str]) -> dict:
    meta = {**body["metadata"], "annotations": annotations}
    return {**body, "metadata": meta, "spec": {**body["spec"], "nodeName": node}}


def test_a_gpu_pod_deleted_moments_after_its_bind_frees_its_card_at_once():
    """Its assumption from the bind used to hold the card for assume_seconds (30 s), long
    after kube-scheduler had retried the waiting pod on the deletion."""
    clock = Clock()
    state = gpu_state(clock)
    first, waiting = pod({GPU_MEMORY: 800}), pod({GPU_MEMORY: 800})
    annotations = state.allocate(first, "g1")
    assert state.filter(waiting, ["g1"]).fits == []

    state.pod_changed(first["metadata"]["uid"], None, gone=True)  # deleted before any relist

    assert state.filter(waiting, ["g1"]).fits == ["g1"]
    assert annotations[GPU_INDEX] == "0"


def test_a_gpu_pod_the_watch_shows_bound_is_counted_once_by_the_feed_then_freed():
    clock = Clock()
    state = gpu_state(clock)
    first, waiting = pod({GPU_MEMORY: 800}), pod({GPU_MEMORY: 800})
    annotations = state.allocate(first, "g1")
    uid = first["metadata"]["uid"]
    # The annotation lands before the binding: not a pod the feed counts yet, nor gone.
    state.pod_changed(uid, None)
    assert state.filter(waiting, ["g1"]).fits == [], "the bind's assumption must still count"
    state.pod_changed(uid, bound(first, "g1", annotations))
    assert uid not in state.assumptions
    assert state.filter(waiting, ["g1"]).fits == []
    state.pod_changed(uid, None, gone=True)
    assert state.filter(waiting, ["g1"]).fits == ["g1"]


def test_a_status_change_of_a_counted_pod_leaves_the_books_alone():
    clock = Clock()
    state = gpu_state(clock)
    first = pod({GPU_MEMORY: 800})
    annotations = state.allocate(first, "g1")
    uid = first["metadata"]["uid"]
    state.pod_changed(uid, bound(first, "g1", annotations))
    version = state.version
    running = bound(first, "g1", annotations)
    running["status"] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
    state.pod_changed(uid, running)
    assert state.version == version


def test_an_akri_assignment_outlives_its_pods_deletion_only_for_a_claims_way_here():
    """The slot of a deleted Akri pod stays taken a little while: the agent may be claiming it
    for an Allocate in flight, and that claim then shows in the cache (counted there until
    released). Not for the whole assume_seconds: a deleted pod's room is for the waiting ones."""
    clock = Clock()
    state = state_with([instance("cam-000001", ("n1",), 1, configuration="cam")], clock)
    first, waiting = pod({"akri.sh/cam": 1}), pod({"akri.sh/cam": 1})
    state.allocate(first, "n1")
    state.pod_changed(first["metadata"]["uid"], None, gone=True)
    assert state.filter(waiting, ["n1"]).fits == []
    clock.now += GONE_GRACE
    assert state.filter(waiting, ["n1"]).fits == ["n1"]


def test_an_assumption_follows_the_assignment_the_agent_corrected_after_admission():
    """The kubelet admitted the pods in its own order: the agent gave "first" the slot
    assigned to another pod and rewrote its assignment. The assumption now waits for the claim
    of that slot, not of the one assigned at bind, which nobody will claim."""
    clock = Clock()
    cams = [instance(f"cam-00000{i}", ("n1",), 1, configuration="cam") for i in (1, 2)]
    state = state_with(cams, clock)
    first = pod({"akri.sh/cam": 1})
    annotations = state.allocate(first, "n1")
    given = json.loads(annotations[ASSIGNMENT])["slots"]["akri.sh/cam"][0]
    other = "cam-000002-0" if given == "cam-000001-0" else "cam-000001-0"
    corrected = assigned("n1", {"akri.sh/cam": [other]}, consumed={"akri.sh/cam": 1})
    state.pod_changed(
        first["metadata"]["uid"],
        {
            **first,
            "spec": {**first["spec"], "nodeName": "n1"},
            "metadata": {**first["metadata"], "annotations": corrected},
        },
    )
    held = [
        instance(c.name, ("n1",), 1, held={0: "C:cam-0:n1"}, configuration="cam")
        if f"{c.name}-0" == other
        else c
        for c in cams
    ]
    state.set_inventory(held, CAM)
    assert first["metadata"]["uid"] not in state.assumptions  # its real claim is in the cache
    assert state.filter(pod({"akri.sh/cam": 1}), ["n1"]).fits == ["n1"]  # the other slot


def test_would_fit_lets_one_pod_through_per_free_slot():
    state = state_with(
        [
            instance("cam-000001", ("n1",), 1, configuration="cam"),
            instance("cam-000002", ("n1",), 1, configuration="cam"),
        ]
    )
    pods = [pod({"akri.sh/cam": 1}) for _ in range(5)]
    fitting = state.would_fit((p["metadata"]["uid"], p, ["n1"]) for p in pods)
    assert fitting == [p["metadata"]["uid"] for p in pods[:2]]
    assert state.assumptions == {}  # nothing booked for real
    assert state.filter(pods[4], ["n1"]).fits == ["n1"]


def test_a_name_nobody_knows_yet_is_unschedulable_with_the_reason_in_words():
    state = state_with([instance("cam-000001", ("n1",), 1, configuration="cam")])
    decision = state.filter(pod({"akri.sh/newcfg": 1}), ["n1"])
    assert decision.unresolvable == {}
    assert "akri.sh/newcfg" in decision.failed["n1"]
    assert "known to the extender yet" in decision.failed["n1"]
    # An Instance that exists but that this node cannot see is still unresolvable here.
    state.set_inventory(
        [
            instance("cam-000001", ("n1",), 1, configuration="cam"),
            instance("cam-000002", ("n2",), 1, configuration="cam"),
        ],
        CAM,
    )
    decision = state.filter(pod({"akri.sh/cam-000002": 1}), ["n1"])
    assert decision.failed == {}
    assert "not visible to node n1" in decision.unresolvable["n1"]


# --- asking kube-scheduler again (agent.extender.retry) ------------------------------------------
class Asking(Retrier):
    def __init__(self, state: SchedulerState, clock: Clock) -> None:
        super().__init__(state, None, clock=clock)
        self.written: list[str] = []

    def _ask(self, pod: dict) -> bool:
        self.written.append(pod["metadata"]["name"])
        return True


def test_a_freed_slot_asks_again_for_one_waiting_pod_not_all_of_them():
    clock = Clock()
    state = state_with([instance("cam-000001", ("n1",), 1, configuration="cam")], clock)
    holder = pod({"akri.sh/cam": 1}, name="holder")
    state.allocate(holder, "n1")
    retrier = Asking(state, clock)
    waiting = [pod({"akri.sh/cam": 1}, name=f"w{i}") for i in range(3)]
    for body in waiting:
        decision = state.filter(body, ["n1"])
        assert decision.fits == []
        retrier.refused_pod(body, list(decision.failed))
    assert retrier.step() == []  # nothing changed
    assert retrier.written == []

    state.release(holder, "n1")  # the slot is free again
    assert retrier.step() == [waiting[0]["metadata"]["uid"]]
    assert retrier.written == ["w0"]
    state.set_inventory([instance("cam-000001", ("n1",), 1, configuration="cam")], CAM)
    retrier.step()  # the books changed again; w0's retry is on its way: nobody else asked
    assert retrier.written == ["w0"]

    clock.now += 11  # w0 never came back (deleted, bound elsewhere): the room is offered on
    state.set_inventory([instance("cam-000001", ("n1",), 1, configuration="cam")], CAM)
    retrier.step()
    assert retrier.written == ["w0", "w1"]


def running_as_the_feed_shows_it(bound_pod, annotations, **extra) -> dict:
    return {
        **bound_pod,
        "metadata": {**bound_pod["metadata"], "annotations": {**annotations, **extra}},
        "spec": {**bound_pod["spec"], "nodeName": "n1"},
        "status": {"phase": "Running"},
    }


def test_a_running_pods_assumption_lasts_until_the_cache_shows_its_claims():
    """Running says the agent's claims were written, not that the cache has them: they reach
    the extender through the API server, the controller and its database, which on a loaded
    node took longer than any fixed grace (a real node's burst of 20 for room 10 bound an 11th
    pod, refused by its kubelet). The pod's feed already says consumed, which frees nothing."""
    clock = Clock()
    cams = [instance(f"cam-00000{i}", ("n1",), 1, configuration="cam") for i in (1, 2)]
    state = state_with(cams, clock)
    first = pod({"akri.sh/cam": 1})
    uid = first["metadata"]["uid"]
    annotations = state.allocate(first, "n1")
    state.pod_changed(
        uid, running_as_the_feed_shows_it(first, annotations, **{CONSUMED: '{"akri.sh/cam": 1}'})
    )
    waiting = [pod({"akri.sh/cam": 1}) for _ in range(2)]

    def fit() -> int:
        return len(state.would_fit((p["metadata"]["uid"], p, ["n1"]) for p in waiting))

    clock.now += GONE_GRACE * 4
    assert fit() == 1, "the slot the running pod claimed must stay taken until the cache shows it"

    slot = json.loads(annotations[ASSIGNMENT])["slots"]["akri.sh/cam"][0]
    claimed = [
        instance(c.name, ("n1",), 1, {0: "C:cam-0:n1"} if slot.startswith(c.name) else None, "cam")
        for c in cams
    ]
    state.set_inventory(claimed, CAM)
    assert uid not in state.assumptions
    assert fit() == 1  # now held per deviceUsage


def test_a_running_pods_assumption_follows_the_corrected_assignment_or_times_out():
    """The agent could not match the pod to its assignment and claimed another slot: the one
    assigned at bind is never claimed. Once the agent records what the pod holds, the
    assumption waits for that slot's claim; with no record, it ends after assume_seconds."""
    clock = Clock()
    cams = [instance(f"cam-00000{i}", ("n1",), 1, configuration="cam") for i in (1, 2, 3)]
    state = state_with(cams, clock)
    first, second = pod({"akri.sh/cam": 1}), pod({"akri.sh/cam": 1})
    first_annotations = state.allocate(first, "n1")
    state.allocate(second, "n1")
    assigned_first = json.loads(first_annotations[ASSIGNMENT])
    other = next(
        f"{c.name}-0"
        for c in cams
        if f"{c.name}-0" not in assigned_first["slots"]["akri.sh/cam"]
        and f"{c.name}-0"
        not in state.assumptions[second["metadata"]["uid"]].pod["metadata"]["annotations"][
            ASSIGNMENT
        ]
    )
    corrected = {**assigned_first, "slots": {"akri.sh/cam": [other]}}
    state.pod_changed(
        first["metadata"]["uid"],
        running_as_the_feed_shows_it(
            first,
            {ASSIGNMENT: json.dumps(corrected, sort_keys=True)},
            **{CONSUMED: '{"akri.sh/cam": 1}'},
        ),
    )
    waiting = [pod({"akri.sh/cam": 1}) for _ in range(3)]

    def fit() -> int:
        return len(state.would_fit((p["metadata"]["uid"], p, ["n1"]) for p in waiting))

    assert fit() == 1  # first's corrected slot and second's assumed: one of three free
    state.set_inventory(
        [
            instance(
                c.name, ("n1",), 1, {0: "C:cam-0:n1"} if other.startswith(c.name) else None, "cam"
            )
            for c in cams
        ],
        CAM,
    )
    assert first["metadata"]["uid"] not in state.assumptions
    assert fit() == 1  # the corrected slot held in the cache, second's still assumed

    clock.now += 31  # second was never claimed, nor recorded: its assumption times out
    assert fit() == 2
