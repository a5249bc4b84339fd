"""The Allocate answer for a container: envs, mounts, device nodes and annotations.

Akri v0.13 (akri-compat.md §4.1): every broker property twice, as ``KEY`` and
``KEY_<DIGEST>``; mounts and device specs as the discovery handler reported them (a device
spec without a host path uses its container path). Annotations name the slots Akri ≤0.12
style (``akri.agent.slot-<slot>: <value>``) plus ``akri.sh/instance``, so a slot can be traced
to its container.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agent.discovery.base import DiscoveredDevice
from agent.domain.naming import broker_envs, digest_from_instance_name
from agent.protos import deviceplugin_pb2 as dp

SLOT_ANNOTATION_PREFIX = "akri.agent.slot-"
INSTANCE_ANNOTATION = "akri.sh/instance"
CONFIGURATION_ANNOTATION = "akri.sh/configuration"


@dataclass(frozen=True)
class Granted:
    """One slot handed to a container: the Instance as last seen, and its device."""

    instance: dict[str, Any]
    device: DiscoveredDevice | None
    slot: str
    value: str

    @property
    def name(self) -> str:
        return self.instance["metadata"]["name"]


def instance_digest_of(obj: dict[str, Any]) -> str:
    """The digest part of an Instance's name (from cdiName when the name is unusual)."""
    spec = obj.get("spec") or {}
    name = obj["metadata"]["name"]
    digest = digest_from_instance_name(spec.get("configurationName", ""), name)
    if digest:
        return digest
    cdi = str(spec.get("cdiName") or "")
    return cdi.rpartition("=")[2] or name[-6:]


def container_response(
    granted: Iterable[Granted], configuration: str = ""
) -> dp.ContainerAllocateResponse:
    response = dp.ContainerAllocateResponse()
    instances: list[str] = []
    mounts: set[tuple[str, str, bool]] = set()
    specs: set[tuple[str, str, str]] = set()
    for grant in granted:
        if grant.name not in instances:
            instances.append(grant.name)
            properties = (grant.instance.get("spec") or {}).get("brokerProperties") or {}
            response.envs.update(broker_envs(properties, instance_digest_of(grant.instance)))
            _add_device(response, grant.device, mounts, specs)
        response.annotations[SLOT_ANNOTATION_PREFIX + grant.slot] = grant.value
    response.annotations[INSTANCE_ANNOTATION] = ",".join(instances)
    if configuration:
        response.annotations[CONFIGURATION_ANNOTATION] = configuration
    return response


def _add_device(
    response: dp.ContainerAllocateResponse,
    device: DiscoveredDevice | None,
    mounts: set[tuple[str, str, bool]],
    specs: set[tuple[str, str, str]],
) -> None:
    if device is None:
        return
    for mount in device.mounts:
        key = (mount.container_path, mount.host_path, mount.read_only)
        if key not in mounts:
            mounts.add(key)
            response.mounts.add(
                container_path=mount.container_path,
                host_path=mount.host_path,
                read_only=mount.read_only,
            )
    for spec in device.device_specs:
        key = (spec.container_path, spec.host_path or spec.container_path, spec.permissions)
        if key not in specs:
            specs.add(key)
            response.devices.add(container_path=key[0], host_path=key[1], permissions=key[2])
