"""The floor under the Allocate benchmarks: a device plugin that does nothing but its writes.

``FloorPlugin`` serves the device-plugin API on the agent's own event loop, as every plugin of
the agent does (``grpc.aio``, the handler's blocking work in the loop's thread pool), and its
``Allocate`` makes one conditional write per requested slot through the same kind of client as
the claim store, the writes of one request concurrently (all but the last in the agent's claim
pool, the last in the handler's thread, as the CL plugin does), then answers an empty response. Like the
real plugins it marks itself in flight for the process's background loops
(``agent.kube.foreground``) until gRPC sent the answer, so the watch's echo of its write does
not compete with the answer. No claim store, no cache, no reconciler, no response building.

Timed by the kubelet process exactly as the real plugins are, it shows what an Allocate costs
on this machine before the agent does anything of its own: a benchmark prints it next to the
real figures, so a ratio target can be read against the floor the same run measured.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import grpc

from agent.kube.client import AkriApi, new_api_client
from agent.kube.foreground import FOREGROUND
from agent.node.loop import LoopThread
from agent.protos import deviceplugin_pb2 as dp
from agent.protos import deviceplugin_pb2_grpc as dp_grpc

if TYPE_CHECKING:
    from agent.node.agent import NodeAgent

HOLDER = "bench-floor"


class FloorPlugin:
    """Serves ``socket_path`` on ``loop``; each requested device id names a slot
    ``(instance, key)`` it toggles between free and ``HOLDER`` with a ``test``ed patch."""

    def __init__(
        self,
        loop: LoopThread,
        pool: Executor,
        api: AkriApi,
        socket_path: str,
        slots: dict[str, str],
    ) -> None:
        self.loop = loop
        self.pool = pool
        self.api = api
        self.socket_path = socket_path
        self.slots = slots  # device id -> Instance name
        self.values = dict.fromkeys(slots, "")  # as last written by this plugin
        self.versions: dict[str, str] = {}  # Instance -> resourceVersion of our last write
        self._server: grpc.aio.Server | None = None

    @classmethod
    def beside(cls, agent: NodeAgent, kubeconfig: str, slots: dict[str, str]) -> FloorPlugin:
        """On ``agent``'s loop and claim pool, with a client of its own, its socket in the
        directory of ``kubeconfig`` (the benchmark's scratch directory)."""
        api = AkriApi(new_api_client(kubeconfig), agent.namespace)
        socket_path = os.path.join(os.path.dirname(kubeconfig), "floor.sock")
        return cls(agent.loop, agent.claim_pool, api, socket_path, slots)

    def start(self) -> FloorPlugin:
        self.loop.run(self._start(), timeout=10)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self.loop.run(self._server.stop(None), timeout=10)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    async def _start(self) -> None:
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port("unix://" + self.socket_path)
        await server.start()
        self._server = server

    def write_all(self, ids: list[str]) -> None:
        futures = [self.pool.submit(self._write, i) for i in ids[:-1]]
        self._write(ids[-1])
        for future in futures:
            future.result()

    def _write(self, device_id: str) -> None:
        instance, old = self.slots[device_id], self.values[device_id]
        new = "" if old else HOLDER
        path = f"/spec/deviceUsage/{device_id}"
        answer = self.api.patch_instance(
            instance,
            [
                {"op": "test", "path": path, "value": old},
                {"op": "replace", "path": path, "value": new},
            ],
        )
        self.values[device_id] = new
        self.versions[instance] = answer["metadata"]["resourceVersion"]


class _Servicer(dp_grpc.DevicePluginServicer):
    def __init__(self, plugin: FloorPlugin) -> None:
        self.plugin = plugin

    async def Allocate(self, request: dp.AllocateRequest, context: Any) -> dp.AllocateResponse:
        context.add_done_callback(FOREGROUND.enter())
        ids = [i for r in request.container_requests for i in r.devices_ids]
        # As the real plugins: blocking work leaves the loop for its pool.
        await asyncio.get_running_loop().run_in_executor(
            self.plugin.loop.blocking, self.plugin.write_all, ids
        )
        return dp.AllocateResponse(
            container_responses=[dp.ContainerAllocateResponse() for _ in request.container_requests]
        )
