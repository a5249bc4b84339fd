"""debugEcho: Akri's test discovery handler, embedded in the agent.

Semantics follow Akri's debugEcho: ``discoveryDetails`` is YAML ``descriptions: [...]``; each
description becomes one device whose id is the description and whose only property is
``DEBUG_ECHO_DESCRIPTION``. An availability file stands in for devices coming and going: while
it contains ``OFFLINE`` the handler reports no devices, otherwise all of them. The file is
polled (Akri: every 10 s) and a list is sent only when it changes, the first one always.

Flip availability with :func:`set_availability` (or by writing the file by hand), as Akri's
end-to-end tests do with ``kubectl exec ... echo OFFLINE > /tmp/debug-echo-availability.txt``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping

import yaml

from .base import DevicePublisher, DiscoveredDevice, DiscoveryError, PollingSession

NAME = "debugEcho"
DESCRIPTION_PROPERTY = "DEBUG_ECHO_DESCRIPTION"
DEFAULT_AVAILABILITY_PATH = "/tmp/debug-echo-availability.txt"
OFFLINE = "OFFLINE"
DEFAULT_POLL_INTERVAL = 10.0
SHARED_ENV = "DEBUG_ECHO_INSTANCES_SHARED"


def parse_descriptions(discovery_details: str) -> list[str]:
    """The ``descriptions`` in debugEcho ``discoveryDetails``; DiscoveryError if malformed."""
    if not discovery_details.strip():
        raise DiscoveryError(
            "debugEcho discoveryDetails is empty; expected YAML like 'descriptions: [foo0, foo1]'"
        )
    try:
        parsed = yaml.safe_load(discovery_details)
    except yaml.YAMLError as exc:
        raise DiscoveryError(f"debugEcho discoveryDetails is not valid YAML: {exc}") from exc
    if not isinstance(parsed, dict) or "descriptions" not in parsed:
        raise DiscoveryError("debugEcho discoveryDetails must be a mapping with 'descriptions'")
    descriptions = parsed["descriptions"]
    if not isinstance(descriptions, list) or not all(isinstance(d, str) for d in descriptions):
        raise DiscoveryError("debugEcho 'descriptions' must be a list of strings")
    duplicates = sorted({d for d in descriptions if descriptions.count(d) > 1})
    if duplicates:
        raise DiscoveryError(f"debugEcho 'descriptions' repeats {', '.join(duplicates)}")
    return descriptions


def devices_for(descriptions: list[str]) -> list[DiscoveredDevice]:
    return [DiscoveredDevice(id=d, properties={DESCRIPTION_PROPERTY: d}) for d in descriptions]


def is_available(path: str) -> bool:
    """False while the availability file says OFFLINE; a missing file means available."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return OFFLINE not in f.read()
    except FileNotFoundError:
        return True


def set_availability(available: bool, path: str = DEFAULT_AVAILABILITY_PATH) -> None:
    """Write the availability file atomically, so a poll never reads half a word."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".debug-echo-", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("ONLINE\n" if available else f"{OFFLINE}\n")
    os.replace(tmp, path)


def parse_shared(value: str | None) -> bool:
    """Strict parse of DEBUG_ECHO_INSTANCES_SHARED: unset → True, a typo is an error."""
    if value is None or value == "":
        return True
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"{SHARED_ENV} must be 'true' or 'false', not {value!r}")
    return lowered == "true"


class DebugEchoHandler:
    """The embedded debugEcho handler."""

    name = NAME

    def __init__(
        self,
        *,
        shared: bool = True,
        availability_path: str = DEFAULT_AVAILABILITY_PATH,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        self.shared = shared
        self.availability_path = availability_path
        self.poll_interval = poll_interval

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        availability_path: str = DEFAULT_AVAILABILITY_PATH,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> DebugEchoHandler:
        """Shared-ness from DEBUG_ECHO_INSTANCES_SHARED, as Akri's debugEcho reads it."""
        env = os.environ if env is None else env
        return cls(
            shared=parse_shared(env.get(SHARED_ENV)),
            availability_path=availability_path,
            poll_interval=poll_interval,
        )

    def set_available(self, available: bool) -> None:
        set_availability(available, self.availability_path)

    def start(
        self,
        discovery_details: str,
        discovery_properties: Mapping[str, bytes | None],
        on_devices: Callable[[list[DiscoveredDevice]], None],
        on_error: Callable[[str], None],
    ) -> PollingSession:
        devices = devices_for(parse_descriptions(discovery_details))
        path = self.availability_path

        def step() -> list[DiscoveredDevice]:
            return devices if is_available(path) else []

        publisher = DevicePublisher(self.name, on_devices, on_error)
        return PollingSession(self.name, step, self.poll_interval, publisher).start()
