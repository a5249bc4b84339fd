"""A watcher stops at once, whenever stop() comes: also between its list and its stream's answer.

The official ``Watch.stream()`` clears its stop flag when it starts, and a response that has not
arrived yet cannot be shut down: a stop() in that window left the thread reading until the
stream's first event or its timeoutSeconds (55 s by default), longer than any join. Seen on a
real API server at load 9: a queue watcher outlived ``QueueWatch.stop()``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from agent.kube.client import CoreApi
from agent.kube.watch import ResourceWatcher

pytestmark = pytest.mark.kube


def watcher_stopped_as_its_stream_opens(kube, *, relist: bool = False) -> ResourceWatcher:
    core = CoreApi(kube.new_client())
    opened = threading.Event()
    watcher: ResourceWatcher | None = None

    def list_pods(namespace: str, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            # stop() (or a relist wanted) lands just before the stream's answer: the thread
            # is past its checks, and no response exists yet for stop() to shut down.
            if relist:
                watcher.relist_soon()
            else:
                watcher.stop()
            opened.set()
            # No bookmarks: on an idle namespace the stream then says nothing until its
            # timeoutSeconds, on the simulator as on a real API server (which sends them
            # about once a minute), so only shutting the response down ends it sooner.
            kwargs.pop("allow_watch_bookmarks", None)
        return core.list_namespaced_pod(namespace, **kwargs)

    watcher = ResourceWatcher(
        owner="test",
        kind="pods",
        list_func=list_pods,
        list_args=(kube.namespace,),
        on_event=lambda kind, obj: None,
        on_relist=lambda items: None,
        api_client=kube.new_client(),
        to_dict=True,
        persist=False,
        timeout_seconds=55,
    )
    watcher.opened = opened
    return watcher


def test_a_stop_that_lands_as_the_stream_opens_ends_the_thread_at_once(kube):
    watcher = watcher_stopped_as_its_stream_opens(kube)
    thread = threading.Thread(target=watcher.run, name="test-watch-stop")
    thread.start()
    try:
        assert watcher.opened.wait(10), "the watch never opened its stream"
        started = time.monotonic()
        thread.join(timeout=10)
        assert not thread.is_alive(), "the stream outlived stop() (it waits for timeoutSeconds)"
        assert time.monotonic() - started < 10
    finally:
        watcher.stop()
        thread.join(timeout=60)


def test_a_relist_wanted_as_the_stream_opens_is_done_at_once(kube):
    watcher = watcher_stopped_as_its_stream_opens(kube, relist=True)
    relisted = threading.Event()
    watcher.on_relist = lambda items: relisted.set() if watcher.relists else None
    thread = threading.Thread(target=watcher.run, name="test-watch-relist")
    thread.start()
    try:
        assert watcher.opened.wait(10), "the watch never opened its stream"
        assert relisted.wait(10), "the relist waited for the stream's timeoutSeconds"
    finally:
        watcher.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
