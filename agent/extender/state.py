"""The extender's books: one set of sharing policies per node, built from the cluster cache,
plus what the extender itself assigned moments ago and nobody has confirmed yet.

Sources, newest first:
- assumptions: a pod this extender bound is counted at once (``allocate``), on its node and, for
  slots of shared Instances, on every node that sees them, so two pods scheduled back to back
  never both get the last slot. An assumption ends when the agent's claim shows in the cache
  (every assigned slot held by that node) or after ``assume_seconds``. Not when the pod feed
  shows the pod: the agent marks an assignment consumed just before it claims, and a relist
  in that window must not make the slot look free;
- bound pods from the pod feed (their device annotations: Volcano's gpu-index, our
  assignment), which is how a restarted extender relearns what is in flight; a pod that is
  also an assumption counts once (the books are keyed by pod uid);
- the inventory: Instances and Configurations from the controller's ORM cache, Node objects
  from the node feed or from the scheduler's own request.

A node's policies are built on first use and dropped when one of their inputs changes (found
once per change, Instances compared by identity: the feed reuses unchanged objects), so a
filter over thousands of nodes only reads. One lock serializes everything: policies are not thread-safe, and
the work under it is short (no I/O).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.domain.slots import InstanceState
from agent.sharing.akri_slots import ASSIGNMENT, instance_of_slot, parse_assignment, unconsumed
from agent.sharing.pods import PodView, annotations_of, uid_of
from agent.sharing.policy import (
    Code,
    ConfigurationInfo,
    NodeInventory,
    Pod,
    PolicyError,
    SharingPolicy,
    Verdict,
)

MAX_SCORE = 10


@dataclass
class Assumption:
    pod: dict[str, Any]
    node: str
    deadline: float


@dataclass
class NodeBooks:
    inventory: NodeInventory
    policies: list[SharingPolicy]
    inputs: tuple


@dataclass
class Decision:
    """A filter's outcome: nodes that fit, and why the others do not."""

    fits: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    error: str = ""
    # False when no enabled policy shares anything the pod asks for (every node fits).
    interested: bool = True


def node_inputs(obj: Mapping[str, Any] | None) -> tuple:
    """What of a Node object the policies read: capacity and annotations."""
    if not obj:
        return ()
    capacity = (obj.get("status") or {}).get("capacity") or {}
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return (tuple(sorted(capacity.items())), tuple(sorted(annotations.items())))


class SchedulerState:
    def __init__(
        self,
        policies: Iterable[type[SharingPolicy]],
        *,
        assume_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy_classes = list(policies)
        self.assume_seconds = assume_seconds
        self.clock = clock
        self.lock = threading.RLock()
        self._instances: dict[str, InstanceState] = {}
        self._by_node: dict[str, tuple[InstanceState, ...]] = {}
        self._configurations: Mapping[str, ConfigurationInfo] = {}
        self._nodes: dict[str, tuple[dict[str, Any], tuple]] = {}
        self._pods_by_node: dict[str, tuple[dict[str, Any], ...]] = {}
        self._pod_nodes: dict[str, str] = {}  # uid -> node, of pods in the feed
        self.assumptions: dict[str, Assumption] = {}
        self._books: dict[str, NodeBooks] = {}
        self._probe: NodeBooks | None = None
        self._owners: dict[str, str] | None = None  # assigned, unclaimed slot -> its node

    # --- inputs -----------------------------------------------------------------------------
    def set_inventory(
        self, instances: Iterable[InstanceState], configurations: Mapping[str, ConfigurationInfo]
    ) -> None:
        """Replace the Instances and Configurations (unchanged objects should be the same
        objects as before, so the nodes they concern keep their books)."""
        by_node: dict[str, list[InstanceState]] = {}
        states = {}
        for state in instances:
            states[state.name] = state
            for node in state.nodes:
                by_node.setdefault(node, []).append(state)
        fresh = {node: tuple(found) for node, found in by_node.items()}
        with self.lock:
            old = self._by_node
            self._instances = states
            self._by_node = fresh
            if configurations != self._configurations:
                self._configurations = dict(configurations)
                self._books.clear()
            else:
                # Compared here, once per change, so that a filter never compares inputs.
                for node in old.keys() | fresh.keys():
                    if not _same_states(old.get(node, ()), fresh.get(node, ())):
                        self._books.pop(node, None)
            self._probe = None
            self._drop_claimed()

    def set_node(self, name: str, obj: Mapping[str, Any]) -> None:
        inputs = node_inputs(obj)
        with self.lock:
            held = self._nodes.get(name)
            if held is None or held[1] != inputs:
                self._nodes[name] = (dict(obj), inputs)
                self._books.pop(name, None)

    def set_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Replace the bound pods that hold devices (the pod feed's relist)."""
        by_node: dict[str, list[dict[str, Any]]] = {}
        nodes: dict[str, str] = {}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName") or ""
            if node:
                by_node.setdefault(node, []).append(dict(pod))
                nodes[uid_of(pod)] = node
        with self.lock:
            old = self._pods_by_node
            self._pods_by_node = {n: tuple(p) for n, p in by_node.items()}
            self._pod_nodes = nodes
            for node in set(old) | set(by_node):
                if old.get(node) != self._pods_by_node.get(node):
                    self._books.pop(node, None)
            # Assumptions stay until the claim shows in the cache: the agent marks an
            # assignment consumed just before it claims, and a relist in between must not
            # make the slot look free.
            self._owners_changed()

    # --- books ------------------------------------------------------------------------------
    def _inputs(self, node: str) -> tuple:
        held = self._nodes.get(node)
        return (self._by_node.get(node, ()), held[1] if held else ())

    def books(self, node: str) -> NodeBooks:
        """The node's policies; built on first use and dropped whenever one of their inputs
        changes (Instances, Node object, pods, assignments). Call with the lock held."""
        books = self._books.get(node)
        if books is None:
            books = self._build(node, self._inputs(node))
            # Kept only for a node the books know of: names of no node (a scheduler's list
            # ahead of the node feed, or made up) must not grow the books for good.
            if self._known(node):
                self._books[node] = books
        return books

    def _known(self, node: str) -> bool:
        return (
            node in self._nodes
            or node in self._by_node
            or node in self._pods_by_node
            or any(a.node == node for a in self.assumptions.values())
        )

    def _build(self, node: str, inputs: tuple) -> NodeBooks:
        held = self._nodes.get(node)
        visible = {state.name for state in inputs[0]}
        reserved = frozenset(
            key
            for key, owner in self._slot_owners().items()
            if owner != node and instance_of_slot(key) in visible
        )
        inventory = NodeInventory(
            name=node,
            node=held[0] if held else {},
            instances=inputs[0],
            configurations=self._configurations,
            assume_seconds=self.assume_seconds,
            reserved=reserved,
        )
        policies = [cls(inventory) for cls in self.policy_classes]
        pods = {uid_of(p): p for p in self._pods_by_node.get(node, ())}
        for uid, assumption in self.assumptions.items():
            if assumption.node == node:
                pods[uid] = assumption.pod
        for pod in pods.values():
            for policy in policies:
                try:
                    if policy.has_device_request(pod):
                        policy.add_resource(pod)
                except PolicyError:
                    continue  # a pod we cannot read holds nothing we can count
        return NodeBooks(inventory, policies, inputs)

    def interested(self, pod: Pod) -> list[int]:
        """Indexes of the policies that share something ``pod`` asks for (PolicyError when
        the pod cannot be read)."""
        with self.lock:
            if self._probe is None:
                self._probe = self._build("", ((), ()))
            return [i for i, p in enumerate(self._probe.policies) if p.has_device_request(pod)]

    # --- scheduling -------------------------------------------------------------------------
    def filter(self, pod: Pod, nodes: Iterable[str]) -> Decision:
        pod = _view(pod)
        decision = Decision()
        try:
            wanted = self.interested(pod)
        except PolicyError as exc:
            decision.error = f"cannot read the pod: {exc}"
            return decision
        decision.interested = bool(wanted)
        with self.lock:
            self._expire()
            for node in nodes:
                code, reason = self._verdict(node, wanted, pod)
                if code is Code.SUCCESS:
                    decision.fits.append(node)
                elif code is Code.UNRESOLVABLE:
                    decision.unresolvable[node] = reason
                else:
                    decision.failed[node] = reason
        return decision

    def _verdict(self, node: str, wanted: list[int], pod: Pod) -> Verdict:
        if not wanted:
            return Code.SUCCESS, ""
        policies = self.books(node).policies
        for index in wanted:
            verdict = policies[index].filter_node(pod)
            if verdict[0] is not Code.SUCCESS:
                return verdict
        return Code.SUCCESS, ""

    def scores(self, pod: Pod, nodes: Iterable[str], pack: bool) -> list[tuple[str, int]]:
        """0-10 per node: more free room scores higher when spreading, lower when packing."""
        pod = _view(pod)
        try:
            wanted = self.interested(pod)
        except PolicyError:
            wanted = []
        result = []
        with self.lock:
            for node in nodes:
                fractions = []
                if wanted:
                    policies = self.books(node).policies
                    fractions = [policies[i].free_fraction(pod) for i in wanted]
                known = [f for f in fractions if f is not None]
                free = sum(known) / len(known) if known else 0.5
                score = (1 - free) if pack else free
                result.append((node, max(0, min(MAX_SCORE, round(score * MAX_SCORE)))))
        return result

    def allocate(self, pod: Pod, node: str) -> dict[str, str]:
        """Book ``pod``'s devices on ``node``; the annotations to write (PolicyError: no fit,
        nothing booked). The pod counts as assumed on the node until confirmed or timed out."""
        pod = _view(pod)
        wanted = self.interested(pod)
        with self.lock:
            self._expire()
            policies = self.books(node).policies
            annotations: dict[str, str] = {}
            done: list[SharingPolicy] = []
            try:
                for index in wanted:
                    annotations.update(policies[index].allocate(pod))
                    done.append(policies[index])
            except PolicyError:
                for policy in done:
                    policy.release(pod)
                raise
            if wanted:
                assumed = _with_annotations(pod, annotations, node)
                self.assumptions[uid_of(pod)] = Assumption(
                    assumed, node, self.clock() + self.assume_seconds
                )
                self._owners_changed()
            return annotations

    def adopt(self, pod: Pod, node: str) -> None:
        """Count a pod bound to ``node`` as its annotations say (a retried or foreign bind),
        replacing what ``allocate`` booked for it."""
        with self.lock:
            self._books.pop(node, None)
            self._forget(uid_of(pod))
            self.assumptions[uid_of(pod)] = Assumption(
                dict(pod), node, self.clock() + self.assume_seconds
            )
            self._books.pop(node, None)
            self._owners_changed()

    def release(self, pod: Pod, node: str) -> None:
        """Undo ``allocate`` (the binding failed)."""
        with self.lock:
            self._books.pop(node, None)
            self._forget(uid_of(pod))

    def status(self, node: str) -> list[tuple[str, str]]:
        with self.lock:
            return [(p.name, p.status()) for p in self.books(node).policies]

    # --- assumptions ------------------------------------------------------------------------
    def _forget(self, uid: str) -> None:
        assumption = self.assumptions.pop(uid, None)
        if assumption is not None:
            self._books.pop(assumption.node, None)
            self._owners_changed()

    # --- slots of shared Instances assigned on one node count on every node that sees them --
    def _slot_owners(self) -> dict[str, str]:
        if self._owners is None:
            owners: dict[str, str] = {}
            fresh_after = time.time_ns() - int(self.assume_seconds * 1e9)
            for node, pods in self._pods_by_node.items():
                for pod in pods:
                    _add_owned(owners, pod, node, fresh_after)
            for assumption in self.assumptions.values():
                _add_owned(owners, assumption.pod, assumption.node, fresh_after)
            self._owners = owners
        return self._owners

    def _owners_changed(self) -> None:
        """Drop the books of every other node that sees a slot whose owner changed."""
        before = self._owners or {}
        self._owners = None
        after = self._slot_owners()
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        for key in changed:
            state = self._instances.get(instance_of_slot(key))
            for node in state.nodes if state is not None else ():
                self._books.pop(node, None)

    def _expire(self) -> None:
        now = self.clock()
        for uid, assumption in list(self.assumptions.items()):
            if assumption.deadline <= now:
                self._forget(uid)

    def _drop_claimed(self) -> None:
        """Assumptions whose every assigned slot the cache now shows held by their node."""
        for uid, assumption in list(self.assumptions.items()):
            annotations = annotations_of(assumption.pod)
            if ASSIGNMENT not in annotations:
                continue
            try:
                _, _, slots = parse_assignment(annotations)
            except PolicyError:
                continue
            keys = [key for keys in slots.values() for key in keys]
            if keys and all(self._held_by(key, assumption.node) for key in keys):
                self._forget(uid)

    def _held_by(self, key: str, node: str) -> bool:
        state = self._instances.get(key.rpartition("-")[0])
        return state is not None and state.usage(key).held_by(node)


def _add_owned(owners: dict[str, str], pod: Pod, node: str, fresh_after: int) -> None:
    annotations = annotations_of(pod)
    if ASSIGNMENT not in annotations:
        return
    try:
        at = parse_assignment(annotations)[1]
    except PolicyError:
        return
    if at < fresh_after:
        return
    for keys in unconsumed(pod, node).values():
        for key in keys:
            owners.setdefault(key, node)


def _view(pod: Pod) -> PodView:
    return pod if isinstance(pod, PodView) else PodView(pod)


def _same_states(a: tuple, b: tuple) -> bool:
    """Equal by identity: the feed keeps the object of an Instance that did not change."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _with_annotations(pod: Pod, annotations: Mapping[str, str], node: str) -> dict[str, Any]:
    meta = dict(pod.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    spec = dict(pod.get("spec") or {})
    spec["nodeName"] = node
    return {**pod, "metadata": meta, "spec": spec}
