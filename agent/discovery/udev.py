"""udev: discovers local devices by udev rules, as Akri's udev discovery handler does (unshared).

``discoveryDetails`` is YAML ``{udevRules: [...], groupRecursive: bool, permissions: str}``.
Each rule is a comma-separated list of udev *match* keys; a device matching every key of any
rule is discovered. Its id is its devpath; its properties are ``UDEV_DEVPATH`` and, when it has
a device node, ``UDEV_DEVNODE``; the node is passed to brokers as a DeviceSpec with
``permissions`` (default ``rwm``). With ``groupRecursive`` matched devices below another matched
device are folded into it: one device whose id is the topmost devpath, with ``UDEV_DEVNODE_<i>``
and a DeviceSpec per node (Akri's grouping, with a path-component rather than string prefix).

Matching follows udev(7) where Akri does: values are shell globs (``* ? [...]``) with ``|``
alternatives, matched against the whole value. Two deliberate readings, both Akri's:

- A parent key (``KERNELS``, ``SUBSYSTEMS``, ``DRIVERS``, ``ATTRS{x}``, ``TAGS``) with ``==``
  matches when the device or any ancestor matches, each key on its own (udev itself wants all
  parent keys of a rule to hold on one ancestor); with ``!=`` no device in the chain may match.
- A missing value (no driver, no such attribute or ENV key) never matches ``==`` and always
  matches ``!=``.

Akri compiles values as regular expressions rather than globs; for the rules people write
(``video[0-9]*``, ``046d``, ``ttyUSB*``) both agree on real device names.

Devices come from a :class:`DeviceSource`: :class:`PyudevSource` reads the host through
pyudev (enumeration, plus a netlink monitor that triggers an early rescan on hotplug when the
agent may open one), :class:`RecordedSource` replays JSON records such as those in
``agent/discovery/testdata/``.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import yaml

from .base import (
    DEVICE_PERMISSION_CHARS,
    DevicePublisher,
    DeviceSpec,
    DiscoveredDevice,
    DiscoveryError,
    PollingSession,
)

log = logging.getLogger(__name__)

NAME = "udev"
DEVNODE_PROPERTY = "UDEV_DEVNODE"
DEVPATH_PROPERTY = "UDEV_DEVPATH"
DEFAULT_PERMISSIONS = "rwm"
DEFAULT_RESCAN_INTERVAL = 10.0
TESTDATA_DIR = os.path.join(os.path.dirname(__file__), "testdata")
DEFAULT_RECORDING = os.path.join(TESTDATA_DIR, "udev-devices.json")

# Keys that look at the device itself, keys that walk up the parent chain, and which of them
# take a {name} argument.
DEVICE_KEYS = frozenset({"DEVPATH", "KERNEL", "SUBSYSTEM", "DRIVER", "ATTR", "ENV", "TAG"})
PARENT_KEYS = frozenset({"KERNELS", "SUBSYSTEMS", "DRIVERS", "ATTRS", "TAGS"})
KEYS_WITH_ARGUMENT = frozenset({"ATTR", "ATTRS", "ENV"})
SUPPORTED_KEYS = DEVICE_KEYS | PARENT_KEYS

_KEY_VALUE = re.compile(
    r"""\s*(?P<key>[A-Za-z_]+)(?:\{(?P<arg>[^{}]*)\})?\s*
        (?P<op>==|!=|\+=|-=|:=|=)\s*
        "(?P<value>(?:[^"\\]|\\.)*)"\s*""",
    re.VERBOSE,
)


# ---------------------------------------------------------------------------------------------
# Devices and where they come from


class UdevDevice(Protocol):
    """What rule matching needs to know about one udev device."""

    @property
    def devpath(self) -> str: ...
    @property
    def sysname(self) -> str: ...
    @property
    def subsystem(self) -> str | None: ...
    @property
    def driver(self) -> str | None: ...
    @property
    def devnode(self) -> str | None: ...
    @property
    def tags(self) -> frozenset[str]: ...
    @property
    def parent(self) -> UdevDevice | None: ...
    def property_value(self, name: str) -> str | None: ...
    def attribute(self, name: str) -> str | None: ...


def chain(device: UdevDevice) -> Iterator[UdevDevice]:
    """The device, then its parent, grandparent and so on."""
    current: UdevDevice | None = device
    while current is not None:
        yield current
        current = current.parent


@dataclass(frozen=True, eq=False)
class RecordedDevice:
    """A udev device as recorded in a JSON fixture."""

    devpath: str
    subsystem: str | None = None
    driver: str | None = None
    devnode: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, str] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    parent: RecordedDevice | None = None

    @property
    def sysname(self) -> str:
        return self.devpath.rsplit("/", 1)[-1]

    def property_value(self, name: str) -> str | None:
        return self.properties.get(name)

    def attribute(self, name: str) -> str | None:
        return self.attributes.get(name)


class DeviceSource(Protocol):
    """Where udev devices come from. Shared by sessions, so it must be thread-safe."""

    @property
    def version(self) -> int:
        """Goes up whenever the source knows the devices changed (hotplug)."""
        ...

    def devices(self) -> list[UdevDevice]: ...

    def wait_for_change(self, since: int, timeout: float, stop: threading.Event) -> None:
        """Return when ``version`` differs from ``since``, ``stop`` is set, or on timeout."""
        ...


class _ChangeSignal:
    """A version counter that several sessions can wait on without consuming events."""

    # How often a waiter looks at its stop event; bounds how long stop() can take.
    STOP_CHECK_INTERVAL = 0.1

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0

    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def bump(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def wait(self, since: int, timeout: float, stop: threading.Event) -> None:
        remaining = timeout
        with self._cond:
            while remaining > 0 and self._version == since and not stop.is_set():
                step = min(remaining, self.STOP_CHECK_INTERVAL)
                self._cond.wait(step)
                remaining -= step


class RecordedSource:
    """Replays recorded devices; :meth:`set_records` simulates hotplug."""

    def __init__(self, records: Sequence[Mapping[str, Any]]) -> None:
        self._signal = _ChangeSignal()
        self._lock = threading.Lock()
        self._devices = build_recorded_devices(records)

    @classmethod
    def from_file(cls, path: str = DEFAULT_RECORDING) -> RecordedSource:
        return cls(load_records(path))

    @property
    def version(self) -> int:
        return self._signal.version

    def devices(self) -> list[UdevDevice]:
        with self._lock:
            return list(self._devices)

    def set_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        devices = build_recorded_devices(records)
        with self._lock:
            self._devices = devices
        self._signal.bump()

    def wait_for_change(self, since: int, timeout: float, stop: threading.Event) -> None:
        self._signal.wait(since, timeout, stop)


def load_records(path: str) -> list[dict[str, Any]]:
    """The device records of a recording file ``{"devices": [...]}``."""
    with open(path, encoding="utf-8") as f:
        return list(json.load(f)["devices"])


def build_recorded_devices(records: Sequence[Mapping[str, Any]]) -> list[RecordedDevice]:
    """Turn records (each naming its parent by devpath) into linked devices, in record order."""
    by_path = {r["devpath"]: r for r in records}
    built: dict[str, RecordedDevice] = {}

    def build(devpath: str, seen: tuple[str, ...] = ()) -> RecordedDevice:
        if devpath in built:
            return built[devpath]
        if devpath in seen:
            raise ValueError(f"recorded device {devpath} is its own ancestor")
        record = by_path[devpath]
        parent_path = record.get("parent")
        if parent_path is not None and parent_path not in by_path:
            raise ValueError(f"recorded device {devpath} names unknown parent {parent_path}")
        parent = build(parent_path, (*seen, devpath)) if parent_path else None
        built[devpath] = RecordedDevice(
            devpath=devpath,
            subsystem=record.get("subsystem"),
            driver=record.get("driver"),
            devnode=record.get("devnode"),
            properties=dict(record.get("properties", {})),
            attributes=dict(record.get("attributes", {})),
            tags=frozenset(record.get("tags", ())),
            parent=parent,
        )
        return built[devpath]

    return [build(r["devpath"]) for r in records]


class _PyudevDevice:
    """Adapts a pyudev.Device; attributes are read from sysfs only when a rule asks."""

    def __init__(self, device: Any) -> None:
        self._device = device

    devpath = property(lambda self: self._device.device_path)
    sysname = property(lambda self: self._device.sys_name)
    subsystem = property(lambda self: self._device.subsystem)
    driver = property(lambda self: self._device.driver)
    devnode = property(lambda self: self._device.device_node)

    @property
    def tags(self) -> frozenset[str]:
        return frozenset(self._device.tags)

    @property
    def parent(self) -> _PyudevDevice | None:
        parent = self._device.parent
        return None if parent is None else _PyudevDevice(parent)

    def property_value(self, name: str) -> str | None:
        return self._device.properties.get(name)

    def attribute(self, name: str) -> str | None:
        try:
            raw = self._device.attributes.get(name)
        except OSError:  # some sysfs attributes refuse reads (permissions, unsupported ops)
            return None
        return None if raw is None else raw.decode("utf-8", "replace").rstrip("\n")


class PyudevSource:
    """The host's devices through pyudev; a netlink monitor, when allowed, wakes rescans."""

    def __init__(self, *, monitor: bool = True) -> None:
        import pyudev  # imported here so hosts without libudev can still use recorded data

        self._pyudev = pyudev
        self._context = pyudev.Context()
        self._signal = _ChangeSignal()
        self._observer: Any = None
        if monitor:
            self._start_monitor()

    @staticmethod
    def available() -> bool:
        """Whether this host has a sysfs to discover from."""
        return os.path.isdir("/sys/devices")

    def _start_monitor(self) -> None:
        try:
            monitor = self._pyudev.Monitor.from_netlink(self._context)
            monitor.start()  # here, not in the observer thread, so a refusal is caught
            self._observer = self._pyudev.MonitorObserver(
                monitor, callback=lambda _device: self._signal.bump(), name="udev-monitor"
            )
            self._observer.daemon = True
            self._observer.start()
        except Exception as exc:  # containers often may not open NETLINK_KOBJECT_UEVENT
            log.warning("udev monitor unavailable, rescanning by interval only: %s", exc)
            self._observer = None

    @property
    def version(self) -> int:
        return self._signal.version

    def devices(self) -> list[UdevDevice]:
        return [_PyudevDevice(d) for d in self._context.list_devices()]

    def wait_for_change(self, since: int, timeout: float, stop: threading.Event) -> None:
        self._signal.wait(since, timeout, stop)

    def close(self) -> None:
        if self._observer is not None:
            self._observer.send_stop()
            self._observer = None


# ---------------------------------------------------------------------------------------------
# Rules


@dataclass(frozen=True)
class UdevMatch:
    """One ``KEY{arg}==/!="pattern|pattern"`` of a rule."""

    key: str
    arg: str | None
    negate: bool
    patterns: tuple[str, ...]

    def matches(self, device: UdevDevice) -> bool:
        devices = chain(device) if self.key in PARENT_KEYS else iter((device,))
        found = any(self._value_matches(d) for d in devices)
        return not found if self.negate else found

    def _value_matches(self, device: UdevDevice) -> bool:
        if self.key in ("TAG", "TAGS"):
            return any(self._glob(tag) for tag in device.tags)
        return self._glob(self._value(device))

    def _value(self, device: UdevDevice) -> str | None:
        key = self.key
        if key in ("KERNEL", "KERNELS"):
            return device.sysname
        if key == "DEVPATH":
            return device.devpath
        if key in ("SUBSYSTEM", "SUBSYSTEMS"):
            return device.subsystem
        if key in ("DRIVER", "DRIVERS"):
            return device.driver
        if key == "ENV":
            return device.property_value(self.arg or "")
        return device.attribute(self.arg or "")  # ATTR, ATTRS

    def _glob(self, value: str | None) -> bool:
        if value is None:
            return False
        return any(fnmatch.fnmatchcase(value, _udev_glob(p)) for p in self.patterns)


def _udev_glob(pattern: str) -> str:
    # udev, like glibc fnmatch, accepts [^...] as well as [!...] for a negated class.
    return pattern.replace("[^", "[!")


def parse_rule(rule: str) -> tuple[UdevMatch, ...]:
    """Parse one udev rule of match keys; DiscoveryError naming the problem otherwise."""
    text = rule.strip()
    if not text:
        # Akri would enumerate every device on the node for an empty rule; refuse instead.
        raise DiscoveryError("udev rule is empty")
    matches: list[UdevMatch] = []
    pos = 0
    while pos < len(text):
        m = _KEY_VALUE.match(text, pos)
        if m is None:
            raise DiscoveryError(
                f"udev rule {rule!r}: cannot parse at {text[pos : pos + 30]!r}; expected "
                'KEY=="value" or KEY!="value" separated by commas'
            )
        matches.append(_match_from(rule, m))
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise DiscoveryError(f"udev rule {rule!r}: expected ',' at {text[pos:]!r}")
            pos += 1
            if not text[pos:].strip():
                raise DiscoveryError(f"udev rule {rule!r}: trailing ','")
    return tuple(matches)


def _match_from(rule: str, m: re.Match[str]) -> UdevMatch:
    key, arg, op = m["key"], m["arg"], m["op"]
    if key not in SUPPORTED_KEYS:
        raise DiscoveryError(
            f"udev rule {rule!r}: unsupported key {key}; discovery supports "
            f"{', '.join(sorted(SUPPORTED_KEYS))}"
        )
    if op not in ("==", "!="):
        raise DiscoveryError(
            f"udev rule {rule!r}: {key}{op} assigns; discovery rules may only match (== or !=)"
        )
    if (key in KEYS_WITH_ARGUMENT) != (arg is not None) or arg == "":
        form = f"{key}{{name}}" if key in KEYS_WITH_ARGUMENT else key
        raise DiscoveryError(f"udev rule {rule!r}: write {form}, not {m.group(0).strip()}")
    value = re.sub(r"\\(.)", r"\1", m["value"])
    return UdevMatch(key=key, arg=arg, negate=op == "!=", patterns=tuple(value.split("|")))


def rule_matches(rule: Sequence[UdevMatch], device: UdevDevice) -> bool:
    return all(match.matches(device) for match in rule)


# ---------------------------------------------------------------------------------------------
# discoveryDetails and discovery


@dataclass(frozen=True)
class UdevDetails:
    rules: tuple[tuple[UdevMatch, ...], ...]
    group_recursive: bool = False
    permissions: str = DEFAULT_PERMISSIONS


def parse_details(discovery_details: str) -> UdevDetails:
    """Parse udev ``discoveryDetails``; DiscoveryError with a clear message if invalid."""
    if not discovery_details.strip():
        raise DiscoveryError("udev discoveryDetails is empty; expected YAML with 'udevRules'")
    try:
        parsed = yaml.safe_load(discovery_details)
    except yaml.YAMLError as exc:
        raise DiscoveryError(f"udev discoveryDetails is not valid YAML: {exc}") from exc
    if not isinstance(parsed, dict) or "udevRules" not in parsed:
        raise DiscoveryError("udev discoveryDetails must be a mapping with 'udevRules'")
    rules = parsed["udevRules"]
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise DiscoveryError("udev 'udevRules' must be a list of strings")
    group_recursive = parsed.get("groupRecursive", False)
    if not isinstance(group_recursive, bool):
        raise DiscoveryError(
            f"udev 'groupRecursive' must be true or false, not {group_recursive!r}"
        )
    permissions = parsed.get("permissions", DEFAULT_PERMISSIONS)
    if (
        not isinstance(permissions, str)
        or not permissions
        or not set(permissions) <= DEVICE_PERMISSION_CHARS
    ):
        raise DiscoveryError(f"udev 'permissions' must combine r, w and m, not {permissions!r}")
    return UdevDetails(tuple(parse_rule(r) for r in rules), group_recursive, permissions)


def discover(details: UdevDetails, devices: Sequence[UdevDevice]) -> list[DiscoveredDevice]:
    """The devices matching any rule of ``details``, as the agent sees them."""
    matched: dict[str, UdevDevice] = {}
    for device in devices:
        if device.devpath not in matched and any(rule_matches(r, device) for r in details.rules):
            matched[device.devpath] = device
    if details.group_recursive:
        groups = _group_by_ancestor(matched)
    else:
        groups = {path: [device] for path, device in matched.items()}
    return [
        _to_discovered(root, members, details.permissions, numbered=details.group_recursive)
        for root, members in sorted(groups.items())
    ]


def _is_below(path: str, ancestor: str) -> bool:
    return path.startswith(ancestor.rstrip("/") + "/")


def _group_by_ancestor(matched: Mapping[str, UdevDevice]) -> dict[str, list[UdevDevice]]:
    # Sorted order visits every ancestor before its descendants, so each device either joins
    # the group of a matched ancestor or starts its own.
    groups: dict[str, list[UdevDevice]] = {}
    for path in sorted(matched):
        root = next((r for r in groups if _is_below(path, r)), None)
        groups.setdefault(root or path, []).append(matched[path])
    return groups


def _to_discovered(
    root: str, members: Sequence[UdevDevice], permissions: str, *, numbered: bool
) -> DiscoveredDevice:
    properties = {DEVPATH_PROPERTY: root}
    specs = []
    nodes = [m.devnode for m in members if m.devnode]
    for i, node in enumerate(nodes):
        properties[f"{DEVNODE_PROPERTY}_{i}" if numbered else DEVNODE_PROPERTY] = node
        specs.append(DeviceSpec(container_path=node, host_path=node, permissions=permissions))
    return DiscoveredDevice(id=root, properties=properties, device_specs=tuple(specs))


class UdevHandler:
    """The embedded udev handler. Unshared: a device node belongs to one node."""

    name = NAME
    shared = False

    def __init__(
        self,
        source: DeviceSource | None = None,
        *,
        rescan_interval: float = DEFAULT_RESCAN_INTERVAL,
    ) -> None:
        self._source = source
        self._source_lock = threading.Lock()
        self.rescan_interval = rescan_interval

    def _get_source(self) -> DeviceSource:
        with self._source_lock:
            if self._source is None:
                if not PyudevSource.available():
                    raise DiscoveryError("udev discovery needs the host's /sys, which is missing")
                self._source = PyudevSource()
            return self._source

    def start(
        self,
        discovery_details: str,
        discovery_properties: Mapping[str, bytes | None],
        on_devices: Callable[[list[DiscoveredDevice]], None],
        on_error: Callable[[str], None],
    ) -> PollingSession:
        details = parse_details(discovery_details)
        source = self._get_source()
        seen = [source.version]

        def step() -> list[DiscoveredDevice]:
            # Read the version first, so a change during the scan still wakes the next wait.
            seen[0] = source.version
            return discover(details, source.devices())

        def wait(timeout: float, stop: threading.Event) -> None:
            source.wait_for_change(seen[0], timeout, stop)

        publisher = DevicePublisher(self.name, on_devices, on_error)
        return PollingSession(self.name, step, self.rescan_interval, publisher, wait).start()
