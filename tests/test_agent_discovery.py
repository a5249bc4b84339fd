"""Akri-style external discovery handlers feeding the agent over the v0 protocol."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from agent.discovery.base import MAX_DEVICES, DeviceSpec, DiscoveredDevice, Mount
from agent.discovery.external import (
    ExampleDiscoveryHandlerServer,
    device_to_proto,
    register_with_agent,
)
from agent.domain.naming import instance_digest, instance_name
from agent.protos import discovery_pb2 as pb

from .test_agent_lifecycle import AgentCluster, configuration_body, healthy, wait_instances

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CONFIG = "cams"
CAMERA = DiscoveredDevice(
    id="cam-1",
    properties={"ONVIF_DEVICE_SERVICE_URL": "http://10.0.0.7/onvif"},
    mounts=(Mount("/var/run/cam", "/run/cam-1", read_only=True),),
    device_specs=(DeviceSpec("/dev/video0", "/dev/video0", "rw"),),
)
CAM1 = instance_name(CONFIG, instance_digest("cam-1", True, ""))
CAM2 = instance_name(CONFIG, instance_digest("cam-2", True, ""))


@pytest.fixture
def handler(cluster):
    server = ExampleDiscoveryHandlerServer(
        os.path.join(cluster.root, "onvif.sock"), [CAMERA], name="onvif", shared=True
    ).start()
    yield server
    server.stop()


@pytest.fixture
def cluster(kube):
    started = AgentCluster(kube, nodes=("node-a", "node-b")).start()
    yield started
    started.stop()


def test_an_external_handler_that_registers_later_gets_its_devices_published(
    cluster, handler, caplog
):
    cluster.api.create_configuration(
        configuration_body(CONFIG, handler="onvif", details="anything", capacity=1)
    )
    cluster.wait_for(
        lambda: any("waits for discovery handler 'onvif'" in r.getMessage() for r in caplog.records)
    )
    assert cluster.instances() == {}

    for node in cluster.nodes.values():
        handler.register(node.registration_socket)

    found = wait_instances(cluster, {CAM1}, nodes=("node-a", "node-b"))
    spec = found[CAM1]["spec"]
    assert spec["brokerProperties"] == {"ONVIF_DEVICE_SERVICE_URL": "http://10.0.0.7/onvif"}
    assert spec["shared"] is True
    assert handler.requests[0].discovery_details == "anything"
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(f"akri.sh/{CAM1}", lambda d: len(healthy(d)) == 1)
    result = kubelet.admit_pod(
        "default", "cam", [{"name": "c", "requests": {f"akri.sh/{CAM1}": 1}}]
    )
    assert result.admitted, result.error
    container = result.container("c")
    [mount] = container.mounts
    assert (mount.container_path, mount.host_path, mount.read_only) == (
        "/var/run/cam",
        "/run/cam-1",
        True,
    )
    [device] = container.device_specs
    assert (device.container_path, device.host_path, device.permissions) == (
        "/dev/video0",
        "/dev/video0",
        "rw",
    )
    suffix = CAM1.rsplit("-", 1)[1].upper()
    assert container.envs[f"ONVIF_DEVICE_SERVICE_URL_{suffix}"] == "http://10.0.0.7/onvif"


def test_a_bad_device_is_left_out_and_the_good_ones_become_instances(cluster, handler, caplog):
    caplog.set_level(logging.INFO)
    cluster.api.create_configuration(configuration_body(CONFIG, handler="onvif", details="x"))
    handler.register(cluster["node-a"].registration_socket)
    wait_instances(cluster, {CAM1}, nodes=("node-a",))
    rv = cluster.api.get_instance(CAM1)["metadata"]["resourceVersion"]

    handler.send_raw(
        pb.DiscoverResponse(
            devices=[
                device_to_proto(CAMERA),
                pb.Device(id="cam-2", properties={"N": "2"}),
                pb.Device(id="cam-3", properties={"BAD=KEY": "1"}),
            ]
        )
    )

    wait_instances(cluster, {CAM1, CAM2}, nodes=("node-a",))
    assert cluster.api.get_instance(CAM1)["metadata"]["resourceVersion"] == rv
    [line] = [r.getMessage() for r in caplog.records if "bad device" in r.getMessage()]
    assert "device 'cam-3': property name 'BAD=KEY'" in line


def test_too_many_devices_are_refused_whole_and_the_previous_list_stays(cluster, handler, caplog):
    cluster.api.create_configuration(configuration_body(CONFIG, handler="onvif", details="x"))
    handler.register(cluster["node-a"].registration_socket)
    wait_instances(cluster, {CAM1}, nodes=("node-a",))
    rv = cluster.api.get_instance(CAM1)["metadata"]["resourceVersion"]
    handler.send_raw(
        pb.DiscoverResponse(devices=[pb.Device(id=f"d{i}") for i in range(MAX_DEVICES + 1)])
    )
    cluster.wait_for(lambda: "device list refused" in caplog.text, message="a refusal in the log")
    assert cluster.api.get_instance(CAM1)["metadata"]["resourceVersion"] == rv
    assert set(cluster.instances()) == {CAM1}


# --- several endpoints under one name, each a real process ----------------------------------


def foo(i: int) -> str:
    return instance_name(CONFIG, instance_digest(f"foo{i}", True, ""))


def bar(i: int) -> str:
    return instance_name(CONFIG, instance_digest(f"bar{i}", True, ""))


class HandlerProcess:
    """``agent.discovery.examplehandler`` in an OS process of its own, registered with a node."""

    def __init__(self, socket_path: str, registration_socket: str, devices: list[str]) -> None:
        self.socket_path = socket_path
        self.uid = f"pyecho@{socket_path}"
        args = ["--name", "pyecho", "--socket", socket_path, "--register", registration_socket]
        for device in devices:
            args += ["--device", device]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agent.discovery.examplehandler", *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.process.stdout.readline()  # bounded: registration times out after 5 s
        assert ready.strip() == "ready", f"handler exited with {self.process.wait(5)}"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture
def processes(cluster):
    started: list[HandlerProcess] = []

    def start(name: str, devices: list[str]) -> HandlerProcess:
        sock = os.path.join(cluster.root, f"{name}.sock")
        started.append(HandlerProcess(sock, cluster["node-a"].registration_socket, devices))
        return started[-1]

    yield start
    for process in started:
        process.stop()


def stays(predicate, seconds: float) -> None:
    """Assert that ``predicate`` holds throughout the next ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate()
        time.sleep(0.02)


def drop_lines(caplog, uid: str) -> list[str]:
    prefix = f"discovery handler endpoint {uid} failed"
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]


def test_two_handler_processes_under_one_name_are_merged_and_one_may_die_and_return(
    cluster, processes, caplog
):
    caplog.set_level(logging.INFO, logger="agent.discovery.external")
    cluster.api.create_configuration(configuration_body(CONFIG, handler="pyecho", details="x"))
    a = processes("a", ["foo0", "foo1"])
    processes("b", ["bar0", "bar1"])
    wait_instances(cluster, {foo(0), foo(1), bar(0), bar(1)}, nodes=("node-a",))

    a.kill()
    # A's devices age out under the offline grace; B's stay.
    wait_instances(cluster, {bar(0), bar(1)}, nodes=("node-a",))
    cluster.wait_for(lambda: drop_lines(caplog, a.uid), message="the drop in the log")
    # Logged once per failure: nothing re-dials a dropped endpoint, so no line repeats.
    stays(lambda: len(drop_lines(caplog, a.uid)) == 1, seconds=1.0)

    processes("a", ["foo0", "foo1"])  # the handler restarts and registers again
    wait_instances(cluster, {foo(0), foo(1), bar(0), bar(1)}, nodes=("node-a",))
    assert len(drop_lines(caplog, a.uid)) == 1


def test_a_registration_for_a_missing_socket_beside_a_live_process_withdraws_nothing(
    cluster, processes, caplog
):
    caplog.set_level(logging.INFO, logger="agent.discovery.external")
    cluster.api.create_configuration(configuration_body(CONFIG, handler="pyecho", details="x"))
    processes("live", ["foo0", "foo1"])
    wait_instances(cluster, {foo(0), foo(1)}, nodes=("node-a",))
    rvs = {n: o["metadata"]["resourceVersion"] for n, o in cluster.instances().items()}
    missing = os.path.join(cluster.root, "missing.sock")

    register_with_agent(cluster["node-a"].registration_socket, "pyecho", missing, shared=True)

    cluster.wait_for(lambda: drop_lines(caplog, f"pyecho@{missing}"), message="the drop")
    # Three offline graces later the live endpoint's Instances are still there, untouched.
    stays(lambda: set(cluster.instances()) == set(rvs), seconds=cluster.grace * 3)
    assert {n: o["metadata"]["resourceVersion"] for n, o in cluster.instances().items()} == rvs
    assert len(drop_lines(caplog, f"pyecho@{missing}")) == 1
