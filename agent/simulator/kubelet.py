"""Kubelet simulator: the kubelet's side of the device plugin and PodResources APIs.

A development and test tool that plays the kubelet over real gRPC on unix sockets, so device
plugins (ours or Akri's) can be exercised without a node. It reproduces what plugins rely on:

- `v1beta1.Registration/Register` on `<plugin_dir>/kubelet.sock`: version and resource-name
  checks with the kubelet's messages (UNKNOWN status); the endpoint is joined onto the plugin
  dir; the plugin is dialled (authority `localhost`) and `GetDevicePluginOptions` is called
  *before* Register returns, and Register fails if either fails.
- One `ListAndWatch` stream per registration in a background thread; each message replaces
  the resource's device set; only the exact string "Healthy" counts. When the stream ends,
  every device turns Unhealthy (capacity kept). A new registration replaces the endpoint.
- Admission as the device manager does it: per container and resource, ids from healthy free
  devices, `GetPreferredAllocation` as a hint when offered, `Allocate` with exactly one
  container request, `PreStartContainer` when required. No Deallocate: ids are freed
  internally by `remove_pod`.
- Restart: stop serving, close plugin connections, delete every socket in the dir, listen on a
  new `kubelet.sock` inode; allocations survive (the checkpoint), capacity is 0 until plugins
  re-register.
- PodResources v1 (`List`, `GetAllocatableResources`, `Get`) with a rate-limit knob.

One re-entrant lock guards all state; the condition `_changed` on it wakes `wait_for` callers.
Calls into plugins are never made while holding the lock, so a slow plugin cannot stall the
simulator, and ids are reserved under the lock before `Allocate` so concurrent admissions
never share a device.

Run standalone: `python -m agent.simulator.kubelet --dir /tmp/kdir` (SIGHUP restarts it).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import stat
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from typing import Any

import grpc

from agent.protos import deviceplugin_pb2 as dp
from agent.protos import deviceplugin_pb2_grpc as dp_grpc
from agent.protos import podresources_pb2_grpc as pr_grpc
from agent.simulator.kubelet_names import (
    SUPPORTED_VERSIONS,
    UNHEALTHY,
    go_status_error,
    invalid_resource_name_error,
    is_extended_resource_name,
    join_endpoint,
    unsupported_version_error,
)
from agent.simulator.kubelet_podresources import PodResourcesServicer
from agent.simulator.kubelet_types import (
    AdmitResult,
    ContainerAllocation,
    PodRecord,
    RegistrationEvent,
    ResourceState,
)

log = logging.getLogger("agent.simulator.kubelet")

KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
PRE_START_TIMEOUT = 30.0  # KubeletPreStartContainerRPCTimeoutInSecs
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL

__all__ = [
    "AdmitResult",
    "ContainerAllocation",
    "KubeletSimulator",
    "PodRecord",
    "RegistrationEvent",
    "ResourceState",
    "main",
]


class _Endpoint:
    """One registration: the connection to a plugin and its ListAndWatch reader."""

    def __init__(self, resource: str, path: str, channel: grpc.Channel) -> None:
        self.resource = resource
        self.path = path
        self.channel = channel
        self.stub = dp_grpc.DevicePluginStub(channel)
        self.options = dp.DevicePluginOptions()
        self.thread: threading.Thread | None = None
        self.stopped = False

    def close(self) -> None:
        # Closing the channel cancels the stream, which ends the reader thread.
        self.channel.close()


class _RegistrationServicer(dp_grpc.RegistrationServicer):
    def __init__(self, register: Callable[[dp.RegisterRequest], str]) -> None:
        self._register = register

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        error = self._register(request)
        if error:
            # The kubelet returns plain Go errors, which grpc-go sends as UNKNOWN.
            context.abort(grpc.StatusCode.UNKNOWN, error)
        return dp.Empty()


def _hold_inode(path: str) -> int | None:
    """Keep a socket's inode allocated so the next socket cannot reuse its number."""
    # Plugins detect a kubelet restart by a changed inode; ext4 happily hands a freed inode
    # number to the next file, so the old one stays referenced until the new one exists.
    try:
        return os.open(path, os.O_PATH)
    except (OSError, AttributeError):
        return None


def _unexpected(error: str) -> str:
    """The message of the kubelet's UnexpectedAdmissionError."""
    return f"Allocate failed due to {error}, which is unexpected"


def _parse_containers(containers: Iterable[Mapping[str, Any]]) -> list[tuple[str, dict[str, int]]]:
    """[(container name, {extended resource: count})]; native resources are not ours."""
    parsed = []
    for container in containers:
        requests: dict[str, int] = {}
        for resource, count in (container.get("requests") or {}).items():
            number = int(count)
            if number < 0:
                raise ValueError(f"negative request {resource}={count}")
            if number and is_extended_resource_name(resource):
                requests[resource] = number
        parsed.append((str(container["name"]), requests))
    return parsed


class KubeletSimulator:
    """The kubelet's device manager and PodResources server, over real gRPC."""

    def __init__(
        self,
        plugin_dir: str,
        pod_resources_socket: str | None = None,
        node_name: str = "node",
        *,
        dial_timeout: float = 10.0,
        rpc_timeout: float = 30.0,
        workers: int = 16,
    ) -> None:
        self.plugin_dir = os.path.abspath(plugin_dir)
        self.socket_path = os.path.join(self.plugin_dir, KUBELET_SOCKET)
        default_pr = os.path.join(self.plugin_dir, "..", "pod-resources", KUBELET_SOCKET)
        self.pod_resources_socket = os.path.normpath(
            os.path.abspath(pod_resources_socket or default_pr)
        )
        for path in (self.socket_path, self.pod_resources_socket):
            if len(os.fsencode(path)) > MAX_UNIX_PATH:
                raise ValueError(f"unix socket path too long ({MAX_UNIX_PATH} bytes max): {path}")
        self.node_name = node_name
        self.dial_timeout = dial_timeout  # the kubelet's blocking dial uses 10 s
        self.rpc_timeout = rpc_timeout  # the kubelet has none; a hung test should not hang
        self._workers = workers  # each Register may block up to dial_timeout

        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._lifecycle = threading.Lock()  # serialises start/stop/restart
        self._servers: list[grpc.Server] = []
        self._executors: list[futures.ThreadPoolExecutor] = []
        self._running = False
        self._started_once = False
        self._epoch = 0  # bumped by start/stop so a Register that straddles them is refused
        self._resources: dict[str, ResourceState] = {}
        self._endpoints: dict[str, _Endpoint] = {}
        self._pods: dict[tuple[str, str], PodRecord] = {}
        self._admitting: set[tuple[str, str]] = set()
        self._registrations: list[RegistrationEvent] = []
        self._registration_errors: list[RegistrationEvent] = []
        self._rate_limited = 0
        self._pod_resources_calls: Counter[str] = Counter()
        self.restarts = 0
        self.started_at: float | None = None  # time.monotonic() of the latest (re)start

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> KubeletSimulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        """Serve Registration and PodResources; a start after a stop is a kubelet restart."""
        with self._lifecycle:
            self._start()

    def stop(self) -> None:
        """Stop serving and drop every plugin connection (the kubelet process exits)."""
        with self._lifecycle:
            self._stop()

    def restart(self) -> None:
        """As a kubelet restart: sockets wiped, new kubelet.sock inode, allocations kept."""
        with self._lifecycle:
            held = _hold_inode(self.socket_path)
            try:
                self._stop()
                self._start()
            finally:
                if held is not None:
                    os.close(held)
            with self._lock:
                self.restarts += 1
                self._changed.notify_all()

    def _start(self) -> None:
        if self._running:
            raise RuntimeError("kubelet simulator is already running")
        with self._lock:
            if self._started_once:
                self._restore_checkpoint()
            self._started_once = True
            # Bumped before serving: a plugin may re-register the moment kubelet.sock appears.
            self._epoch += 1
            self._running = True
            self.started_at = time.monotonic()
        try:
            self._serve()
        except BaseException:
            self._stop()
            raise
        log.info(
            "kubelet %s serving Registration on %s and PodResources on %s",
            self.node_name,
            self.socket_path,
            self.pod_resources_socket,
        )

    def _serve(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        os.makedirs(os.path.dirname(self.pod_resources_socket), exist_ok=True)
        # Like the kubelet, wipe stale sockets first: plugins treat this as "re-register".
        self._cleanup_plugin_dir()
        registration = self._server("kubelet-register", self._workers)
        dp_grpc.add_RegistrationServicer_to_server(
            _RegistrationServicer(self._register), registration
        )
        registration.add_insecure_port("unix://" + self.socket_path)
        pod_resources = self._server("kubelet-podresources", 8)
        servicer = PodResourcesServicer(self.pods, self.resources, self._admit_pod_resources_call)
        pr_grpc.add_PodResourcesListerServicer_to_server(servicer, pod_resources)
        pod_resources.add_insecure_port("unix://" + self.pod_resources_socket)
        registration.start()
        pod_resources.start()

    def _server(self, name: str, workers: int) -> grpc.Server:
        executor = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        server = grpc.server(executor)
        with self._lock:  # tracked at once so a failed start still cleans up
            self._executors.append(executor)
            self._servers.append(server)
        return server

    def _stop(self) -> None:
        with self._lock:
            servers, self._servers = self._servers, []
            executors, self._executors = self._executors, []
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
            self._running = False
            self._epoch += 1
            for state in self._resources.values():
                state.connected = False
            self._changed.notify_all()
        for server in servers:
            server.stop(grace=None).wait(5)
        for executor in executors:
            executor.shutdown(wait=False, cancel_futures=True)
        for endpoint in endpoints:
            endpoint.close()
        for endpoint in endpoints:
            if endpoint.thread is not None:
                endpoint.thread.join(timeout=5)
        if servers:
            log.info("kubelet %s stopped", self.node_name)

    def _restore_checkpoint(self) -> None:
        # The checkpoint keeps pod assignments but no devices: capacity stays 0 until the
        # plugin registers again and lists its devices.
        now = time.monotonic()
        for state in self._resources.values():
            state.devices = {}
            state.topology = {}
            state.endpoint = ""
            state.options = None
            state.connected = False
            state.stopped_at = now

    def _cleanup_plugin_dir(self) -> None:
        for entry in os.scandir(self.plugin_dir):
            if entry.name == CHECKPOINT_FILE:
                continue
            try:
                if stat.S_ISSOCK(os.stat(entry.path).st_mode):
                    os.unlink(entry.path)
            except FileNotFoundError:
                continue

    # ---- registration and ListAndWatch -----------------------------------------------------

    def _register(self, request: dp.RegisterRequest) -> str:
        """Handle one Register call; returns the error text, "" on success."""
        with self._lock:
            epoch = self._epoch
        resource = request.resource_name
        path = join_endpoint(self.plugin_dir, request.endpoint)
        log.info("Register: resource=%s endpoint=%s version=%s", resource, path, request.version)
        if request.version not in SUPPORTED_VERSIONS:
            error = unsupported_version_error(request.version)
        elif not is_extended_resource_name(resource):
            error = invalid_resource_name_error(resource)
        else:
            error = self._connect(resource, path, epoch)
        if error:
            with self._lock:
                event = RegistrationEvent(resource, path, time.monotonic(), error)
                self._registration_errors.append(event)
                self._changed.notify_all()
            log.warning("Register %s refused: %s", resource, error)
        return error

    def _connect(self, resource: str, path: str, epoch: int) -> str:
        channel = grpc.insecure_channel(
            "unix://" + path, options=[("grpc.default_authority", "localhost")]
        )
        ready = grpc.channel_ready_future(channel)
        try:
            ready.result(timeout=self.dial_timeout)
        except grpc.FutureTimeoutError:
            ready.cancel()
            channel.close()
            return "failed to dial device plugin: context deadline exceeded"
        endpoint = _Endpoint(resource, path, channel)
        try:
            options = endpoint.stub.GetDevicePluginOptions(dp.Empty(), timeout=self.rpc_timeout)
        except grpc.RpcError as err:
            channel.close()
            return f"failed to get device plugin options: {go_status_error(err)}"
        endpoint.options = options
        with self._lock:
            if epoch != self._epoch or not self._running:
                channel.close()
                return "kubelet is shutting down"
            old = self._endpoints.get(resource)
            self._endpoints[resource] = endpoint
            state = self._resources.setdefault(resource, ResourceState(resource))
            state.endpoint = path
            state.options = options
            state.registrations += 1
            state.connected = True
            state.stopped_at = None
            self._registrations.append(RegistrationEvent(resource, path, time.monotonic()))
            # The stream runs beside the handler: Register returns without waiting for it.
            endpoint.thread = threading.Thread(
                target=self._watch, args=(endpoint,), name=f"listandwatch-{resource}", daemon=True
            )
            endpoint.thread.start()
            self._changed.notify_all()
        if old is not None:
            old.close()
            log.info("%s: registration replaced endpoint %s", resource, old.path)
        log.info("%s: registered %s options={%s}", resource, path, str(options).strip())
        return ""

    def _watch(self, endpoint: _Endpoint) -> None:
        reason = "stream closed by the plugin"
        try:
            for response in endpoint.stub.ListAndWatch(dp.Empty()):
                self._apply_list(endpoint, response)
        except grpc.RpcError as err:
            reason = go_status_error(err)
        except ValueError as err:  # the channel was closed before the call started
            reason = str(err)
        self._stream_ended(endpoint, reason)

    def _apply_list(self, endpoint: _Endpoint, response: dp.ListAndWatchResponse) -> None:
        devices = {d.ID: d.health for d in response.devices}
        topology = {d.ID: tuple(n.ID for n in d.topology.nodes) for d in response.devices}
        with self._lock:
            if self._endpoints.get(endpoint.resource) is not endpoint:
                return  # a replaced or closed registration
            state = self._resources[endpoint.resource]
            # Every message is the complete list: rebuild, never merge.
            state.devices = devices
            state.topology = {d: nodes for d, nodes in topology.items() if nodes}
            state.list_updates += 1
            state.last_list_time = time.monotonic()
            count = state.list_updates
            healthy = len(state.healthy())
            self._changed.notify_all()
        log.info(
            "%s: ListAndWatch update #%d: %d devices, %d healthy",
            endpoint.resource,
            count,
            len(devices),
            healthy,
        )

    def _stream_ended(self, endpoint: _Endpoint, reason: str) -> None:
        with self._lock:
            endpoint.stopped = True
            current = self._endpoints.get(endpoint.resource) is endpoint
            if current:
                state = self._resources[endpoint.resource]
                state.devices = dict.fromkeys(state.devices, UNHEALTHY)
                state.connected = False
                state.stopped_at = time.monotonic()
                self._changed.notify_all()
        endpoint.close()
        if current:
            log.warning(
                "%s: ListAndWatch ended (%s); all devices Unhealthy", endpoint.resource, reason
            )

    # ---- admission -------------------------------------------------------------------------

    def admit_pod(
        self,
        namespace: str,
        name: str,
        containers: list[dict[str, Any]],
        uid: str | None = None,
    ) -> AdmitResult:
        """Admit a pod as the kubelet's device manager would; see the module docstring.

        `containers` are `{"name": "c1", "requests": {"akri.sh/foo": 1}}`; requests that are
        not extended resources (cpu, memory) are ignored. Refusals come back as
        `admitted=False` with the kubelet's reason and message: "UnexpectedAdmissionError" for
        device trouble (too few healthy free ids, Allocate failed or answered nothing),
        "OutOf<resource>" for a resource no plugin ever registered. Every id the pod had taken
        is released again. A PreStartContainer failure leaves the pod admitted with its devices
        (`started` is False), as a container that fails to start would.
        """
        uid = uid or str(uuid.uuid4())
        parsed = _parse_containers(containers)
        key = (namespace, name)
        with self._lock:
            if key in self._pods or key in self._admitting:
                raise ValueError(f"pod {namespace}/{name} is already admitted")
            self._admitting.add(key)
        try:
            return self._admit(namespace, name, uid, parsed)
        finally:
            with self._lock:
                self._admitting.discard(key)

    def _admit(
        self, namespace: str, name: str, uid: str, parsed: list[tuple[str, dict[str, int]]]
    ) -> AdmitResult:
        refusal = self._check_pod_fits(parsed)
        if refusal:
            log.info("pod %s/%s refused: %s", namespace, name, refusal[1])
            return AdmitResult(False, uid, [], *refusal)
        allocations: list[ContainerAllocation] = []
        error = ""
        for container_name, requests in parsed:
            allocation = ContainerAllocation(container_name)
            allocations.append(allocation)
            for resource, needed in requests.items():
                error = error or self._allocate(allocation, resource, needed)
            if error:
                break
        if error:
            # The kubelet would free these when it garbage-collects the failed pod.
            self._release(allocations)
            message = _unexpected(error)
            log.info("pod %s/%s refused: %s", namespace, name, message)
            return AdmitResult(False, uid, allocations, UNEXPECTED_ADMISSION_ERROR, message)
        pod = PodRecord(namespace, name, uid, allocations, time.monotonic())
        with self._lock:
            self._pods[(namespace, name)] = pod
            self._changed.notify_all()
        log.info(
            "pod %s/%s admitted: %s", namespace, name, {c.name: c.devices for c in allocations}
        )
        self._pre_start(allocations)
        return AdmitResult(True, uid, [c.copy() for c in allocations])

    def _check_pod_fits(self, parsed: list[tuple[str, dict[str, int]]]) -> tuple[str, str] | None:
        """(reason, message) refusing the pod before any plugin is called, or None."""
        totals: Counter[str] = Counter()
        for _, requests in parsed:
            totals.update(requests)
        with self._lock:
            for resource, needed in totals.items():
                state = self._resources.get(resource)
                if state is None:
                    # Never registered: the device manager ignores it and the node predicate
                    # finds no capacity.
                    return f"OutOf{resource}", (
                        f"Node didn't have enough resource: {resource}, "
                        f"requested: {needed}, used: 0, capacity: 0"
                    )
                free = len(state.healthy() - state.allocated)
                if needed > free:
                    error = (
                        f"requested number of devices unavailable for {resource}. "
                        f"Requested: {needed}, Available: {free}"
                    )
                    return UNEXPECTED_ADMISSION_ERROR, _unexpected(error)
        return None

    def _available(self, resource: str, needed: int) -> tuple[set[str], str]:
        """Healthy free ids of a resource, or the device manager's refusal."""
        state = self._resources.get(resource)
        if state is None:
            return set(), f"cannot allocate unregistered device {resource}"
        healthy = state.healthy()
        if not healthy:
            return (
                set(),
                f"no healthy devices present; cannot allocate unhealthy devices {resource}",
            )
        available = healthy - state.allocated
        if len(available) < needed:
            return available, (
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        return available, ""

    def _allocate(self, allocation: ContainerAllocation, resource: str, needed: int) -> str:
        """Pick ids for one container and resource, then call Allocate; returns an error."""
        with self._lock:
            available, error = self._available(resource, needed)
            endpoint = self._endpoints.get(resource)
        if error:
            return error
        if endpoint is None:
            return f"unknown Device Plugin {resource}"
        preferred: list[str] = []
        if endpoint.options.get_preferred_allocation_available:
            request = dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=sorted(available),
                        must_include_deviceIDs=[],
                        allocation_size=needed,
                    )
                ]
            )
            try:
                answer = endpoint.stub.GetPreferredAllocation(request, timeout=self.rpc_timeout)
            except grpc.RpcError as err:
                return go_status_error(err)
            except ValueError:
                return f"endpoint {endpoint.path} has been stopped"
            if answer.container_responses:
                preferred = list(answer.container_responses[0].deviceIDs)
        with self._lock:
            # Re-read: another admission may have taken ids while the lock was released.
            available, error = self._available(resource, needed)
            if error:
                return error
            # The answer is only a hint: keep ids that are still candidates, fill the rest.
            picked = [d for d in dict.fromkeys(preferred) if d in available][:needed]
            picked += [d for d in sorted(available) if d not in picked][: needed - len(picked)]
            self._resources[resource].allocated.update(picked)
            allocation.devices[resource] = picked  # recorded now so a rollback frees them
            self._changed.notify_all()
        if endpoint.stopped:
            return f"endpoint {endpoint.path} has been stopped"
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=picked)]
        )
        try:
            response = endpoint.stub.Allocate(request, timeout=self.rpc_timeout)
        except grpc.RpcError as err:
            return go_status_error(err)
        except ValueError:
            return f"endpoint {endpoint.path} has been stopped"
        if not response.container_responses:
            return "no containers return in allocation response &AllocateResponse{}"
        allocation.responses[resource] = response.container_responses[0]
        return ""

    def _pre_start(self, allocations: list[ContainerAllocation]) -> None:
        # The kubelet calls PreStartContainer when it starts each container; a failure keeps
        # the container from starting but the pod keeps its devices.
        for allocation in allocations:
            for resource, ids in allocation.devices.items():
                with self._lock:
                    endpoint = self._endpoints.get(resource)
                if endpoint is None or not endpoint.options.pre_start_required:
                    continue
                try:
                    endpoint.stub.PreStartContainer(
                        dp.PreStartContainerRequest(devices_ids=ids), timeout=PRE_START_TIMEOUT
                    )
                except (grpc.RpcError, ValueError) as err:
                    detail = go_status_error(err) if isinstance(err, grpc.RpcError) else str(err)
                    allocation.prestart_error = (
                        f"device plugin PreStartContainer rpc failed with err: {detail}"
                    )
                    break

    def _release(self, allocations: Iterable[ContainerAllocation]) -> None:
        with self._lock:
            for allocation in allocations:
                for resource, ids in allocation.devices.items():
                    state = self._resources.get(resource)
                    if state is not None:
                        state.allocated.difference_update(ids)
            self._changed.notify_all()

    def remove_pod(self, namespace: str, name: str) -> bool:
        """The pod ended: its ids become free for later Allocate calls (no RPC exists)."""
        with self._lock:
            pod = self._pods.pop((namespace, name), None)
            if pod is None:
                return False
            self._release(pod.containers)
        log.info("pod %s/%s removed", namespace, name)
        return True

    # ---- introspection ---------------------------------------------------------------------

    def pods(self) -> list[PodRecord]:
        """Admitted pods not yet removed, in admission order (copies)."""
        with self._lock:
            return [pod.copy() for pod in self._pods.values()]

    def resources(self) -> dict[str, ResourceState]:
        with self._lock:
            return {name: state.snapshot() for name, state in self._resources.items()}

    def capacity(self, resource: str) -> int:
        """All advertised devices, healthy or not (node status capacity)."""
        with self._lock:
            state = self._resources.get(resource)
            return len(state.devices) if state else 0

    def allocatable(self, resource: str) -> int:
        """Healthy devices, held or not (node status allocatable, as a real kubelet reports
        it: kube-scheduler subtracts the requests of the node's pods from it)."""
        with self._lock:
            state = self._resources.get(resource)
            return len(state.healthy()) if state else 0

    def free(self, resource: str) -> int:
        """Healthy devices not held by any pod: what the device manager can still hand out."""
        with self._lock:
            state = self._resources.get(resource)
            return len(state.healthy() - state.allocated) if state else 0

    def list_updates(self, resource: str) -> int:
        with self._lock:
            state = self._resources.get(resource)
            return state.list_updates if state else 0

    @property
    def registrations(self) -> list[RegistrationEvent]:
        """Successful registrations, oldest first."""
        with self._lock:
            return list(self._registrations)

    @property
    def registration_errors(self) -> list[RegistrationEvent]:
        """Refused registrations with the error text sent back."""
        with self._lock:
            return list(self._registration_errors)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Wait until `predicate()` holds; False on timeout.

        Woken by every state change, and also every 50 ms so predicates over outside state
        (a plugin's counters, a file) work too.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if predicate():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.05))

    def wait_devices(
        self,
        resource: str,
        predicate: Callable[[dict[str, str]], bool] | None = None,
        timeout: float = 5.0,
    ) -> dict[str, str]:
        """Wait until the resource's devices (id -> health) satisfy `predicate` (default:
        any device listed); returns them, raises TimeoutError with the last seen set."""
        check = predicate or bool

        def devices() -> dict[str, str]:
            state = self._resources.get(resource)
            return dict(state.devices) if state else {}

        if self.wait_for(lambda: check(devices()), timeout):
            with self._lock:
                return devices()
        raise TimeoutError(f"{resource}: devices still {devices()} after {timeout}s")

    def wait_registration(
        self, resource: str, after: float = 0.0, timeout: float = 5.0
    ) -> RegistrationEvent:
        """The first successful registration of `resource` later than `after` (monotonic)."""
        found: list[RegistrationEvent] = []

        def registered() -> bool:
            found[:] = [e for e in self._registrations if e.resource == resource and e.time > after]
            return bool(found)

        if self.wait_for(registered, timeout):
            return found[0]
        raise TimeoutError(f"{resource} did not register within {timeout}s")

    # ---- PodResources ----------------------------------------------------------------------

    def rate_limit_next(self, n: int) -> None:
        """Fail the next `n` PodResources calls with RESOURCE_EXHAUSTED "rejected by rate limit"."""
        with self._lock:
            self._rate_limited = n

    def pod_resources_calls(self) -> dict[str, int]:
        """PodResources calls received per method, refused ones included."""
        with self._lock:
            return dict(self._pod_resources_calls)

    def _admit_pod_resources_call(self, method: str) -> bool:
        with self._lock:
            self._pod_resources_calls[method] += 1
            if self._rate_limited > 0:
                self._rate_limited -= 1
                return False
            return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agent.simulator.kubelet",
        description="Serve the kubelet's device plugin Registration and PodResources APIs.",
    )
    parser.add_argument("--dir", required=True, help="plays /var/lib/kubelet/device-plugins")
    parser.add_argument(
        "--pod-resources", help="PodResources socket (default <dir>/../pod-resources/kubelet.sock)"
    )
    parser.add_argument("--node", default="node", help="node name shown in logs")
    parser.add_argument("--dial-timeout", type=float, default=10.0, help="plugin dial timeout, s")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    sim = KubeletSimulator(args.dir, args.pod_resources, args.node, dial_timeout=args.dial_timeout)
    stopping = threading.Event()
    restart = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGHUP, lambda *_: restart.set())
    sim.start()
    try:
        while not stopping.wait(0.2):
            if restart.is_set():
                restart.clear()
                log.info("SIGHUP: restarting")
                sim.restart()
    finally:
        with contextlib.suppress(Exception):
            sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
