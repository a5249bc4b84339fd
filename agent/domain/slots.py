"""`Instance.spec.deviceUsage`: slot values, slot views, per-slot health, resizing.

Values (akri-compat.md §2): `""` free, `"<node>"` held through the Instance-level (IL) plugin of
that node, `"C:<vdev>:<node>"` held through the Configuration-level (CL) plugin. Akri v0.13
drops free keys (server-side apply), Akri v0.12 and we pre-fill them with `""`: readers treat an
absent key as free. Anything else is FOREIGN: reported as it is and never overwritten, because
we cannot know who wrote it or whether it still means "in use".

Keys that are not slot keys of the Instance (wrong prefix, non-canonical index) are "stray":
`slot_views` leaves them out, `stray_keys` reports them, and no rule here writes to them.
"""

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agent.domain.cordon import Cordon, cordon_of
from agent.domain.naming import slot_index, slot_key

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

CL_PREFIX = "C"


class UsageKind(enum.Enum):
    FREE = "free"
    NODE = "node"  # held through the Instance-level plugin
    CONFIG = "config"  # held through the Configuration-level plugin
    FOREIGN = "foreign"  # not a format we understand


@dataclass(frozen=True)
class Usage:
    kind: UsageKind
    node: str = ""
    vdev: str = ""
    raw: str = ""

    @property
    def is_free(self) -> bool:
        return self.kind is UsageKind.FREE

    def held_by(self, node: str) -> bool:
        """True when `node` holds the slot through either plugin."""
        return self.kind in (UsageKind.NODE, UsageKind.CONFIG) and self.node == node


FREE = Usage(UsageKind.FREE)


def parse_usage(value: object) -> Usage:
    """Parse one deviceUsage value, split on `:` exactly as Akri's agent does."""
    if value is None or value == "":
        return FREE
    if not isinstance(value, str):
        # The schema forbids it, but a server without validation may hand us anything.
        return Usage(UsageKind.FOREIGN, raw=str(value))
    parts = value.split(":")
    if len(parts) == 1:
        return Usage(UsageKind.NODE, node=value, raw=value)
    if len(parts) == 3 and parts[0] == CL_PREFIX and parts[1] and parts[2]:
        return Usage(UsageKind.CONFIG, node=parts[2], vdev=parts[1], raw=value)
    return Usage(UsageKind.FOREIGN, raw=value)


def _check_part(what: str, value: str) -> None:
    if not value or ":" in value:
        raise ValueError(f"{what} must be non-empty and free of ':', got {value!r}")


def format_il(node: str) -> str:
    """Value of a slot held through the Instance-level plugin of `node`."""
    _check_part("node", node)
    return node


def format_cl(vdev: str, node: str) -> str:
    """Value of a slot held through the Configuration-level plugin of `node` for `vdev`."""
    _check_part("vdev", vdev)
    _check_part("node", node)
    return f"{CL_PREFIX}:{vdev}:{node}"


@dataclass(frozen=True)
class SlotView:
    key: str
    index: int
    usage: Usage
    surplus: bool  # index >= capacity: capacity shrank while the slot was held


def slot_views(
    instance: str, capacity: int, device_usage: Mapping[str, Any] | None
) -> list[SlotView]:
    """Every slot in range(capacity) in index order, then non-free surplus slots.

    Missing keys are free. Free surplus keys are left out: they are not slots any more and
    `resize_usage` drops them. Stray keys are left out (see the module docstring).
    """
    usage = device_usage or {}
    views = [
        SlotView(key, i, parse_usage(usage.get(key)), False)
        for i in range(capacity)
        for key in (slot_key(instance, i),)
    ]
    surplus: list[SlotView] = []
    for key, value in usage.items():
        index = slot_index(instance, key)
        if index is None or index < capacity:
            continue
        parsed = parse_usage(value)
        if not parsed.is_free:
            surplus.append(SlotView(key, index, parsed, True))
    surplus.sort(key=lambda view: view.index)
    return views + surplus


def stray_keys(instance: str, device_usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """deviceUsage entries whose key is not a slot key of `instance`; for reporting only."""
    return {
        key: value
        for key, value in (device_usage or {}).items()
        if slot_index(instance, key) is None
    }


def il_health(usage: Usage, this_node: str, surplus: bool = False, cordoned: bool = False) -> str:
    """Health of one slot in the IL plugin's ListAndWatch (akri-compat.md §4.3).

    A slot this node holds stays Healthy so that kubelet can re-ask for it (Akri PR #556). A
    CL-held slot is Unhealthy everywhere, even on its own node: the IL plugin did not hand it
    out, so kubelet must not offer it to an IL request. A free slot of a cordoned Instance is
    Unhealthy: Allocate would refuse it, and health must not offer what Allocate refuses.
    """
    if surplus:
        return UNHEALTHY
    if usage.is_free:
        return UNHEALTHY if cordoned else HEALTHY
    if usage.kind is UsageKind.NODE and usage.node == this_node:
        return HEALTHY
    return UNHEALTHY


def il_devices(
    instance: str,
    capacity: int,
    device_usage: Mapping[str, Any] | None,
    this_node: str,
    cordoned: bool = False,
) -> list[tuple[str, str]]:
    """(kubelet device id, health) for the IL plugin of `instance` on `this_node`."""
    return [
        (view.key, il_health(view.usage, this_node, view.surplus, cordoned))
        for view in slot_views(instance, capacity, device_usage)
    ]


def initial_usage(instance: str, capacity: int) -> dict[str, str]:
    """deviceUsage of a new Instance: every key present and free (readable by Akri v0.12 too)."""
    return {slot_key(instance, i): "" for i in range(capacity)}


def resize_usage(instance: str, device_usage: Mapping[str, Any], new_capacity: int) -> dict:
    """deviceUsage after a capacity change.

    Growing adds free keys. Shrinking drops only free keys at index >= new_capacity; held or
    foreign ones stay (as surplus) until their holder releases them, so no holder loses a slot
    it is using. Stray keys are kept untouched.
    """
    if new_capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {new_capacity}")
    resized: dict = {}
    for key, value in device_usage.items():
        index = slot_index(instance, key)
        if index is not None and index >= new_capacity and parse_usage(value).is_free:
            continue
        resized[key] = value
    for i in range(new_capacity):
        resized.setdefault(slot_key(instance, i), "")
    return resized


def _valid_capacity(capacity: Any) -> bool:
    return isinstance(capacity, int) and not isinstance(capacity, bool) and capacity >= 0


def _read_capacity(spec: Mapping[str, Any], name: str, default: int | None) -> int:
    capacity = spec.get("capacity")
    if _valid_capacity(capacity):
        return capacity
    if default is not None:
        return default
    # Akri v0.12 Instances have no capacity but pre-fill every key: count them.
    indices = [slot_index(name, key) for key in spec.get("deviceUsage") or {}]
    return max((i + 1 for i in indices if i is not None), default=0)


@dataclass(frozen=True)
class InstanceState:
    """A read-only snapshot of the parts of an Instance the slot rules need."""

    name: str
    configuration: str
    capacity: int
    device_usage: Mapping[str, str]
    nodes: tuple[str, ...]
    shared: bool = False
    # False when the object has no spec.deviceUsage at all (Akri v0.13 SSA, or a server that
    # applies no schema defaults); a claim then has to create the map, not add a key to it.
    device_usage_present: bool = True
    # False when ``capacity`` was not read from spec.capacity (Akri v0.12 objects).
    capacity_present: bool = True
    # The Instance's cordon (annotation, agent.domain.cordon), or None: no new claims.
    cordon: Cordon | None = None
    # The slot views, made on first need (``_slot_views``): a release decides from one key's
    # value, and building every view of an Instance for it was a tenth of the agents' time in
    # a storm of releases.
    _views: tuple[SlotView, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Copy, so the snapshot cannot change under the decisions made from it.
        usage = MappingProxyType(dict(self.device_usage or {}))
        object.__setattr__(self, "device_usage", usage)
        object.__setattr__(self, "nodes", tuple(self.nodes or ()))

    def _slot_views(self) -> tuple[SlotView, ...]:
        views = self.__dict__.get("_views")
        if views is None:  # two threads may both build them: the same tuple either way
            views = tuple(slot_views(self.name, self.capacity, self.device_usage))
            object.__setattr__(self, "_views", views)
        return views

    @classmethod
    def from_object(
        cls, obj: Mapping[str, Any], default_capacity: int | None = None
    ) -> "InstanceState":
        """Build from an Instance object (a dict as the API returns it), tolerating absent
        defaults. Without spec.capacity (Akri v0.12) use `default_capacity` (the
        Configuration's), else infer it from the pre-filled keys."""
        name = obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        return cls(
            name=name,
            configuration=spec.get("configurationName", ""),
            capacity=_read_capacity(spec, name, default_capacity),
            device_usage=spec.get("deviceUsage") or {},
            nodes=tuple(spec.get("nodes") or ()),
            shared=bool(spec.get("shared", False)),
            device_usage_present=spec.get("deviceUsage") is not None,
            capacity_present=_valid_capacity(spec.get("capacity")),
            cordon=cordon_of(obj),
        )

    def views(self) -> list[SlotView]:
        return list(self._slot_views())

    def view(self, key: str) -> SlotView | None:
        """The slot with this key, or None when it is not a (current or held surplus) slot."""
        return next((view for view in self._slot_views() if view.key == key), None)

    def usage(self, key: str) -> Usage:
        return parse_usage(self.device_usage.get(key))

    def free_slots(self) -> list[str]:
        """Keys of free slots within capacity, in index order."""
        return [v.key for v in self._slot_views() if v.usage.is_free and not v.surplus]

    def claimable_slots(self) -> list[str]:
        """Free slots a new claim may take: none while the Instance is cordoned."""
        return [] if self.cordon is not None else self.free_slots()

    def held_by(self, node: str) -> list[str]:
        """Keys of slots `node` holds through either plugin, surplus ones included."""
        return [v.key for v in self._slot_views() if v.usage.held_by(node)]

    def used_count(self) -> int:
        """Slots within capacity that are not free (held or foreign)."""
        return sum(1 for v in self._slot_views() if not v.surplus and not v.usage.is_free)

    def usable_by(self, node: str) -> bool:
        return node in self.nodes


def holders(states: Iterable[InstanceState]) -> dict[str, list[tuple[str, str]]]:
    """node -> [(instance, slot key)] it holds; handy for dashboards and reconcilers."""
    held: dict[str, list[tuple[str, str]]] = {}
    for state in states:
        for view in state.views():
            if view.usage.kind in (UsageKind.NODE, UsageKind.CONFIG):
                held.setdefault(view.usage.node, []).append((state.name, view.key))
    return held
