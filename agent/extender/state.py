"""The extender's books: one set of sharing policies per node, built from the cluster cache,
plus what the extender itself assigned moments ago and nobody has confirmed yet.

Sources, newest first:
- assumptions: a pod this extender bound is counted at once (``allocate``), on its node and, for
  slots of shared Instances, on every node that sees them, so two pods scheduled back to back
  never both get the last slot. An Akri assumption ends when the agent's claim shows in the
  cache (every assigned slot held by that node; the slots the agent corrected the assignment
  to, once it has), or ``GONE_GRACE`` after the pod is gone (its claims, if any, are in the
  cache by then), or after ``assume_seconds``. A Running pod's assumption is not cut short:
  Running says the claims were written, not that the cache has them. Not when the pod feed shows the pod:
  the agent marks an assignment consumed just before it claims, and a look in that window must
  not make the slot look free. Any other assumption (a GPU card) ends when the pod feed counts
  the pod, or the pod is gone;
- bound pods from the pod watch (their device annotations: Volcano's gpu-index, our
  assignment), which is how a restarted extender relearns what is in flight; a pod that is
  also an assumption counts once (the books are keyed by pod uid). A pod Running for
  ``GONE_GRACE`` no longer reserves an assignment it never took;
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
from agent.sharing.akri_slots import (
    ASSIGNMENT,
    CONSUMED,
    instance_of_slot,
    parse_assignment,
    unconsumed,
)
from agent.sharing.gpu_cards import GPU_INDEX, PREDICATE_TIME
from agent.sharing.pods import EXTENDED, PodView, annotations_of, requests_of, uid_of
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
# How long the assignment of an Akri pod that is gone still counts (see pod_changed): a claim
# write's timeout (agent.node.assignments.TAKE_SETTLE_SECONDS) and the cache's way here. Also
# how long a pod the feed shows Running keeps reserving an assignment it never took, when the
# extender holds no assumption of it (restarted since the bind).
GONE_GRACE = 6.0
DEVICE_KEYS = frozenset({ASSIGNMENT, CONSUMED, GPU_INDEX, PREDICATE_TIME})


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
        # Bumped whenever an input changes (and when an assumption ends): what a pod was
        # refused on may have changed (agent.extender.retry looks again).
        self.version = 0
        # Pods the feed shows Running, and since when (clock); those running for GONE_GRACE are
        # "settled": their Allocate is long done, so an assignment they never took (the
        # agent planned alone) no longer reserves anything; their claims count in the cache.
        self._running: dict[str, float] = {}
        self._settled: set[str] = set()

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
            self.version += 1

    def set_node(self, name: str, obj: Mapping[str, Any]) -> None:
        inputs = node_inputs(obj)
        with self.lock:
            held = self._nodes.get(name)
            if held is None or held[1] != inputs:
                self._nodes[name] = (dict(obj), inputs)
                self._books.pop(name, None)
                self.version += 1

    def set_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Replace the bound pods that hold devices (the pod feed's relist)."""
        by_node: dict[str, list[dict[str, Any]]] = {}
        nodes: dict[str, str] = {}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName") or ""
            if node:
                by_node.setdefault(node, []).append(PodView(pod))
                nodes[uid_of(pod)] = node
        with self.lock:
            old = self._pods_by_node
            self._pods_by_node = {n: tuple(p) for n, p in by_node.items()}
            self._pod_nodes = nodes
            self._running = {u: t for u, t in self._running.items() if u in nodes}
            self._settled &= set(self._running)
            for node in set(old) | set(by_node):
                if old.get(node) != self._pods_by_node.get(node):
                    self._books.pop(node, None)
            # Assumptions of Akri slots stay until the claim shows in the cache: the agent
            # marks an assignment consumed just before it claims, and a relist in between must
            # not make the slot look free. Others end once the feed counts the pod itself.
            for uid in [u for u in self.assumptions if u in nodes]:
                if _counted_by_feed(self.assumptions[uid]):
                    self._forget(uid)
            self._owners_changed()
            self.version += 1

    def pod_changed(self, uid: str, pod: Mapping[str, Any] | None, gone: bool = False) -> None:
        """One pod from the pod watch: bound and holding devices as ``pod`` now, or (None)
        holding nothing; ``gone``: deleted or finished. An assumption of a pod whose devices
        are read from its annotations alone ends once the feed counts the pod, or once it is
        gone (kept, it would hold its card until ``assume_seconds`` after the bind, while
        kube-scheduler has retried the waiting pods on the deletion already). A change the
        books do not read (a status condition, a label) changes nothing here."""
        node = ((pod or {}).get("spec") or {}).get("nodeName") or ""
        # A PodView: its parsed requests are kept across the rebuilds of its node's books.
        new = PodView(pod) if pod is not None and node else None
        with self.lock:
            before = self._pod_nodes.get(uid, "")
            old = _find(self._pods_by_node.get(before, ()), uid)
            assumption = self.assumptions.get(uid)
            if assumption is not None and _counted_by_feed(assumption) and (gone or new):
                self._forget(uid)
            elif assumption is not None and new is not None:
                # Running or not, it ends when the cache shows its claims (of the slots the
                # agent corrected the assignment to, once it has) or after assume_seconds.
                # Not a few seconds after the pod started: its claims were written before
                # the kubelet started it, but reach the cache only through the API server,
                # the controller and its database; on a loaded node that took longer than
                # any fixed grace, and the slots looked free to the next pod, which the
                # kubelet then refused (UnexpectedAdmissionError).
                self._follow(uid, assumption, new)
            elif assumption is not None and gone:
                # An Akri pod gone before the cache showed its claims: the agent claims only
                # for a pod it admitted, within a claim's write; what it claimed shows in the
                # cache by GONE_GRACE, and is then counted there until released. Kept for the
                # whole assume_seconds, its slots stayed taken for that long after the pod.
                self._cap(assumption)
            if new is not None and _running(new):
                # Admitted: its Allocate claimed before the kubelet started it. The slots
                # assigned at bind may not be the ones it got (the agent plans alone when it
                # cannot match the pod to its assignment); counted from the feed (no
                # assumption of ours: we restarted since the bind), they stayed taken until
                # assume_seconds passed. An assumption still counts them (see above).
                self._running.setdefault(uid, self.clock())
            else:
                self._running.pop(uid, None)
                self._settled.discard(uid)
            if old is None and new is None:
                return
            if old is not None and new is not None and before == node:
                same = _device_inputs(old) == _device_inputs(new)
                self._pods_by_node[node] = tuple(
                    new if uid_of(p) == uid else p for p in self._pods_by_node[node]
                )
                if same:
                    return
            else:
                if old is not None:
                    kept = tuple(p for p in self._pods_by_node[before] if uid_of(p) != uid)
                    if kept:
                        self._pods_by_node[before] = kept
                    else:
                        del self._pods_by_node[before]
                    del self._pod_nodes[uid]
                if new is not None:
                    self._pods_by_node[node] = (*self._pods_by_node.get(node, ()), new)
                    self._pod_nodes[uid] = node
            self._books.pop(before, None)
            self._books.pop(node, None)
            if _owns(old, before) != _owns(new, node):
                self._owners_changed()
            self.version += 1

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
            instance_known=self._instance_known,
        )
        policies = [cls(inventory) for cls in self.policy_classes]
        pods = {
            uid_of(p): _without_assignment(p) if uid_of(p) in self._settled else p
            for p in self._pods_by_node.get(node, ())
        }
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

    def _instance_known(self, name: str) -> bool:
        # Read at filter time, not build time: books built before an Instance arrived must
        # not keep calling its name unknown.
        return name in self._instances

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

    def would_fit(self, candidates: Iterable[tuple[str, Pod, list[str]]]) -> list[str]:
        """Of ``candidates`` (uid, pod, nodes), in order, the pods that fit one after
        another: each one that fits is booked on a private copy of its node's books, so that
        one free slot lets one pod through, not every pod that wants it. Nothing is booked
        for real. Pods asking for the same over the same nodes as one that did not fit are
        not looked at again (two hundred waiting replicas cost one look)."""
        found: list[str] = []
        copies: dict[str, NodeBooks] = {}
        hopeless: set[tuple] = set()
        with self.lock:
            self._expire()
            for uid, pod, nodes in candidates:
                view = _view(pod)
                try:
                    wanted = self.interested(view)
                    signature = (tuple(sorted(requests_of(view, EXTENDED).items())), *nodes)
                except PolicyError:
                    continue
                if not wanted or signature in hopeless:
                    continue
                if self._book_on_copy(view, wanted, nodes, copies):
                    found.append(uid)
                else:
                    hopeless.add(signature)
        return found

    def _book_on_copy(
        self, pod: PodView, wanted: list[int], nodes: list[str], copies: dict[str, NodeBooks]
    ) -> bool:
        for node in nodes:
            books = copies.get(node) or self.books(node)
            if any(books.policies[i].filter_node(pod)[0] is not Code.SUCCESS for i in wanted):
                continue
            if node not in copies:  # the shared books are only read; copy before booking
                books = copies[node] = self._build(node, self._inputs(node))
            try:
                for index in wanted:
                    books.policies[index].allocate(pod)
            except PolicyError:
                continue
            return True
        return False

    def status(self, node: str) -> list[tuple[str, str]]:
        with self.lock:
            return [(p.name, p.status()) for p in self.books(node).policies]

    # --- assumptions ------------------------------------------------------------------------
    def _forget(self, uid: str) -> None:
        assumption = self.assumptions.pop(uid, None)
        if assumption is not None:
            self._books.pop(assumption.node, None)
            self._owners_changed()
            self.version += 1

    def _follow(self, uid: str, assumption: Assumption, pod: PodView) -> None:
        """The pod as the feed shows it now carries the assignment the agent corrected after
        admission (the kubelet admits in its own order, and an Allocate may have taken another
        waiting pod's slots): the assumption waits for the claims of those slots, not of the
        ones assigned at bind, which may never be claimed and would stay taken until
        assume_seconds passed."""
        if ASSIGNMENT not in annotations_of(pod):
            return
        if annotations_of(pod).get(ASSIGNMENT) == annotations_of(assumption.pod).get(ASSIGNMENT):
            return
        # The corrected slots, none of them taken yet as far as the books go: the agent marks
        # them consumed before its claims land, and the assumption covers that window.
        meta = dict(assumption.pod.get("metadata") or {})
        meta["annotations"] = {
            **{k: v for k, v in annotations_of(assumption.pod).items() if k != CONSUMED},
            ASSIGNMENT: annotations_of(pod)[ASSIGNMENT],
        }
        self._books.pop(assumption.node, None)
        assumption.pod = {**assumption.pod, "metadata": meta}
        self._owners_changed()
        self._drop_claimed()

    def _cap(self, assumption: Assumption) -> None:
        assumption.deadline = min(assumption.deadline, self.clock() + GONE_GRACE)

    def expire(self) -> None:
        """End the assumptions whose time is up (a filter does it too)."""
        with self.lock:
            self._expire()

    # --- slots of shared Instances assigned on one node count on every node that sees them --
    def _slot_owners(self) -> dict[str, str]:
        if self._owners is None:
            owners: dict[str, str] = {}
            fresh_after = time.time_ns() - int(self.assume_seconds * 1e9)
            for node, pods in self._pods_by_node.items():
                for pod in pods:
                    if uid_of(pod) not in self._settled:
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

    def _settle(self) -> None:
        """Running pods whose grace is over stop reserving their assignment (see _running)."""
        now = self.clock()
        settled = [
            u for u, t in self._running.items() if u not in self._settled and now - t >= GONE_GRACE
        ]
        for uid in settled:
            self._settled.add(uid)
            self._books.pop(self._pod_nodes.get(uid, ""), None)
        if settled:
            self._owners_changed()
            self.version += 1

    def _expire(self) -> None:
        self._settle()
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


def _find(pods: Iterable[dict[str, Any]], uid: str) -> dict[str, Any] | None:
    return next((p for p in pods if uid_of(p) == uid), None)


def _device_inputs(pod: Mapping[str, Any]) -> tuple:
    """What the policies read of a bound pod: its device annotations, requests and phase."""
    annotations = annotations_of(pod)
    devices = tuple(sorted((k, v) for k, v in annotations.items() if k in DEVICE_KEYS))
    spec = pod.get("spec") or {}
    resources = [
        (c.get("resources") or {})
        for key in ("initContainers", "containers")
        for c in spec.get(key) or ()
    ]
    phase = (pod.get("status") or {}).get("phase")
    return devices, repr(resources), phase


def _owns(pod: Mapping[str, Any] | None, node: str) -> dict[str, list[str]]:
    """The slots an assignment still reserves for ``pod`` (what ``_slot_owners`` counts)."""
    return unconsumed(pod, node) if pod is not None else {}


def _running(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def _without_assignment(pod: PodView) -> PodView:
    """A settled pod as the books count it: its other device annotations, no assignment."""
    meta = dict(pod.get("metadata") or {})
    meta["annotations"] = {
        k: v for k, v in annotations_of(pod).items() if k not in (ASSIGNMENT, CONSUMED)
    }
    return PodView({**pod, "metadata": meta})


def _counted_by_feed(assumption: Assumption) -> bool:
    """Whether the pod feed alone counts what the assumed pod holds: true of every device
    annotation but an Akri assignment (see ``set_pods``)."""
    return ASSIGNMENT not in annotations_of(assumption.pod)


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
