"""Random interleavings of allocations, pod lifecycles, restarts and node loss across three
nodes, with fake time; after every step: no slot has two holders, no live pod's slot is free,
and no gone pod's slot outlives the grace plus one sweep.

The test plays the kubelets (health from the API server, devices held per pod, PodResources)
and the pod watch (events queued per node, delivered before time moves, so an Allocate can
come between a pod's end and its event: seed 002's "allocate before delete"). The API server
is the simulator; reconcilers run inline (``workers=0``) on one fake clock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from agent.domain.naming import il_resource_name, slot_key
from agent.kube.claims import ClaimStore, SlotTaken
from agent.kube.client import AkriApi
from agent.models import ReconcileRun
from agent.node.reconcile import NodeReconciler
from agent.reconcile_cluster import run_cluster_pass
from tests.reconcile_world import (
    FakeClock,
    FakePodResources,
    configuration_body,
    make_instance,
    pod_object,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

NODES = ("node-a", "node-b", "node-c")
GRACE = 20.0
SWEEP = 10.0
VISIBLE_AFTER = 5.0  # a kubelet lists an admitted pod well within the grace


@dataclass
class Pod:
    name: str
    node: str
    instance: str
    slot: str
    obj: dict[str, Any]
    born: float
    state: str = "allocated"  # -> running -> gone

    @property
    def alive(self) -> bool:
        return self.state != "gone"


@dataclass
class NodeSim:
    name: str
    kubelet: FakePodResources
    store: ClaimStore
    reconciler: NodeReconciler
    next_sweep: float
    lost: bool = False
    pending: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    api_pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # not deleted in the API


class World:
    def __init__(self, kube: Any) -> None:
        self.kube = kube
        self.namespace = kube.create_namespace()
        self.api = AkriApi(kube.api_client, self.namespace)
        self.clock = FakeClock()
        self.t = 0.0
        self.pods: list[Pod] = []
        self.ended: dict[tuple[str, str], float] = {}  # (node, slot) -> when its last pod went
        core = client.CoreV1Api(kube.api_client)
        self.created_nodes: list[str] = []
        for name in NODES:
            try:
                core.create_node(
                    {
                        "metadata": {"name": name},
                        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                    }
                )
                self.created_nodes.append(name)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        self.api.create_configuration(configuration_body("cams"))
        self.instances = [f"cams-{uuid.uuid4().hex[:6]}" for _ in range(2)]
        for name in self.instances:
            make_instance(self.api, name, capacity=2, nodes=NODES)
        self.slots = [(i, slot_key(i, n)) for i in self.instances for n in range(2)]
        self.nodes = {name: self._node(name) for name in NODES}

    def _reconciler(
        self, node: str, kubelet: FakePodResources, store: ClaimStore
    ) -> NodeReconciler:
        reconciler = NodeReconciler(
            node=node,
            namespace=self.namespace,
            pod_resources=kubelet,
            claims=store,
            grace=GRACE,
            sweep_interval=SWEEP,
            clock=self.clock,
            workers=0,
            watch_pods=False,
            read_pods=False,
        )
        return reconciler

    def _node(self, name: str) -> NodeSim:
        kubelet = FakePodResources()
        store = ClaimStore(self.api, f"agent:{name}")
        reconciler = self._reconciler(name, kubelet, store)
        reconciler.on_pod_relist([])
        return NodeSim(name, kubelet, store, reconciler, SWEEP)

    def close(self) -> None:
        for node in self.nodes.values():
            node.reconciler.stop()
        core = client.CoreV1Api(self.kube.api_client)
        for name in self.created_nodes:  # cluster-scoped: no namespace removal takes them
            try:
                core.delete_node(name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise

    # --- the kubelet's side -----------------------------------------------------------------
    def usage(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for name in self.instances:
            merged.update(self.api.get_instance(name)["spec"].get("deviceUsage") or {})
        return merged

    def _free_on(self, node: str, slot: str) -> bool:
        """The kubelet would offer ``slot``: Healthy (free or ours) and held by no pod here."""
        held_here = any(p.alive and p.node == node and p.slot == slot for p in self.pods)
        return not held_here and self.usage().get(slot, "") in ("", node)

    def allocate(self, node: str, index: int, crash: bool = False) -> None:
        sim = self.nodes[node]
        instance, slot = self.slots[index]
        if sim.lost or not self._free_on(node, slot):
            return
        with sim.reconciler.serialized(instance):
            try:
                sim.store.claim(instance, slot, node, node=node)
            except SlotTaken:
                return  # the race is lost: admission fails, no pod
            if crash:  # the agent dies before the binding; the kubelet's Allocate fails
                # Held with no pod from now: the slot was free, so an earlier end there (a
                # pod, or a crash long since reconciled) does not date this claim.
                self.ended[(node, slot)] = self.t
            else:
                sim.reconciler.on_allocated(
                    node, instance, slot, node, slot, il_resource_name(instance)
                )
        if crash:
            self.restart_agent(node, delete_while_down=False)
            return
        name = f"p{len(self.pods)}"
        obj = pod_object(self.namespace, name, node, phase="Pending")
        self.pods.append(Pod(name, node, instance, slot, obj, self.t))
        self.ended.pop((node, slot), None)
        sim.api_pods[name] = obj
        sim.pending.append(("ADDED", obj))

    def start(self, pod: Pod) -> None:
        if pod.state != "allocated":
            return
        sim = self.nodes[pod.node]
        pod.state = "running"
        pod.obj = {**pod.obj, "status": {"phase": "Running"}}
        sim.api_pods[pod.name] = pod.obj
        sim.kubelet.hold(self.namespace, pod.name, il_resource_name(pod.instance), pod.slot)
        self.deliver(pod.node)
        sim.pending.append(("MODIFIED", pod.obj))
        self.deliver(pod.node)
        sim.reconciler.learn()  # the agent's learn poll, right after the kubelet lists it

    def end(self, pod: Pod, terminate: bool) -> None:
        if not pod.alive:
            return
        sim = self.nodes[pod.node]
        pod.state = "gone"
        sim.kubelet.drop(self.namespace, pod.name)
        self.ended.setdefault((pod.node, pod.slot), self.t)
        if terminate:
            pod.obj = {**pod.obj, "status": {"phase": "Failed"}}
            sim.api_pods[pod.name] = pod.obj
            sim.pending.append(("MODIFIED", pod.obj))
        else:
            sim.api_pods.pop(pod.name, None)
            sim.pending.append(("DELETED", pod.obj))

    def deliver(self, node: str) -> None:
        sim = self.nodes[node]
        events, sim.pending = sim.pending, []
        if sim.lost:
            return
        for kind, obj in events:
            sim.reconciler.on_pod_event(kind, obj)

    # --- failures -------------------------------------------------------------------------------
    def restart_agent(self, node: str, delete_while_down: bool) -> None:
        sim = self.nodes[node]
        if sim.lost:
            return
        sim.reconciler.stop()
        sim.pending.clear()  # events nobody received: the new agent relists
        if delete_while_down:
            victim = next((p for p in self.pods if p.alive and p.node == node), None)
            if victim is not None:
                self.end(victim, terminate=False)
                sim.pending.clear()
        sim.reconciler = self._reconciler(node, sim.kubelet, sim.store)
        sim.reconciler.on_pod_relist(list(sim.api_pods.values()))
        sim.reconciler.sweep(ReconcileRun.Trigger.STARTUP)
        sim.next_sweep = self.t + SWEEP

    def restart_kubelet(self, node: str) -> None:
        sim = self.nodes[node]
        if sim.lost:
            return
        sim.kubelet.available = False
        run = sim.reconciler.sweep()
        assert run.released == 0 and run.errors == 1
        sim.kubelet.available = True

    def lose_node(self, node: str) -> None:
        sim = self.nodes[node]
        if sim.lost or sum(not n.lost for n in self.nodes.values()) == 1:
            return
        sim.lost = True
        sim.reconciler.stop()
        for pod in self.pods:
            if pod.alive and pod.node == node:
                self.end(pod, terminate=False)
        sim.pending.clear()
        core = client.CoreV1Api(self.kube.api_client)
        core.delete_node(node)
        try:
            run = run_cluster_pass(
                self.namespace, api_client=self.kube.api_client, now=self.clock(), grace=60
            )
        finally:
            core.create_node(
                {
                    "metadata": {"name": node},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                }
            )
        assert run is not None and run.errors == 0

    def tick(self, seconds: int) -> None:
        for node in self.nodes:
            self.deliver(node)
        for _ in range(seconds):
            self.t += 1
            self.clock.advance(1)
            for pod in self.pods:
                if (
                    pod.state == "allocated"
                    and not self.nodes[pod.node].lost
                    and self._age(pod) >= VISIBLE_AFTER
                ):
                    self.start(pod)
            for sim in self.nodes.values():
                if not sim.lost and self.t >= sim.next_sweep:
                    sim.reconciler.sweep()
                    sim.next_sweep += SWEEP

    def _age(self, pod: Pod) -> float:
        return self.t - pod.born

    # --- what must hold -----------------------------------------------------------------------
    def check(self) -> None:
        usage = self.usage()
        users: dict[str, list[Pod]] = {}
        for pod in self.pods:
            if pod.alive:
                users.setdefault(pod.slot, []).append(pod)
        for slot, pods in users.items():
            assert len(pods) == 1, f"{slot} has two holders: {[p.name for p in pods]}"
            [pod] = pods
            assert usage.get(slot) == pod.node, (
                f"live pod {pod.name} on {pod.node}: {slot}={usage.get(slot)!r}"
            )
        for _, slot in self.slots:
            holder = usage.get(slot, "")
            if not holder or slot in users:
                continue
            assert not self.nodes[holder].lost, f"{slot} still held by lost {holder}"
            since = self.ended.get((holder, slot))
            assert since is not None, f"{slot} held by {holder} with no pod ever ending there"
            assert self.t - since <= GRACE + SWEEP, (
                f"{slot} held {self.t - since}s after its pod went"
            )


def steps():
    node = st.sampled_from(NODES)
    slot = st.integers(0, 3)
    pick = st.integers(0, 40)
    return st.lists(
        st.one_of(
            st.tuples(st.just("allocate"), node, slot),
            st.tuples(st.just("reuse"), pick),  # the kubelet hands a freed device on at once
            # A pod ends, the kubelet gives its device to the next pod, then the event arrives.
            st.tuples(st.just("handover"), pick, st.booleans()),
            st.tuples(st.just("start"), pick),
            st.tuples(st.just("delete"), pick),
            st.tuples(st.just("terminate"), pick),
            st.tuples(st.just("deliver"), node),
            st.tuples(st.just("crash_allocate"), node, slot),
            # Failures strike a node that has pods, when one has: that is where they can hurt.
            st.tuples(st.just("agent_restart"), pick, st.booleans()),
            st.tuples(st.just("kubelet_restart"), pick),
            st.tuples(st.just("node_loss"), pick),
            st.tuples(st.just("tick"), st.sampled_from([1, 4, 9, 16, 25])),
        ),
        min_size=4,
        max_size=28,
    )


def busy_node(world: World, pick: int) -> str:
    busy = sorted({p.node for p in world.pods if p.alive}) or list(NODES)
    return busy[pick % len(busy)]


def run_steps(world: World, plan: list[tuple]) -> None:
    for step in plan:
        kind = step[0]
        live = [p for p in world.pods if p.alive]
        if kind in ("allocate", "crash_allocate"):
            world.allocate(step[1], step[2], crash=kind == "crash_allocate")
        elif kind == "reuse" and (ended := [p for p in world.pods if not p.alive]):
            pod = ended[step[1] % len(ended)]
            world.allocate(pod.node, world.slots.index((pod.instance, pod.slot)))
        elif kind == "handover" and live:
            pod = live[step[1] % len(live)]
            world.end(pod, terminate=step[2])
            world.allocate(pod.node, world.slots.index((pod.instance, pod.slot)))
            world.deliver(pod.node)  # the pod's end is heard only after the new Allocate
        elif kind == "start" and live:
            world.start(live[step[1] % len(live)])
        elif kind in ("delete", "terminate") and live:
            world.end(live[step[1] % len(live)], terminate=kind == "terminate")
        elif kind == "deliver":
            world.deliver(step[1])
        elif kind == "agent_restart":
            world.restart_agent(busy_node(world, step[1]), step[2])
        elif kind == "kubelet_restart":
            world.restart_kubelet(busy_node(world, step[1]))
        elif kind == "node_loss":
            world.lose_node(busy_node(world, step[1]))
        elif kind == "tick":
            world.tick(step[1])
        world.check()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=steps())
def test_random_interleavings_never_double_book_starve_or_leak(kube, plan):
    world = World(kube)
    try:
        run_steps(world, plan)
    finally:
        world.close()
