"""Tests for the kubelet simulator, driven by a tiny fake device plugin over real gRPC."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.protos import deviceplugin_pb2 as dp
from agent.protos import deviceplugin_pb2_grpc as dp_grpc
from agent.protos import podresources_pb2 as pr
from agent.protos import podresources_pb2_grpc as pr_grpc
from agent.simulator.kubelet import KubeletSimulator
from agent.simulator.kubelet_names import (
    is_extended_resource_name,
    join_endpoint,
)

RESOURCE = "akri.sh/foo-8120fe"
REPO = Path(__file__).resolve().parent.parent


class FakePlugin(dp_grpc.DevicePluginServicer):
    """A device plugin whose answers the test controls and whose calls it records."""

    def __init__(self, plugin_dir: str, name: str = "fake.sock", **options: bool) -> None:
        self.path = os.path.join(plugin_dir, name)
        self.options = dp.DevicePluginOptions(**options)
        self.calls: list[tuple[str, Any, float]] = []  # (method, request, monotonic time)
        self.cond = threading.Condition()
        self.devices: list[dp.Device] = []
        self.version = 0
        self.stream_generation = 0
        self.active_streams = 0
        self.options_delay = 0.0
        self.options_error = ""
        self.preferred: list[str] = []
        self.allocate: Callable[[dp.AllocateRequest, grpc.ServicerContext], Any] = self.answer
        self.prestart_error = ""
        self.server: grpc.Server | None = None

    # -- test controls --

    def serve(self) -> "FakePlugin":
        if os.path.exists(self.path):
            os.unlink(self.path)  # plugins remove a stale socket first
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        dp_grpc.add_DevicePluginServicer_to_server(self, self.server)
        self.server.add_insecure_port("unix://" + self.path)
        self.server.start()
        return self

    def shutdown(self) -> None:
        self.end_streams()
        if self.server is not None:
            self.server.stop(grace=None).wait(5)
            self.server = None

    def register(self, sim: KubeletSimulator, resource: str = RESOURCE, **fields: str) -> None:
        request = dp.RegisterRequest(
            version=fields.get("version", "v1beta1"),
            endpoint=fields.get("endpoint", os.path.basename(self.path)),
            resource_name=resource,
            options=self.options,
        )
        with grpc.insecure_channel("unix://" + sim.socket_path) as channel:
            # The kubelet's dial (10 s) and its GetDevicePluginOptions call (5 s) fit in it.
            dp_grpc.RegistrationStub(channel).Register(request, timeout=20)

    def set_devices(self, *devices: tuple[str, str] | tuple[str, str, list[int]]) -> None:
        with self.cond:
            self.devices = [
                dp.Device(
                    ID=d[0],
                    health=d[1],
                    topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=n) for n in d[2]])
                    if len(d) > 2
                    else None,
                )
                for d in devices
            ]
            self.version += 1
            self.cond.notify_all()

    def end_streams(self) -> None:
        with self.cond:
            self.stream_generation += 1
            self.cond.notify_all()

    def wait_streams(self, count: int, timeout: float = 5.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.active_streams == count, timeout)

    def requests(self, method: str) -> list[Any]:
        return [request for m, request, _ in self.calls if m == method]

    @staticmethod
    def answer(request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        ids = list(request.container_requests[0].devices_ids)
        return dp.AllocateResponse(
            container_responses=[
                dp.ContainerAllocateResponse(
                    envs={"FAKE_DEVICES": ",".join(ids)},
                    mounts=[dp.Mount(container_path="/fake", host_path="/tmp", read_only=True)],
                    devices=[dp.DeviceSpec(container_path="/dev/fake", host_path="/dev/null")],
                    annotations={"fake/ids": ",".join(ids)},
                )
            ]
        )

    # -- DevicePlugin service --

    def _record(self, method: str, request: Any) -> None:
        with self.cond:
            self.calls.append((method, request, time.monotonic()))

    def GetDevicePluginOptions(self, request, context):
        self._record("GetDevicePluginOptions", request)
        time.sleep(self.options_delay)
        if self.options_error:
            context.abort(grpc.StatusCode.INTERNAL, self.options_error)
        return self.options

    def ListAndWatch(self, request, context):
        self._record("ListAndWatch", request)
        with self.cond:
            generation = self.stream_generation
            self.active_streams += 1
            self.cond.notify_all()
        sent = -1
        try:
            while context.is_active():
                with self.cond:
                    if self.version == sent and self.stream_generation == generation:
                        self.cond.wait(0.1)
                    if self.stream_generation != generation:
                        return
                    if self.version == sent:
                        continue
                    sent, devices = self.version, list(self.devices)
                yield dp.ListAndWatchResponse(devices=devices)
        finally:
            with self.cond:
                self.active_streams -= 1
                self.cond.notify_all()

    def GetPreferredAllocation(self, request, context):
        self._record("GetPreferredAllocation", request)
        return dp.PreferredAllocationResponse(
            container_responses=[dp.ContainerPreferredAllocationResponse(deviceIDs=self.preferred)]
        )

    def Allocate(self, request, context):
        self._record("Allocate", request)
        return self.allocate(request, context)

    def PreStartContainer(self, request, context):
        self._record("PreStartContainer", request)
        if self.prestart_error:
            context.abort(grpc.StatusCode.INTERNAL, self.prestart_error)
        return dp.PreStartContainerResponse()


@pytest.fixture
def workdir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="k", dir="/tmp")  # unix socket paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sim(workdir: str) -> Iterator[KubeletSimulator]:
    # The kubelet's own dial timeout (10 s): a serving plugin is dialled at once on a quiet
    # machine, but at load 8 on two cores 0.5 s was once too short (a registration refused
    # with "context deadline exceeded"). Tests of an absent plugin set a short one.
    with KubeletSimulator(os.path.join(workdir, "dp"), rpc_timeout=5) as kubelet:
        yield kubelet


@pytest.fixture
def plugins(sim: KubeletSimulator) -> Iterator[Callable[..., FakePlugin]]:
    started: list[FakePlugin] = []

    def make(name: str = "fake.sock", **options: bool) -> FakePlugin:
        plugin = FakePlugin(sim.plugin_dir, name, **options).serve()
        started.append(plugin)
        return plugin

    yield make
    for plugin in started:
        plugin.shutdown()


def registered_plugin(
    sim: KubeletSimulator, make: Callable[..., FakePlugin], count: int = 4, **options: bool
) -> FakePlugin:
    plugin = make(**options)
    plugin.set_devices(*[(f"d{i}", "Healthy") for i in range(1, count + 1)])
    plugin.register(sim)
    sim.wait_devices(RESOURCE, lambda d: len(d) == count)
    return plugin


def pod_resources_stub(
    sim: KubeletSimulator,
) -> tuple[grpc.Channel, pr_grpc.PodResourcesListerStub]:
    channel = grpc.insecure_channel(
        "unix://" + sim.pod_resources_socket,
        options=[("grpc.max_receive_message_length", 16 * 1024 * 1024)],
    )
    return channel, pr_grpc.PodResourcesListerStub(channel)


# ---- names and messages ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["akri.sh/foo-8120fe", "example.com/gpu", "vendor.io/a.b_c-d", "x/Y"]
)
def test_it_accepts_extended_resource_names(name: str) -> None:
    assert is_extended_resource_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "foo",  # no domain: native
        "kubernetes.io/foo",
        "sub.kubernetes.io/foo",
        "requests.akri.sh/foo",
        "Akri.sh/foo",  # prefix must be a lowercase DNS subdomain
        "akri.sh/",
        "/foo",
        "a/b/c",
        "akri.sh/-foo",
        "akri.sh/" + "x" * 64,
    ],
)
def test_it_rejects_other_resource_names(name: str) -> None:
    assert not is_extended_resource_name(name)


def test_endpoint_is_joined_like_go_filepath_join() -> None:
    assert join_endpoint("/d/dp", "p.sock") == "/d/dp/p.sock"
    assert join_endpoint("/d/dp", "/p.sock") == "/d/dp/p.sock"
    assert join_endpoint("/d/dp", "../x.sock") == "/d/x.sock"


# ---- registration ----------------------------------------------------------------------------


def test_register_calls_get_device_plugin_options_before_returning(sim, plugins) -> None:
    plugin = plugins(pre_start_required=True)
    plugin.options_delay = 0.3

    plugin.register(sim)
    returned = time.monotonic()

    (options_call,) = [c for c in plugin.calls if c[0] == "GetDevicePluginOptions"]
    assert options_call[2] < returned
    state = sim.resources()[RESOURCE]
    assert state.endpoint == plugin.path
    assert state.options.pre_start_required
    assert state.registrations == 1
    assert [(e.resource, e.endpoint) for e in sim.registrations] == [(RESOURCE, plugin.path)]
    assert plugin.wait_streams(1)  # the stream is opened after Register, in the background


def test_register_fails_when_the_plugin_is_not_serving(sim) -> None:
    plugin = FakePlugin(sim.plugin_dir, "absent.sock")
    sim.dial_timeout = 0.5  # nothing will ever answer: no need to wait the kubelet's 10 s

    with pytest.raises(grpc.RpcError) as failure:
        plugin.register(sim)

    assert failure.value.code() == grpc.StatusCode.UNKNOWN
    assert failure.value.details() == "failed to dial device plugin: context deadline exceeded"
    assert sim.resources() == {}
    assert sim.registrations == []
    assert sim.registration_errors[0].resource == RESOURCE


def test_register_fails_when_get_device_plugin_options_fails(sim, plugins) -> None:
    plugin = plugins()
    plugin.options_error = "not ready"

    with pytest.raises(grpc.RpcError) as failure:
        plugin.register(sim)

    assert failure.value.code() == grpc.StatusCode.UNKNOWN
    assert failure.value.details() == (
        "failed to get device plugin options: rpc error: code = Internal desc = not ready"
    )
    assert sim.resources() == {}
    assert not plugin.wait_streams(1, timeout=0.2)


def test_register_rejects_an_unsupported_version(sim, plugins) -> None:
    plugin = plugins()

    with pytest.raises(grpc.RpcError) as failure:
        plugin.register(sim, version="v1alpha")

    assert failure.value.code() == grpc.StatusCode.UNKNOWN
    assert failure.value.details() == (
        'requested API version "v1alpha" is not supported by kubelet. '
        'Supported version is ["v1beta1"]'
    )
    assert plugin.calls == []


@pytest.mark.parametrize("name", ["foo", "kubernetes.io/foo", "requests.akri.sh/foo"])
def test_register_rejects_an_invalid_resource_name(sim, plugins, name: str) -> None:
    plugin = plugins()

    with pytest.raises(grpc.RpcError) as failure:
        plugin.register(sim, resource=name)

    assert failure.value.code() == grpc.StatusCode.UNKNOWN
    assert failure.value.details() == f'the ResourceName "{name}" is invalid'
    assert plugin.calls == []
    assert sim.resources() == {}


# ---- ListAndWatch ----------------------------------------------------------------------------


def test_each_list_replaces_the_device_set_and_only_healthy_counts(sim, plugins) -> None:
    plugin = plugins()
    plugin.set_devices(("a", "Healthy"), ("b", "Healthy"))
    plugin.register(sim)
    assert sim.wait_devices(RESOURCE, lambda d: len(d) == 2) == {"a": "Healthy", "b": "Healthy"}

    plugin.set_devices(("b", "Unhealthy"), ("c", "Healthy"), ("d", "healthy"))

    devices = sim.wait_devices(RESOURCE, lambda d: "a" not in d)
    assert devices == {"b": "Unhealthy", "c": "Healthy", "d": "healthy"}
    assert sim.capacity(RESOURCE) == 3
    assert sim.free(RESOURCE) == 1
    assert sim.list_updates(RESOURCE) == 2
    assert sim.resources()[RESOURCE].last_list_time is not None


def test_stream_end_marks_every_device_unhealthy_and_keeps_capacity(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=3)

    plugin.end_streams()

    devices = sim.wait_devices(RESOURCE, lambda d: set(d.values()) == {"Unhealthy"})
    assert len(devices) == 3
    assert sim.capacity(RESOURCE) == 3
    assert sim.free(RESOURCE) == 0
    assert not sim.resources()[RESOURCE].connected
    result = sim.admit_pod("ns", "p", [{"name": "c", "requests": {RESOURCE: 1}}])
    assert not result.admitted
    assert plugin.requests("Allocate") == []


def test_a_new_registration_replaces_the_endpoint_and_closes_the_old_stream(sim, plugins) -> None:
    first = registered_plugin(sim, plugins, count=2)
    second = plugins("second.sock")
    second.set_devices(("x", "Healthy"))

    second.register(sim)

    assert first.wait_streams(0)
    assert sim.wait_devices(RESOURCE, lambda d: d == {"x": "Healthy"})
    state = sim.resources()[RESOURCE]
    assert state.endpoint == second.path
    assert state.registrations == 2
    first.set_devices(("stale", "Healthy"))  # the old plugin no longer counts
    assert not sim.wait_for(lambda: "stale" in sim.resources()[RESOURCE].devices, 0.3)
    assert sim.resources()[RESOURCE].connected


# ---- admission -------------------------------------------------------------------------------


def test_admit_pod_allocates_one_container_at_a_time(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=4)

    result = sim.admit_pod(
        "ns",
        "p",
        [
            {"name": "c1", "requests": {RESOURCE: 1, "cpu": 2}},
            {"name": "c2", "requests": {RESOURCE: 2}},
            {"name": "c3", "requests": {}},
        ],
    )

    assert result.admitted and result.started, result.error
    allocate = plugin.requests("Allocate")
    assert [len(r.container_requests) for r in allocate] == [1, 1]
    sent = [list(r.container_requests[0].devices_ids) for r in allocate]
    assert sent == [
        result.container("c1").devices[RESOURCE],
        result.container("c2").devices[RESOURCE],
    ]
    assert [len(ids) for ids in sent] == [1, 2]
    assert len(set(sent[0]) | set(sent[1])) == 3
    c2 = result.container("c2")
    assert c2.envs == {"FAKE_DEVICES": ",".join(sent[1])}
    assert c2.annotations == {"fake/ids": ",".join(sent[1])}
    assert [m.container_path for m in c2.mounts] == ["/fake"]
    assert [d.container_path for d in c2.device_specs] == ["/dev/fake"]
    assert result.container("c3").devices == {}
    assert plugin.requests("GetPreferredAllocation") == []
    assert plugin.requests("PreStartContainer") == []
    assert sim.resources()[RESOURCE].allocated == set(sent[0]) | set(sent[1])
    assert sim.free(RESOURCE) == 1
    assert [(p.namespace, p.name) for p in sim.pods()] == [("ns", "p")]


def test_admit_pod_only_hands_out_healthy_devices(sim, plugins) -> None:
    plugin = plugins()
    plugin.set_devices(("bad", "Unhealthy"), ("good", "Healthy"))
    plugin.register(sim)
    sim.wait_devices(RESOURCE, lambda d: len(d) == 2)

    result = sim.admit_pod("ns", "p", [{"name": "c", "requests": {RESOURCE: 1}}])

    assert result.admitted
    assert result.container("c").devices == {RESOURCE: ["good"]}


def test_admit_pod_uses_the_preferred_allocation_as_a_hint(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=4, get_preferred_allocation_available=True)
    plugin.preferred = ["d3", "d1"]

    first = sim.admit_pod("ns", "p1", [{"name": "c", "requests": {RESOURCE: 2}}])

    assert sorted(first.container("c").devices[RESOURCE]) == ["d1", "d3"]
    (request,) = plugin.requests("GetPreferredAllocation")
    (container,) = request.container_requests
    assert list(container.available_deviceIDs) == ["d1", "d2", "d3", "d4"]
    assert list(container.must_include_deviceIDs) == []
    assert container.allocation_size == 2

    plugin.preferred = ["d1", "d4"]  # d1 is taken: kept out, shortfall filled by the kubelet
    second = sim.admit_pod("ns", "p2", [{"name": "c", "requests": {RESOURCE: 2}}])

    assert sorted(second.container("c").devices[RESOURCE]) == ["d2", "d4"]
    assert list(
        plugin.requests("GetPreferredAllocation")[1].container_requests[0].available_deviceIDs
    ) == [
        "d2",
        "d4",
    ]


def test_admit_pod_fails_on_allocate_error_and_releases_earlier_containers(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=4)

    def second_call_fails(request, context):
        if len(plugin.requests("Allocate")) == 2:
            context.abort(grpc.StatusCode.INTERNAL, "device busy")
        return FakePlugin.answer(request, context)

    plugin.allocate = second_call_fails

    result = sim.admit_pod(
        "ns",
        "p",
        [{"name": "c1", "requests": {RESOURCE: 1}}, {"name": "c2", "requests": {RESOURCE: 1}}],
    )

    assert not result.admitted
    assert result.reason == "UnexpectedAdmissionError"
    assert result.error == (
        "Allocate failed due to rpc error: code = Internal desc = device busy, which is unexpected"
    )
    assert len(plugin.requests("Allocate")) == 2
    assert sim.pods() == []
    assert sim.resources()[RESOURCE].allocated == set()
    assert sim.free(RESOURCE) == 4


def test_admit_pod_fails_on_an_empty_allocate_response(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=2)
    plugin.allocate = lambda request, context: dp.AllocateResponse()

    result = sim.admit_pod("ns", "p", [{"name": "c", "requests": {RESOURCE: 1}}])

    assert not result.admitted
    assert "no containers return in allocation response" in result.error
    assert sim.free(RESOURCE) == 2


def test_admit_pod_fails_without_calling_the_plugin_when_devices_are_short(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=2)

    result = sim.admit_pod(
        "ns",
        "p",
        [{"name": "c1", "requests": {RESOURCE: 1}}, {"name": "c2", "requests": {RESOURCE: 2}}],
    )

    assert not result.admitted
    assert result.reason == "UnexpectedAdmissionError"
    assert (
        "requested number of devices unavailable for akri.sh/foo-8120fe. Requested: 3, Available: 2"
        in result.error
    )
    assert plugin.requests("Allocate") == []
    unknown = sim.admit_pod("ns", "q", [{"name": "c", "requests": {"akri.sh/other": 1}}])
    assert not unknown.admitted
    assert unknown.reason == "OutOfakri.sh/other"
    assert unknown.error == (
        "Node didn't have enough resource: akri.sh/other, requested: 1, used: 0, capacity: 0"
    )


def test_remove_pod_frees_its_ids_for_later_pods(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=2)
    first = sim.admit_pod("ns", "p1", [{"name": "c", "requests": {RESOURCE: 2}}])
    assert first.admitted
    assert not sim.admit_pod("ns", "p2", [{"name": "c", "requests": {RESOURCE: 1}}]).admitted

    assert sim.remove_pod("ns", "p1")

    assert sim.free(RESOURCE) == 2
    again = sim.admit_pod("ns", "p2", [{"name": "c", "requests": {RESOURCE: 2}}])
    assert again.admitted
    assert sorted(again.container("c").devices[RESOURCE]) == ["d1", "d2"]
    assert len(plugin.requests("Allocate")) == 2
    assert not sim.remove_pod("ns", "p1")


def test_pre_start_container_is_called_only_when_required(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=3, pre_start_required=True)

    result = sim.admit_pod("ns", "p", [{"name": "c", "requests": {RESOURCE: 2}}])

    assert result.started
    (request,) = plugin.requests("PreStartContainer")
    assert list(request.devices_ids) == result.container("c").devices[RESOURCE]

    plugin.prestart_error = "no power"
    failed = sim.admit_pod("ns", "q", [{"name": "c", "requests": {RESOURCE: 1}}])
    assert failed.admitted and not failed.started
    assert "PreStartContainer rpc failed" in failed.container("c").prestart_error
    assert sim.free(RESOURCE) == 0  # the pod keeps its devices


def test_concurrent_admissions_never_share_a_device(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=8)
    results = []

    def admit(i: int) -> None:
        results.append(sim.admit_pod("ns", f"p{i}", [{"name": "c", "requests": {RESOURCE: 1}}]))

    def churn() -> None:  # list updates racing the admissions
        for n in range(5):
            plugin.set_devices(
                *[(f"d{i}", "Healthy") for i in range(1, 9)], (f"extra{n}", "Unhealthy")
            )

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(12)]
    threads.append(threading.Thread(target=churn))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    admitted = [r for r in results if r.admitted]
    assert len(results) == 12
    assert len(admitted) == 8
    ids = [r.container("c").devices[RESOURCE][0] for r in admitted]
    assert sorted(ids) == [f"d{i}" for i in range(1, 9)]
    assert sim.resources()[RESOURCE].allocated == set(ids)


def test_admissions_racing_a_restart_keep_the_books_straight(sim, plugins) -> None:
    plugin = registered_plugin(sim, plugins, count=6)
    results = []
    start = threading.Barrier(7)

    def admit(i: int) -> None:
        start.wait()
        results.append(sim.admit_pod("ns", f"p{i}", [{"name": "c", "requests": {RESOURCE: 1}}]))

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    start.wait()
    sim.restart()
    for thread in threads:
        thread.join(10)
    plugin.shutdown()
    plugin.serve()
    plugin.register(sim)
    sim.wait_devices(RESOURCE, lambda d: len(d) == 6)

    assert len(results) == 6
    held = [d for p in sim.pods() for c in p.containers for d in c.devices[RESOURCE]]
    assert len(held) == len(set(held)) == len([r for r in results if r.admitted])
    assert sim.resources()[RESOURCE].allocated == set(held)
    assert sim.free(RESOURCE) == 6 - len(held)


# ---- restart ---------------------------------------------------------------------------------


def test_restart_wipes_sockets_keeps_allocations_and_accepts_re_registration(
    sim, plugins, workdir
) -> None:
    plugin = registered_plugin(sim, plugins, count=3)
    pod = sim.admit_pod("ns", "p", [{"name": "c", "requests": {RESOURCE: 1}}])
    held = pod.container("c").devices[RESOURCE]
    stray = socket.socket(socket.AF_UNIX)
    stray.bind(os.path.join(sim.plugin_dir, "stray.sock"))
    Path(sim.plugin_dir, "kubelet_internal_checkpoint").write_text("{}")
    Path(sim.plugin_dir, "notes.txt").write_text("kept")
    inode = os.stat(sim.socket_path).st_ino

    restarted = time.monotonic()
    sim.restart()

    assert sorted(os.listdir(sim.plugin_dir)) == [
        "kubelet.sock",
        "kubelet_internal_checkpoint",
        "notes.txt",
    ]
    assert os.stat(sim.socket_path).st_ino != inode
    assert plugin.wait_streams(0)
    state = sim.resources()[RESOURCE]
    assert state.allocated == set(held)
    assert state.endpoint == "" and state.devices == {}
    assert sim.capacity(RESOURCE) == 0
    assert [p.name for p in sim.pods()] == ["p"]
    stray.close()

    # The plugin notices, serves a fresh socket and registers again.
    plugin.shutdown()
    plugin.serve()
    plugin.register(sim)

    event = sim.wait_registration(RESOURCE, after=restarted)
    assert event.time - restarted < 2
    sim.wait_devices(RESOURCE, lambda d: len(d) == 3)
    assert sim.resources()[RESOURCE].registrations == 2
    assert sim.free(RESOURCE) == 2
    allocate_calls = len(plugin.requests("Allocate"))
    other = sim.admit_pod("ns", "q", [{"name": "c", "requests": {RESOURCE: 2}}])
    assert other.admitted
    assert not set(other.container("c").devices[RESOURCE]) & set(held)
    assert len(plugin.requests("Allocate")) == allocate_calls + 1  # none for the running pod


# ---- PodResources ----------------------------------------------------------------------------


def test_pod_resources_list_shows_active_pods_with_advertised_ids(sim, plugins) -> None:
    plugin = plugins()
    plugin.set_devices(("gpu-a", "Healthy", [0]), ("gpu-b", "Healthy", [1]), ("gpu-c", "Unhealthy"))
    plugin.register(sim)
    sim.wait_devices(RESOURCE, lambda d: len(d) == 3)
    sim.admit_pod("ns", "p", [{"name": "c1", "requests": {RESOURCE: 2}}, {"name": "c2"}])
    sim.admit_pod("ns", "gone", [{"name": "c"}])
    sim.remove_pod("ns", "gone")
    channel, stub = pod_resources_stub(sim)

    with channel:
        listed = stub.List(pr.ListPodResourcesRequest(), timeout=10)
        allocatable = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=10)

    (pod,) = listed.pod_resources
    assert (pod.namespace, pod.name) == ("ns", "p")
    assert [c.name for c in pod.containers] == ["c1", "c2"]
    devices = pod.containers[0].devices
    assert sorted(
        (d.resource_name, list(d.device_ids), d.topology.nodes[0].ID) for d in devices
    ) == [
        (RESOURCE, ["gpu-a"], 0),
        (RESOURCE, ["gpu-b"], 1),
    ]
    assert list(pod.containers[1].devices) == []
    assert sorted((d.resource_name, list(d.device_ids)) for d in allocatable.devices) == [
        (RESOURCE, ["gpu-a"]),
        (RESOURCE, ["gpu-b"]),
    ]


def test_pod_resources_get_finds_a_pod_or_says_not_found(sim, plugins) -> None:
    registered_plugin(sim, plugins, count=1)
    admitted = sim.admit_pod("ns", "p", [{"name": "c", "requests": {RESOURCE: 1}}])
    channel, stub = pod_resources_stub(sim)

    with channel:
        found = stub.Get(pr.GetPodResourcesRequest(pod_name="p", pod_namespace="ns"), timeout=10)
        with pytest.raises(grpc.RpcError) as missing:
            stub.Get(pr.GetPodResourcesRequest(pod_name="q", pod_namespace="ns"), timeout=10)

    (container,) = found.pod_resources.containers
    assert list(container.devices[0].device_ids) == admitted.container("c").devices[RESOURCE]
    assert missing.value.code() == grpc.StatusCode.UNKNOWN
    assert missing.value.details() == "pod q in namespace ns not found"


def test_pod_resources_rate_limit_rejects_the_next_calls(sim) -> None:
    channel, stub = pod_resources_stub(sim)
    sim.rate_limit_next(2)

    with channel:
        codes = []
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as rejected:
                stub.List(pr.ListPodResourcesRequest(), timeout=10)
            codes.append((rejected.value.code(), rejected.value.details()))
        answered = stub.List(pr.ListPodResourcesRequest(), timeout=10)

    assert codes == [(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")] * 2
    assert list(answered.pod_resources) == []
    assert sim.pod_resources_calls() == {"List": 3}


def test_pod_resources_answers_again_after_a_restart(sim) -> None:
    channel, stub = pod_resources_stub(sim)
    with channel:
        stub.List(pr.ListPodResourcesRequest(), timeout=10)
        sim.restart()
        stub.List(pr.ListPodResourcesRequest(), timeout=10, wait_for_ready=True)
    assert sim.pod_resources_calls() == {"List": 2}


# ---- standalone ------------------------------------------------------------------------------


def test_it_runs_standalone_and_logs_registrations(workdir) -> None:
    plugin_dir = os.path.join(workdir, "dp")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.simulator.kubelet",
            "--dir",
            plugin_dir,
            "--dial-timeout",
            "2",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    plugin = FakePlugin(plugin_dir)
    try:
        socket_path = os.path.join(plugin_dir, "kubelet.sock")
        deadline = time.monotonic() + 10
        while not os.path.exists(socket_path):
            assert time.monotonic() < deadline, "kubelet.sock never appeared"
            assert process.poll() is None, process.communicate()[0]
            time.sleep(0.05)
        plugin.serve().set_devices(("d1", "Healthy"))
        with grpc.insecure_channel("unix://" + socket_path) as channel:
            request = dp.RegisterRequest(
                version="v1beta1", endpoint="fake.sock", resource_name=RESOURCE
            )
            dp_grpc.RegistrationStub(channel).Register(request, timeout=10, wait_for_ready=True)
        assert plugin.wait_streams(1)
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=10)[0]
        plugin.shutdown()
    assert process.returncode == 0, output
    assert f"{RESOURCE}: registered {plugin.path}" in output
