"""The node agent end to end: three agents in this process sharing one cache sync, a kubelet
simulator each, the API-server simulator over HTTP, real gRPC on unix sockets.

Also home of ``AgentCluster`` and the small helpers the other ``test_agent_*`` files use.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any

import grpc
import pytest
from kubernetes import client

from agent.discovery.base import HandlerRegistry
from agent.discovery.debugecho import DebugEchoHandler, set_availability
from agent.kube.claims import ClaimStore
from agent.kube.client import AkriApi
from agent.kube.watch import CacheSync
from agent.models import Instance, SlotEvent, SlotPodBinding
from agent.node.agent import NodeAgent
from agent.node.instances import DesiredInstance, InstanceWriter
from agent.protos import deviceplugin_pb2 as dp
from agent.protos import deviceplugin_pb2_grpc as dp_grpc
from agent.simulator.kubelet import KubeletSimulator
from agent.simulator.kubelet_pods import PodFinisher

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

NODES = ("node-a", "node-b", "node-c")
CONFIG = "akri-debug-echo-foo"
FOO0 = f"{CONFIG}-8120fe"
FOO1 = f"{CONFIG}-a19705"
GRACE = 0.5


def configuration_body(
    name: str = CONFIG,
    descriptions: tuple[str, ...] = ("foo0", "foo1"),
    *,
    capacity: int = 2,
    unique: bool = True,
    handler: str = "debugEcho",
    details: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    if details is None:
        details = "descriptions:\n" + "".join(f"- {d}\n" for d in descriptions)
    body = {
        "discoveryHandler": {"name": handler, "discoveryDetails": details},
        "capacity": capacity,
        "uniqueDevices": unique,
    }
    body.update(spec)
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name},
        "spec": body,
    }


class Node:
    def __init__(self, name: str, root: str) -> None:
        self.name = name
        self.dir = os.path.join(root, name[-1])
        self.plugin_dir = os.path.join(self.dir, "dp")
        os.makedirs(self.plugin_dir)
        self.availability = os.path.join(self.dir, "echo")
        self.registration_socket = os.path.join(self.dir, "reg.sock")
        self.kubelet = KubeletSimulator(
            self.plugin_dir, os.path.join(self.dir, "pr", "kubelet.sock"), node_name=name
        )
        self.handlers = HandlerRegistry()
        self.handlers.register(
            DebugEchoHandler(availability_path=self.availability, poll_interval=0.05)
        )
        self.agent: NodeAgent | None = None
        self.finisher: PodFinisher | None = None

    def set_available(self, available: bool) -> None:
        set_availability(available, self.availability)

    def sockets(self) -> list[str]:
        return sorted(n for n in os.listdir(self.plugin_dir) if n != "kubelet.sock")


class AgentCluster:
    """Agents for ``nodes`` sharing one CacheSync, each with its own kubelet simulator."""

    def __init__(
        self,
        kube: Any,
        nodes: tuple[str, ...] = NODES,
        grace: float = GRACE,
        *,
        reconcile: bool = False,
    ) -> None:
        self.kube = kube
        self.api = AkriApi(kube.api_client, kube.namespace)
        self.root = tempfile.mkdtemp(prefix="ag", dir="/tmp")
        self.grace = grace
        # Off unless asked for: most tests admit pods in the kubelet only, and the reconciler
        # would rightly free slots whose pods the API server has never heard of.
        self.reconcile = reconcile
        self.sync = CacheSync(
            kube.new_client(), kube.namespace, owner=f"agents-{uuid.uuid4().hex[:6]}"
        )
        self.nodes = {name: Node(name, self.root) for name in nodes}

    def start(self) -> AgentCluster:
        self.sync.start()
        assert self.sync.wait_synced()
        for node in self.nodes.values():
            node.kubelet.start()
            # The kubelet's side of pod deletion: Terminating pods are stopped and removed.
            node.finisher = PodFinisher(node.kubelet, self.kube.new_client(), self.kube.namespace)
            node.finisher.start()
            node.agent = NodeAgent(
                node.name,
                self.kube.new_client(),
                self.kube.namespace,
                node.plugin_dir,
                node.kubelet.pod_resources_socket,
                node.registration_socket,
                handlers=node.handlers,
                sync=self.sync,
                offline_grace=self.grace,
                reconcile=self.reconcile,
            ).start()
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.finisher is not None:
                node.finisher.stop()
            if node.agent is not None:
                node.agent.stop()
            node.kubelet.stop()
        self.sync.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def kubelets(self) -> list[KubeletSimulator]:
        return [n.kubelet for n in self.nodes.values()]

    def usage(self, instance: str) -> dict[str, str]:
        return self.api.get_instance(instance)["spec"].get("deviceUsage") or {}

    def instances(self) -> dict[str, dict[str, Any]]:
        return {o["metadata"]["name"]: o for o in self.api.list_instances()["items"]}

    def events(self, **filters: Any) -> list[SlotEvent]:
        """Slot history, once every cache write queued so far is done (they are asynchronous)."""
        assert self.sync.drain()
        return list(SlotEvent.objects.filter(**filters).order_by("id"))

    def wait_for(self, predicate: Any, timeout: float = 5.0, message: str | None = None) -> Any:
        return self.kube.wait_for(predicate, timeout=timeout, interval=0.02, message=message)


@pytest.fixture
def cluster(kube):
    started = AgentCluster(kube).start()
    yield started
    started.stop()


def healthy(devices: dict[str, str]) -> set[str]:
    return {d for d, h in devices.items() if h == "Healthy"}


def allocate(
    kubelet: KubeletSimulator, resource: str, ids: list[str]
) -> dp.AllocateResponse | grpc.RpcError:
    """Call a plugin's Allocate as the kubelet does; the RpcError is returned, not raised."""
    endpoint = kubelet.resources()[resource].endpoint
    options = [("grpc.default_authority", "localhost")]
    with grpc.insecure_channel("unix://" + endpoint, options=options) as channel:
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
        )
        try:
            return dp_grpc.DevicePluginStub(channel).Allocate(request, timeout=10)
        except grpc.RpcError as exc:
            return exc


def wait_instances(cluster: AgentCluster, names: set[str], nodes: tuple[str, ...] = NODES):
    def ready() -> dict[str, dict]:
        found = cluster.instances()
        if set(found) != names:
            return {}
        if any(sorted(o["spec"].get("nodes") or []) != sorted(nodes) for o in found.values()):
            return {}
        return found

    return cluster.wait_for(ready, message=f"Instances {sorted(names)} on {nodes}")


# --- the story ---------------------------------------------------------------------------


def test_a_debug_echo_configuration_becomes_akri_instances_on_every_node(cluster):
    created = cluster.api.create_configuration(configuration_body(brokerProperties={"SITE": "lab"}))

    found = wait_instances(cluster, {FOO0, FOO1})

    foo0 = found[FOO0]
    assert foo0["spec"]["configurationName"] == CONFIG
    assert foo0["spec"]["cdiName"] == f"akri.sh/{CONFIG}=8120fe"
    assert foo0["spec"]["capacity"] == 2
    assert foo0["spec"]["shared"] is True
    assert foo0["spec"]["brokerProperties"] == {"DEBUG_ECHO_DESCRIPTION": "foo0", "SITE": "lab"}
    assert foo0["spec"]["deviceUsage"] == {f"{FOO0}-0": "", f"{FOO0}-1": ""}
    owner = foo0["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Configuration",
        CONFIG,
        created["metadata"]["uid"],
    )
    for kubelet in cluster.kubelets():
        devices = kubelet.wait_devices(f"akri.sh/{FOO0}", lambda d: len(healthy(d)) == 2)
        assert devices == {f"{FOO0}-0": "Healthy", f"{FOO0}-1": "Healthy"}
        kubelet.wait_devices(f"akri.sh/{FOO1}", lambda d: len(healthy(d)) == 2)
        vdevs = kubelet.wait_devices(f"akri.sh/{CONFIG}", lambda d: len(healthy(d)) == 2)
        assert vdevs == {f"{CONFIG}-0": "Healthy", f"{CONFIG}-1": "Healthy"}


def test_a_pod_on_node_a_claims_a_slot_and_the_other_nodes_see_it_unhealthy(cluster):
    cluster.api.create_configuration(configuration_body())
    wait_instances(cluster, {FOO0, FOO1})
    resource = f"akri.sh/{FOO0}"
    for kubelet in cluster.kubelets():
        kubelet.wait_devices(resource, lambda d: len(healthy(d)) == 2)

    result = cluster["node-a"].kubelet.admit_pod(
        "default", "broker", [{"name": "main", "requests": {resource: 1}}]
    )

    assert result.admitted, result.error
    [slot] = result.container("main").devices[resource]
    assert cluster.usage(FOO0)[slot] == "node-a"
    container = result.container("main")
    assert container.envs["DEBUG_ECHO_DESCRIPTION"] == "foo0"
    assert container.envs["DEBUG_ECHO_DESCRIPTION_8120FE"] == "foo0"
    assert container.annotations[f"akri.agent.slot-{slot}"] == "node-a"
    assert container.annotations["akri.sh/instance"] == FOO0
    for name in ("node-b", "node-c"):
        devices = cluster[name].kubelet.wait_devices(resource, lambda d: d.get(slot) == "Unhealthy")
        assert len(healthy(devices)) == 1
    # node-a keeps its own slot Healthy (the kubelet may re-ask for it, Akri PR #556).
    assert cluster["node-a"].kubelet.resources()[resource].devices[slot] == "Healthy"
    [event] = cluster.events(slot=slot, cause="allocate")
    assert (event.before, event.after, event.actor) == ("", "node-a", "agent:node-a")


def test_two_nodes_racing_for_the_last_slot_get_exactly_one_winner(cluster):
    cluster.api.create_configuration(configuration_body())
    wait_instances(cluster, {FOO0, FOO1})
    resource = f"akri.sh/{FOO0}"
    for kubelet in cluster.kubelets():
        kubelet.wait_devices(resource, lambda d: len(healthy(d)) == 2)
    first = cluster["node-a"].kubelet.admit_pod(
        "default", "p-a", [{"name": "c", "requests": {resource: 1}}]
    )
    assert first.admitted
    taken = first.container("c").devices[resource][0]
    last = next(k for k in cluster.usage(FOO0) if k != taken)
    for name in ("node-b", "node-c"):
        cluster[name].kubelet.wait_devices(resource, lambda d: healthy(d) == {last})
    barrier = threading.Barrier(2)
    results: dict[str, Any] = {}

    def race(name: str) -> None:
        barrier.wait()
        results[name] = allocate(cluster[name].kubelet, resource, [last])

    threads = [threading.Thread(target=race, args=(n,)) for n in ("node-b", "node-c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    winners = [n for n, r in results.items() if isinstance(r, dp.AllocateResponse)]
    losers = [n for n, r in results.items() if isinstance(r, grpc.RpcError)]
    assert len(winners) == 1 and len(losers) == 1, results
    error = results[losers[0]]
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert f"Unable to claim slot {last}" in error.details()
    assert f"held by {winners[0]}" in error.details()
    assert cluster.usage(FOO0) == {taken: "node-a", last: winners[0]}
    assert [e.after for e in cluster.events(slot=last)] == [winners[0]]


def test_an_unknown_slot_id_is_invalid_argument_and_writes_nothing(cluster):
    cluster.api.create_configuration(configuration_body())
    wait_instances(cluster, {FOO0, FOO1})
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(f"akri.sh/{FOO0}", lambda d: len(healthy(d)) == 2)
    rv = cluster.api.get_instance(FOO0)["metadata"]["resourceVersion"]

    answers = [
        allocate(kubelet, f"akri.sh/{FOO0}", ids)
        for ids in ([f"{FOO1}-0"], [f"{FOO0}-0", f"{FOO0}-7"], ["nonsense"], [f"{FOO0}-01"])
    ]

    for answer in answers:
        assert isinstance(answer, grpc.RpcError)
        assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Invalid device id" in answer.details()
    assert cluster.api.get_instance(FOO0)["metadata"]["resourceVersion"] == rv
    assert cluster.usage(FOO0) == {f"{FOO0}-0": "", f"{FOO0}-1": ""}
    assert cluster.events(instance=FOO0) == []


def test_a_multi_slot_request_is_all_or_nothing(cluster):
    cluster.api.create_configuration(configuration_body())
    wait_instances(cluster, {FOO0, FOO1})
    ClaimStore(cluster.api, "agent:node-b").claim(FOO0, f"{FOO0}-1", "node-b")
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(f"akri.sh/{FOO0}", lambda d: d.get(f"{FOO0}-1") == "Unhealthy")

    answer = allocate(kubelet, f"akri.sh/{FOO0}", [f"{FOO0}-0", f"{FOO0}-1"])

    assert isinstance(answer, grpc.RpcError)
    assert answer.code() == grpc.StatusCode.UNKNOWN
    assert "held by node-b" in answer.details()
    assert cluster.usage(FOO0) == {f"{FOO0}-0": "", f"{FOO0}-1": "node-b"}
    kubelet.wait_devices(f"akri.sh/{FOO0}", lambda d: d.get(f"{FOO0}-0") == "Healthy")


def test_asking_again_for_a_slot_this_node_holds_succeeds_without_a_write(cluster):
    cluster.api.create_configuration(configuration_body())
    wait_instances(cluster, {FOO0, FOO1})
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(f"akri.sh/{FOO0}", lambda d: len(healthy(d)) == 2)
    assert isinstance(allocate(kubelet, f"akri.sh/{FOO0}", [f"{FOO0}-0"]), dp.AllocateResponse)
    rv = cluster.api.get_instance(FOO0)["metadata"]["resourceVersion"]

    again = allocate(kubelet, f"akri.sh/{FOO0}", [f"{FOO0}-0"])

    assert isinstance(again, dp.AllocateResponse)
    assert cluster.api.get_instance(FOO0)["metadata"]["resourceVersion"] == rv
    assert len(cluster.events(slot=f"{FOO0}-0")) == 1


def test_an_offline_device_leaves_after_the_grace_and_its_instance_is_deleted(cluster):
    cluster.api.create_configuration(configuration_body())
    wait_instances(cluster, {FOO0, FOO1})
    for kubelet in cluster.kubelets():
        kubelet.wait_devices(f"akri.sh/{FOO0}")
    assert all(len(n.sockets()) == 3 for n in cluster.nodes.values())

    cluster["node-c"].set_available(False)
    went_offline = time.monotonic()
    wait_instances(cluster, {FOO0, FOO1}, nodes=("node-a", "node-b"))

    assert time.monotonic() - went_offline >= GRACE
    cluster.wait_for(lambda: cluster["node-c"].sockets() == [], message="node-c sockets gone")
    cluster["node-c"].kubelet.wait_devices(
        f"akri.sh/{FOO0}", lambda d: healthy(d) == set(), timeout=5
    )

    cluster["node-a"].set_available(False)
    cluster["node-b"].set_available(False)
    cluster.wait_for(lambda: cluster.instances() == {}, message="Instances deleted")
    for node in cluster.nodes.values():
        cluster.wait_for(lambda n=node: n.sockets() == [], message=f"{node.name} sockets gone")


def test_an_unshared_device_leaves_at_once(kube):
    cluster = AgentCluster(kube, nodes=("node-a",), grace=30.0)
    cluster["node-a"].handlers.register(
        DebugEchoHandler(
            shared=False, availability_path=cluster["node-a"].availability, poll_interval=0.05
        )
    )
    cluster.start()
    try:
        cluster.api.create_configuration(configuration_body(descriptions=("foo0",)))
        found = cluster.wait_for(lambda: cluster.instances(), message="an Instance")
        [(name, obj)] = found.items()
        assert obj["spec"]["shared"] is False
        assert name != FOO0  # unshared: the node name is part of the digest

        cluster["node-a"].set_available(False)

        cluster.wait_for(lambda: cluster.instances() == {}, timeout=20, message="deleted at once")
    finally:
        cluster.stop()


def test_a_deleted_configuration_takes_its_instances_and_plugins_with_it(cluster):
    cluster.api.create_configuration(configuration_body())
    wait_instances(cluster, {FOO0, FOO1})
    for node in cluster.nodes.values():
        cluster.wait_for(lambda n=node: len(n.sockets()) == 3, message=f"{node.name} plugins")

    cluster.api.custom.delete_namespaced_custom_object(
        "akri.sh", "v0", cluster.kube.namespace, "configurations", CONFIG
    )

    cluster.wait_for(lambda: cluster.instances() == {}, message="Instances deleted")
    for node in cluster.nodes.values():
        cluster.wait_for(lambda n=node: n.sockets() == [], message=f"{node.name} sockets gone")
        assert node.agent.plugins() == {}


def test_capacity_follows_the_configuration_without_taking_a_held_slot(cluster):
    cluster.api.create_configuration(configuration_body(descriptions=("foo0",), capacity=3))
    wait_instances(cluster, {FOO0})
    kubelet = cluster["node-a"].kubelet
    kubelet.wait_devices(f"akri.sh/{FOO0}", lambda d: len(healthy(d)) == 3)
    assert isinstance(allocate(kubelet, f"akri.sh/{FOO0}", [f"{FOO0}-2"]), dp.AllocateResponse)

    cluster.api.patch_configuration(
        CONFIG, [{"op": "replace", "path": "/spec/capacity", "value": 1}]
    )
    cluster.wait_for(lambda: cluster.api.get_instance(FOO0)["spec"]["capacity"] == 1)
    assert cluster.usage(FOO0) == {f"{FOO0}-0": "", f"{FOO0}-2": "node-a"}
    devices = kubelet.wait_devices(f"akri.sh/{FOO0}", lambda d: len(d) == 2)
    assert devices == {f"{FOO0}-0": "Healthy", f"{FOO0}-2": "Unhealthy"}

    cluster.api.patch_configuration(
        CONFIG,
        [
            {"op": "replace", "path": "/spec/capacity", "value": 4},
            {"op": "add", "path": "/spec/brokerProperties", "value": {"SITE": "b"}},
        ],
    )
    cluster.wait_for(lambda: cluster.api.get_instance(FOO0)["spec"]["capacity"] == 4)
    cluster.wait_for(
        lambda: cluster.api.get_instance(FOO0)["spec"]["brokerProperties"].get("SITE") == "b"
    )
    # Three agents follow the change, each from its own queue of events: one that has not yet
    # seen the new capacity may shrink the Instance back for a moment. They settle here.
    grown = {f"{FOO0}-0": "", f"{FOO0}-1": "", f"{FOO0}-2": "node-a", f"{FOO0}-3": ""}
    cluster.wait_for(lambda: cluster.usage(FOO0) == grown, message="the grown slots")
    instance = cluster.api.get_instance(FOO0)["spec"]
    assert (instance["capacity"], instance["deviceUsage"]) == (4, grown)


def test_changed_discovery_details_restart_discovery(cluster):
    cluster.api.create_configuration(configuration_body(descriptions=("foo0",)))
    wait_instances(cluster, {FOO0})

    cluster.api.patch_configuration(
        CONFIG,
        [
            {
                "op": "replace",
                "path": "/spec/discoveryHandler/discoveryDetails",
                "value": "descriptions:\n- foo1\n",
            }
        ],
    )

    wait_instances(cluster, {FOO1})


def test_a_malformed_configuration_is_skipped_with_a_clear_log_line(cluster, caplog):
    """Our CRD refuses `capacity: "two"` (422), but a cluster that runs Akri's own CRD, which
    checks less, serves it: it arrives as that cluster's watch would bring it."""
    bad = configuration_body(name="broken", capacity=2)
    bad["spec"]["capacity"] = "two"
    with pytest.raises(client.ApiException) as refused:
        cluster.api.create_configuration(bad)
    assert refused.value.status == 422
    bad["metadata"].update(namespace=cluster.kube.namespace, uid="u-broken", resourceVersion="1")
    cluster.sync.configurations.on_event("ADDED", bad)
    cluster.api.create_configuration(configuration_body())

    wait_instances(cluster, {FOO0, FOO1})

    cluster.wait_for(
        lambda: any(
            "Configuration broken skipped" in r.getMessage() and "capacity" in r.getMessage()
            for r in caplog.records
        ),
        message="the log line",
    )
    assert all(o["spec"]["configurationName"] == CONFIG for o in cluster.instances().values())


def test_the_reconciler_learns_each_allocation_and_frees_the_slot_when_its_pod_goes(kube):
    cluster = AgentCluster(kube, nodes=("node-a", "node-b"), reconcile=True).start()
    try:
        cluster.api.create_configuration(configuration_body(descriptions=("foo0",)))
        wait_instances(cluster, {FOO0}, nodes=("node-a", "node-b"))
        resource = f"akri.sh/{FOO0}"
        kubelet = cluster["node-a"].kubelet
        kubelet.wait_devices(resource, lambda d: len(healthy(d)) == 2)
        core = client.CoreV1Api(cluster.kube.api_client)
        pod = core.create_namespaced_pod(
            cluster.kube.namespace,
            {
                "metadata": {"name": "broker"},
                "spec": {
                    "nodeName": "node-a",
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"limits": {resource: "1"}}}
                    ],
                },
            },
        )
        result = kubelet.admit_pod(
            cluster.kube.namespace,
            "broker",
            [{"name": "c", "requests": {resource: 1}}],
            uid=pod.metadata.uid,
        )
        assert result.admitted, result.error
        [slot] = result.container("c").devices[resource]

        # The hook binds the slot at Allocate; PodResources then names the pod.
        binding = cluster.wait_for(
            lambda: SlotPodBinding.objects.filter(
                node="node-a", slot=slot, pod_name="broker"
            ).first(),
            message="the slot bound to its pod",
        )
        assert (binding.device_id, binding.resource_name) == (slot, resource)
        cluster["node-b"].kubelet.wait_devices(resource, lambda d: d.get(slot) == "Unhealthy")

        # Terminating until node-a's kubelet (its PodFinisher) stops it and removes it.
        core.delete_namespaced_pod("broker", cluster.kube.namespace)

        cluster.wait_for(lambda: cluster.usage(FOO0)[slot] == "", timeout=10, message="slot freed")
        cluster["node-b"].kubelet.wait_devices(resource, lambda d: d.get(slot) == "Healthy")
    finally:
        cluster.stop()


def test_leaving_never_deletes_an_instance_another_node_just_joined(kube):
    api = AkriApi(kube.api_client, kube.namespace)
    desired = DesiredInstance(CONFIG, "", "8120fe", 2, True, {"DEBUG_ECHO_DESCRIPTION": "foo0"}, {})
    deleted: list[str] = []
    node_a = InstanceWriter(api, "node-a", lambda obj: None, lambda name, rv: deleted.append(name))
    node_b = InstanceWriter(api, "node-b", lambda obj: None, lambda name, rv: None)
    seen_by_a = node_a.ensure(None, desired)
    assert seen_by_a["spec"]["nodes"] == ["node-a"]
    node_b.ensure(api.get_instance(FOO0), desired)  # node-a has not heard of it yet

    node_a.leave(seen_by_a, FOO0)

    assert api.get_instance(FOO0)["spec"]["nodes"] == ["node-b"]
    assert deleted == []
    node_b.leave(None, FOO0)
    with pytest.raises(client.ApiException) as gone:
        api.get_instance(FOO0)
    assert gone.value.status == 404


def test_broker_properties_enforce_the_configuration_and_never_fight_over_device_values():
    desired = DesiredInstance(
        CONFIG, "", "8120fe", 2, True, {"URL": "b", "NEW": "n"}, {"SITE": "x"}
    )

    assert desired.properties_to_write({"URL": "a", "SITE": "x", "NEW": "n"}) is None
    assert desired.properties_to_write({"URL": "a", "SITE": "old"}) == {
        "URL": "a",
        "SITE": "x",
        "NEW": "n",
    }
    assert desired.broker_properties == {"URL": "b", "NEW": "n", "SITE": "x"}


def test_instances_created_while_a_relist_is_under_way_stay_in_the_agents_view(kube):
    """A relist's snapshot can miss an Instance this node creates while the pages come in;
    the node's own answer reaches the cache before the relist ends. The relist's end must
    not take it from the cache or from the agent's view: the watch's echo carries the same
    version, so the view would never take it back, and the node would serve no plugin for
    it (seen once as a Configuration plugin listing 98 of 100 devices)."""
    cluster = AgentCluster(kube, nodes=("node-a",))
    node = cluster["node-a"]
    node.set_available(False)
    cluster.start()
    try:
        cluster.api.create_configuration(configuration_body())
        watcher = cluster.sync.instances
        real_list = watcher.list_func
        created: list[bool] = []

        def list_then_discover(*args, **kwargs):
            # The snapshot is taken, empty; then the devices appear and the agent creates
            # their Instances before this page (and so the relist's end) reaches the cache.
            answer = real_list(*args, **kwargs)
            if not created:
                created.append(True)
                node.set_available(True)
                cluster.wait_for(
                    lambda: {FOO0, FOO1} <= node.agent.view.instance_names(),
                    message="both Instances in the agent's view",
                )
            return answer

        watcher.list_func = list_then_discover
        relists = watcher.relists
        watcher.relist_soon()
        cluster.wait_for(lambda: watcher.relists > relists, timeout=15, message="the relist")
        assert cluster.sync.drain()  # its end applied, and the watch's echoes after it
        kubelet = node.kubelet
        for name in (FOO0, FOO1):
            kubelet.wait_devices(f"akri.sh/{name}", lambda d: len(healthy(d)) == 2)
        kubelet.wait_devices(f"akri.sh/{CONFIG}", lambda d: len(healthy(d)) == 2)
        assert {FOO0, FOO1} <= node.agent.view.instance_names()
        assert set(Instance.objects.values_list("name", flat=True)) == {FOO0, FOO1}
    finally:
        cluster.stop()
