"""External discovery handlers over Akri's discovery gRPC (proto package ``v0``).

An Akri discovery handler (DH) is a separate process. It serves ``v0.DiscoveryHandler/Discover``
on a Unix socket or a network address and announces itself by calling
``v0.Registration/RegisterDiscoveryHandler`` on the agent's socket (Akri's default
``/var/lib/akri/agent-registration.sock``). :class:`RegistrationServer` is that socket: every
valid registration becomes an :class:`ExternalHandler` in the agent's
:class:`~agent.discovery.base.HandlerRegistry`.

One endpoint per name: a registration under a name already registered with a different endpoint
(or shared flag) replaces the handler and notifies the registry's listeners, so the agent
restarts the sessions of that name against the new endpoint. Akri instead merges the device
lists of several endpoints per name; one DH process per name per node is what Akri's charts
deploy, so we keep the simpler model. Re-registering the same endpoint (a restarted DH does this)
changes nothing except waking that handler's sessions to reconnect at once.

A session streams ``Discover``; every ``DiscoverResponse`` is the whole device list. When the
dial fails or the stream ends, the session reconnects with capped, jittered exponential backoff
until stopped. The last good list stays in force while reconnecting, so a DH restart does not
tear down brokers; if no response arrives within ``offline_grace`` the devices are withdrawn
(an empty list). ``INVALID_ARGUMENT`` from ``Discover`` means the DH refuses the
``discoveryDetails``: that is reported and retried slowly, since an edited Configuration makes
the agent start a new session anyway.

:class:`ExampleDiscoveryHandlerServer` is a small DH speaking the same protocol, for tests and
the demo.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from urllib.parse import urlsplit

import grpc

from agent.protos import discovery_pb2 as pb
from agent.protos import discovery_pb2_grpc as pb_grpc

from .base import (
    DevicePublisher,
    DeviceSpec,
    DiscoveredDevice,
    HandlerRegistry,
    Mount,
)

log = logging.getLogger(__name__)

DEFAULT_REGISTRATION_SOCKET = "/var/lib/akri/agent-registration.sock"
UDS = pb.RegisterDiscoveryHandlerRequest.UDS
NETWORK = pb.RegisterDiscoveryHandlerRequest.NETWORK

# Names end up in Configuration.spec.discoveryHandler.name, logs and metric labels.
HANDLER_NAME_PATTERN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
# sun_path is 108 bytes including the terminating NUL.
MAX_UNIX_SOCKET_PATH_BYTES = 107


@dataclass(frozen=True)
class ReconnectPolicy:
    """How an external session retries. Times in seconds."""

    initial: float = 0.1
    maximum: float = 5.0
    invalid_details_retry: float = 30.0
    offline_grace: float = 30.0

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Backoff before retry ``attempt`` (0-based): doubling, capped, 50–100 % jitter."""
        base = min(self.maximum, self.initial * (2 ** min(attempt, 32)))
        return base * (0.5 + 0.5 * rng())


class InvalidRegistration(ValueError):
    """A RegisterDiscoveryHandler request the agent refuses."""


def endpoint_target(endpoint: str, endpoint_type: int) -> str:
    """The gRPC target for a registered endpoint; InvalidRegistration if it is unusable."""
    if not endpoint:
        raise InvalidRegistration("endpoint is empty")
    if endpoint_type == UDS:
        if not endpoint.startswith("/"):
            raise InvalidRegistration(f"UDS endpoint {endpoint!r} is not an absolute path")
        if len(os.fsencode(endpoint)) > MAX_UNIX_SOCKET_PATH_BYTES:
            raise InvalidRegistration(
                f"UDS endpoint {endpoint!r} is longer than {MAX_UNIX_SOCKET_PATH_BYTES} bytes"
            )
        return f"unix://{endpoint}"
    if endpoint_type == NETWORK:
        return _network_target(endpoint)
    raise InvalidRegistration(f"unknown endpoint_type {endpoint_type}")


def _network_target(endpoint: str) -> str:
    # Akri DHs register "http://<POD_IP>:10000"; accept a bare host:port too.
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.scheme != "http":
        raise InvalidRegistration(
            f"NETWORK endpoint {endpoint!r}: only plaintext http:// endpoints are supported"
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidRegistration(f"NETWORK endpoint {endpoint!r}: {exc}") from exc
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise InvalidRegistration(f"NETWORK endpoint {endpoint!r} must look like http://host:port")
    return parts.netloc


def validate_registration(request: pb.RegisterDiscoveryHandlerRequest) -> str:
    """Check a registration; returns its gRPC target or raises InvalidRegistration."""
    if not request.name:
        raise InvalidRegistration("name is empty")
    if not HANDLER_NAME_PATTERN.match(request.name):
        raise InvalidRegistration(
            f"name {request.name!r} must be 1-63 letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit"
        )
    return endpoint_target(request.endpoint, request.endpoint_type)


def device_from_proto(device: pb.Device) -> DiscoveredDevice:
    return DiscoveredDevice(
        id=device.id,
        properties=dict(device.properties),
        mounts=tuple(Mount(m.container_path, m.host_path, m.read_only) for m in device.mounts),
        device_specs=tuple(
            DeviceSpec(s.container_path, s.host_path, s.permissions) for s in device.device_specs
        ),
    )


def device_to_proto(device: DiscoveredDevice) -> pb.Device:
    return pb.Device(
        id=device.id,
        properties=dict(device.properties),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in device.mounts
        ],
        device_specs=[
            pb.DeviceSpec(
                container_path=s.container_path, host_path=s.host_path, permissions=s.permissions
            )
            for s in device.device_specs
        ],
    )


def discover_request(
    discovery_details: str, discovery_properties: Mapping[str, bytes | None]
) -> pb.DiscoverRequest:
    # ByteData.vec is proto3-optional: a property resolved to nothing is sent without vec.
    return pb.DiscoverRequest(
        discovery_details=discovery_details,
        discovery_properties={
            key: pb.ByteData() if value is None else pb.ByteData(vec=value)
            for key, value in discovery_properties.items()
        },
    )


# ---------------------------------------------------------------------------------------------
# Agent side: handler, session, registration server


class ExternalHandler:
    """A registered external DH: starts sessions that stream ``Discover`` from its endpoint."""

    def __init__(
        self,
        name: str,
        endpoint: str,
        endpoint_type: int = UDS,
        shared: bool = False,
        *,
        policy: ReconnectPolicy | None = None,
    ) -> None:
        self.name = name
        self.shared = shared
        self.endpoint = endpoint
        self.endpoint_type = endpoint_type
        self.target = endpoint_target(endpoint, endpoint_type)
        self.policy = policy or ReconnectPolicy()
        self._sessions: weakref.WeakSet[ExternalSession] = weakref.WeakSet()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ExternalHandler({self.name!r}, {self.target!r}, shared={self.shared})"

    def same_endpoint(self, other: ExternalHandler) -> bool:
        return (self.target, self.shared) == (other.target, other.shared)

    def start(
        self,
        discovery_details: str,
        discovery_properties: Mapping[str, bytes | None],
        on_devices: Callable[[list[DiscoveredDevice]], None],
        on_error: Callable[[str], None],
    ) -> ExternalSession:
        session = ExternalSession(
            self,
            discover_request(discovery_details, discovery_properties),
            DevicePublisher(self.name, on_devices, on_error),
        )
        with self._lock:
            self._sessions.add(session)
        return session.start()

    def wake(self) -> None:
        """Make every running session reconnect now (the DH has just re-registered)."""
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.wake()


class ExternalSession:
    """One ``Discover`` stream for one Configuration, kept alive until :meth:`stop`."""

    def __init__(
        self, handler: ExternalHandler, request: pb.DiscoverRequest, publisher: DevicePublisher
    ) -> None:
        self._handler = handler
        self._request = request
        self._publisher = publisher
        self._policy = handler.policy
        self._stop = threading.Event()
        self._interrupt = threading.Event()  # set by stop() and wake() to end a backoff wait
        self._lock = threading.Lock()
        self._call: grpc.RpcContext | None = None
        self._grace_timer: threading.Timer | None = None
        self.connects = 0  # streams that delivered at least one response; for tests and logs
        self._thread = threading.Thread(
            target=self._run, name=f"discovery-{handler.name}", daemon=True
        )

    def start(self) -> ExternalSession:
        self._arm_grace()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._interrupt.set()
        self._publisher.close()
        with self._lock:
            call, self._call = self._call, None
            timer, self._grace_timer = self._grace_timer, None
        if call is not None:
            call.cancel()
        if timer is not None:
            timer.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def wake(self) -> None:
        self._interrupt.set()

    def _run(self) -> None:
        attempt = 0  # consecutive failed connections; 0 once a response arrives
        while not self._stop.is_set():
            try:
                received, error = self._stream_once()
            except Exception as exc:  # a bug here must not end discovery for good
                log.exception("discovery session for %s failed", self._handler.name)
                received, error = False, exc
            if self._stop.is_set():
                break
            if received:
                attempt = 0
            if (
                isinstance(error, grpc.RpcError)
                and error.code() == grpc.StatusCode.INVALID_ARGUMENT
            ):
                self._refused(error)
                delay = self._policy.invalid_details_retry
            else:
                self._lost(error, first=attempt == 0)
                delay = self._policy.delay(attempt)
                attempt += 1
            if self._interrupt.wait(delay) and not self._stop.is_set():
                attempt = 0  # woken by a re-registration: the DH is back, dial at once
            self._interrupt.clear()

    def _refused(self, error: grpc.RpcError) -> None:
        details = error.details()
        log.warning(
            "discovery handler %s refused discoveryDetails: %s", self._handler.name, details
        )
        self._publisher.error(f"invalid discoveryDetails: {details}")

    def _lost(self, error: Exception | None, *, first: bool) -> None:
        name, target = self._handler.name, self._handler.target
        if error is None:
            problem = "stream closed by the handler"
        elif isinstance(error, grpc.RpcError):
            problem = f"{error.code().name}: {error.details()}"
        else:
            problem = f"{type(error).__name__}: {error}"
        # One warning per outage; the retries themselves only at debug level.
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "discovery handler %s at %s: %s; reconnecting", name, target, problem)
        self._publisher.error(
            f"discovery handler {name} at {target} unavailable ({problem}); reconnecting"
        )
        self._arm_grace()

    def _stream_once(self) -> tuple[bool, grpc.RpcError | None]:
        """Stream until it ends; returns whether anything arrived, and the error if any."""
        received = False
        channel = grpc.insecure_channel(self._handler.target)
        try:
            call = pb_grpc.DiscoveryHandlerStub(channel).Discover(self._request)
            with self._lock:
                if self._stop.is_set():
                    call.cancel()
                self._call = call
            for response in call:
                if not received:
                    received = True
                    self.connects += 1
                    self._cancel_grace()
                    log.info("discovery handler %s streaming devices", self._handler.name)
                self._deliver(response)
            return received, None
        except grpc.RpcError as exc:
            return received, exc
        finally:
            with self._lock:
                self._call = None
            channel.close()

    def _deliver(self, response: pb.DiscoverResponse) -> None:
        try:
            devices = [device_from_proto(d) for d in response.devices]
        except Exception as exc:  # never let a malformed response kill the session
            log.exception("discovery handler %s sent an unreadable response", self._handler.name)
            self._publisher.error(f"unreadable response from {self._handler.name}: {exc}")
            return
        self._publisher.publish(devices)

    def _arm_grace(self) -> None:
        with self._lock:
            if self._grace_timer is not None or self._stop.is_set():
                return
            timer = threading.Timer(self._policy.offline_grace, self._withdraw)
            timer.daemon = True
            self._grace_timer = timer
        timer.start()

    def _cancel_grace(self) -> None:
        with self._lock:
            timer, self._grace_timer = self._grace_timer, None
        if timer is not None:
            timer.cancel()

    def _withdraw(self) -> None:
        with self._lock:
            if self._stop.is_set() or self._grace_timer is None:
                return
            self._grace_timer = None
        name = self._handler.name
        log.warning(
            "discovery handler %s unreachable for %ss, withdrawing its devices",
            name,
            self._policy.offline_grace,
        )
        self._publisher.publish([])
        self._publisher.error(
            f"discovery handler {name} at {self._handler.target} unreachable for "
            f"{self._policy.offline_grace:g}s; its devices are withdrawn"
        )


class _RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, server: RegistrationServer) -> None:
        self._server = server

    def RegisterDiscoveryHandler(
        self, request: pb.RegisterDiscoveryHandlerRequest, context: grpc.ServicerContext
    ) -> pb.Empty:
        try:
            self._server.register(request)
        except InvalidRegistration as exc:
            log.warning("refused discovery handler registration %r: %s", request.name, exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.Empty()


class RegistrationServer:
    """Serves ``v0.Registration`` on the agent's Unix socket and fills the registry."""

    def __init__(
        self,
        registry: HandlerRegistry,
        socket_path: str = DEFAULT_REGISTRATION_SOCKET,
        *,
        policy: ReconnectPolicy | None = None,
    ) -> None:
        self.registry = registry
        self.socket_path = socket_path
        self.policy = policy or ReconnectPolicy()
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()

    def start(self) -> RegistrationServer:
        self._server = _serve_unix(
            self.socket_path,
            lambda server: pb_grpc.add_RegistrationServicer_to_server(
                _RegistrationServicer(self), server
            ),
            max_workers=4,
        )
        log.info("discovery handler registration listening on %s", self.socket_path)
        return self

    def stop(self, grace: float | None = None) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        _remove_socket(self.socket_path)

    def register(self, request: pb.RegisterDiscoveryHandlerRequest) -> ExternalHandler:
        """Validate and apply one registration (also callable without gRPC)."""
        validate_registration(request)
        handler = ExternalHandler(
            request.name,
            request.endpoint,
            request.endpoint_type,
            request.shared,
            policy=self.policy,
        )
        with self._lock:  # serialise compare-and-replace per server
            current = self.registry.get(request.name)
            if isinstance(current, ExternalHandler) and current.same_endpoint(handler):
                log.info("discovery handler %s re-registered at %s", handler.name, handler.target)
                current.wake()
                return current
            if current is not None and not isinstance(current, ExternalHandler):
                log.warning("external discovery handler %s replaces the built-in one", handler.name)
            self.registry.register(handler)
        log.info(
            "discovery handler %s registered at %s (shared=%s)",
            handler.name,
            handler.target,
            handler.shared,
        )
        return handler


def _serve_unix(
    socket_path: str, add_servicers: Callable[[grpc.Server], None], *, max_workers: int
) -> grpc.Server:
    directory = os.path.dirname(socket_path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    _remove_socket(socket_path)  # a stale socket from a previous run blocks bind()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    add_servicers(server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    return server


def _remove_socket(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# ---------------------------------------------------------------------------------------------
# Discovery-handler side: registering, and an example handler


def register_with_agent(
    registration_socket: str,
    name: str,
    endpoint: str,
    *,
    endpoint_type: int = UDS,
    shared: bool = False,
    timeout: float = 5.0,
) -> None:
    """Call RegisterDiscoveryHandler on an agent, as an Akri DH does at start-up."""
    with grpc.insecure_channel(f"unix://{registration_socket}") as channel:
        pb_grpc.RegistrationStub(channel).RegisterDiscoveryHandler(
            pb.RegisterDiscoveryHandlerRequest(
                name=name, endpoint=endpoint, endpoint_type=endpoint_type, shared=shared
            ),
            timeout=timeout,
            wait_for_ready=True,
        )


class _ExampleServicer(pb_grpc.DiscoveryHandlerServicer):
    def __init__(self, owner: ExampleDiscoveryHandlerServer) -> None:
        self._owner = owner

    def Discover(
        self, request: pb.DiscoverRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.DiscoverResponse]:
        return self._owner._stream(request, context)


class ExampleDiscoveryHandlerServer:
    """A tiny external DH: streams a device list that the caller controls.

    Like Akri's DHs it sends the current list as soon as a stream opens and again on every
    change. ``validate_details`` may return an error message to refuse ``discoveryDetails``
    with INVALID_ARGUMENT. :meth:`drop_streams` ends open streams with UNAVAILABLE, as a
    crashing DH would; :meth:`send_raw` sends any response, valid or not.
    """

    # How often an idle stream notices that its client went away or the server stops.
    IDLE_CHECK_INTERVAL = 0.2

    def __init__(
        self,
        socket_path: str,
        devices: Iterable[DiscoveredDevice] = (),
        *,
        name: str = "example",
        shared: bool = True,
        validate_details: Callable[[str], str | None] | None = None,
        max_streams: int = 8,
    ) -> None:
        self.socket_path = socket_path
        self.name = name
        self.shared = shared
        self.validate_details = validate_details
        self.max_streams = max_streams
        self.requests: list[pb.DiscoverRequest] = []
        self._cond = threading.Condition()
        self._response = pb.DiscoverResponse(devices=[device_to_proto(d) for d in devices])
        self._version = 0
        self._generation = 0  # bumped by drop_streams() and stop()
        self._active = 0
        self._server: grpc.Server | None = None

    def start(self) -> ExampleDiscoveryHandlerServer:
        self._server = _serve_unix(
            self.socket_path,
            lambda server: pb_grpc.add_DiscoveryHandlerServicer_to_server(
                _ExampleServicer(self), server
            ),
            max_workers=self.max_streams,
        )
        return self

    def register(self, registration_socket: str, timeout: float = 5.0) -> None:
        register_with_agent(
            registration_socket, self.name, self.socket_path, shared=self.shared, timeout=timeout
        )

    def stop(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None
        _remove_socket(self.socket_path)

    def set_devices(self, devices: Iterable[DiscoveredDevice]) -> None:
        self.send_raw(pb.DiscoverResponse(devices=[device_to_proto(d) for d in devices]))

    def send_raw(self, response: pb.DiscoverResponse) -> None:
        with self._cond:
            self._response = response
            self._version += 1
            self._cond.notify_all()

    def drop_streams(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    @property
    def active_streams(self) -> int:
        with self._cond:
            return self._active

    def _stream(
        self, request: pb.DiscoverRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.DiscoverResponse]:
        problem = (
            self.validate_details(request.discovery_details) if self.validate_details else None
        )
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        with self._cond:
            self.requests.append(request)
            self._active += 1
            generation = self._generation
        try:
            sent: int | None = None
            dropped = False
            while context.is_active():
                with self._cond:
                    self._cond.wait_for(
                        lambda last=sent: self._version != last or self._generation != generation,
                        timeout=self.IDLE_CHECK_INTERVAL,
                    )
                    if self._generation != generation:
                        dropped = True
                        break
                    if self._version == sent:
                        continue
                    response, sent = self._response, self._version
                yield response
            if dropped:
                context.abort(grpc.StatusCode.UNAVAILABLE, "discovery handler dropped the stream")
        finally:
            with self._cond:
                self._active -= 1
