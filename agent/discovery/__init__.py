"""Device discovery for the node agent: the handler interface and the handlers.

``base`` holds the interface the agent codes against; ``debugecho`` and ``udev`` are the
built-in handlers; ``external`` speaks Akri's discovery gRPC (``v0``) to out-of-process
handlers. Nothing here imports Django.
"""

from .base import (
    DeviceSpec,
    DiscoveredDevice,
    DiscoveryError,
    DiscoveryHandler,
    DiscoverySession,
    HandlerRegistry,
    Mount,
    validate_devices,
)

__all__ = [
    "DeviceSpec",
    "DiscoveredDevice",
    "DiscoveryError",
    "DiscoveryHandler",
    "DiscoverySession",
    "HandlerRegistry",
    "Mount",
    "validate_devices",
]
