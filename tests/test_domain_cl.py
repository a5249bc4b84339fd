"""Configuration-level virtual devices: advertised health and claim plans (seed 001)."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agent.domain.cl import (
    cl_claimable,
    cl_count,
    cl_devices,
    held_vdevs,
    plan_cl_claims,
    preferred_allocation,
)
from agent.domain.claims import (
    ClaimOutcome,
    ReleaseOutcome,
    claim_patch,
    decide_claim,
    decide_release,
    release_patch,
    resize_patch,
)
from agent.domain.errors import InsufficientDevices, InvalidDeviceId
from agent.domain.jsonpatch import JsonPatchError, apply_json_patch
from agent.domain.naming import cl_device_id, instance_digest, instance_name, slot_index, slot_key
from agent.domain.slots import (
    HEALTHY,
    InstanceState,
    UsageKind,
    format_cl,
    format_il,
    il_devices,
    parse_usage,
)

CFG = "akri-onvif"
CAM1 = instance_name(CFG, instance_digest("foo0", True, ""))  # akri-onvif-8120fe
CAM2 = instance_name(CFG, instance_digest("foo1", True, ""))  # akri-onvif-a19705
NODES = ("node-a", "node-b")


def cam(name: str, usage: dict, capacity: int = 2, nodes=NODES) -> InstanceState:
    return InstanceState(name, CFG, capacity, usage, tuple(nodes))


def healthy(devices: list[tuple[str, str]]) -> int:
    return sum(1 for _, health in devices if health == HEALTHY)


def il_healthy(state: InstanceState, node: str) -> int:
    return healthy(il_devices(state.name, state.capacity, state.device_usage, node))


def vd(n: int) -> str:
    return cl_device_id(CFG, n)


# --- Seed 001's worked example ----------------------------------------------------------------


def seed_steps() -> list[list[InstanceState]]:
    """The three deviceUsage states of seed 001, with CL claims in the v0.13 format."""
    step1 = [cam(CAM1, {}), cam(CAM2, {})]
    # node-a's pod takes 2 CL devices: one slot of each camera (8120fe-0, a19705-1).
    step2 = [
        cam(CAM1, {slot_key(CAM1, 0): format_cl(vd(0), "node-a")}),
        cam(CAM2, {slot_key(CAM2, 1): format_cl(vd(1), "node-a")}),
    ]
    # node-b's pod takes a19705 through its IL resource.
    step3 = [
        step2[0],
        cam(
            CAM2,
            {slot_key(CAM2, 0): format_il("node-b"), slot_key(CAM2, 1): format_cl(vd(1), "node-a")},
        ),
    ]
    return [step1, step2, step3]


def test_the_seed_example_names_are_akris():
    assert (CAM1, CAM2) == ("akri-onvif-8120fe", "akri-onvif-a19705")


def scheduler_free(states: list[InstanceState], node: str, unique: bool) -> int:
    """What kube-scheduler sees free on ``node``: its allocatable (the Healthy vdevs) minus the
    requests of the pods there, which hold the vdevs ``node`` holds."""
    return healthy(cl_devices(CFG, states, node, unique)) - len(held_vdevs(states, node, CFG))


@pytest.mark.parametrize(
    ("unique", "cl_listed", "cl_free_a", "cl_free_b"),
    [
        # uniqueDevices true: 2 CL devices at first. After step 2 the seed shows node-a "0
        # (2 - 2)": it caps a node at one CL slot per camera. We let a second pod of node-a
        # take the other slot of each camera (uniqueness binds the devices of one request), so
        # node-a still has 2 free, then 1 once node-b takes a19705's last slot.
        (True, [2, 4, 3], [2, 2, 1], [2, 2, 1]),
        # false: 4 CL devices ("2 * 2"), the flow is otherwise the same.
        (False, [4, 4, 4], [4, 2, 1], [4, 2, 1]),
    ],
)
def test_seed_001_worked_example(unique, cl_listed, cl_free_a, cl_free_b):
    il_a = [[2, 2], [1, 1], [1, 0]]  # seed: 8120fe 2 -> 1 -> 1, a19705 2 -> 1 -> 0 on node-a
    il_b = [[2, 2], [1, 1], [1, 1]]  # node-b holds a19705-0 itself, so it stays Healthy there
    for step, states in enumerate(seed_steps()):
        assert len(cl_devices(CFG, states, "node-a", unique)) == cl_listed[step], step
        assert scheduler_free(states, "node-a", unique) == cl_free_a[step], step
        assert scheduler_free(states, "node-b", unique) == cl_free_b[step], step
        assert [il_healthy(s, "node-a") for s in states] == il_a[step], step
        assert [il_healthy(s, "node-b") for s in states] == il_b[step], step


def apply_plan(states: list[InstanceState], plan, node: str) -> list[InstanceState]:
    by_name = {s.name: dict(s.device_usage) for s in states}
    for vdev, name, key in plan:
        assert by_name[name].get(key, "") == ""
        by_name[name][key] = format_cl(vdev, node)
    return [cam(s.name, by_name[s.name], s.capacity, s.nodes) for s in states]


def test_seed_001_unique_plan_takes_one_slot_of_each_camera():
    states = seed_steps()[0]
    ids = [d for d, h in cl_devices(CFG, states, "node-a", True) if h == HEALTHY]
    plan = plan_cl_claims(states, "node-a", ids, True, CFG)
    assert sorted(name for _, name, _ in plan) == [CAM1, CAM2]
    after = apply_plan(states, plan, "node-a")
    assert scheduler_free(after, "node-a", True) == 2
    assert [il_healthy(s, "node-a") for s in after] == [1, 1]
    # node-b then takes a camera through IL; the other camera still has a slot for CL.
    cam2 = next(s for s in after if s.name == CAM2)
    free = cam2.free_slots()[0]
    after = [after[0], cam(CAM2, {**cam2.device_usage, free: format_il("node-b")})]
    assert scheduler_free(after, "node-b", True) == 1
    with pytest.raises(InsufficientDevices, match="2 unique devices requested, 1 available"):
        plan_cl_claims(after, "node-b", [vd(0), vd(1)], True, CFG)


def test_seed_001_packing_plan_fills_one_camera_first():
    states = seed_steps()[0]
    plan = plan_cl_claims(states, "node-a", [vd(0), vd(1)], False, CFG)
    assert plan == [(vd(0), CAM1, slot_key(CAM1, 0)), (vd(1), CAM1, slot_key(CAM1, 1))]
    after = apply_plan(states, plan, "node-a")
    assert scheduler_free(after, "node-a", False) == 2
    assert [il_healthy(s, "node-a") for s in after] == [0, 2]


# --- cl_devices ------------------------------------------------------------------------------


def test_cl_devices_counts_only_usable_instances_of_the_configuration():
    states = [
        cam(CAM1, {}, nodes=("node-a",)),
        cam(CAM2, {}, nodes=("node-b",)),
        InstanceState("other-8120fe", "other", 2, {}, ("node-a",)),
    ]
    assert cl_devices(CFG, states, "node-a", True) == [(vd(0), HEALTHY)]
    assert cl_devices(CFG, states, "node-a", False) == [(vd(0), HEALTHY), (vd(1), HEALTHY)]
    assert cl_devices(CFG, states, "node-c", True) == []


def test_held_vdevs_stay_healthy_and_the_lowest_free_ones_are_offered():
    states = [
        cam(CAM1, {slot_key(CAM1, 0): format_cl(vd(1), "node-a")}, capacity=3),
        cam(CAM2, {slot_key(CAM2, 0): format_il("node-b")}, capacity=3),
    ]
    assert cl_count(states, "node-a", False, CFG) == 6
    assert cl_claimable(states, "node-a", False, CFG) == 4
    # Held vdev 1 is Healthy (the kubelet keeps it for its pod and counts it in allocatable,
    # which kube-scheduler reduces by the pod's request), and 4 more are offered.
    assert cl_devices(CFG, states, "node-a", False) == [
        (vd(0), HEALTHY),
        (vd(1), HEALTHY),
        (vd(2), HEALTHY),
        (vd(3), HEALTHY),
        (vd(4), HEALTHY),
        (vd(5), "Unhealthy"),
    ]


def test_unique_mode_counts_instances_with_a_free_slot():
    states = [
        cam(CAM1, {slot_key(CAM1, 0): "node-b", slot_key(CAM1, 1): "node-b"}),
        cam(CAM2, {slot_key(CAM2, 0): "node-b"}),
    ]
    assert cl_claimable(states, "node-a", True, CFG) == 1
    assert healthy(cl_devices(CFG, states, "node-a", True)) == 1


def test_held_vdevs_beyond_the_count_stay_listed():
    # CAM2 went away from node-a while node-a held vdev 3 on it.
    states = [
        cam(CAM1, {}),
        cam(CAM2, {slot_key(CAM2, 0): format_cl(vd(3), "node-a")}, nodes=("node-b",)),
    ]
    assert held_vdevs(states, "node-a", CFG) == {vd(3): (CAM2, slot_key(CAM2, 0))}
    assert cl_devices(CFG, states, "node-a", False) == [
        (vd(0), HEALTHY),
        (vd(1), HEALTHY),
        (vd(3), HEALTHY),
    ]


def allocatable_minus_requests(states, node, unique, requests):
    """What kube-scheduler's resource fit sees free: Healthy devices minus the node's requests."""
    return healthy(cl_devices(CFG, states, node, unique)) - requests


def test_the_scheduler_sees_what_the_node_can_still_claim_after_each_cl_pod():
    # Issue 27's reproduction: two Instances of capacity 2 on one node, pods asking 1 each.
    for unique in (True, False):
        states = [cam(CAM1, {}), cam(CAM2, {})]
        held: list[tuple[int, str]] = []  # (instance index, slot key)
        for pod in range(4):
            assert allocatable_minus_requests(states, "node-a", unique, pod) >= 1, (unique, pod)
            plan = plan_cl_claims(states, "node-a", [vd(100 + pod)], unique, CFG)
            ((vdev, name, key),) = plan
            i = 0 if name == CAM1 else 1
            usage = dict(states[i].device_usage)
            usage[key] = format_cl(vdev, "node-a")
            states[i] = cam(name, usage)
            held.append((i, key))
        # Every slot is held: nothing is offered, and nothing is counted twice.
        assert allocatable_minus_requests(states, "node-a", unique, 4) == 0
        assert healthy(cl_devices(CFG, states, "node-a", unique)) == 4


def test_a_held_vdev_offered_again_maps_to_the_slot_it_holds():
    # Its pod ended and the release is not through: the kubelet may hand it to the next pod.
    held = format_cl(vd(0), "node-a")
    states = [cam(CAM1, {slot_key(CAM1, 0): held, slot_key(CAM1, 1): "node-b"}), cam(CAM2, {})]
    assert (vd(0), HEALTHY) in cl_devices(CFG, states, "node-a", True)
    assert plan_cl_claims(states, "node-a", [vd(0)], True, CFG) == [
        (vd(0), CAM1, slot_key(CAM1, 0))
    ]


def test_foreign_and_surplus_slots_are_not_claimable():
    states = [cam(CAM1, {slot_key(CAM1, 0): "C:junk", slot_key(CAM1, 2): "node-a"}, capacity=1)]
    assert cl_claimable(states, "node-a", False, CFG) == 0
    assert healthy(cl_devices(CFG, states, "node-a", False)) == 0


# --- plan_cl_claims --------------------------------------------------------------------------


def test_unique_plan_prefers_instances_with_most_free_slots():
    states = [
        cam(CAM1, {slot_key(CAM1, 0): "node-b"}, capacity=3),
        cam(CAM2, {}, capacity=3),
    ]
    assert plan_cl_claims(states, "node-a", [vd(4)], True, CFG) == [
        (vd(4), CAM2, slot_key(CAM2, 0))
    ]


def test_unique_plan_ties_go_to_the_first_name():
    states = [cam(CAM2, {}), cam(CAM1, {})]
    assert plan_cl_claims(states, "node-a", [vd(0)], True, CFG) == [
        (vd(0), CAM1, slot_key(CAM1, 0))
    ]


def test_unique_plan_refuses_more_devices_than_instances():
    with pytest.raises(InsufficientDevices) as err:
        plan_cl_claims([cam(CAM1, {}), cam(CAM2, {})], "node-a", [vd(0), vd(1), vd(2)], True, CFG)
    assert str(err.value) == "3 unique devices requested, 2 available"
    assert (err.value.requested, err.value.available) == (3, 2)


def test_packing_plan_fills_the_most_used_instance_first():
    states = [
        cam(CAM1, {}, capacity=3),
        cam(CAM2, {slot_key(CAM2, 1): "node-b"}, capacity=3),
    ]
    assert plan_cl_claims(states, "node-a", [vd(0), vd(1), vd(2)], False, CFG) == [
        (vd(0), CAM2, slot_key(CAM2, 0)),
        (vd(1), CAM2, slot_key(CAM2, 2)),
        (vd(2), CAM1, slot_key(CAM1, 0)),
    ]


def test_packing_plan_refuses_more_devices_than_free_slots():
    with pytest.raises(InsufficientDevices, match="5 devices requested, 4 available"):
        plan_cl_claims(
            [cam(CAM1, {}), cam(CAM2, {})], "node-a", [vd(i) for i in range(5)], False, CFG
        )


def test_a_held_vdev_maps_to_its_existing_slot():
    held = format_cl(vd(1), "node-a")
    states = [cam(CAM1, {slot_key(CAM1, 1): held}), cam(CAM2, {})]
    plan = plan_cl_claims(states, "node-a", [vd(1), vd(0)], True, CFG)
    assert plan == [(vd(1), CAM1, slot_key(CAM1, 1)), (vd(0), CAM2, slot_key(CAM2, 0))]
    assert decide_claim(states[0], slot_key(CAM1, 1), held) is ClaimOutcome.ALREADY_OURS


def test_the_same_vdev_of_another_node_is_not_ours():
    states = [cam(CAM1, {slot_key(CAM1, 0): format_cl(vd(0), "node-b")})]
    assert plan_cl_claims(states, "node-a", [vd(0)], True, CFG) == [
        (vd(0), CAM1, slot_key(CAM1, 1))
    ]


@pytest.mark.parametrize("vdevs", [["0"], ["other-0"], [f"{CFG}-01"], [vd(0), vd(0)]])
def test_plan_refuses_ids_that_are_not_this_plugins(vdevs):
    with pytest.raises(InvalidDeviceId):
        plan_cl_claims([cam(CAM1, {})], "node-a", vdevs, True, CFG)


def test_an_empty_request_plans_nothing():
    assert plan_cl_claims([], "node-a", [], True, CFG) == []


def test_preferred_allocation():
    available = [vd(10), vd(2), vd(1), vd(3)]
    assert preferred_allocation(available, [], 2) == [vd(1), vd(2)]
    assert preferred_allocation(available, [vd(10)], 2) == [vd(10), vd(1)]
    assert preferred_allocation(available, [vd(3), vd(2)], 2) == [vd(3), vd(2)]
    assert preferred_allocation(available, [], 9) == [vd(1), vd(2), vd(3), vd(10)]
    assert preferred_allocation(["b", "a-1", "a"], [], 3) == ["a-1", "a", "b"]


# --- Random claims and releases across three nodes -------------------------------------------

SIM_NODES = ["node-a", "node-b", "node-c"]
SIM_INSTANCES = [instance_name(CFG, d) for d in ("aaaaaa", "bbbbbb", "cccccc")]


class SlotMachine(RuleBasedStateMachine):
    """Nodes claim through IL and CL and release, from fresh or stale snapshots, against an
    API-server-like store that applies JSON patches and bumps resourceVersions."""

    def __init__(self) -> None:
        super().__init__()
        self.objects: dict[str, dict] = {}
        self.rv = 0
        self.stale: list[tuple[str, list[dict]]] = []

    def bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    @initialize(data=st.data())
    def create_instances(self, data):
        for name in SIM_INSTANCES:
            capacity = data.draw(st.integers(0, 3))
            nodes = data.draw(st.lists(st.sampled_from(SIM_NODES), unique=True, min_size=1))
            spec = {"configurationName": CFG, "capacity": capacity, "nodes": nodes}
            if data.draw(st.booleans()):  # our Instances pre-fill keys, Akri v0.13's do not
                spec["deviceUsage"] = {slot_key(name, i): "" for i in range(capacity)}
            metadata = {"name": name, "resourceVersion": self.bump()}
            self.objects[name] = {"metadata": metadata, "spec": spec}

    def states(self) -> list[InstanceState]:
        return [InstanceState.from_object(obj) for obj in self.objects.values()]

    def write(self, name: str, ops: list[dict]) -> bool:
        """Apply like the API server: all or nothing; a failed test changes nothing."""
        if not ops:
            return True
        before = self.objects[name]
        try:
            after = apply_json_patch(before, ops)
        except JsonPatchError:  # the API server answers 422 to any of these
            return False
        self.check_transition(before, after)
        after["metadata"]["resourceVersion"] = self.bump()
        self.objects[name] = after
        return True

    def check_transition(self, before: dict, after: dict) -> None:
        # A slot goes free -> held or held -> free, never from one holder to another, and a
        # new holder only ever lands within the capacity of the Instance as written.
        name = after["metadata"]["name"]
        old = before["spec"].get("deviceUsage") or {}
        new = after["spec"].get("deviceUsage") or {}
        for key in set(old) | set(new):
            a, b = parse_usage(old.get(key)), parse_usage(new.get(key))
            if a != b:
                assert a.is_free or b.is_free, (key, a, b)
            if a.is_free and not b.is_free:
                assert slot_index(name, key) < after["spec"]["capacity"], (key, after)

    @rule(data=st.data(), node=st.sampled_from(SIM_NODES), index=st.integers(0, 3))
    def il_claim(self, data, node, index):
        name = data.draw(st.sampled_from(sorted(self.objects)))
        obj = self.objects[name]
        state = InstanceState.from_object(obj)
        key = slot_key(name, index)
        wanted = format_il(node)
        outcome = decide_claim(state, key, wanted)
        if outcome is ClaimOutcome.CLAIM:
            ops = claim_patch(state, key, wanted, obj["metadata"]["resourceVersion"])
            self.stale.append((name, ops))
            assert self.write(name, ops)

    @rule(data=st.data(), node=st.sampled_from(SIM_NODES), unique=st.booleans())
    def cl_claim(self, data, node, unique):
        states = self.states()
        # The kubelet offers Healthy ids its pods do not hold; here every held vdev has its pod.
        held_now = held_vdevs(states, node, CFG)
        healthy_ids = [
            d
            for d, h in cl_devices(CFG, states, node, unique)
            if h == HEALTHY and d not in held_now
        ]
        size = data.draw(st.integers(1, 3))
        if len(healthy_ids) >= size and data.draw(st.booleans()):
            # What kubelet would ask for: any `size` of the ids advertised Healthy.
            vdevs = data.draw(st.permutations(healthy_ids))[:size]
        else:
            vdevs = data.draw(
                st.lists(st.integers(0, 6).map(vd), min_size=size, max_size=size, unique=True)
            )
        try:
            plan = plan_cl_claims(states, node, vdevs, unique, CFG)
        except InsufficientDevices:
            # Kubelet only asks for what is advertised Healthy: that must always be grantable.
            assert not set(vdevs) <= set(healthy_ids)
            return
        names = [name for _, name, _ in plan]
        held = held_vdevs(states, node, CFG)
        if unique:
            new_names = [name for vdev, name, _ in plan if vdev not in held]
            assert len(set(new_names)) == len(new_names)
            assert not set(new_names) & {held[v][0] for v in vdevs if v in held}
        by_name = {s.name: s for s in states}
        for vdev, name, key in plan:
            state = by_name[name]
            wanted = format_cl(vdev, node)
            outcome = decide_claim(state, key, wanted)
            assert outcome in (ClaimOutcome.CLAIM, ClaimOutcome.ALREADY_OURS)
            if outcome is ClaimOutcome.CLAIM:
                assert state.usable_by(node)
                obj = self.objects[name]
                ops = claim_patch(state, key, wanted, obj["metadata"]["resourceVersion"])
                assert self.write(name, ops)
                # Not added to self.stale: a node's CL plugin serializes its Allocates (see
                # agent/domain/cl.py), so its CL decisions are never written late.
                by_name[name] = InstanceState.from_object(self.objects[name])
        assert len(names) == len(vdevs)

    @rule(data=st.data())
    def release(self, data):
        views = [(s, v) for s in self.states() for v in s.views() if not v.usage.is_free]
        if not views:
            return
        state, view = data.draw(st.sampled_from(views))
        outcome = decide_release(state, view.key, view.usage.raw)
        assert outcome is ReleaseOutcome.RELEASE
        ops = release_patch(state, view.key, view.usage.raw)
        self.stale.append((state.name, ops))
        assert self.write(state.name, ops)

    @rule(data=st.data())
    @precondition(lambda self: self.stale)
    def replay_stale_write(self, data):
        # A writer that decided from an old snapshot: it may only succeed if nothing it
        # depends on changed, and must never overwrite a holder (checked in write()).
        name, ops = data.draw(st.sampled_from(self.stale))
        self.write(name, ops)

    @rule(data=st.data(), capacity=st.integers(0, 3))
    def resize(self, data, capacity):
        name = data.draw(st.sampled_from(sorted(self.objects)))
        obj = self.objects[name]
        state = InstanceState.from_object(obj)
        assert self.write(name, resize_patch(state, capacity, obj["metadata"]["resourceVersion"]))

    @invariant()
    def every_value_written_is_one_we_understand(self):
        for obj in self.objects.values():
            for key, value in (obj["spec"].get("deviceUsage") or {}).items():
                assert slot_index(obj["metadata"]["name"], key) is not None, key
                assert parse_usage(value).kind is not UsageKind.FOREIGN, value

    @invariant()
    def a_vdev_has_at_most_one_slot_per_node(self):
        for node in SIM_NODES:
            seen = []
            for state in self.states():
                for view in state.views():
                    if view.usage.kind is UsageKind.CONFIG and view.usage.node == node:
                        seen.append(view.usage.vdev)
            assert len(seen) == len(set(seen)), (node, seen)

    @invariant()
    def allocatable_is_what_is_held_plus_what_can_be_claimed(self):
        # kube-scheduler subtracts the node's requests (its held vdevs) from the Healthy count.
        states = self.states()
        for node in SIM_NODES:
            for unique in (True, False):
                held = held_vdevs(states, node, CFG)
                devices = dict(cl_devices(CFG, states, node, unique))
                assert all(devices.get(vdev) == HEALTHY for vdev in held)
                assert healthy(list(devices.items())) == len(held) + cl_claimable(
                    states, node, unique, CFG
                )


SlotMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_random_claims_and_releases_across_three_nodes = SlotMachine.TestCase
