"""External discovery handlers: Akri's v0 gRPC over real Unix sockets."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time

import grpc
import pytest

from agent.discovery.base import DeviceSpec, DiscoveredDevice, HandlerRegistry, Mount
from agent.discovery.external import (
    NETWORK,
    UDS,
    Endpoint,
    EndpointStream,
    ExampleDiscoveryHandlerServer,
    ExternalHandler,
    InvalidRegistration,
    ReconnectPolicy,
    RegistrationServer,
    device_to_proto,
    endpoint_target,
)
from agent.protos import discovery_pb2 as pb
from agent.protos import discovery_pb2_grpc as pb_grpc

from .test_discovery_base import Recorder

FAST = ReconnectPolicy(initial=0.02, maximum=0.1, invalid_details_retry=0.05)

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

    def dh(
        self, devices=(CAMERA,), name: str = "onvif", sock: str = "", **kwargs
    ) -> ExampleDiscoveryHandlerServer:
        server = ExampleDiscoveryHandlerServer(
            os.path.join(self.dir, f"{sock or name}.sock"), devices, name=name, **kwargs
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
    [endpoint] = handler.endpoints()
    assert (handler.name, handler.shared, endpoint.target, endpoint.uid) == (
        "onvif",
        True,
        f"unix://{dh.socket_path}",
        f"onvif@{dh.socket_path}",
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


def drop_lines(caplog, uid: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(f"discovery handler endpoint {uid} failed")
    ]


def test_a_dropped_stream_drops_the_endpoint_once_and_re_registration_brings_it_back(env, caplog):
    dh = env.dh()
    rec = env.discover()
    rec.wait_for_ids(["cam-1"])
    uid = f"onvif@{dh.socket_path}"
    with caplog.at_level(logging.INFO, logger="agent.discovery.external"):
        dh.drop_streams()
        rec.wait_for_ids([])
        assert env.registry.get("onvif").endpoints() == []
        # Dropped, as Akri does: no re-dialling, so no further lines however long we look.
        rec.wait_for(lambda r: dh.active_streams == 0)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            assert len(drop_lines(caplog, uid)) == 1
            time.sleep(0.05)
        assert "UNAVAILABLE" in drop_lines(caplog, uid)[0]
        assert "no live endpoint" in rec.errors[-1]
        dh.register(env.registration_socket)
        rec.wait_for_ids(["cam-1"])
    assert len(drop_lines(caplog, uid)) == 1
    assert [e.uid for e in env.registry.get("onvif").endpoints()] == [uid]


@pytest.fixture
def windowed():
    """An agent side that re-dials a failed endpoint for 30 s before dropping it."""
    e = Env(ReconnectPolicy(initial=0.02, maximum=0.1, reconnect_window=30))
    yield e
    e.close()


def test_within_the_reconnect_window_a_dropped_stream_is_redialled_and_devices_stay(windowed):
    dh = windowed.dh()
    rec = windowed.discover()
    rec.wait_for_ids(["cam-1"])
    session = windowed.sessions[0]
    dh.drop_streams()
    rec.wait_for(lambda r: session.connects == 2)
    dh.set_devices([DiscoveredDevice("cam-9")])
    rec.wait_for_ids(["cam-9"])
    # The list stayed in force while re-dialling: nothing was withdrawn in between.
    assert all(lst for lst in rec.lists)
    assert len(windowed.registry.get("onvif").endpoints()) == 1


def test_a_restarted_handler_is_found_within_the_window_without_registering(windowed):
    dh = windowed.dh()
    rec = windowed.discover()
    rec.wait_for_ids(["cam-1"])
    dh.stop()
    rec.wait_for(lambda r: not os.path.exists(dh.socket_path))
    restarted = ExampleDiscoveryHandlerServer(dh.socket_path, [DiscoveredDevice("cam-2")])
    windowed.servers.append(restarted.start())
    rec.wait_for_ids(["cam-2"])


def test_after_the_window_the_endpoint_is_dropped_and_its_devices_leave(caplog):
    env = Env(ReconnectPolicy(initial=0.02, maximum=0.05, reconnect_window=0.3))
    try:
        dh = env.dh()
        rec = env.discover()
        rec.wait_for_ids(["cam-1"])
        with caplog.at_level(logging.INFO, logger="agent.discovery.external"):
            dh.stop()
            rec.wait_for_ids([])
        assert len(drop_lines(caplog, f"onvif@{dh.socket_path}")) == 1
        assert env.registry.get("onvif").endpoints() == []
    finally:
        env.close()


def test_re_registration_re_dials_at_once_out_of_a_long_backoff():
    env = Env(ReconnectPolicy(initial=30, maximum=30, reconnect_window=600))
    try:
        dh = env.dh()
        rec = env.discover()
        rec.wait_for_ids(["cam-1"])
        dh.stop()
        rec.wait_for(lambda r: not os.path.exists(dh.socket_path))
        again = env.dh([DiscoveredDevice("cam-2")])
        assert again.socket_path == dh.socket_path
        rec.wait_for_ids(["cam-2"], timeout=3)  # far sooner than the 15-30 s backoff
        assert env.notified == ["onvif"]  # same handler: the agent's sessions keep running
    finally:
        env.close()


def test_endpoints_under_one_name_are_merged_and_keep_their_own_lists(env):
    a = env.dh([DiscoveredDevice("foo0"), DiscoveredDevice("foo1")], sock="a")
    b = env.dh([DiscoveredDevice("bar0"), DiscoveredDevice("bar1")], sock="b")
    rec = env.discover()
    rec.wait_for_ids(["bar0", "bar1", "foo0", "foo1"])
    a.set_devices([DiscoveredDevice("foo2")])
    rec.wait_for_ids(["bar0", "bar1", "foo2"])
    b.set_devices([])  # one endpoint's list never erases another's
    rec.wait_for_ids(["foo2"])
    b.set_devices([DiscoveredDevice("foo2", {"FROM": "b"}), DiscoveredDevice("baz")])
    rec.wait_for_ids(["baz", "foo2"])
    # One id reported by two endpoints is one device: the first registered endpoint's.
    assert {d.id: dict(d.properties) for d in rec.lists[-1]}["foo2"] == {}
    assert env.notified == ["onvif"]


def test_a_device_seen_by_two_endpoints_stays_when_one_is_dropped(env):
    a = env.dh([DiscoveredDevice("shared-cam")], sock="a")
    env.dh([DiscoveredDevice("shared-cam"), DiscoveredDevice("b-only")], sock="b")
    rec = env.discover()
    rec.wait_for_ids(["b-only", "shared-cam"])
    a.stop()
    rec.wait_for(lambda r: len(env.registry.get("onvif").endpoints()) == 1)
    assert rec.ids == ["b-only", "shared-cam"]


def test_a_registration_for_a_missing_socket_never_withdraws_a_live_endpoints_devices(env, caplog):
    env.dh(sock="live")
    rec = env.discover()
    rec.wait_for_ids(["cam-1"])
    missing = os.path.join(env.dir, "missing.sock")
    with caplog.at_level(logging.WARNING, logger="agent.discovery.external"):
        env.register_raw(name="onvif", endpoint=missing, shared=True)
        handler = env.registry.get("onvif")
        # The missing endpoint is dropped (and says so) after its registration is answered:
        # wait for both, not only for the endpoint count, which is 1 before it is added too.
        rec.wait_for(
            lambda r: len(handler.endpoints()) == 1 and drop_lines(caplog, f"onvif@{missing}")
        )
    assert [line for line in drop_lines(caplog, f"onvif@{missing}")][0].endswith(
        "1 other endpoint(s) of onvif live"
    )
    assert len(drop_lines(caplog, f"onvif@{missing}")) == 1
    assert rec.lists == [[CAMERA]] and rec.errors == []


def test_a_dead_endpoint_at_session_start_publishes_nothing_before_the_live_one_answers(env):
    env.register_raw(name="onvif", endpoint=os.path.join(env.dir, "missing.sock"), shared=True)
    answer = threading.Event()
    env.dh(sock="live", validate_details=lambda details: None if answer.wait(5) else "late")
    rec = env.discover()
    rec.wait_for(lambda r: len(env.registry.get("onvif").endpoints()) == 1)
    answer.set()
    rec.wait_for_ids(["cam-1"])
    assert rec.lists == [[CAMERA]]  # never an empty list the agent would read as "all gone"


def test_a_dead_endpoint_dropped_before_the_live_one_is_dialled_publishes_nothing(env, monkeypatch):
    """The worst order a loaded machine can give: the dead endpoint's stream fails and is
    dropped before the session has even started the live one's."""
    dead = os.path.join(env.dir, "missing.sock")
    env.register_raw(name="onvif", endpoint=dead, shared=True)
    env.dh(sock="live")
    start = EndpointStream.start

    def dead_first(stream: EndpointStream) -> None:
        start(stream)
        if stream.endpoint.uid == f"onvif@{dead}":
            stream._thread.join(5)  # reconnect window 0: dropped by now

    monkeypatch.setattr(EndpointStream, "start", dead_first)
    rec = env.discover()
    rec.wait_for_ids(["cam-1"])
    assert len(env.registry.get("onvif").endpoints()) == 1
    assert rec.lists == [[CAMERA]] and rec.errors == []


def test_a_session_started_later_streams_from_every_live_endpoint(env):
    env.dh([DiscoveredDevice("a0")], sock="a")
    env.dh([DiscoveredDevice("b0")], sock="b")
    first = env.discover()
    first.wait_for_ids(["a0", "b0"])
    second = env.discover(details="other")
    second.wait_for_ids(["a0", "b0"])


def test_an_endpoint_with_another_shared_flag_than_the_live_ones_is_refused(env):
    env.dh(sock="a", shared=True)
    with pytest.raises(grpc.RpcError) as caught:
        env.register_raw(name="onvif", endpoint=os.path.join(env.dir, "b.sock"), shared=False)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "differs from shared=True" in caught.value.details()
    assert len(env.registry.get("onvif").endpoints()) == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (pb.Device(id="cam-1"), "'cam-1' is reported more than once"),
        (pb.Device(id="", properties={"SERIAL": "77"}), "empty id (properties {'SERIAL': '77'})"),
        (pb.Device(id="big", properties={"BIG": "x" * (16 * 1024 + 1)}), "'big': property BIG"),
        (pb.Device(id="eq", properties={"A=B": "1"}), "'eq': property name 'A=B'"),
    ],
)
def test_a_bad_device_is_left_out_and_named_and_the_good_ones_are_used(env, caplog, bad, message):
    dh = env.dh()
    rec = env.discover()
    rec.wait_for_ids(["cam-1"])
    good = [device_to_proto(CAMERA), pb.Device(id="cam-2")]
    with caplog.at_level(logging.ERROR, logger="agent.discovery.base"):
        dh.send_raw(pb.DiscoverResponse(devices=[*good, bad]))
        rec.wait_for_ids(["cam-1", "cam-2"])
        dh.send_raw(pb.DiscoverResponse(devices=[*good, bad, pb.Device(id="cam-3")]))
        rec.wait_for_ids(["cam-1", "cam-2", "cam-3"])
    lines = [r.getMessage() for r in caplog.records if "bad device" in r.getMessage()]
    assert len(lines) == 1, lines  # the same bad device again is not logged again
    assert f"onvif@{dh.socket_path}: 1 bad device(s) left out" in lines[0]
    assert message in lines[0]


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


def test_endpoints_join_their_name_and_one_uid_registering_again_replaces_only_itself(env):
    env.register_raw(name="opcua", endpoint="http://10.0.0.1:10000", endpoint_type=NETWORK)
    env.register_raw(name="opcua", endpoint="http://10.0.0.1:10000", endpoint_type=NETWORK)
    env.register_raw(name="opcua", endpoint="http://10.0.0.2:10000", endpoint_type=NETWORK)
    handler = env.registry.get("opcua")
    assert [e.uid for e in handler.endpoints()] == [
        "opcua@http://10.0.0.1:10000",
        "opcua@http://10.0.0.2:10000",
    ]
    assert [e.target for e in handler.endpoints()] == ["10.0.0.1:10000", "10.0.0.2:10000"]
    assert env.notified == ["opcua"]  # the agent learns of the name once


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


def test_an_endpoint_refuses_an_unusable_address():
    with pytest.raises(InvalidRegistration):
        Endpoint("x", "relative.sock", UDS)


def test_backoff_doubles_from_the_initial_delay_up_to_the_cap_with_jitter():
    policy = ReconnectPolicy(initial=0.1, maximum=5.0)
    assert [policy.delay(n, rng=lambda: 1.0) for n in range(8)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    )
    assert policy.delay(0, rng=lambda: 0.0) == pytest.approx(0.05)
    assert policy.delay(1000, rng=lambda: 0.0) == pytest.approx(2.5)
