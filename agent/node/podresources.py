"""A client of the kubelet's PodResources v1 API: which pod holds which ``akri.sh/*`` device.

The kubelet never tells a device plugin which pod an ``Allocate`` was for, and never calls it
when a pod ends. ``List`` is the one place that says it: the device ids each active pod's
containers hold, exactly as the plugin advertised them (IL ids are slot keys, CL ids are
vdevs). There is no pod UID in the answer, only namespace and name.

Errors are all temporary from the caller's point of view: the kubelet restarting (socket gone
or a new inode), the rate limit (``RESOURCE_EXHAUSTED``) or a timeout. The caller keeps its
books as they are and asks again later.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc

from agent.domain.naming import AKRI_PREFIX
from agent.protos import podresources_pb2 as pr
from agent.protos import podresources_pb2_grpc as pr_grpc

# Kubelet e2e defaults (kubelet-apis.md §1.7).
MAX_MESSAGE = 16 * 1024 * 1024
CALL_TIMEOUT = 10.0
RESOURCE_PREFIX = AKRI_PREFIX + "/"


@dataclass(frozen=True)
class DeviceUse:
    """One device id in use by one container of one pod, as the kubelet reports it."""

    resource_name: str
    device_id: str
    namespace: str
    pod: str
    container: str


class PodResourcesUnavailable(Exception):
    """The kubelet could not answer now (restarting, rate limited, slow): ask again later."""


class PodResourcesClient:
    """``List`` over the kubelet's unix socket, filtered to ``akri.sh/`` resources."""

    def __init__(self, socket_path: str, *, timeout: float = CALL_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: pr_grpc.PodResourcesListerStub | None = None

    def list(self) -> list[DeviceUse]:
        """Every ``akri.sh/*`` device id held by an active pod on this node."""
        for attempt in (1, 2):
            stub = self._connect()
            try:
                answer = stub.List(pr.ListPodResourcesRequest(), timeout=self.timeout)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.UNAVAILABLE:
                    # A restarted kubelet listens on a new inode: dial afresh (once, now)
                    # rather than wait out the old channel's reconnect backoff.
                    self.close()
                    if attempt == 1:
                        continue
                raise PodResourcesUnavailable(f"{err.code().name}: {err.details()}") from None
            return uses_of(answer)
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def _connect(self) -> pr_grpc.PodResourcesListerStub:
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(
                    f"unix://{self.socket_path}",
                    options=[
                        ("grpc.max_receive_message_length", MAX_MESSAGE),
                        # grpc-go servers accept it; a %-encoded socket path may not be.
                        ("grpc.default_authority", "localhost"),
                        ("grpc.initial_reconnect_backoff_ms", 100),
                        ("grpc.max_reconnect_backoff_ms", 1000),
                    ],
                )
                self._stub = pr_grpc.PodResourcesListerStub(self._channel)
            return self._stub


def uses_of(answer: pr.ListPodResourcesResponse) -> list[DeviceUse]:
    """Flatten a ``List`` answer to ``akri.sh/*`` device uses.

    A container may list one resource several times (once per NUMA node), so entries are
    aggregated, and an id is reported once per container.
    """
    uses: dict[tuple[str, str, str, str, str], DeviceUse] = {}
    for pod in answer.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not devices.resource_name.startswith(RESOURCE_PREFIX):
                    continue
                for device_id in devices.device_ids:
                    use = DeviceUse(
                        devices.resource_name, device_id, pod.namespace, pod.name, container.name
                    )
                    uses[(use.resource_name, device_id, use.namespace, use.pod, use.container)] = (
                        use
                    )
    return list(uses.values())
