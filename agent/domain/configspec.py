"""Reading an Akri Configuration: defaults as Akri's deserializer applies them, and refusal
of what cannot be used, with a message that says what is wrong.

The CRD schema has no defaults (as Akri's), so a real server and the simulator both hand us
objects where any field may be missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAX_CAPACITY = 1024
_PROPERTY_NAME = re.compile(r"^[_A-Za-z][_A-Za-z0-9]*$")


class InvalidConfiguration(ValueError):
    """A Configuration that cannot be used as it is."""


@dataclass(frozen=True)
class DiscoveryProperty:
    name: str
    value: str | None = None
    # {"secretKeyRef": {...}} or {"configMapKeyRef": {...}}, as in the spec.
    value_from: dict[str, Any] | None = None


@dataclass(frozen=True)
class ConfigSpec:
    namespace: str
    name: str
    handler_name: str
    discovery_details: str = ""
    discovery_properties: tuple[DiscoveryProperty, ...] = ()
    capacity: int = 1
    unique_devices: bool = True
    broker_properties: dict[str, str] = field(default_factory=dict)
    broker_spec: dict[str, Any] | None = None
    instance_service_spec: dict[str, Any] | None = None
    configuration_service_spec: dict[str, Any] | None = None


def parse_configuration(obj: dict[str, Any]) -> ConfigSpec:
    """The usable form of a Configuration object, or ``InvalidConfiguration`` saying why not."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise InvalidConfiguration(f"Configuration {name!r}: spec is missing or not an object")
    handler = spec.get("discoveryHandler")
    if (
        not isinstance(handler, dict)
        or not isinstance(handler.get("name"), str)
        or not handler["name"]
    ):
        raise InvalidConfiguration(
            f"Configuration {name!r}: spec.discoveryHandler.name is required (a non-empty string)"
        )
    details = handler.get("discoveryDetails", "")
    if details is None:
        details = ""
    if not isinstance(details, str):
        raise InvalidConfiguration(
            f"Configuration {name!r}: spec.discoveryHandler.discoveryDetails must be a string"
        )
    capacity = spec.get("capacity", 1)
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise InvalidConfiguration(f"Configuration {name!r}: spec.capacity must be a whole number")
    if not 1 <= capacity <= MAX_CAPACITY:
        raise InvalidConfiguration(
            f"Configuration {name!r}: spec.capacity {capacity} is outside 1..{MAX_CAPACITY}"
        )
    unique = spec.get("uniqueDevices", True)
    if unique is None:
        unique = True
    if not isinstance(unique, bool):
        raise InvalidConfiguration(
            f"Configuration {name!r}: spec.uniqueDevices must be true or false"
        )
    broker_properties = spec.get("brokerProperties") or {}
    if not isinstance(broker_properties, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in broker_properties.items()
    ):
        raise InvalidConfiguration(
            f"Configuration {name!r}: spec.brokerProperties must map strings to strings"
        )
    broker_spec = spec.get("brokerSpec")
    if broker_spec is not None:
        if not isinstance(broker_spec, dict):
            raise InvalidConfiguration(f"Configuration {name!r}: spec.brokerSpec must be an object")
        kinds = [k for k in ("brokerPodSpec", "brokerJobSpec") if broker_spec.get(k) is not None]
        if len(kinds) > 1:
            raise InvalidConfiguration(
                f"Configuration {name!r}: spec.brokerSpec takes brokerPodSpec or brokerJobSpec, not both"
            )
    return ConfigSpec(
        namespace=meta.get("namespace", ""),
        name=name,
        handler_name=handler["name"],
        discovery_details=details,
        discovery_properties=_properties(name, handler.get("discoveryProperties")),
        capacity=capacity,
        unique_devices=unique,
        broker_properties=dict(broker_properties),
        broker_spec=broker_spec,
        instance_service_spec=spec.get("instanceServiceSpec"),
        configuration_service_spec=spec.get("configurationServiceSpec"),
    )


def _properties(config: str, raw: Any) -> tuple[DiscoveryProperty, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidConfiguration(
            f"Configuration {config!r}: discoveryHandler.discoveryProperties must be a list"
        )
    result = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidConfiguration(
                f"Configuration {config!r}: every discoveryProperty needs a name"
            )
        if not _PROPERTY_NAME.match(item["name"]):
            raise InvalidConfiguration(
                f"Configuration {config!r}: discoveryProperty name {item['name']!r} is not a valid name"
            )
        value, value_from = item.get("value"), item.get("valueFrom")
        if value is not None and value_from is not None:
            raise InvalidConfiguration(
                f"Configuration {config!r}: discoveryProperty {item['name']!r} has both value and valueFrom"
            )
        if value is not None and not isinstance(value, str):
            raise InvalidConfiguration(
                f"Configuration {config!r}: discoveryProperty {item['name']!r} value must be a string"
            )
        result.append(DiscoveryProperty(item["name"], value, value_from))
    return tuple(result)
