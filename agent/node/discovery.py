"""Discovery sessions of one agent: one per usable Configuration, keyed by what started it.

A session runs while its Configuration is valid and its handler is registered. It is restarted
when the handler or the Configuration's discovery details or properties change (the key), and
it keeps the device list it last reported, which the agent turns into Instances.

``discoveryProperties`` are resolved here as Akri's agent does (akri-compat.md §1.1): plain
values, or ``valueFrom`` a Secret or ConfigMap key (ConfigMaps: ``data`` first, then
``binaryData``); a missing key is skipped when ``optional``, else the Configuration cannot run.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from agent.discovery.base import DiscoveredDevice, DiscoveryError, DiscoveryHandler
from agent.domain.configspec import ConfigSpec, DiscoveryProperty
from agent.kube.client import CoreApi

log = logging.getLogger(__name__)


class UnresolvedProperty(Exception):
    """A discoveryProperty whose value cannot be read."""


def session_key(handler: DiscoveryHandler, spec: ConfigSpec) -> tuple:
    """What a running session depends on: a change of any part restarts it."""
    properties = json.dumps(
        [(p.name, p.value, p.value_from) for p in spec.discovery_properties], sort_keys=True
    )
    # ``shared`` too: an external handler keeps its identity when its endpoints re-register
    # with another shared flag, and the Instances' names depend on it.
    return (
        spec.handler_name,
        id(handler),
        bool(handler.shared),
        spec.discovery_details,
        properties,
    )


def resolve_properties(
    api_client: client.ApiClient, properties: tuple[DiscoveryProperty, ...]
) -> dict[str, bytes | None]:
    resolved: dict[str, bytes | None] = {}
    for prop in properties:
        if prop.value_from is None:
            resolved[prop.name] = None if prop.value is None else prop.value.encode()
            continue
        value = _resolve_reference(api_client, prop)
        if value is not None:
            resolved[prop.name] = value
    return resolved


def _resolve_reference(api_client: client.ApiClient, prop: DiscoveryProperty) -> bytes | None:
    source = prop.value_from or {}
    secret, config_map = source.get("secretKeyRef"), source.get("configMapKeyRef")
    ref = secret if isinstance(secret, dict) else config_map
    if not isinstance(ref, dict) or not ref.get("name") or not ref.get("key"):
        raise UnresolvedProperty(f"discoveryProperty {prop.name}: valueFrom needs a name and a key")
    namespace = ref.get("namespace") or "default"
    core = CoreApi(api_client)
    try:
        if ref is secret:
            obj = core.read_namespaced_secret(ref["name"], namespace)
            encoded = (obj.get("data") or {}).get(ref["key"])
            value = None if encoded is None else base64.b64decode(encoded)
        else:
            obj = core.read_namespaced_config_map(ref["name"], namespace)
            value = _config_map_value(obj, ref["key"])
    except ApiException as exc:
        if exc.status == 404 and ref.get("optional"):
            return None
        raise UnresolvedProperty(
            f"discoveryProperty {prop.name}: reading {namespace}/{ref['name']}: {exc.status}"
        ) from None
    if value is None and not ref.get("optional"):
        raise UnresolvedProperty(
            f"discoveryProperty {prop.name}: key {ref['key']!r} not in {namespace}/{ref['name']}"
        )
    return value


def _config_map_value(obj: dict[str, Any], key: str) -> bytes | None:
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    if key in data:
        return data[key].encode()
    if key in binary:
        return base64.b64decode(binary[key])
    return None


class ConfigDiscovery:
    """The running session of one Configuration and the devices it last reported."""

    def __init__(
        self,
        configuration: str,
        handler: DiscoveryHandler,
        key: tuple,
        on_change: Callable[[str], None],
    ) -> None:
        self.configuration = configuration
        self.handler = handler
        self.key = key
        self.devices: list[DiscoveredDevice] | None = None  # None until the first list
        self.error = ""
        self._on_change = on_change
        self._lock = threading.Lock()
        self._session: Any = None

    @property
    def shared(self) -> bool:
        return bool(self.handler.shared)

    def start(self, details: str, properties: Mapping[str, bytes | None]) -> None:
        """Raises DiscoveryError (or whatever the handler raises) when it cannot start."""
        self._session = self.handler.start(details, properties, self._devices, self._failed)

    def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                session.stop()
            except Exception:  # a handler's bug must not stop the agent
                log.exception("stopping discovery for %s failed", self.configuration)

    def current(self) -> list[DiscoveredDevice] | None:
        with self._lock:
            return None if self.devices is None else list(self.devices)

    def _devices(self, devices: list[DiscoveredDevice]) -> None:
        with self._lock:
            self.devices = list(devices)
            self.error = ""
        log.info(
            "discovery for %s: %d device(s) %s",
            self.configuration,
            len(devices),
            [d.id for d in devices][:10],
        )
        self._on_change(self.configuration)

    def _failed(self, message: str) -> None:
        with self._lock:
            self.error = message
        log.warning("discovery for %s: %s", self.configuration, message)


__all__ = [
    "ConfigDiscovery",
    "DiscoveryError",
    "UnresolvedProperty",
    "resolve_properties",
    "session_key",
]
