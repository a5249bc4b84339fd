"""The simulator's watch fan-out (issue 32 §5): a watch with a selector is handed only the events
that concern it, and draining a watch never waits for the store lock. At 50 nodes every pod
event woke a hundred node-filtered watches that all queued on that lock."""

from __future__ import annotations

import threading

from agent.simulator.apiserver_select import fields_match, parse_field_selector
from agent.simulator.apiserver_store import PODS_KEY, Store, node_trigger


def pod(name: str, node: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
    }


def on_node(node: str):
    fields = parse_field_selector(f"spec.nodeName={node}", lambda path: True)
    return lambda obj: fields_match(fields, obj)


def test_a_selected_watch_is_woken_only_by_its_own_objects():
    store = Store()
    pods = store.types[PODS_KEY]
    mine, _, _ = store.start_watch(pods, "default", None, on_node("node-a"))
    other, _, _ = store.start_watch(pods, "default", None, on_node("node-b"))
    everything, _, _ = store.start_watch(pods, "default", None)

    store.create(pods, "v1", "default", pod("web-a", "node-a"))
    store.delete(pods, "default", "web-a", grace_seconds=0)

    assert not other.wake.is_set() and not other.queue
    events, _ = store.take(mine)
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert len(store.take(everything)[0]) == 3


def test_take_returns_without_the_store_lock_and_never_runs_ahead_of_an_event():
    store = Store()
    pods = store.types[PODS_KEY]
    watcher, _, _ = store.start_watch(pods, "default", None, on_node("node-a"))
    store.create(pods, "v1", "default", pod("web-a", "node-a"))
    taken: list = []

    with store.lock:  # a writer holds the lock: the drain must not wait for it
        drain = threading.Thread(target=lambda: taken.append(store.take(watcher)))
        drain.start()
        drain.join(5)
        assert not drain.is_alive()

    (events, rv) = taken[0]
    assert [e.obj["metadata"]["name"] for e in events] == ["web-a"]
    assert rv == events[-1].rv  # a bookmark at rv would not skip an event still queued
    assert store.take(watcher) == ([], store.rv)


def test_a_pod_watch_indexed_by_node_is_offered_only_its_nodes_pods():
    store = Store()
    pods = store.types[PODS_KEY]
    mine, _, _ = store.start_watch(pods, "default", None, on_node("node-a"), "node-a")
    other, _, _ = store.start_watch(pods, "default", None, on_node("node-b"), "node-b")
    tested: list[str] = []

    def never(obj: dict) -> bool:  # an unindexed watch still sees every event
        tested.append(obj["metadata"]["name"])
        return False

    store.start_watch(pods, "default", None, never)
    store.create(pods, "v1", "default", pod("web-a", "node-a"))
    store.create(pods, "v1", "default", pod("web-b", "node-b"))
    store.create(pods, "v1", "default", pod("pending", ""))

    assert [e.obj["metadata"]["name"] for e in store.take(mine)[0]] == ["web-a"]
    assert [e.obj["metadata"]["name"] for e in store.take(other)[0]] == ["web-b"]
    assert tested == ["web-a", "web-b", "pending"]


def test_a_pod_bound_to_a_node_reaches_that_nodes_indexed_watch():
    store = Store()
    pods = store.types[PODS_KEY]
    store.create(pods, "v1", "default", pod("web", ""))
    watcher, _, _ = store.start_watch(pods, "default", None, on_node("node-a"), "node-a")

    with store.lock:  # bound, as the pods/binding registry commits it
        stored = store.objects[PODS_KEY][("default", "web")]
        bound = dict(stored, spec=dict(stored["spec"], nodeName="node-a"))
        store._commit(pods, dict(bound, metadata=dict(stored["metadata"])), stored, "MODIFIED")

    events, _ = store.take(watcher)
    assert [(e.type, e.obj["spec"]["nodeName"]) for e in events] == [("MODIFIED", "node-a")]


def test_an_indexed_watch_leaves_the_index_when_stopped_or_ended():
    store = Store()
    pods = store.types[PODS_KEY]
    first, _, _ = store.start_watch(pods, "default", None, on_node("node-a"), "node-a")
    second, _, _ = store.start_watch(pods, "default", None, on_node("node-b"), "node-b")

    store.stop_watch(first)
    assert set(store.triggered) == {"node-b"}
    assert store.end_watches("clean") == 1
    assert second.ended == "clean" and second.wake.is_set()
    assert store.triggered == {}
    store.create(pods, "v1", "default", pod("web", "node-b"))
    assert not second.queue


def test_only_a_pod_watch_selecting_one_node_is_indexed():
    store = Store()
    pods, nodes = store.types[PODS_KEY], store.types[("", "nodes")]
    selector = parse_field_selector("spec.nodeName=node-a,status.phase=Running", lambda p: True)

    assert node_trigger(pods, selector) == "node-a"
    assert node_trigger(pods, parse_field_selector("spec.nodeName!=node-a", lambda p: True)) is None
    assert node_trigger(pods, parse_field_selector("spec.nodeName=", lambda p: True)) == ""
    assert node_trigger(nodes, []) is None
