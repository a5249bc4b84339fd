"""What one agent knows of its namespace: Configurations and Instances as the API server last
showed them, fed by the cache sync's subscription and by the answers to our own writes.

The device plugins read it on every ListAndWatch update and Allocate, so it is memory only:
no ORM query sits on those paths. Objects are stored as received and never mutated.

Two sources race (the watch and our writes' answers), so an object older than the one held is
ignored. resourceVersions are opaque in general; the API server (etcd) and the simulator hand
out integers, and only when both sides are integers are they compared. A name keeps its last
version after deletion, so a late answer to an earlier write cannot bring a deleted Instance
back.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from agent.domain.configspec import ConfigSpec, InvalidConfiguration, parse_configuration
from agent.domain.slots import InstanceState


def rv_of(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def is_older(rv: str, than: str) -> bool:
    """True when both are integers and ``rv`` comes before ``than``."""
    return rv.isdigit() and than.isdigit() and int(rv) < int(than)


def nodes_of(obj: dict[str, Any]) -> list[str]:
    return list((obj.get("spec") or {}).get("nodes") or [])


def is_deleting(obj: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def config_of(obj: dict[str, Any]) -> str:
    return str((obj.get("spec") or {}).get("configurationName") or "")


# What an Instance's lifecycle depends on; deviceUsage alone changes only health.
_LIFECYCLE_FIELDS = ("configurationName", "capacity", "shared", "nodes", "brokerProperties")


@dataclass(frozen=True)
class Update:
    previous: dict[str, Any] | None
    current: dict[str, Any]

    @property
    def lifecycle_changed(self) -> bool:
        """More than slot values changed (or the Instance is new to us)."""
        if self.previous is None:
            return True
        old, new = self.previous.get("spec") or {}, self.current.get("spec") or {}
        if is_deleting(self.previous) != is_deleting(self.current):
            return True
        return any(old.get(f) != new.get(f) for f in _LIFECYCLE_FIELDS)


@dataclass(frozen=True)
class ConfigEntry:
    obj: dict[str, Any]
    spec: ConfigSpec | None
    error: str


class ClusterView:
    """Thread-safe maps name -> object for Configurations and Instances."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._configs: dict[str, ConfigEntry] = {}
        self._instances: dict[str, dict[str, Any]] = {}
        self._last_rv: dict[str, str] = {}  # instance name -> newest version seen, deletes too
        # Parsed slot views by Instance name, for the object and default capacity they were
        # parsed from: health lists, CL plans and Allocate checks all ask for the same few
        # snapshots between two changes, and an InstanceState is immutable.
        self._parsed: dict[str, tuple[dict[str, Any], int | None, InstanceState]] = {}

    # --- Instances --------------------------------------------------------------------
    def put_instance(self, obj: dict[str, Any]) -> Update | None:
        """Hold ``obj`` unless an equal or newer version is already known; the update if taken."""
        name = obj["metadata"]["name"]
        rv = rv_of(obj)
        with self._lock:
            last = self._last_rv.get(name, "")
            if rv and last and (rv == last or is_older(rv, last)):
                return None
            previous = self._instances.get(name)
            self._instances[name] = obj
            if rv:
                self._last_rv[name] = rv
            return Update(previous, obj)

    def drop_instance(self, name: str, rv: str = "") -> dict[str, Any] | None:
        with self._lock:
            if rv and not is_older(rv, self._last_rv.get(name, "")):
                self._last_rv[name] = rv
            self._parsed.pop(name, None)
            return self._instances.pop(name, None)

    def instance(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._instances.get(name)

    def instances(self, configuration: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            objs = list(self._instances.values())
        if configuration is None:
            return objs
        return [o for o in objs if config_of(o) == configuration]

    def instance_names(self) -> set[str]:
        with self._lock:
            return set(self._instances)

    def states(self, configuration: str) -> list[InstanceState]:
        """Slot views of every Instance of ``configuration``, for the CL rules."""
        default = self.capacity(configuration)
        return [self._parse(o, default) for o in self.instances(configuration)]

    def state(self, name: str) -> InstanceState | None:
        obj = self.instance(name)
        if obj is None:
            return None
        return self.state_of(obj)

    def state_of(self, obj: dict[str, Any]) -> InstanceState:
        """The slot views of ``obj`` (an Instance as this view holds or held it), with its
        Configuration's capacity for objects that carry none (Akri v0.12)."""
        return self._parse(obj, self.capacity(config_of(obj)))

    def _parse(self, obj: dict[str, Any], default: int | None) -> InstanceState:
        name = obj["metadata"]["name"]
        cached = self._parsed.get(name)
        if cached is not None and cached[0] is obj and cached[1] == default:
            return cached[2]
        state = InstanceState.from_object(obj, default)
        with self._lock:
            # Only the object the view holds now is worth keeping (an older one is done with).
            if self._instances.get(name) is obj:
                self._parsed[name] = (obj, default, state)
        return state

    # --- Configurations ---------------------------------------------------------------
    def put_configuration(self, obj: dict[str, Any]) -> ConfigEntry:
        try:
            entry = ConfigEntry(obj, parse_configuration(obj), "")
        except InvalidConfiguration as exc:
            entry = ConfigEntry(obj, None, str(exc))
        with self._lock:
            self._configs[obj["metadata"]["name"]] = entry
        return entry

    def drop_configuration(self, name: str) -> None:
        with self._lock:
            self._configs.pop(name, None)

    def configuration(self, name: str) -> ConfigEntry | None:
        with self._lock:
            return self._configs.get(name)

    def configuration_names(self) -> set[str]:
        with self._lock:
            return set(self._configs)

    def spec(self, name: str) -> ConfigSpec | None:
        entry = self.configuration(name)
        return entry.spec if entry else None

    def capacity(self, configuration: str) -> int | None:
        spec = self.spec(configuration)
        return spec.capacity if spec else None
