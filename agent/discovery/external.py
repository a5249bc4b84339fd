"""External discovery handlers over Akri's discovery gRPC (proto package ``v0``).

An Akri discovery handler (DH) is a separate process. It serves ``v0.DiscoveryHandler/Discover``
on a Unix socket or a network address and announces itself by calling
``v0.Registration/RegisterDiscoveryHandler`` on the agent's socket (Akri's default
``/var/lib/akri/agent-registration.sock``). :class:`RegistrationServer` is that socket: every
valid registration becomes an :class:`ExternalHandler` in the agent's
:class:`~agent.discovery.base.HandlerRegistry`.

Several endpoints per name, as in Akri: each registration is an :class:`Endpoint` with uid
``<name>@<endpoint>``, and all endpoints of one name form one :class:`ExternalHandler`. Each
Configuration's :class:`ExternalSession` streams ``Discover`` from every endpoint (one
:class:`EndpointStream` each) and merges the lists: each endpoint keeps its own latest list, a
device reported by any endpoint is present, and one endpoint's list never erases another's.
Registering the same uid again replaces that endpoint only.

A failed endpoint (dial refused, stream ended or broken) is dropped, as Akri drops a closed
endpoint, after an optional re-dial window (``ReconnectPolicy.reconnect_window``, the setting
``AKRI_DISCOVERY_RECONNECT_SECONDS``, default 0 as in Akri). The drop is logged once; its
devices leave the merged list and so age out under the agent's one offline grace
(``AKRI_OFFLINE_GRACE_SECONDS``); only a new registration brings the endpoint back. A dead
endpoint therefore never withdraws what live endpoints of the same name report.
``INVALID_ARGUMENT`` from ``Discover`` means the DH refuses the ``discoveryDetails``: that is
reported and retried slowly, since an edited Configuration makes the agent start a new session
anyway.

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
import time
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
    merge_device_lists,
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
    # How long an endpoint whose dial or stream failed is re-dialled before it is dropped.
    # 0 (Akri's behaviour, the default): dropped at once, until the handler registers again.
    reconnect_window: float = 0.0

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
# Agent side: endpoints, the handler of a name, sessions, the registration server


class Endpoint:
    """One registration: ``<name>@<endpoint>`` (Akri's endpoint uid), dialled at ``target``.

    Closed for good once it fails or a new registration of the same uid replaces it; only a
    new registration brings the uid back.
    """

    def __init__(self, name: str, endpoint: str, endpoint_type: int = UDS, shared: bool = False):
        self.name = name
        self.endpoint = endpoint
        self.endpoint_type = endpoint_type
        self.shared = shared
        self.target = endpoint_target(endpoint, endpoint_type)
        self.uid = f"{name}@{endpoint}"
        self._closed = threading.Event()
        self._close_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Endpoint({self.uid!r}, shared={self.shared})"

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> bool:
        """Close it; True only for the call that closed it (so a failure is logged once)."""
        with self._close_lock:
            if self._closed.is_set():
                return False
            self._closed.set()
            return True


class ExternalHandler:
    """Every endpoint registered under one handler name: what the agent's registry holds.

    Sessions started from it stream from each live endpoint and merge the lists. Endpoints come
    and go (:meth:`add`, :meth:`drop`) without restarting the sessions: a session dials a new
    endpoint as it arrives and forgets a dropped one. The handler stays registered when its last
    endpoint is dropped, so the devices it reported age out under the agent's offline grace.
    """

    def __init__(self, name: str, shared: bool = False, *, policy: ReconnectPolicy | None = None):
        self.name = name
        self.shared = shared
        self.policy = policy or ReconnectPolicy()
        self._endpoints: dict[str, Endpoint] = {}
        self._sessions: weakref.WeakSet[ExternalSession] = weakref.WeakSet()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ExternalHandler({self.name!r}, {sorted(self._endpoints)}, shared={self.shared})"

    def endpoints(self) -> list[Endpoint]:
        """The live endpoints, in registration order."""
        with self._lock:
            return list(self._endpoints.values())

    def others(self, uid: str) -> list[Endpoint]:
        """Live endpoints other than ``uid``."""
        return [e for e in self.endpoints() if e.uid != uid]

    def add(self, endpoint: Endpoint) -> Endpoint | None:
        """Register ``endpoint`` (replacing the one of the same uid, returned); sessions dial it."""
        with self._lock:
            previous = self._endpoints.pop(endpoint.uid, None)
            self._endpoints[endpoint.uid] = endpoint
            self.shared = endpoint.shared
            sessions = list(self._sessions)
        if previous is not None:
            previous.close()  # replaced, not failed: nothing to report
        for session in sessions:
            session.attach(endpoint)
        return previous

    def drop(self, endpoint: Endpoint, problem: str) -> bool:
        """Forget a failed endpoint until it registers again; True if it was live until now."""
        if not endpoint.close():
            return False  # already dropped, or replaced by a new registration
        with self._lock:
            if self._endpoints.get(endpoint.uid) is endpoint:
                del self._endpoints[endpoint.uid]
            remaining = len(self._endpoints)
            sessions = list(self._sessions)
        log.warning(
            "discovery handler endpoint %s failed (%s): dropped until it registers again; "
            "%d other endpoint(s) of %s live",
            endpoint.uid,
            problem,
            remaining,
            self.name,
        )
        for session in sessions:
            session.detach(endpoint)
        return True

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
            endpoints = list(self._endpoints.values())
        session.attach(*endpoints)
        return session


class ExternalSession:
    """One Configuration's discovery: a stream per endpoint of the handler, lists merged.

    Each endpoint keeps its own latest list; the merged list holds every device any endpoint
    reports (one id once: the endpoint registered first wins, as Akri's merge keeps the first).
    An endpoint's list leaves the merge only when the endpoint is dropped or replaced by a
    stream of a new registration that has sent its own list.
    """

    def __init__(
        self, handler: ExternalHandler, request: pb.DiscoverRequest, publisher: DevicePublisher
    ) -> None:
        self._handler = handler
        self._request = request
        self._publisher = publisher
        self._lock = threading.Lock()  # guards the dicts and serialises deliveries
        self._streams: dict[str, EndpointStream] = {}
        self._lists: dict[str, list[DiscoveredDevice]] = {}
        self._stopped = False

    @property
    def handler(self) -> ExternalHandler:
        return self._handler

    @property
    def connects(self) -> int:
        """Streams that delivered at least one response; for tests and logs."""
        with self._lock:
            return sum(s.connects for s in self._streams.values())

    def attach(self, *endpoints: Endpoint) -> None:
        """Stream from each endpoint (replacing the stream of an endpoint with its uid).

        Every one is in the session before any stream starts: a dead endpoint's stream fails
        at once, and its drop must not find the session without the live ones and publish an
        empty list, which the agent reads as every device gone."""
        streams = [EndpointStream(self, endpoint, self._request) for endpoint in endpoints]
        with self._lock:
            if self._stopped:
                return
            previous = [self._streams.get(stream.endpoint.uid) for stream in streams]
            for stream in streams:
                self._streams[stream.endpoint.uid] = stream
        for old in previous:
            if old is not None:
                old.stop()  # its list stays in the merge until the new stream sends one
        for stream in streams:
            stream.start()

    def detach(self, endpoint: Endpoint) -> None:
        """Forget a dropped endpoint and the devices it reported."""
        with self._lock:
            stream = self._streams.get(endpoint.uid)
            if self._stopped or stream is None or stream.endpoint is not endpoint:
                return
            del self._streams[endpoint.uid]
            reported = self._lists.pop(endpoint.uid, None) is not None
            orphaned = not self._streams
            # Only a change is news: an endpoint that never answered takes nothing away, and
            # the live endpoints' lists (maybe not in yet) are not to be read as empty.
            if reported or orphaned:
                self._deliver_merged()
        stream.stop()
        if orphaned:
            self._publisher.error(
                f"no live endpoint of discovery handler {self._handler.name}: its devices age "
                "out until it registers again"
            )

    def received(self, stream: EndpointStream, devices: list[DiscoveredDevice]) -> None:
        """A stream's new list (already screened)."""
        with self._lock:
            if self._stopped or self._streams.get(stream.endpoint.uid) is not stream:
                return
            self._lists[stream.endpoint.uid] = devices
            self._deliver_merged()

    def screen(
        self, stream: EndpointStream, devices: list[DiscoveredDevice]
    ) -> list[DiscoveredDevice] | None:
        """The good devices of a stream's list (bad ones logged under the endpoint's uid)."""
        return self._publisher.screen(devices, stream.endpoint.uid)

    def error(self, message: str) -> None:
        self._publisher.error(message)

    def _deliver_merged(self) -> None:
        # In the order the endpoints registered: the first one's device wins a shared id.
        lists = [self._lists[uid] for uid in self._streams if uid in self._lists]
        self._publisher.deliver(merge_device_lists(lists))

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            streams = list(self._streams.values())
        self._publisher.close()
        for stream in streams:
            stream.stop()


class EndpointStream:
    """One ``Discover`` stream from one endpoint for one session, in a thread of its own.

    A response replaces this endpoint's list. When the dial fails or the stream ends, the
    endpoint is re-dialled with backoff for ``policy.reconnect_window`` seconds (0: not at all,
    as Akri) and then dropped from its handler. ``INVALID_ARGUMENT`` means the handler refuses
    the ``discoveryDetails``: reported and retried slowly, the endpoint stays.
    """

    def __init__(
        self, session: ExternalSession, endpoint: Endpoint, request: pb.DiscoverRequest
    ) -> None:
        self.session = session
        self.endpoint = endpoint
        self._request = request
        self._policy = session.handler.policy
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._call: grpc.RpcContext | None = None
        self.connects = 0
        self._thread = threading.Thread(
            target=self._run, name=f"discovery-{endpoint.uid}"[:60], daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            call, self._call = self._call, None
        if call is not None:
            call.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _done(self) -> bool:
        return self._stop.is_set() or self.endpoint.closed

    def _run(self) -> None:
        attempt = 0
        lost_at: float | None = None  # when the current outage began
        while not self._done():
            try:
                received, error = self._stream_once()
            except Exception as exc:  # a bug here must not end discovery silently
                log.exception("discovery stream from %s failed", self.endpoint.uid)
                received, error = False, exc
            if self._done():
                break
            if received:
                attempt, lost_at = 0, None
            if _is_invalid_argument(error):
                self._refused(error)
                self._stop.wait(self._policy.invalid_details_retry)
                continue
            problem = _describe(error)
            now = time.monotonic()
            lost_at = now if lost_at is None else lost_at
            if now - lost_at >= self._policy.reconnect_window:
                self.session.handler.drop(self.endpoint, problem)
                break
            if attempt == 0:
                log.info(
                    "discovery handler endpoint %s: %s; re-dialling for up to %gs",
                    self.endpoint.uid,
                    problem,
                    self._policy.reconnect_window,
                )
            self._stop.wait(self._policy.delay(attempt))
            attempt += 1

    def _refused(self, error: grpc.RpcError) -> None:
        details = error.details()
        log.warning(
            "discovery handler endpoint %s refused discoveryDetails: %s", self.endpoint.uid, details
        )
        self.session.error(f"invalid discoveryDetails: {details}")

    def _stream_once(self) -> tuple[bool, Exception | None]:
        """Stream until it ends; returns whether anything arrived, and the error if any."""
        received = False
        channel = grpc.insecure_channel(self.endpoint.target)
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
                    log.info("discovery handler endpoint %s streaming devices", self.endpoint.uid)
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
        except Exception as exc:  # never let a malformed response kill the stream
            log.exception(
                "discovery handler endpoint %s sent an unreadable response", self.endpoint.uid
            )
            self.session.error(f"unreadable response from {self.endpoint.uid}: {exc}")
            return
        accepted = self.session.screen(self, devices)
        if accepted is not None:
            self.session.received(self, accepted)


def _is_invalid_argument(error: Exception | None) -> bool:
    return isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.INVALID_ARGUMENT


def _describe(error: Exception | None) -> str:
    if error is None:
        return "stream closed by the handler"
    if isinstance(error, grpc.RpcError):
        return f"{error.code().name}: {error.details()}"
    return f"{type(error).__name__}: {error}"


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
        """Validate and apply one registration (also callable without gRPC).

        The endpoint joins the handler of its name (created on first use, replacing a built-in
        handler of that name). Its uid ``<name>@<endpoint>`` registering again replaces the
        earlier registration of that uid; the other endpoints are untouched.
        """
        validate_registration(request)
        endpoint = Endpoint(request.name, request.endpoint, request.endpoint_type, request.shared)
        with self._lock:  # serialise find-or-create per server
            handler, created = self._handler_for(endpoint)
            was_shared = handler.shared
            replaced = handler.add(endpoint)
        if created or was_shared != endpoint.shared:
            # New to the registry, or a changed shared flag: the agent (re)starts its sessions.
            self.registry.register(handler)
        log.info(
            "discovery handler endpoint %s %s at %s (shared=%s)",
            endpoint.uid,
            "registered again" if replaced is not None else "registered",
            endpoint.target,
            endpoint.shared,
        )
        return handler

    def _handler_for(self, endpoint: Endpoint) -> tuple[ExternalHandler, bool]:
        current = self.registry.get(endpoint.name)
        if isinstance(current, ExternalHandler):
            others = current.others(endpoint.uid)
            if others and current.shared != endpoint.shared:
                raise InvalidRegistration(
                    f"shared={endpoint.shared} differs from shared={current.shared} of the "
                    f"live endpoint(s) {', '.join(e.uid for e in others)} of {endpoint.name}"
                )
            return current, False
        if current is not None:
            log.warning("external discovery handler %s replaces the built-in one", endpoint.name)
        return ExternalHandler(endpoint.name, endpoint.shared, policy=self.policy), True


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
