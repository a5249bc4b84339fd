"""The sharing-policy interface, for one node (seed 004's ``Devices``).

A policy object holds one node's books for one kind of device. The extender builds one per
enabled policy per node from a ``NodeInventory`` (what the cluster cache shows of that node),
feeds it the pods that hold or are assumed to hold its devices (``add_resource`` /
``sub_resource``), asks ``filter_node`` for each pod being scheduled, and on bind calls
``allocate``, which books the devices and returns the annotations to write on the pod.
``release`` undoes an ``allocate`` whose binding failed.

Pods are plain Kubernetes JSON dicts (camelCase), as the scheduler sends them. Filter codes
are the scheduler framework's: Success, Error, Unschedulable (preemption might help) and
UnschedulableAndUnresolvable (it would not: the node lacks the device altogether).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agent.domain.slots import InstanceState

Pod = Mapping[str, Any]


class Code(enum.IntEnum):
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNRESOLVABLE = 3  # UnschedulableAndUnresolvable


Verdict = tuple[Code, str]
OK: Verdict = (Code.SUCCESS, "")


class PolicyError(Exception):
    """A pod a policy cannot read (bad quantity, bad annotation): Code.ERROR for that pod."""


@dataclass(frozen=True)
class ConfigurationInfo:
    """The parts of a Configuration the Akri policies need."""

    name: str
    capacity: int = 1
    unique_devices: bool = True


@dataclass
class NodeInventory:
    """What the cluster cache shows of one node, for building its policies.

    ``instances``: the Instances that list this node (``spec.nodes``). ``configurations``: every
    Configuration of the namespace, visible or not, so that a policy can tell "no such
    Configuration" from "none of its Instances here". ``node``: the Node object (capacity,
    annotations), ``{}`` when unknown. ``shared``: scratch space of the node's policies, for
    books two policies keep together (IL and CL requests take slots of the same Instances).
    """

    name: str
    node: Mapping[str, Any] = field(default_factory=dict)
    instances: tuple[InstanceState, ...] = ()
    configurations: Mapping[str, ConfigurationInfo] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    # How long a device assigned at bind counts as taken before the agent's claim shows.
    assume_seconds: float = 30.0
    # Slots of shared Instances assigned to pods on other nodes and not claimed yet: taken
    # here too (the Instance is one device, whichever node's pod gets it).
    reserved: frozenset[str] = frozenset()
    # Whether an Instance of that name exists anywhere the books know (None: not told, as if
    # every name did). A name that is neither this nor a Configuration is one the cache has
    # not caught up with yet, or a name of nothing: not a device missing from this node.
    instance_known: Callable[[str], bool] | None = None

    def shared_book(self, key: str, build: Any) -> Any:
        """The one ``build(self)`` object the node's policies keyed ``key`` share."""
        book = self.shared.get(key)
        if book is None:
            book = self.shared[key] = build(self)
        return book


class SharingPolicy(ABC):
    """One node's books for one kind of device. Not thread-safe: the caller serializes."""

    name: ClassVar[str] = ""

    def __init__(self, inventory: NodeInventory) -> None:
        self.node = inventory.name

    @abstractmethod
    def add_resource(self, pod: Pod) -> None:
        """Count the devices ``pod`` holds (or is assumed to hold) on this node."""

    @abstractmethod
    def sub_resource(self, pod: Pod) -> None:
        """Stop counting what ``pod`` held; idempotent."""

    @abstractmethod
    def has_device_request(self, pod: Pod) -> bool:
        """True when ``pod`` asks for a device this policy shares."""

    @abstractmethod
    def filter_node(self, pod: Pod) -> Verdict:
        """Whether ``pod`` fits this node now, and why not in words."""

    @abstractmethod
    def allocate(self, pod: Pod) -> dict[str, str]:
        """Book devices for ``pod`` on this node; the annotations to write on the pod.
        Raises PolicyError when it does not fit (nothing booked then)."""

    @abstractmethod
    def release(self, pod: Pod) -> None:
        """Undo ``allocate`` (the binding failed); idempotent."""

    @abstractmethod
    def status(self) -> str:
        """One line for operators: what this node has and what is in use."""

    def free_fraction(self, pod: Pod) -> float | None:
        """How much of what ``pod`` asks for is free here (0-1), for spreading or packing;
        None when the policy has no opinion."""
        return None
