"""A kubelet device plugin (v1beta1) on the agent's asyncio loop: socket, registration, streams.

Kubelet contract (kubelet-apis.md §1.4-1.6): serve on ``<plugin_dir>/<name>-<unix secs>.sock``
first, then call ``Register`` on ``kubelet.sock`` with the socket's base name; inside Register
the kubelet dials back and calls GetDevicePluginOptions, so the server must already be
answering (it is: ``grpc.aio`` on a loop that is free while we await Register). Register is
retried until the kubelet accepts it. ListAndWatch sends the complete device list at once and
again whenever it changes; ``notify()`` (from any thread) wakes the streams, which recompute
the list and send it if it differs from the last one sent. There is no polling.

A kubelet restart wipes the sockets and listens on a new ``kubelet.sock``; the agent's watcher
then calls ``restart()``: a new socket and a new registration.

Subclasses say what the devices are and how Allocate claims them (``il``, ``cl``). Allocate's
blocking work (claims through the API server) runs in the loop's thread pool, and the answer
leaves as soon as the claims stand: the reconciler's bookkeeping happens after it, still under
the reconciler's per-Instance lock, so no reconcile action can come in between. The device-list
updates the claims cause wait until the answer has been sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

import grpc

from agent import metrics
from agent.domain.naming import plugin_socket_name
from agent.kube.foreground import FOREGROUND, QUIET
from agent.node.host import PluginHost
from agent.protos import deviceplugin_pb2 as dp
from agent.protos import deviceplugin_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT = 15.0  # the kubelet's own dial back to us may take up to 10 s
REGISTER_RETRY_MAX = 2.0
STOP_GRACE = 0.5
REGISTER_FINISH_WAIT = 1.0
# The kubelet (grpc-go) accepts the %-encoded socket path C-core sends as :authority; stricter
# servers do not, and the kubelet itself dials plugins with "localhost".
CHANNEL_OPTIONS = [("grpc.default_authority", "localhost")]


Respond = Callable[[dp.AllocateResponse], None]


class AllocateRefused(Exception):
    """An Allocate the plugin refuses; nothing was written (or it was rolled back)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def socket_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


async def register_with_kubelet(
    kubelet_socket: str, endpoint: str, resource_name: str, options: dp.DevicePluginOptions
) -> None:
    """One Register call on a fresh channel, so no reconnect backoff of an old one applies."""
    async with grpc.aio.insecure_channel("unix://" + kubelet_socket, options=CHANNEL_OPTIONS) as ch:
        request = dp.RegisterRequest(
            version=API_VERSION, endpoint=endpoint, resource_name=resource_name, options=options
        )
        await dp_grpc.RegistrationStub(ch).Register(request, timeout=REGISTER_TIMEOUT)


class DevicePlugin:
    """Base of the IL and CL plugins. Lifecycle methods are coroutines run on the agent's loop;
    ``notify`` may be called from any thread."""

    level = "?"

    def __init__(self, agent: PluginHost, name: str, resource_name: str) -> None:
        self.agent = agent
        self.name = name
        self.resource_name = resource_name
        self.socket_path = ""
        self.inode: int | None = None
        self.registered = False
        self.registrations = 0
        self.updates_sent = 0
        self._server: grpc.aio.Server | None = None
        self._register_task: asyncio.Task | None = None
        self._lifecycle = asyncio.Lock()
        self._changed = asyncio.Event()
        self._stopping = False
        self._in_register = False
        self._wake_pending = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.resource_name} {self.socket_path or '(not serving)'}>"

    # --- what subclasses define -----------------------------------------------------------
    def options(self) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(pre_start_required=False)

    def devices(self) -> list[tuple[str, str]]:
        """(kubelet device id, health) as of now."""
        raise NotImplementedError

    def allocate(self, request: dp.AllocateRequest, respond: Respond) -> None:
        """Blocking. Claims, then ``respond(answer)`` (the kubelet gets it at once), then
        anything that may follow the answer; raises AllocateRefused before responding."""
        raise NotImplementedError

    def preferred(self, request: dp.PreferredAllocationRequest) -> dp.PreferredAllocationResponse:
        raise AllocateRefused(
            grpc.StatusCode.UNIMPLEMENTED, "GetPreferredAllocation is not offered"
        )

    # --- lifecycle (on the loop) ------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return self._server is not None and not self._stopping

    async def start(self) -> None:
        async with self._lifecycle:
            if self._stopping or self._server is not None:
                return
            await self._serve()
            self._start_registration()

    async def restart(self, why: str) -> None:
        """Serve on a new socket and register again (the kubelet restarted or lost our socket)."""
        async with self._lifecycle:
            if self._stopping:
                return
            log.info("%s: re-serving and re-registering (%s)", self.resource_name, why)
            await self._cancel_registration()
            await self._close_server()
            await self._serve()
            self._start_registration()

    async def stop(self) -> None:
        """End the streams, stop serving, remove the socket. Final."""
        self._stopping = True
        self._wake()
        async with self._lifecycle:
            await self._finish_registration()
            await self._close_server()
        log.info("%s: plugin stopped", self.resource_name)

    def notify(self) -> None:
        """Something the device list depends on changed (thread-safe). Changes that arrive
        before the loop gets to it (a burst of watch events) make one update."""
        if not self._wake_pending:
            self._wake_pending = True
            self.agent.loop.call_soon(self._wake)

    def _wake(self) -> None:
        # Waiters hold the old event; a fresh one catches the next change.
        self._wake_pending = False
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _serve(self) -> None:
        directory = self.agent.plugin_dir
        path = os.path.join(directory, plugin_socket_name(self.name, int(time.time())))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a stale file blocks bind()
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(_Servicer(self), _GenericOnly(server))
        server.add_insecure_port("unix://" + path)
        await server.start()
        self._server, self.socket_path = server, path
        self.inode = socket_inode(path)
        self.registered = False

    async def _close_server(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._wake()
        await server.stop(STOP_GRACE)
        # Only our own file: after a kubelet restart the path may be gone already.
        if self.socket_path and socket_inode(self.socket_path) == self.inode:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)

    def _start_registration(self) -> None:
        self._register_task = asyncio.get_running_loop().create_task(self._register_until_done())

    async def _cancel_registration(self) -> None:
        task, self._register_task = self._register_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _finish_registration(self) -> None:
        """Let a Register under way complete (briefly): the kubelet is dialling us back inside
        it, and closing the socket now would leave it waiting out its dial timeout."""
        task = self._register_task
        if task is not None and not task.done() and self._in_register:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), REGISTER_FINISH_WAIT)
        await self._cancel_registration()

    async def _register_until_done(self) -> None:
        delay, failures = 0.1, 0
        endpoint = os.path.basename(self.socket_path)
        while not self._stopping:
            if socket_inode(self.socket_path) != self.inode:
                # A (re)starting kubelet wiped our socket: the kubelet watcher re-serves us on
                # a new one; registering this one would leave the kubelet dialling nothing.
                await asyncio.sleep(delay)
                continue
            try:
                async with self.agent.register_slots:
                    self._in_register = True
                    try:
                        await register_with_kubelet(
                            self.agent.kubelet_socket, endpoint, self.resource_name, self.options()
                        )
                    finally:
                        self._in_register = False
            except grpc.aio.AioRpcError as exc:
                failures += 1
                level = logging.WARNING if failures in (1, 10) else logging.DEBUG
                log.log(
                    level,
                    "%s: Register with the kubelet failed (%s: %s); retrying",
                    self.resource_name,
                    exc.code().name,
                    exc.details(),
                )
                await asyncio.sleep(delay)
                delay = min(REGISTER_RETRY_MAX, delay * 2)
                continue
            self.registered = True
            self.registrations += 1
            log.info("%s: registered with the kubelet as %s", self.resource_name, endpoint)
            return

    # --- RPC bodies -------------------------------------------------------------------------
    def _safe_devices(self, last: list[tuple[str, str]] | None) -> list[tuple[str, str]] | None:
        try:
            return self.devices()
        except Exception:
            log.exception("%s: computing the device list failed", self.resource_name)
            return last

    async def list_and_watch(self):
        last: list[tuple[str, str]] | None = None
        while not self._stopping:
            changed = self._changed
            devices = self._safe_devices(last)
            if devices is not None and devices != last:
                last = devices
                self.updates_sent += 1
                yield dp.ListAndWatchResponse(
                    devices=[dp.Device(ID=i, health=h) for i, h in devices]
                )
            await changed.wait()

    async def allocate_rpc(self, request: dp.AllocateRequest, context: grpc.aio.ServicerContext):
        started = time.perf_counter()
        # Until gRPC has sent the answer, background bookkeeping waits (see
        # agent.kube.foreground). The done callback runs however the call ends (answered,
        # refused, cancelled).
        context.add_done_callback(FOREGROUND.enter())
        loop = asyncio.get_running_loop()
        # The claims change health; the device lists that say so go out once the kubelet has
        # its answer: sent, then QUIET for it to read (NodeAgent.defer_notifications).
        release = self.agent.defer_notifications()
        context.add_done_callback(lambda _: loop.call_later(QUIET, release))
        answer: asyncio.Future = loop.create_future()
        responded = False

        def respond(response: dp.AllocateResponse) -> None:
            nonlocal responded
            responded = True
            loop.call_soon_threadsafe(_settle, answer, response, None)

        def work() -> None:
            try:
                self.allocate(request, respond)
            except BaseException as exc:
                if responded:  # after the answer: the kubelet is not told, the log is
                    log.exception("%s: after answering Allocate", self.resource_name)
                else:
                    loop.call_soon_threadsafe(_settle, answer, None, exc)
            else:
                if not responded:
                    error = RuntimeError("the plugin gave no answer")
                    loop.call_soon_threadsafe(_settle, answer, None, error)

        loop.run_in_executor(self.agent.loop.blocking, work)
        try:
            return await answer
        except AllocateRefused as exc:
            log.warning(
                "%s: Allocate %s refused: %s", self.resource_name, _ids(request), exc.message
            )
            await context.abort(exc.code, exc.message)
        except Exception as exc:
            log.exception("%s: Allocate %s failed", self.resource_name, _ids(request))
            await context.abort(grpc.StatusCode.UNKNOWN, f"Allocate failed: {exc}")
        finally:
            metrics.ALLOCATE_SECONDS.labels(self.level).observe(time.perf_counter() - started)


def _settle(future: asyncio.Future, result: object, error: BaseException | None) -> None:
    """The first outcome wins; later ones (a failure after answering) are dropped."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _ids(request: dp.AllocateRequest) -> list[list[str]]:
    return [list(r.devices_ids) for r in request.container_requests]


class _GenericOnly:
    """The server as ``add_DevicePluginServicer_to_server`` sees it, minus the registration
    of each method with gRPC's core. Registered methods let the core match calls ahead of
    time, for servers that take many; each costs every server memory, some 20 KB for the
    five of a plugin, and an agent runs a server per Instance whose calls are a handful
    (``bench agent-memory``). The generic handler, which the same function adds, routes them."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers) -> None:
        pass


class _Servicer(dp_grpc.DevicePluginServicer):
    """The gRPC face of one plugin."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin

    async def GetDevicePluginOptions(self, request, context):
        return self.plugin.options()

    async def ListAndWatch(self, request, context):
        async for response in self.plugin.list_and_watch():
            yield response

    async def GetPreferredAllocation(self, request, context):
        try:
            # In the blocking pool: a plugin may look its pod's assignment up in the API server.
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self.plugin.agent.loop.blocking, self.plugin.preferred, request
            )
        except AllocateRefused as exc:
            await context.abort(exc.code, exc.message)

    async def Allocate(self, request, context):
        return await self.plugin.allocate_rpc(request, context)

    async def PreStartContainer(self, request, context):
        # pre_start_required is false: a kubelet calling this anyway gets the empty answer.
        log.info("%s: PreStartContainer called although not required", self.plugin.resource_name)
        return dp.PreStartContainerResponse()
