"""External discovery handlers: Akri's v0 gRPC over real Unix sockets."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import grpc
import pytest

from agent.discovery.base import DeviceSpec, DiscoveredDevice, HandlerRegistry, Mount
from agent.discovery.external import (
    NETWORK,
    UDS,
    ExampleDiscoveryHandlerServer,
    ExternalHandler,
    InvalidRegistration,
    ReconnectPolicy,
    RegistrationServer,
    endpoint_target,
)
from agent.protos import discovery_pb2 as pb
from agent.protos import discovery_pb2_grpc as pb_grpc

from .test_discovery_base import Recorder

FAST = ReconnectPolicy(initial=0.02, maximum=0.1, invalid_details_retry=0.05, offline_grace=30)

CAMERA = DiscoveredDevice(
    id="cam-1",
    properties={"ONVIF_DEVICE_SERVICE_URL": "http://10.0.0.7/onvif/device_service"},
    mounts=(Mount("/var/run/cam", "/run/cam-1", read_only=True),),
    device_specs=(DeviceSpec("/dev/video0", "/dev/video0", "rw"),),
)


class Env:
    """An agent-side registry and Registration socket, plus Akri-style DHs on their own sockets."""

    def __init__(self, policy: ReconnectPolicy = FAST) -> None:
        self.dir = tempfile.mkdtemp(prefix="d", dir="/tmp")
        self.registry = HandlerRegistry()
        self.notified: list[str] = []
        self.registry.add_listener(self.notified.append)
        self.registration_socket = os.path.join(self.dir, "agent-registration.sock")
        self.registration = RegistrationServer(
            self.registry, self.registration_socket, policy=policy
        ).start()
        self.servers: list[ExampleDiscoveryHandlerServer] = []
        self.sessions: list = []

    def dh(self, devices=(CAMERA,), name: str = "onvif", **kwargs) -> ExampleDiscoveryHandlerServer:
        server = ExampleDiscoveryHandlerServer(
            os.path.join(self.dir, f"{name}.sock"), devices, name=name, **kwargs
        ).start()
        server.register(self.registration_socket)
        self.servers.append(server)
        return server

    def discover(self, name: str = "onvif", details: str = "", properties=None) -> Recorder:
        rec = Recorder()
        handler = self.registry.get(name)
        assert handler is not None
        self.sessions.append(handler.start(details, properties or {}, rec.on_devices, rec.on_error))
        return rec

    def register_raw(self, **fields) -> None:
        with grpc.insecure_channel(f"unix://{self.registration_socket}") as channel:
            pb_grpc.RegistrationStub(channel).RegisterDiscoveryHandler(
                pb.RegisterDiscoveryHandlerRequest(**fields), timeout=5
            )

    def close(self) -> None:
        for session in self.sessions:
            session.stop()
        for server in self.servers:
            server.stop()
        self.registration.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def env():
    e = Env()
    yield e
    e.close()


def test_a_registered_handler_streams_its_devices(env):
    dh = env.dh(shared=True)
    handler = env.registry.get("onvif")
    assert isinstance(handler, ExternalHandler)
    assert (handler.name, handler.shared, handler.target) == (
        "onvif",
        True,
        f"unix://{dh.socket_path}",
    )
    assert env.notified == ["onvif"]
    rec = env.discover(details="ipAddresses: {action: Exclude, items: []}")
    rec.wait_for(lambda r: r.lists == [[CAMERA]])
    assert rec.errors == []


def test_it_sends_discovery_details_and_properties_as_bytedata(env):
    dh = env.dh()
    rec = env.discover(details="x: 1", properties={"USER": b"admin", "UNSET": None})
    rec.wait_for(lambda r: len(r.lists) == 1)
    (request,) = dh.requests
    assert request.discovery_details == "x: 1"
    assert request.discovery_properties["USER"].vec == b"admin"
    assert not request.discovery_properties["UNSET"].HasField("vec")


def test_every_response_replaces_the_whole_list(env):
    dh = env.dh()
    rec = env.discover()
    rec.wait_for_ids(["cam-1"])
    dh.set_devices([DiscoveredDevice("cam-3"), DiscoveredDevice("cam-2")])
    rec.wait_for_ids(["cam-2", "cam-3"])
    dh.set_devices([])
    rec.wait_for_ids([])
    assert [len(lst) for lst in rec.lists] == [1, 2, 0]


def test_a_dropped_stream_reconnects_and_devices_resume(env):
    dh = env.dh()
    rec = env.discover()
    rec.wait_for_ids(["cam-1"])
    session = env.sessions[0]
    dh.drop_streams()
    rec.wait_for(lambda r: session.connects == 2)
    assert "unavailable" in rec.errors[0] and "reconnecting" in rec.errors[0]
    dh.set_devices([DiscoveredDevice("cam-9")])
    rec.wait_for_ids(["cam-9"])
    # The list stayed in force while reconnecting: nothing was withdrawn in between.
    assert all(lst for lst in rec.lists)


def test_a_handler_that_restarts_is_reached_again_with_backoff(env):
    dh = env.dh()
    rec = env.discover()
    rec.wait_for_ids(["cam-1"])
    dh.stop()
    rec.wait_for(lambda r: len(r.errors) >= 1 and not os.path.exists(dh.socket_path))
    restarted = ExampleDiscoveryHandlerServer(dh.socket_path, [DiscoveredDevice("cam-2")]).start()
    env.servers.append(restarted)  # not re-registered: the session's own retries find it
    rec.wait_for_ids(["cam-2"])


def test_re_registration_wakes_a_session_out_of_a_long_backoff():
    env = Env(ReconnectPolicy(initial=30, maximum=30, offline_grace=60))
    try:
        dh = env.dh()
        rec = env.discover()
        rec.wait_for_ids(["cam-1"])
        dh.stop()
        rec.wait_for(lambda r: len(r.errors) >= 1)
        again = env.dh([DiscoveredDevice("cam-2")])
        assert again.socket_path == dh.socket_path
        rec.wait_for_ids(["cam-2"], timeout=3)  # far sooner than the 15-30 s backoff
        assert env.notified == ["onvif"]  # same endpoint: no restart of the agent's sessions
    finally:
        env.close()


def test_devices_are_withdrawn_when_the_handler_stays_away():
    env = Env(ReconnectPolicy(initial=0.02, maximum=0.05, offline_grace=0.3))
    try:
        dh = env.dh()
        rec = env.discover()
        rec.wait_for_ids(["cam-1"])
        dh.stop()
        rec.wait_for_ids([])
        rec.wait_for(lambda r: "devices are withdrawn" in r.errors[-1])
    finally:
        env.close()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([pb.Device(id="a"), pb.Device(id="a")], "reported more than once"),
        ([pb.Device(id="")], "empty id"),
        ([pb.Device(id="a", properties={"BIG": "x" * (16 * 1024 + 1)})], "more than 16384"),
        ([pb.Device(id="a", properties={"not a name": "1"})], "environment variable name"),
    ],
)
def test_an_invalid_list_is_refused_and_the_previous_one_stays(env, caplog, bad, message):
    dh = env.dh()
    rec = env.discover()
    rec.wait_for_ids(["cam-1"])
    with caplog.at_level(logging.ERROR, logger="agent.discovery.base"):
        dh.send_raw(pb.DiscoverResponse(devices=bad))
        rec.wait_for(lambda r: len(r.errors) == 1)
    assert message in rec.errors[0]
    assert any(message in r.getMessage() for r in caplog.records)
    assert rec.lists == [[CAMERA]]
    dh.set_devices([DiscoveredDevice("cam-2")])
    rec.wait_for_ids(["cam-2"])


def test_invalid_details_are_reported_and_retried_slowly(env):
    attempts: list[str] = []

    def refuse(details: str) -> str | None:
        attempts.append(details)
        return "udevRules is required"

    env.dh(validate_details=refuse)
    rec = env.discover(details="nope: 1")
    rec.wait_for(lambda r: len(attempts) >= 2)
    assert rec.errors == ["invalid discoveryDetails: udevRules is required"]
    assert rec.lists == []


def test_stop_ends_the_stream_and_silences_the_session(env):
    dh = env.dh()
    rec = env.discover()
    rec.wait_for_ids(["cam-1"])
    env.sessions[0].stop()
    rec.wait_for(lambda r: dh.active_streams == 0)
    dh.set_devices([])
    assert rec.lists == [[CAMERA]]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "", "endpoint": "/tmp/x.sock"}, "name is empty"),
        ({"name": "bad name", "endpoint": "/tmp/x.sock"}, "must be 1-63"),
        ({"name": "-x", "endpoint": "/tmp/x.sock"}, "must be 1-63"),
        ({"name": "udev"}, "endpoint is empty"),
        ({"name": "udev", "endpoint": "udev.sock"}, "not an absolute path"),
        ({"name": "udev", "endpoint": "/" + "x" * 120}, "longer than 107 bytes"),
        ({"name": "opcua", "endpoint": "https://10.0.0.1:10000", "endpoint_type": NETWORK}, "http"),
        ({"name": "opcua", "endpoint": "http://10.0.0.1", "endpoint_type": NETWORK}, "host:port"),
        ({"name": "opcua", "endpoint": "http://h:x", "endpoint_type": NETWORK}, "Port"),
        ({"name": "opcua", "endpoint": "/x.sock", "endpoint_type": 7}, "unknown endpoint_type"),
    ],
)
def test_an_invalid_registration_is_refused_with_invalid_argument(env, fields, message):
    with pytest.raises(grpc.RpcError) as caught:
        env.register_raw(**fields)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()
    assert env.registry.names() == [] and env.notified == []


def test_a_new_endpoint_for_a_name_replaces_the_handler(env):
    env.register_raw(name="opcua", endpoint="http://10.0.0.1:10000", endpoint_type=NETWORK)
    env.register_raw(name="opcua", endpoint="http://10.0.0.1:10000", endpoint_type=NETWORK)
    env.register_raw(name="opcua", endpoint="http://10.0.0.2:10000", endpoint_type=NETWORK)
    assert env.registry.get("opcua").target == "10.0.0.2:10000"
    assert env.notified == ["opcua", "opcua"]


@pytest.mark.parametrize(
    ("endpoint", "endpoint_type", "target"),
    [
        ("/var/lib/akri/udev.sock", UDS, "unix:///var/lib/akri/udev.sock"),
        ("http://10.1.2.3:10000", NETWORK, "10.1.2.3:10000"),
        ("http://[fd00::7]:10000", NETWORK, "[fd00::7]:10000"),
        ("dh.example:10000", NETWORK, "dh.example:10000"),
    ],
)
def test_endpoints_become_grpc_targets(endpoint, endpoint_type, target):
    assert endpoint_target(endpoint, endpoint_type) == target


def test_an_external_handler_refuses_an_unusable_endpoint():
    with pytest.raises(InvalidRegistration):
        ExternalHandler("x", "relative.sock", UDS)


def test_backoff_doubles_from_the_initial_delay_up_to_the_cap_with_jitter():
    policy = ReconnectPolicy(initial=0.1, maximum=5.0)
    assert [policy.delay(n, rng=lambda: 1.0) for n in range(8)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    )
    assert policy.delay(0, rng=lambda: 0.0) == pytest.approx(0.05)
    assert policy.delay(1000, rng=lambda: 0.0) == pytest.approx(2.5)
