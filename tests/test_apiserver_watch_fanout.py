"""The simulator's watch fan-out (issue 32 §5): a watch with a selector is handed only the events
that concern it, and draining a watch never waits for the store lock. At 50 nodes every pod
event woke a hundred node-filtered watches that all queued on that lock."""

from __future__ import annotations

import threading

from agent.simulator.apiserver_select import fields_match, parse_field_selector
from agent.simulator.apiserver_store import PODS_KEY, Store


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
