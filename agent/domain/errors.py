"""Exceptions raised by the domain rules.

Plain classes carrying the facts as attributes, so the device plugins can translate them into
Akri's gRPC messages and the dashboard can show them, without parsing message strings.
"""


class DomainError(Exception):
    """Base class: a request the domain rules refuse. State is left as it was."""


class InvalidDeviceId(DomainError):
    """A kubelet device id (slot key or CL vdev id) that does not belong to this plugin."""

    def __init__(self, device_id: str, reason: str) -> None:
        self.device_id = device_id
        self.reason = reason
        super().__init__(f"invalid device id {device_id!r}: {reason}")


class SlotTaken(DomainError):
    """The slot is held by someone else (another node, or the other plugin kind)."""

    def __init__(self, key: str, holder: str) -> None:
        self.key = key
        self.holder = holder
        super().__init__(f"slot {key!r} is held by {holder!r}")


class SlotChanged(DomainError):
    """A release found a different holder than the one it meant to release."""

    def __init__(self, key: str, expected: str, actual: str) -> None:
        self.key = key
        self.expected = expected
        self.actual = actual
        super().__init__(f"slot {key!r} holds {actual!r}, not {expected!r}; left as it is")


class ForeignValue(DomainError):
    """A deviceUsage value we do not understand: reported, never overwritten."""

    def __init__(self, key: str, value: str) -> None:
        self.key = key
        self.value = value
        super().__init__(f"slot {key!r} holds an unrecognised value {value!r}; not overwriting it")


class InsufficientDevices(DomainError):
    """A Configuration-level request asks for more devices than can be claimed right now."""

    def __init__(self, requested: int, available: int, unique: bool = True) -> None:
        self.requested = requested
        self.available = available
        self.unique = unique
        kind = "unique devices" if unique else "devices"
        super().__init__(f"{requested} {kind} requested, {available} available")
