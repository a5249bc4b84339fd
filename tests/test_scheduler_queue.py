"""The stand-in's scheduling queue retries a refused pod only when kube-scheduler would: on an
event one of the plugins that refused it registered for, after its backoff, or after 5
minutes in the unschedulable pool (agent.simulator.scheduler_queue)."""

from __future__ import annotations

from agent.simulator.scheduler_queue import (
    ASSIGNED_POD_DELETE,
    EXTENDER,
    FIT,
    NODE_ALLOCATABLE_CHANGE,
    UNSCHEDULED_POD_UPDATE,
    SchedulingQueue,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(uid: str) -> dict:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "default"}}


def refused(queue: SchedulingQueue, uid: str, plugins: frozenset[str]) -> None:
    queue.add(pod(uid))
    info = queue.pop()
    assert info is not None and info.uid == uid
    queue.failed(info, plugins)


def test_a_refused_pod_waits_for_an_event_not_a_timer():
    clock = Clock()
    queue = SchedulingQueue(clock)
    refused(queue, "a", frozenset({EXTENDER}))
    clock.now += 60
    assert queue.pop() is None
    assert queue.where("a") == "unschedulable"


def test_any_event_moves_a_pod_the_extender_refused_and_backoff_doubles_to_ten_seconds():
    clock = Clock()
    queue = SchedulingQueue(clock)
    refused(queue, "a", frozenset({EXTENDER}))
    assert [queue.backoff(queue._pods["a"])] == [1.0]
    assert queue.event(NODE_ALLOCATABLE_CHANGE) == 1
    assert queue.where("a") == "backoff"  # 1 s from the failure has not passed
    info = queue.pop()  # activeQ empty: popped from backoffQ anyway (SchedulerPopFromBackoffQ)
    assert info is not None and info.attempts == 2
    backoffs = []
    for _ in range(5):
        queue.failed(info, frozenset({EXTENDER}))
        backoffs.append(queue.backoff(info))
        queue.event(ASSIGNED_POD_DELETE)
        info = queue.pop()
    assert backoffs == [2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_backed_off_pod_waits_behind_active_ones():
    clock = Clock()
    queue = SchedulingQueue(clock)
    refused(queue, "a", frozenset({EXTENDER}))
    queue.event(ASSIGNED_POD_DELETE)
    queue.add(pod("b"))
    assert queue.pop().uid == "b"
    clock.now += 1.0  # a's backoff is over: it is active again
    assert queue.where("a") == "backoff"
    assert queue.pop().uid == "a"


def test_a_pod_the_resource_fit_refused_moves_only_on_its_events():
    clock = Clock()
    queue = SchedulingQueue(clock)
    refused(queue, "a", frozenset({FIT}))
    assert queue.event(UNSCHEDULED_POD_UPDATE, "a") == 0
    assert queue.where("a") == "unschedulable"
    assert queue.event(ASSIGNED_POD_DELETE) == 1
    assert queue.where("a") == "backoff"


def test_an_update_of_a_pod_moves_that_pod_only():
    clock = Clock()
    queue = SchedulingQueue(clock)
    refused(queue, "a", frozenset({EXTENDER}))
    refused(queue, "b", frozenset({EXTENDER}))
    assert queue.event(UNSCHEDULED_POD_UPDATE, "b") == 1
    assert (queue.where("a"), queue.where("b")) == ("unschedulable", "backoff")


def test_an_event_during_the_attempt_sends_the_refused_pod_to_backoff():
    clock = Clock()
    queue = SchedulingQueue(clock)
    queue.add(pod("a"))
    info = queue.pop()
    queue.event(ASSIGNED_POD_DELETE)  # while "a" is being scheduled
    queue.failed(info, frozenset({EXTENDER}))
    assert queue.where("a") == "backoff"


def test_unschedulable_pods_are_flushed_after_five_minutes():
    clock = Clock()
    queue = SchedulingQueue(clock)
    refused(queue, "a", frozenset({EXTENDER}))
    clock.now += 299
    assert queue.pop() is None
    clock.now += 31  # the leftover flush runs every 30 s and takes pods older than 5 min
    info = queue.pop()
    assert info is not None and info.uid == "a"


def test_a_deleted_or_bound_pod_leaves_the_queue():
    clock = Clock()
    queue = SchedulingQueue(clock)
    queue.add(pod("a"))
    queue.forget("a")
    assert queue.pop() is None
    assert queue.counts() == {}
