"""Pod deletion in the simulator at storm size (issue 32 §5): a ``deletecollection`` holds the
store lock once for its items yet gives each pod its own resourceVersion and watch event, in
list order, as kube-apiserver's registry does; the kubelet stand-in finishes each pod with one
delete, not a second one for its final delete's own event."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kubernetes import client, watch

from agent.simulator.apiserver import ApiServerSimulator
from agent.simulator.apiserver_store import PODS_KEY, Store
from agent.simulator.kubelet_pods import PodFinisher
from tests.kubeenv import restore_simulator

pytest_plugins = ["tests.kubeenv"]

NS = "default"


@pytest.fixture
def sim(apiserver: ApiServerSimulator) -> Iterator[ApiServerSimulator]:
    restore_simulator(apiserver)
    yield apiserver
    restore_simulator(apiserver)


@pytest.fixture
def core(sim: ApiServerSimulator) -> Iterator[client.CoreV1Api]:
    api_client = sim.api_client()
    yield client.CoreV1Api(api_client)
    api_client.close()


def pod(name: str, node: str = "", storm: bool = True) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    labels = {"storm": "yes" if storm else "no"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": spec}  # fmt: skip


class CountingLock:
    """The store's lock, counting the holds the current thread takes."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.holds = 0
        self.counting: int | None = None

    def __enter__(self) -> bool:
        self.acquire()
        return True

    def __exit__(self, *exc: object) -> None:
        self.lock.release()

    def acquire(self, *args: object) -> bool:
        if threading.get_ident() == self.counting:
            self.holds += 1
        return self.lock.acquire(*args)

    def release(self) -> None:
        self.lock.release()


def test_deletecollection_marks_each_bound_pod_with_its_own_event_in_list_order(core):
    for name, node in (("c", "node-a"), ("a", "node-b"), ("d", ""), ("b", "node-a")):
        core.create_namespaced_pod(NS, pod(name, node))
    core.create_namespaced_pod(NS, pod("kept", "node-a", storm=False))
    since = core.list_namespaced_pod(NS).metadata.resource_version

    core.delete_collection_namespaced_pod(NS, label_selector="storm=yes")

    events = [
        (e["type"], e["object"]["metadata"])
        for e in watch.Watch().stream(
            core.list_namespaced_pod,
            NS,
            resource_version=since,
            timeout_seconds=1,
            deserialize=False,
        )
    ]
    assert [(kind, meta["name"]) for kind, meta in events] == [
        ("MODIFIED", "a"),
        ("MODIFIED", "b"),
        ("MODIFIED", "c"),
        ("MODIFIED", "d"),  # not on a node: stamped, then gone at once
        ("DELETED", "d"),
    ]
    versions = [int(meta["resourceVersion"]) for _, meta in events]
    assert versions == list(range(int(since) + 1, int(since) + 6))
    assert all(meta["deletionGracePeriodSeconds"] == 30 for _, meta in events[:3])
    left = {
        p.metadata.name: p.metadata.deletion_timestamp for p in core.list_namespaced_pod(NS).items
    }
    assert set(left) == {"a", "b", "c", "kept"}
    assert left["kept"] is None and all(left[n] for n in "abc")


def test_deletecollection_with_grace_zero_removes_bound_pods_one_event_pair_each(core):
    for name in ("a", "b"):
        core.create_namespaced_pod(NS, pod(name, "node-a"))
    since = core.list_namespaced_pod(NS).metadata.resource_version

    core.delete_collection_namespaced_pod(NS, label_selector="storm=yes", grace_period_seconds=0)

    stream = watch.Watch().stream(
        core.list_namespaced_pod, NS, resource_version=since, timeout_seconds=1, deserialize=False
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in stream] == [
        ("MODIFIED", "a"),
        ("DELETED", "a"),
        ("MODIFIED", "b"),
        ("DELETED", "b"),
    ]
    assert core.list_namespaced_pod(NS).items == []


def test_deletecollection_holds_the_store_lock_once_for_all_its_pods(sim, core):
    for i in range(20):
        core.create_namespaced_pod(NS, pod(f"p{i:02d}", "node-a"))
    counting = CountingLock(sim.store.lock)
    sim.store.lock, counting.counting = counting, threading.get_ident()
    try:
        sim._delete_collection(
            sim.store.types[PODS_KEY], "v1", NS, {"labelSelector": "storm=yes"}, False
        )
    finally:
        sim.store.lock = counting.lock

    assert counting.holds == 2  # the list, then every deletion
    assert all(p.metadata.deletion_timestamp for p in core.list_namespaced_pod(NS).items)


def test_delete_many_skips_a_pod_gone_meanwhile_and_deletes_the_rest():
    store = Store()
    pods = store.types[PODS_KEY]
    for name in ("a", "b"):
        store.create(pods, "v1", NS, pod(name, "node-a"))
    watcher, _, _ = store.start_watch(pods, NS, None)

    done = store.delete_many(pods, [(NS, "a"), (NS, "gone"), (NS, "b")], grace_seconds=0)

    assert [obj["metadata"]["name"] for obj in done] == ["a", "b"]
    events, _ = store.take(watcher)
    assert [(e.type, e.obj["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "a"),
        ("DELETED", "a"),
        ("MODIFIED", "b"),
        ("DELETED", "b"),
    ]


class Kubelet:
    """What PodFinisher asks of a kubelet: its node, and to stop a pod."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self.stopped: list[str] = []
        self.cond = threading.Condition()

    def remove_pod(self, namespace: str, name: str) -> None:
        with self.cond:
            self.stopped.append(name)
            self.cond.notify_all()


def test_the_kubelet_finishes_a_deleted_pod_with_one_delete(sim, core):
    core.create_namespaced_pod(NS, pod("web", "node-a"))
    kubelet = Kubelet("node-a")
    finisher = PodFinisher(kubelet, sim.api_client(), NS).start()
    try:
        assert finisher.wait_synced(10)
        sim.request_log.clear()

        core.delete_namespaced_pod("web", NS)

        with kubelet.cond:  # stopped to be finished, then again once seen gone (DELETED)
            assert kubelet.cond.wait_for(lambda: len(kubelet.stopped) == 2, timeout=10)
        # Every finish the final delete's own MODIFIED event could have asked for has run.
        finisher._workers.shutdown(wait=True)
    finally:
        finisher.stop()

    deletes = [r for r in sim.request_log if r.method == "DELETE"]
    assert [r.path for r in deletes] == [f"/api/v1/namespaces/{NS}/pods/web"] * 2
    assert finisher.finished == 1
    assert core.list_namespaced_pod(NS).items == []
