"""Random sequences of Instance-level and Configuration-level allocations and releases across
three nodes, end to end: real agents and kubelet simulators (shared with every example, reset
in between), the API-server simulator over HTTP, real gRPC.

After every step, read from the API server: no Instance holds more than its capacity, every
device a live pod holds maps to exactly one slot and no slot to two pods (nor to none: refused
requests leave nothing behind), and a unique CL request got distinct Instances. Before every
step each kubelet's lists are waited for to match what the slots say, so whether the kubelet
admits a pod is known in advance, and checked: a request is refused exactly when too few
devices are free, never because the lists lagged.

A release is what the kubelet and the reconciler do when a pod ends: ``remove_pod``, then the
node's own claim store frees the slots (no waiting on the reconciler's grace).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent.domain.naming import slot_key
from agent.domain.slots import HEALTHY, UNHEALTHY, InstanceState, UsageKind, format_cl
from agent.kube.claims import ClaimStore
from agent.protos import deviceplugin_pb2 as dp
from agent.simulator.kubelet_types import AdmitResult, PodRecord

from .test_agent_lifecycle import (
    CONFIG,
    FOO0,
    FOO1,
    NODES,
    AgentCluster,
    allocate,
    configuration_body,
    healthy,
    wait_instances,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAPACITY = 2
INSTANCES = (FOO0, FOO1)
CL = f"akri.sh/{CONFIG}"
IL = {name: f"akri.sh/{name}" for name in INSTANCES}
NAMESPACE = "default"

Slot = tuple[str, str]  # (instance, slot key)


@pytest.fixture
def cluster(kube):
    started = AgentCluster(kube).start()
    try:
        started.api.create_configuration(configuration_body(capacity=CAPACITY))
        wait_instances(started, set(INSTANCES))
        # Tests call the Configuration-level plugin at once: it must have registered.
        for kubelet in started.kubelets():
            kubelet.wait_registration(CL, timeout=10)
        yield started
    finally:
        started.stop()


# --- reading the API server ------------------------------------------------------------------


def states(cluster: AgentCluster) -> dict[str, InstanceState]:
    found = {n: InstanceState.from_object(o) for n, o in cluster.instances().items()}
    assert set(found) == set(INSTANCES)
    return found


def held_slots(found: dict[str, InstanceState]) -> dict[Slot, str]:
    return {
        (name, view.key): view.usage.raw
        for name, state in found.items()
        for view in state.views()
        if not view.usage.is_free
    }


def pod_slots(pod: PodRecord, node: str, found: dict[str, InstanceState]) -> list[list[Slot]]:
    """The slots behind each container's devices, as the API server records them."""
    per_container = []
    for container in pod.containers:
        slots: list[Slot] = []
        for resource, ids in container.devices.items():
            for device in ids:
                if resource == CL:
                    value = format_cl(device, node)
                    matches = [s for s, v in held_slots(found).items() if v == value]
                    assert len(matches) == 1, f"{pod.name}: {value} is on slots {matches}"
                    slots.append(matches[0])
                else:
                    instance = resource.removeprefix("akri.sh/")
                    assert found[instance].device_usage.get(device) == node, (pod.name, device)
                    slots.append((instance, device))
        per_container.append(slots)
    return per_container


def check_invariants(cluster: AgentCluster, unique: bool) -> None:
    found = states(cluster)
    for name, state in found.items():
        # Never beyond capacity: the keys are exactly the slots below it (our Instances list
        # free slots as "", so none may be missing either).
        assert state.capacity == CAPACITY
        assert set(state.device_usage) == {slot_key(name, i) for i in range(CAPACITY)}, name
        assert all(v.usage.kind is not UsageKind.FOREIGN for v in state.views()), name
    owners: dict[Slot, str] = {}
    for node in NODES:
        for pod in cluster[node].kubelet.pods():
            for slots in pod_slots(pod, node, found):
                for slot in slots:
                    assert slot not in owners, f"{slot} held by {owners[slot]} and {pod.name}"
                    owners[slot] = pod.name
                if unique and any(CL in c.devices for c in pod.containers):
                    instances = [instance for instance, _ in slots]
                    assert len(set(instances)) == len(instances), f"{pod.name}: {slots}"
    # Every claim belongs to a live pod: refused requests and releases leave nothing.
    assert set(held_slots(found)) == set(owners)


# --- what the kubelets should see ------------------------------------------------------------


def expected_lists(found: dict[str, InstanceState], node: str, unique: bool) -> dict:
    """resource -> {device id: health} on ``node``, from the rules stated plainly (seed 001,
    akri-compat.md §4.3, issue 27): IL slots free or held by this node's IL plugin are
    Healthy; CL vdevs this node holds are Healthy (not Unhealthy as Akri #849 has them, which
    kube-scheduler would count twice), and of the rest the lowest k are Healthy, k = Instances
    with a free slot (unique) or free slots (packing), the others up to the count Unhealthy."""
    held = {
        view.usage.vdev
        for state in found.values()
        for view in state.views()
        if view.usage.kind is UsageKind.CONFIG and view.usage.node == node
    }
    free = {name: len(state.free_slots()) for name, state in found.items()}
    count = len(found) if unique else CAPACITY * len(found)
    k = sum(1 for f in free.values() if f) if unique else sum(free.values())
    others: list[str] = []
    n = 0
    while n < count or len(others) < k:
        if f"{CONFIG}-{n}" not in held:
            others.append(f"{CONFIG}-{n}")
        n += 1
    lists = {
        CL: {
            vdev: HEALTHY if vdev in held or vdev in others[:k] else UNHEALTHY
            for vdev in held | set(others)
        }
    }
    for name, state in found.items():
        lists[IL[name]] = {
            view.key: HEALTHY if view.usage.is_free or view.usage.raw == node else UNHEALTHY
            for view in state.views()
        }
    return lists


def converge(cluster: AgentCluster, unique: bool) -> dict[str, InstanceState]:
    """Wait until every agent has heard of every write so far and every kubelet lists what
    the API server's slots say; return those. (Lists alone could match a view that lags: a
    claim and its release leave the slots as they were.)"""
    assert cluster.sync.drain()
    found = states(cluster)
    for node in NODES:
        kubelet = cluster[node].kubelet
        wanted = expected_lists(found, node, unique)

        def listed(k=kubelet, w=wanted) -> dict[str, dict[str, str]]:
            return {r: s.devices for r, s in k.resources().items() if r in w}

        kubelet.wait_for(lambda k=kubelet, w=wanted: listed(k, w) == w)
        assert listed() == wanted, node
    return found


# --- steps -------------------------------------------------------------------------------------


class Run:
    def __init__(self, cluster: AgentCluster, unique: bool) -> None:
        self.cluster = cluster
        self.unique = unique
        self.names = (f"p{n}" for n in itertools.count())

    def admit(self, node: str, resource: str, count: int) -> AdmitResult:
        containers = [{"name": "c", "requests": {resource: count}}]
        return self.cluster[node].kubelet.admit_pod(NAMESPACE, next(self.names), containers)

    def allocate(self, node: str, resource: str, count: int) -> None:
        found = converge(self.cluster, self.unique)
        before = held_slots(found)
        if resource == CL:  # the vdevs the node's pods hold are Healthy, but allocated
            held = {
                v.usage.vdev
                for s in found.values()
                for v in s.views()
                if v.usage.node == node and v.usage.kind is UsageKind.CONFIG
            }
            free = len(healthy(expected_lists(found, node, self.unique)[CL]) - held)
        else:  # the node's own IL slots are Healthy, but allocated to its pods
            free = len(found[resource.removeprefix("akri.sh/")].free_slots())

        result = self.admit(node, resource, count)

        assert result.admitted == (count <= free), (node, resource, count, free, result.error)
        event(f"{'CL' if resource == CL else 'IL'} {'admitted' if result.admitted else 'refused'}")
        if not result.admitted:
            assert held_slots(states(self.cluster)) == before

    def race(self, requests: list[tuple[str, str, int]]) -> None:
        """Two nodes admit at the same moment; only the invariants are certain."""
        converge(self.cluster, self.unique)
        barrier = threading.Barrier(len(requests))

        def go(node: str, resource: str, count: int) -> None:
            barrier.wait()
            self.admit(node, resource, count)

        threads = [threading.Thread(target=go, args=r) for r in requests]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def release(self, pick: int) -> None:
        live = [(node, pod) for node in NODES for pod in self.cluster[node].kubelet.pods()]
        if not live:
            return
        node, pod = live[pick % len(live)]
        self.end(node, pod)

    def end(self, node: str, pod: PodRecord) -> None:
        found = states(self.cluster)
        slots = [s for c in pod_slots(pod, node, found) for s in c]
        assert self.cluster[node].kubelet.remove_pod(pod.namespace, pod.name)
        agent = self.cluster[node].agent
        for instance, key in slots:
            value = found[instance].device_usage[key]
            outcome = agent.claims.release(
                instance, key, value, node=node, detail=f"pod {pod.name} ended"
            )
            assert outcome == "released", (instance, key, outcome)

    def reset(self) -> None:
        """Every pod gone and every slot freed (also what a failed example left behind, so
        shrinking sees each example on its own); the policy this example runs with."""
        for node in NODES:
            for pod in self.cluster[node].kubelet.pods():
                self.cluster[node].kubelet.remove_pod(pod.namespace, pod.name)
        found = states(self.cluster)
        for (instance, key), value in held_slots(found).items():
            holder = found[instance].usage(key).node
            self.cluster[holder].agent.claims.release(instance, key, value, node=holder)
        assert held_slots(states(self.cluster)) == {}
        spec = self.cluster.api.get_configuration(CONFIG)["spec"]
        if spec.get("uniqueDevices", True) != self.unique:
            self.cluster.api.patch_configuration(
                CONFIG, [{"op": "replace", "path": "/spec/uniqueDevices", "value": self.unique}]
            )
        converge(self.cluster, self.unique)


kind_st = st.one_of(
    st.tuples(st.just(CL), st.integers(1, 3)),
    st.tuples(st.sampled_from(sorted(IL.values())), st.integers(1, 2)),
)
step_st = st.one_of(
    st.tuples(st.just("allocate"), st.sampled_from(NODES), kind_st),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("race"), st.permutations(NODES), kind_st, kind_st),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(unique=st.booleans(), plan=st.lists(step_st, min_size=1, max_size=10))
def test_random_il_and_cl_allocations_never_overbook_double_book_or_repeat_an_instance(
    cluster: Any, unique: bool, plan: list[tuple]
):
    run = Run(cluster, unique)
    run.reset()
    for step in plan:
        if step[0] == "allocate":
            run.allocate(step[1], *step[2])
        elif step[0] == "release":
            run.release(step[1])
        else:
            nodes, first, second = step[1:]
            run.race([(nodes[0], *first), (nodes[1], *second)])
        check_invariants(cluster, unique)
    converge(cluster, unique)


def test_a_release_the_view_has_not_heard_of_does_not_refuse_a_cl_request(cluster):
    """Pinned from the property test: node-a's view still had a slot held that the API server
    had freed, and the CL plugin refused "2 unique devices requested, 1 available" instead of
    asking the API server, as the claim store does before it decides to write nothing."""
    node_b = cluster["node-b"].agent.claims
    node_b.claim(FOO0, f"{FOO0}-0", "node-b", node="node-b")
    node_b.claim(FOO0, f"{FOO0}-1", "node-b", node="node-b")
    assert cluster.sync.drain()
    cluster.sync.instances.stop()  # from here on node-a hears of no change
    ClaimStore(cluster.api, "agent:node-b").release(FOO0, f"{FOO0}-1", "node-b")
    assert cluster["node-a"].agent.view.state(FOO0).free_slots() == []

    answer = allocate(cluster["node-a"].kubelet, CL, [f"{CONFIG}-0", f"{CONFIG}-1"])

    assert isinstance(answer, dp.AllocateResponse), answer
    assert cluster.usage(FOO0) == {f"{FOO0}-0": "node-b", f"{FOO0}-1": f"C:{CONFIG}-1:node-a"}
    assert cluster.usage(FOO1) == {f"{FOO1}-0": f"C:{CONFIG}-0:node-a", f"{FOO1}-1": ""}
