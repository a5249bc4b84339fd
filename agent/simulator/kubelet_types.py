"""Records the kubelet simulator hands out: resource state, registrations, pods, admissions.

Plain dataclasses; every one the simulator returns is a copy, so callers may keep or change it
without touching the simulator's books. The protobuf responses inside are shared: read only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from agent.protos import deviceplugin_pb2 as dp
from agent.simulator.kubelet_names import HEALTHY


@dataclass
class ResourceState:
    """What the kubelet knows about one extended resource (snapshots are copies)."""

    name: str
    endpoint: str = ""  # absolute plugin socket path; "" after a restart until re-registered
    options: dp.DevicePluginOptions | None = None  # from GetDevicePluginOptions at Register
    devices: dict[str, str] = field(default_factory=dict)  # id -> health as advertised
    topology: dict[str, tuple[int, ...]] = field(default_factory=dict)  # id -> NUMA nodes
    allocated: set[str] = field(default_factory=set)  # held by admitted or admitting pods
    registrations: int = 0
    list_updates: int = 0
    last_list_time: float | None = None  # time.monotonic()
    connected: bool = False  # a ListAndWatch stream is open
    stopped_at: float | None = None  # when the stream ended / the kubelet restarted

    def healthy(self) -> set[str]:
        return {d for d, health in self.devices.items() if health == HEALTHY}

    def snapshot(self) -> ResourceState:
        options = None
        if self.options is not None:
            options = dp.DevicePluginOptions()
            options.CopyFrom(self.options)
        return dataclasses.replace(
            self,
            options=options,
            devices=dict(self.devices),
            topology=dict(self.topology),
            allocated=set(self.allocated),
        )


@dataclass(frozen=True)
class RegistrationEvent:
    resource: str
    endpoint: str  # joined onto the plugin dir
    time: float  # time.monotonic()
    error: str = ""


@dataclass
class ContainerAllocation:
    """Devices and plugin answers for one container, per resource."""

    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)
    responses: dict[str, dp.ContainerAllocateResponse] = field(default_factory=dict)
    prestart_error: str = ""  # the container would not start; the pod keeps its devices

    @property
    def envs(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for response in self.responses.values():
            merged.update(response.envs)
        return merged

    @property
    def annotations(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for response in self.responses.values():
            merged.update(response.annotations)
        return merged

    @property
    def mounts(self) -> list[dp.Mount]:
        return [m for r in self.responses.values() for m in r.mounts]

    @property
    def device_specs(self) -> list[dp.DeviceSpec]:
        return [d for r in self.responses.values() for d in r.devices]

    def copy(self) -> ContainerAllocation:
        return dataclasses.replace(
            self,
            devices={r: list(ids) for r, ids in self.devices.items()},
            responses=dict(self.responses),
        )


@dataclass
class PodRecord:
    namespace: str
    name: str
    uid: str
    containers: list[ContainerAllocation]
    admitted_at: float

    def copy(self) -> PodRecord:
        return dataclasses.replace(self, containers=[c.copy() for c in self.containers])


@dataclass
class AdmitResult:
    admitted: bool
    uid: str
    containers: list[ContainerAllocation]
    reason: str = ""  # "UnexpectedAdmissionError" when refused
    error: str = ""

    @property
    def started(self) -> bool:
        """Admitted and every PreStartContainer call (if any) succeeded."""
        return self.admitted and not any(c.prestart_error for c in self.containers)

    def container(self, name: str) -> ContainerAllocation:
        return next(c for c in self.containers if c.name == name)
