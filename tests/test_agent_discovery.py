"""Akri-style external discovery handlers feeding the agent over the v0 protocol."""

from __future__ import annotations

import logging
import os

import pytest

from agent.discovery.base import DeviceSpec, DiscoveredDevice, Mount
from agent.discovery.external import ExampleDiscoveryHandlerServer
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


def test_bad_device_lists_are_refused_and_the_agent_keeps_running(cluster, handler, caplog):
    caplog.set_level(logging.INFO)
    cluster.api.create_configuration(configuration_body(CONFIG, handler="onvif", details="x"))
    handler.register(cluster["node-a"].registration_socket)
    wait_instances(cluster, {CAM1}, nodes=("node-a",))
    rv = cluster.api.get_instance(CAM1)["metadata"]["resourceVersion"]
    bad_lists = [
        [pb.Device(id="cam-1"), pb.Device(id="cam-1")],
        [pb.Device(id="")],
        [pb.Device(id="cam-1", properties={"BIG": "x" * 20_000})],
    ]

    for devices in bad_lists:
        refusals = sum("invalid device list" in r.getMessage() for r in caplog.records)
        handler.send_raw(pb.DiscoverResponse(devices=devices))
        cluster.wait_for(
            lambda n=refusals: (
                sum("invalid device list" in r.getMessage() for r in caplog.records) > n
            ),
            message="a refusal in the log",
        )

    assert cluster.api.get_instance(CAM1)["metadata"]["resourceVersion"] == rv
    assert set(cluster.instances()) == {CAM1}
    handler.set_devices([CAMERA, DiscoveredDevice(id="cam-2", properties={"N": "2"})])
    wait_instances(cluster, {CAM1, CAM2}, nodes=("node-a",))
    assert any(
        "duplicate" in r.getMessage() or "more than once" in r.getMessage() for r in caplog.records
    )
