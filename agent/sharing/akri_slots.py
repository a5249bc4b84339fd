"""The slot books of one node, shared by the ``akri-instance`` and ``akri-configuration``
policies (a slot taken through either plugin is gone from both), and the assignment
annotation the extender writes on a pod at bind time.

A slot is busy when ``deviceUsage`` says so (the API server's truth, through the cache) or
when a pod is assumed to take it: the extender assigned it at bind and the agent has not
claimed it yet. The two are a union, so a claim that lands before the assumption is dropped
is not counted twice.

Annotation ``akri.sh/assignment`` (written by the extender):
``{"node": "<node>", "at": <unix ns>, "slots": {"akri.sh/<resource>": ["<slot key>", ...]}}``.
Annotation ``akri.sh/assignment-consumed`` (written by the agent as it allocates):
``{"akri.sh/<resource>": <slots taken so far>}``. Slots are taken in the listed order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from agent.domain.naming import AKRI_PREFIX
from agent.domain.slots import InstanceState, UsageKind
from agent.sharing.pods import annotations_of, memo, requests_of, uid_of
from agent.sharing.policy import (
    OK,
    Code,
    NodeInventory,
    Pod,
    PolicyError,
    SharingPolicy,
    Verdict,
)

ASSIGNMENT = "akri.sh/assignment"
CONSUMED = "akri.sh/assignment-consumed"
RESOURCE_PREFIX = AKRI_PREFIX + "/"
SHARED_KEY = "akri.sh/slots"


def akri_requests(pod: Pod) -> dict[str, int]:
    """``akri.sh/*`` requests of a pod, by full resource name."""
    return requests_of(pod, RESOURCE_PREFIX)


def short_name(resource: str) -> str:
    return resource[len(RESOURCE_PREFIX) :]


def parse_assignment(annotations: Mapping[str, Any]) -> tuple[str, int, dict[str, list[str]]]:
    """(node, at, slots by resource) of an assignment annotation; PolicyError when malformed."""
    raw = annotations.get(ASSIGNMENT)
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise PolicyError(f"annotation {ASSIGNMENT} is not a JSON object")
    node, at, slots = value.get("node"), value.get("at"), value.get("slots")
    if not isinstance(node, str) or not isinstance(at, int) or not isinstance(slots, dict):
        raise PolicyError(f"annotation {ASSIGNMENT} lacks node, at or slots")
    for resource, keys in slots.items():
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise PolicyError(f"annotation {ASSIGNMENT}: slots of {resource} are not a list")
    return node, at, slots


def parse_consumed(annotations: Mapping[str, Any]) -> dict[str, int]:
    """Slots the agent has taken so far, by resource; malformed reads as nothing taken."""
    raw = annotations.get(CONSUMED)
    try:
        value = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


def format_assignment(node: str, at: int, slots: Mapping[str, list[str]]) -> str:
    return json.dumps({"node": node, "at": at, "slots": dict(slots)}, sort_keys=True)


def unconsumed(pod: Pod, node: str) -> dict[str, list[str]]:
    """Slots assigned to ``pod`` on ``node`` that the agent has not taken yet."""
    annotations = annotations_of(pod)
    if ASSIGNMENT not in annotations:
        return {}
    try:
        where, _, slots = parse_assignment(annotations)
    except PolicyError:
        return {}
    if where != node:
        return {}
    taken = parse_consumed(annotations)
    left = {r: keys[max(0, taken.get(r, 0)) :] for r, keys in slots.items()}
    return {r: keys for r, keys in left.items() if keys}


def instance_of_slot(key: str) -> str:
    return key.rpartition("-")[0]


class AkriSlots:
    """Free and assumed slots of the Instances one node can see."""

    def __init__(self, inventory: NodeInventory) -> None:
        self.node = inventory.name
        self.assume_ns = int(inventory.assume_seconds * 1e9)
        self.configurations = inventory.configurations
        self.instances: dict[str, InstanceState] = {s.name: s for s in inventory.instances}
        self.instance_known = inventory.instance_known
        self._elsewhere = inventory.reserved  # assumed by pods bound to other nodes
        # Slots free in deviceUsage and not assumed on another node: fixed for these books. A
        # cordoned Instance has none (claimable_slots): no new pod may get one of its slots.
        self._free = {
            s.name: [k for k in s.claimable_slots() if k not in self._elsewhere]
            for s in inventory.instances
        }
        self._cl_held = self._count_cl_held(inventory.instances)
        self._by_config: dict[str, list[InstanceState]] = {}
        for state in sorted(inventory.instances, key=lambda s: s.name):
            self._by_config.setdefault(state.configuration, []).append(state)
        self.assumed: dict[str, dict[str, list[str]]] = {}  # pod uid -> resource -> slots
        self._taken: dict[str, str] = {}  # slot key -> pod uid assumed to take it
        self.at: dict[str, int] = {}  # pod uid -> when it was assigned (unix ns)
        # Counts kept as slots are assumed and forgotten, so that a filter over thousands of
        # nodes compares numbers instead of walking slots (``check`` recounts them).
        self._free_count = {name: len(keys) for name, keys in self._free.items()}
        self._with_free = {
            config: sum(1 for s in states if self._free_count[s.name])
            for config, states in self._by_config.items()
        }
        self._cl_assumed: dict[str, int] = {}

    @classmethod
    def of(cls, inventory: NodeInventory) -> AkriSlots:
        """The node's one shared book (both Akri policies of a node get the same object)."""
        return inventory.shared_book(SHARED_KEY, cls)

    def _count_cl_held(self, states: Iterable[InstanceState]) -> dict[str, int]:
        held: dict[str, int] = {}
        for state in states:
            for view in state.views():
                usage = view.usage
                if usage.kind is UsageKind.CONFIG and usage.node == self.node:
                    held[state.configuration] = held.get(state.configuration, 0) + 1
        return held

    # --- kinds of resource ----------------------------------------------------------------
    def is_configuration(self, resource: str) -> bool:
        return short_name(resource) in self.configurations

    def unknown(self, name: str) -> bool:
        """``akri.sh/<name>`` names neither a Configuration nor an Instance the books know."""
        return (
            self.instance_known is not None
            and name not in self.configurations
            and name not in self.instances
            and not self.instance_known(name)
        )

    def usable(self, configuration: str) -> list[InstanceState]:
        """Instances of ``configuration`` this node can see, by name."""
        return self._by_config.get(configuration, [])

    # --- books ----------------------------------------------------------------------------
    def free(self, instance: str) -> list[str]:
        return [k for k in self._free.get(instance, ()) if k not in self._taken]

    def free_count(self, instance: str) -> int:
        return self._free_count.get(instance, 0)

    def with_free(self, configuration: str) -> int:
        """Instances of ``configuration`` this node sees that have a free slot."""
        return self._with_free.get(configuration, 0)

    def cordon_note(self, states: Iterable[InstanceState]) -> str:
        """The cordons among ``states`` in words, to append to a refusal ("" when none)."""
        notes = [f"Instance {s.name} is {s.cordon.describe()}" for s in states if s.cordon]
        return "; " + "; ".join(notes) if notes else ""

    def cl_held(self, configuration: str) -> int:
        """Slots this node holds or is assumed to hold through the CL plugin."""
        return self._cl_held.get(configuration, 0) + self._cl_assumed.get(configuration, 0)

    def _count(self, resource: str, key: str, step: int) -> None:
        """Keep the counts as ``key`` is taken (step -1) or given back (+1)."""
        state = self.instances.get(instance_of_slot(key))
        if state is not None and key in self._free[state.name]:
            before = self._free_count[state.name]
            self._free_count[state.name] = before + step
            if (before == 0) != (before + step == 0):
                self._with_free[state.configuration] += step
        if self.is_configuration(resource):
            configuration = short_name(resource)
            self._cl_assumed[configuration] = self._cl_assumed.get(configuration, 0) - step

    def assume(self, uid: str, resource: str, keys: list[str], at: int = 0) -> None:
        """Count ``keys`` as taken by pod ``uid``; replaces what it held for ``resource``."""
        self.forget(uid, [resource])
        mine = [k for k in dict.fromkeys(keys) if k not in self._taken and k not in self._elsewhere]
        for key in mine:
            self._taken[key] = uid
            self._count(resource, key, -1)
        self.assumed.setdefault(uid, {})[resource] = mine
        self.at.setdefault(uid, at)

    def forget(self, uid: str, resources: Iterable[str] | None = None) -> None:
        slots = self.assumed.get(uid, {})
        for resource in list(slots) if resources is None else list(resources):
            for key in slots.pop(resource, []):
                if self._taken.get(key) == uid:
                    del self._taken[key]
                    self._count(resource, key, +1)
        if not slots:
            self.assumed.pop(uid, None)
            self.at.pop(uid, None)

    def add_pod(self, pod: Pod, want_configuration: bool) -> None:
        """Assume the pod's unconsumed slots of one kind (CL or IL) on this node."""
        uid = uid_of(pod)
        at = 0
        if ASSIGNMENT in annotations_of(pod):
            try:
                at = parse_assignment(annotations_of(pod))[1]
            except PolicyError:
                at = 0
        if time.time_ns() - at > self.assume_ns:
            return  # assigned too long ago: the agent did not follow it
        for resource, keys in unconsumed(pod, self.node).items():
            if self.is_configuration(resource) == want_configuration:
                self.assume(uid, resource, keys, at)

    def drop_pod(self, pod: Pod, want_configuration: bool) -> None:
        uid = uid_of(pod)
        kinds = [
            r for r in self.assumed.get(uid, {}) if self.is_configuration(r) == want_configuration
        ]
        self.forget(uid, kinds)

    def annotations_for(self, uid: str) -> dict[str, str]:
        """The assignment annotation of everything assumed for ``uid`` on this node."""
        slots = self.assumed.get(uid)
        if not slots:
            return {}
        return {ASSIGNMENT: format_assignment(self.node, self.at.get(uid, 0), slots)}

    def check(self) -> None:
        """Assert the books' invariants (tests): each assumed slot taken by exactly its pod."""
        seen: dict[str, str] = {}
        for uid, slots in self.assumed.items():
            for keys in slots.values():
                for key in keys:
                    assert key not in seen, f"slot {key} assumed by {seen.get(key)} and {uid}"
                    seen[key] = uid
        assert seen == self._taken, "assumed slots and the taken index disagree"
        for name in self._free:
            assert self._free_count[name] == len(self.free(name)), f"free count of {name}"
        for config, states in self._by_config.items():
            with_free = sum(1 for s in states if self.free(s.name))
            assert self._with_free[config] == with_free, f"instances with a free slot, {config}"
        for config in self.configurations:
            assumed = sum(
                len(slots.get(RESOURCE_PREFIX + config, ())) for slots in self.assumed.values()
            )
            assert self._cl_assumed.get(config, 0) == assumed, f"CL slots assumed, {config}"


class AkriSlotPolicy(SharingPolicy):
    """What the two Akri policies share: the node's slot book, and which of a pod's
    ``akri.sh/*`` requests are theirs (Configuration-level names or the others)."""

    configuration_level: ClassVar[bool] = False

    def __init__(self, inventory: NodeInventory) -> None:
        super().__init__(inventory)
        self.slots = AkriSlots.of(inventory)

    def _wanted(self, pod: Pod) -> dict[str, int]:
        mine = self.configuration_level
        return memo(
            pod,
            (self.name, id(self.slots.configurations)),
            lambda: {
                r: n
                for r, n in akri_requests(pod).items()
                if self.slots.is_configuration(r) == mine
            },
        )

    def add_resource(self, pod: Pod) -> None:
        self.slots.add_pod(pod, want_configuration=self.configuration_level)

    def sub_resource(self, pod: Pod) -> None:
        self.slots.drop_pod(pod, want_configuration=self.configuration_level)

    def release(self, pod: Pod) -> None:
        self.slots.drop_pod(pod, want_configuration=self.configuration_level)

    def has_device_request(self, pod: Pod) -> bool:
        return bool(self._wanted(pod))

    def filter_node(self, pod: Pod) -> Verdict:
        try:
            wanted = self._wanted(pod)
        except PolicyError as exc:
            return Code.ERROR, str(exc)
        for resource, count in sorted(wanted.items()):
            verdict = self._fits(short_name(resource), count)
            if verdict[0] is not Code.SUCCESS:
                return verdict
        return OK

    def _fits(self, name: str, count: int) -> Verdict:
        """Whether ``count`` of the resource named ``name`` fit this node now."""
        raise NotImplementedError
