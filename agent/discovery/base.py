"""The discovery-handler interface the agent codes against, and what every handler shares.

A discovery handler turns a Configuration's ``discoveryDetails`` (and resolved
``discoveryProperties``) into a running *session* that reports the whole current device list
whenever it changes. Handlers are built in (debugEcho, udev) or external (Akri's ``v0`` gRPC
protocol); the agent looks them up by name in a :class:`HandlerRegistry`.

Every session delivers through a :class:`DevicePublisher`, so all handlers get the same rules:
device lists are screened by :func:`screen_devices` (as in Akri a list is never refused for one
bad device: the bad device is left out and logged by name, the others are used; only a list
over :data:`MAX_DEVICES` is refused whole and the previous one kept), a list is delivered
only when it differs from the last one delivered, and a failing agent callback is logged instead
of killing the session thread.

This module must not import Django: the agent wires discovery to the ORM and the API server.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)

# Limits on what a handler may report. Device properties end up in Instance
# ``spec.brokerProperties`` and as environment variables of broker containers, so they must be
# valid env names and must keep the Instance object far below the API server's size limit.
MAX_PROPERTY_NAME_LENGTH = 256
MAX_PROPERTY_VALUE_BYTES = 16 * 1024
MAX_PROPERTIES_PER_DEVICE = 128
MAX_DEVICE_ID_LENGTH = 4096
MAX_DEVICES = 10_000

# Kubernetes' rule for container env var names (what the API server enforces), not the stricter
# C-identifier rule Akri applies to *discoveryProperties* names: Akri's own udev handler emits
# names such as ``USB_RESOURCE_AKRI_SH_UDEV-USB-KEYBOARD``, which the stricter rule would refuse.
PROPERTY_NAME_PATTERN = re.compile(r"^[-._A-Za-z][-._A-Za-z0-9]*$")

# cgroup device permissions, as in the kubelet's DeviceSpec.
DEVICE_PERMISSION_CHARS = frozenset("rwm")


class DiscoveryError(Exception):
    """A handler cannot run with what it was given (invalid discoveryDetails and the like)."""


class InvalidDeviceList(DiscoveryError):
    """A handler reported a device list that breaks :func:`validate_devices`."""


class FrozenProperties(Mapping[str, str]):
    """An immutable, hashable str→str mapping, kept sorted so equal mappings hash alike."""

    __slots__ = ("_items", "_dict")

    def __init__(self, items: Mapping[str, str] | Sequence[tuple[str, str]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        self._dict = dict(pairs)
        self._items = tuple(sorted(self._dict.items()))

    def __getitem__(self, key: str) -> str:
        return self._dict[key]

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenProperties):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._dict == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenProperties({self._dict!r})"


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = ""


@dataclass(frozen=True)
class DiscoveredDevice:
    """One device as a handler reports it; ``id`` is unique within one handler's list."""

    id: str
    properties: Mapping[str, str] = field(default_factory=FrozenProperties)
    mounts: tuple[Mount, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()

    def __post_init__(self) -> None:
        # Accept dicts and lists from callers, store immutable forms so devices hash and compare.
        if not isinstance(self.properties, FrozenProperties):
            object.__setattr__(self, "properties", FrozenProperties(self.properties))
        object.__setattr__(self, "mounts", tuple(self.mounts))
        object.__setattr__(self, "device_specs", tuple(self.device_specs))


@runtime_checkable
class DiscoverySession(Protocol):
    """One running discovery for one Configuration.

    Calls ``on_devices(list[DiscoveredDevice])`` with the WHOLE current list each time it changes
    (the first call always comes), from its own thread; ``on_error(str)`` on failure. No
    callback starts after ``stop()`` returns (one already running may finish).
    """

    def stop(self) -> None: ...


@runtime_checkable
class DiscoveryHandler(Protocol):
    name: str
    shared: bool

    def start(
        self,
        discovery_details: str,
        discovery_properties: Mapping[str, bytes | None],
        on_devices: Callable[[list[DiscoveredDevice]], None],
        on_error: Callable[[str], None],
    ) -> DiscoverySession: ...


class HandlerRegistry:
    """Discovery handlers by name. Thread-safe; listeners are called outside the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handlers: dict[str, DiscoveryHandler] = {}
        self._listeners: list[Callable[[str], None]] = []

    def register(self, handler: DiscoveryHandler) -> None:
        """Add ``handler``, replacing any handler of the same name, and notify listeners."""
        with self._lock:
            previous = self._handlers.get(handler.name)
            self._handlers[handler.name] = handler
        if previous is not None and previous is not handler:
            log.info("discovery handler %s replaced", handler.name)
        self._notify(handler.name)

    def unregister(self, name: str, handler: DiscoveryHandler | None = None) -> bool:
        """Remove ``name`` (only if it is still ``handler``, when given); True if removed."""
        with self._lock:
            current = self._handlers.get(name)
            if current is None or (handler is not None and current is not handler):
                return False
            del self._handlers[name]
        self._notify(name)
        return True

    def get(self, name: str) -> DiscoveryHandler | None:
        with self._lock:
            return self._handlers.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._handlers)

    def add_listener(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(name)`` whenever a handler of that name (re)registers or goes away."""
        with self._lock:
            self._listeners.append(fn)

    def _notify(self, name: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(name)
            except Exception:
                log.exception("discovery handler listener failed for %s", name)


@dataclass(frozen=True)
class Screened:
    """A device list split into the devices to use and what was wrong with the others."""

    accepted: tuple[DiscoveredDevice, ...]
    problems: tuple[str, ...]


def screen_devices(devices: Sequence[DiscoveredDevice]) -> Screened:
    """Keep the good devices of a list and name the bad ones (Akri never refuses a list whole).

    A device that breaks a rule below is left out; of several with one id the first is kept.
    Only a list longer than :data:`MAX_DEVICES` raises :class:`InvalidDeviceList` (refused whole:
    that is a handler gone wrong, not one bad device).
    """
    if len(devices) > MAX_DEVICES:
        raise InvalidDeviceList(f"{len(devices)} devices reported, more than {MAX_DEVICES}")
    accepted: list[DiscoveredDevice] = []
    problems: list[str] = []
    seen: set[str] = set()
    for index, device in enumerate(devices):
        try:
            _validate_device(device, index, seen)
        except InvalidDeviceList as exc:
            problems.append(str(exc))
            continue
        seen.add(device.id)
        accepted.append(device)
    return Screened(tuple(accepted), tuple(problems))


def merge_device_lists(lists: Iterable[Sequence[DiscoveredDevice]]) -> list[DiscoveredDevice]:
    """Several endpoints' lists as one, as Akri merges the endpoints of one handler name.

    Every device of every list is present; an id in several lists is the first list's device.
    """
    merged: dict[str, DiscoveredDevice] = {}
    for devices in lists:
        for device in devices:
            merged.setdefault(device.id, device)
    return list(merged.values())


def validate_devices(devices: Sequence[DiscoveredDevice]) -> None:
    """Raise :class:`InvalidDeviceList` naming the first problem in ``devices``."""
    problems = screen_devices(devices).problems
    if problems:
        raise InvalidDeviceList(problems[0])


def _validate_device(device: DiscoveredDevice, index: int, seen: set[str]) -> None:
    if not device.id:
        # Nothing to name it by but its place in the list and what it carries.
        described = repr(dict(device.properties))
        raise InvalidDeviceList(
            f"device #{index + 1} in the list has an empty id (properties {described[:200]})"
        )
    _validate_id(device.id, seen)
    _validate_properties(device)
    for mount in device.mounts:
        _validate_paths(device.id, "mount", mount.container_path, mount.host_path)
    for spec in device.device_specs:
        _validate_paths(device.id, "device spec", spec.container_path, spec.host_path)
        if not spec.permissions or not set(spec.permissions) <= DEVICE_PERMISSION_CHARS:
            raise InvalidDeviceList(
                f"device {device.id!r}: device spec permissions {spec.permissions!r} "
                "must be a non-empty combination of r, w and m"
            )


def _validate_id(device_id: str, seen: set[str]) -> None:
    if len(device_id) > MAX_DEVICE_ID_LENGTH:
        raise InvalidDeviceList(
            f"device id {device_id[:64]!r}... is longer than {MAX_DEVICE_ID_LENGTH} characters"
        )
    if device_id in seen:
        raise InvalidDeviceList(f"device id {device_id!r} is reported more than once")


def _validate_properties(device: DiscoveredDevice) -> None:
    if len(device.properties) > MAX_PROPERTIES_PER_DEVICE:
        raise InvalidDeviceList(
            f"device {device.id!r} has {len(device.properties)} properties, "
            f"more than {MAX_PROPERTIES_PER_DEVICE}"
        )
    for name, value in device.properties.items():
        if len(name) > MAX_PROPERTY_NAME_LENGTH:
            raise InvalidDeviceList(
                f"device {device.id!r}: property name {name[:64]!r}... is longer than "
                f"{MAX_PROPERTY_NAME_LENGTH} characters"
            )
        if not PROPERTY_NAME_PATTERN.match(name):
            raise InvalidDeviceList(
                f"device {device.id!r}: property name {name!r} is not a valid environment "
                f"variable name ({PROPERTY_NAME_PATTERN.pattern})"
            )
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_PROPERTY_VALUE_BYTES:
            raise InvalidDeviceList(
                f"device {device.id!r}: property {name} is {size} bytes, "
                f"more than {MAX_PROPERTY_VALUE_BYTES}"
            )


def _validate_paths(device_id: str, what: str, container_path: str, host_path: str) -> None:
    # The kubelet refuses relative paths only when it builds the container, far from the cause.
    for label, path in (("container_path", container_path), ("host_path", host_path)):
        if not path.startswith("/"):
            raise InvalidDeviceList(
                f"device {device_id!r}: {what} {label} {path!r} is not an absolute path"
            )


def _list_key(devices: Sequence[DiscoveredDevice]) -> tuple[DiscoveredDevice, ...]:
    return tuple(sorted(devices, key=lambda d: d.id))


class DevicePublisher:
    """Delivers one session's device lists and errors to the agent's callbacks.

    Lists are screened (:func:`screen_devices`: bad devices are left out and logged by name),
    delivered sorted by id and only when they differ from the last one delivered. After an error has been reported the next good list is delivered even when
    unchanged, so the agent can tell that the session has recovered and clear the error.
    Consecutive identical errors are reported once. Callbacks are serialised by a lock, and
    none starts after :meth:`close`.
    """

    def __init__(
        self,
        handler_name: str,
        on_devices: Callable[[list[DiscoveredDevice]], None],
        on_error: Callable[[str], None],
    ) -> None:
        self.handler_name = handler_name
        self._on_devices = on_devices
        self._on_error = on_error
        self._lock = threading.RLock()
        self._last: tuple[DiscoveredDevice, ...] | None = None
        self._last_error: str | None = None
        self._problems: dict[str, tuple[str, ...]] = {}  # bad devices last logged, per source
        # An Event, not the lock: stop() must not wait for a callback that may itself be
        # waiting for the thread calling stop().
        self._closed = threading.Event()

    @property
    def current(self) -> list[DiscoveredDevice] | None:
        """The list last delivered (the one in force), or None before the first delivery."""
        with self._lock:
            return None if self._last is None else list(self._last)

    def publish(self, devices: Sequence[DiscoveredDevice]) -> bool:
        """Screen ``devices`` and deliver the good ones if they changed; True if delivered."""
        accepted = self.screen(devices, self.handler_name)
        return False if accepted is None else self.deliver(accepted)

    def screen(
        self, devices: Sequence[DiscoveredDevice], source: str
    ) -> list[DiscoveredDevice] | None:
        """The good devices of a list from ``source``, the bad ones logged by name.

        A problem is logged when it first appears, not on every repetition of the same list.
        None (and an error reported) when the whole list is refused: too many devices.
        """
        try:
            screened = screen_devices(devices)
        except InvalidDeviceList as exc:
            log.error(
                "discovery handler %s: device list refused, keeping the previous one: %s",
                source,
                exc,
            )
            self.error(f"invalid device list from {source}: {exc}")
            return None
        with self._lock:
            changed = self._problems.get(source, ()) != screened.problems
            self._problems[source] = screened.problems
        if changed and screened.problems:
            log.error(
                "discovery handler %s: %d bad device(s) left out, the other %d used: %s",
                source,
                len(screened.problems),
                len(screened.accepted),
                "; ".join(screened.problems),
            )
        return list(screened.accepted)

    def deliver(self, devices: Sequence[DiscoveredDevice]) -> bool:
        """Deliver an already screened list if it changed; True if the agent was called."""
        key = _list_key(devices)
        with self._lock:
            if self._closed.is_set() or (key == self._last and self._last_error is None):
                return False
            self._last = key
            self._last_error = None
            _call_safely(self._on_devices, list(key), what="on_devices")
            return True

    def error(self, message: str) -> None:
        """Report ``message`` unless it repeats the error reported last."""
        with self._lock:
            if self._closed.is_set() or message == self._last_error:
                return
            self._last_error = message
            _call_safely(self._on_error, message, what="on_error")

    def close(self) -> None:
        """Start no callback from now on (one already running may still finish)."""
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()


def _call_safely(fn: Callable[[Any], None], arg: Any, *, what: str) -> None:
    try:
        fn(arg)
    except Exception:
        log.exception("discovery callback %s failed", what)


class PollingSession:
    """A session whose thread calls ``step()`` now and then every ``interval`` until stopped.

    ``step`` returns the current device list; exceptions from it are reported as errors and
    the loop goes on. ``wait(timeout)`` may be overridden to wake early (udev hotplug events).
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], Sequence[DiscoveredDevice]],
        interval: float,
        publisher: DevicePublisher,
        wait: Callable[[float, threading.Event], None] | None = None,
    ) -> None:
        self._step = step
        self._interval = interval
        self._publisher = publisher
        self._wait = wait or (lambda timeout, stop: stop.wait(timeout))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"discovery-{name}", daemon=True)

    def start(self) -> PollingSession:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._publisher.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                devices = self._step()
            except Exception as exc:
                log.exception("discovery %s failed", self._publisher.handler_name)
                self._publisher.error(f"{self._publisher.handler_name} discovery failed: {exc}")
            else:
                self._publisher.publish(devices)
            if self._stop.is_set():
                break
            self._wait(self._interval, self._stop)
