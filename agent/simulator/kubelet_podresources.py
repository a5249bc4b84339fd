"""The kubelet simulator's PodResources v1 server (`v1.PodResourcesLister`).

Builds answers from the simulator's public snapshots (`pods()`, `resources()`), shaped the way
the kubelet shapes them: active pods only, no pod UID, device ids exactly as the plugin
advertised, one `ContainerDevices` per resource and NUMA node for a container, and one entry
per device (and NUMA node) in `GetAllocatableResources`. Consumers must aggregate both forms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import grpc

from agent.protos import podresources_pb2 as pr
from agent.protos import podresources_pb2_grpc as pr_grpc
from agent.simulator.kubelet_names import HEALTHY
from agent.simulator.kubelet_types import ContainerAllocation, PodRecord, ResourceState

RATE_LIMIT_MESSAGE = "rejected by rate limit"


def _topology(numa: Iterable[int]) -> pr.TopologyInfo | None:
    nodes = [pr.NUMANode(ID=n) for n in numa]
    return pr.TopologyInfo(nodes=nodes) if nodes else None


def container_devices(
    container: ContainerAllocation, topology: Mapping[str, Mapping[str, tuple[int, ...]]]
) -> list[pr.ContainerDevices]:
    """Group a container's ids per resource and NUMA node, as podDevices does."""
    out: list[pr.ContainerDevices] = []
    for resource, ids in container.devices.items():
        by_node: dict[int | None, list[str]] = {}
        for device_id in ids:
            for node in topology.get(resource, {}).get(device_id) or (None,):
                by_node.setdefault(node, []).append(device_id)
        for node, node_ids in by_node.items():
            out.append(
                pr.ContainerDevices(
                    resource_name=resource,
                    device_ids=node_ids,
                    topology=_topology(() if node is None else (node,)),
                )
            )
    return out


def pod_message(
    pod: PodRecord, topology: Mapping[str, Mapping[str, tuple[int, ...]]]
) -> pr.PodResources:
    return pr.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            pr.ContainerResources(name=c.name, devices=container_devices(c, topology))
            for c in pod.containers
        ],
    )


def allocatable_devices(resources: Mapping[str, ResourceState]) -> list[pr.ContainerDevices]:
    """Every healthy device, one entry per device and NUMA node (free or not)."""
    out: list[pr.ContainerDevices] = []
    for name, state in resources.items():
        for device_id, health in state.devices.items():
            if health != HEALTHY:
                continue
            for node in state.topology.get(device_id) or (None,):
                out.append(
                    pr.ContainerDevices(
                        resource_name=name,
                        device_ids=[device_id],
                        topology=_topology(() if node is None else (node,)),
                    )
                )
    return out


class PodResourcesServicer(pr_grpc.PodResourcesListerServicer):
    """Answers from snapshots; `admit_call` enforces the simulator's rate-limit knob."""

    def __init__(
        self,
        pods: Callable[[], list[PodRecord]],
        resources: Callable[[], dict[str, ResourceState]],
        admit_call: Callable[[str], bool],
    ) -> None:
        self._pods = pods
        self._resources = resources
        self._admit_call = admit_call

    def _check(self, method: str, context: grpc.ServicerContext) -> None:
        if not self._admit_call(method):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMIT_MESSAGE)

    def _topology_map(self) -> dict[str, dict[str, tuple[int, ...]]]:
        return {name: state.topology for name, state in self._resources().items()}

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext):
        self._check("List", context)
        topology = self._topology_map()
        return pr.ListPodResourcesResponse(
            pod_resources=[pod_message(p, topology) for p in self._pods()]
        )

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ):
        self._check("GetAllocatableResources", context)
        return pr.AllocatableResourcesResponse(devices=allocatable_devices(self._resources()))

    def Get(self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext):
        self._check("Get", context)
        for pod in self._pods():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pr.GetPodResourcesResponse(
                    pod_resources=pod_message(pod, self._topology_map())
                )
        # A plain Go error in the kubelet, hence UNKNOWN.
        context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
