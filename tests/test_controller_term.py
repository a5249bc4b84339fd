"""A leader that cannot do its work hands over (issue 29 §3): the controller's term is retried
with backoff, then the replica resigns its Lease; ``/healthz`` fails while it leads without
watchers; a resigned elector releases at once and holds off so a rival takes over."""

from __future__ import annotations

import gc
import threading
import urllib.error
import urllib.request

import pytest
from django.db import OperationalError

from agent import metrics
from agent.exporter import MetricsServer
from agent.heap import SyncCollection
from agent.leader import CONTROLLER_LEASE
from agent.management.commands import runcontroller
from agent.management.commands.runcontroller import START_ATTEMPTS, Term
from tests.test_leader_election import TIMING, Clock, elector, lease_spec


class FakeElector:
    def __init__(self) -> None:
        self.leads = True
        self.resigned: list[str] = []

    def is_leading(self) -> bool:
        return self.leads

    def resign(self, why: str, hold_off: float | None = None) -> None:
        self.resigned.append(why)


class FlakyController:
    """Controller whose start fails ``failures`` times (the database away), then works."""

    failures = 0
    made: list[FlakyController] = []

    def __init__(self, api_client, namespace) -> None:
        self.stopped = False
        self.threads_ended: list[str] = []
        self.lists_done = threading.Event()
        FlakyController.made.append(self)

    def start(self) -> FlakyController:
        if FlakyController.failures:
            FlakyController.failures -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return self

    def stop(self) -> None:
        self.stopped = True

    def stopped_watchers(self) -> list[str]:
        return self.threads_ended

    def listed(self, timeout: float) -> bool:
        return self.lists_done.wait(timeout)


@pytest.fixture
def term(monkeypatch):
    monkeypatch.setattr(runcontroller, "Controller", FlakyController)
    monkeypatch.setattr(runcontroller, "new_api_client", lambda kubeconfig: None)
    FlakyController.made = []
    FlakyController.failures = 0
    made = Term(None, "default")
    made.elector = FakeElector()
    made.slept = []
    made.sleep = made.slept.append
    yield made
    made.stop()  # its heap-settle thread joined, collection on again
    gc.unfreeze()  # a test term's freeze must not keep this process's objects frozen


def test_a_term_that_fails_to_start_is_retried_with_backoff_until_it_works(term):
    FlakyController.failures = 2

    term.start()

    assert term.slept == [1.0, 2.0]
    assert term.controller is FlakyController.made[-1]
    assert [c.stopped for c in FlakyController.made] == [True, True, False]  # failed ones cleaned
    assert term.elector.resigned == []
    assert metrics.LEADER.labels(CONTROLLER_LEASE)._value.get() == 1
    assert term.healthy() == (True, "leading, watching")


def test_a_term_that_never_starts_hands_the_lease_over(term):
    FlakyController.failures = START_ATTEMPTS + 10

    term.start()

    assert len(FlakyController.made) == START_ATTEMPTS
    assert term.elector.resigned == ["its watchers would not start"]
    assert term.controller is None
    assert term.healthy() == (False, "leading, but its watchers are not running")
    term.elector.leads = False
    assert term.healthy() == (True, "following")


def test_a_term_stops_retrying_once_it_no_longer_leads(term):
    FlakyController.failures = START_ATTEMPTS + 10
    term.sleep = lambda seconds: setattr(term.elector, "leads", False)

    term.start()

    assert len(FlakyController.made) == 1
    assert term.elector.resigned == []


def test_a_term_collects_nothing_until_its_controller_has_listed_then_freezes_the_heap(term):
    """agent.heap: the first sync loads the cache without full collections; once every
    watcher has listed, its objects are frozen out of later ones and collection is on."""
    term.start()
    assert not gc.isenabled()
    assert term.heap.frozen == 0

    term.controller.lists_done.set()
    term.heap._thread.join(timeout=10)

    assert gc.isenabled()
    assert term.heap.frozen > 0
    assert gc.get_freeze_count() > 0  # fewer by now: frozen objects still die by refcount


def test_a_term_stopped_before_its_controller_listed_turns_collection_on_and_freezes_nothing(
    term,
):
    term.start()
    assert not gc.isenabled()

    term.stop()

    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_collection_comes_back_on_after_the_bound_even_if_the_lists_never_end():
    never = threading.Event()
    heap = SyncCollection(never.wait, settle_after=0.2).start()
    try:
        assert not gc.isenabled()
        heap._thread.join(timeout=10)
        assert gc.isenabled()
        assert heap.frozen > 0
    finally:
        heap.stop()
        gc.unfreeze()


def test_a_watcher_that_ended_fails_the_health_of_a_leader(term):
    term.start()
    term.controller.threads_ended = ["controller-pods"]

    assert term.healthy() == (False, "leading, but these watchers ended: controller-pods")


def test_healthz_answers_503_with_the_reason_and_needs_no_token():
    state = {"alive": (False, "leading, but its watchers are not running")}
    server = MetricsServer(
        port=0, address="127.0.0.1", token="secret", name="test", health=lambda: state["alive"]
    )
    assert server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/healthz"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 503
        assert b"watchers are not running" in refused.value.read()
        state["alive"] = (True, "following")
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert (answer.status, answer.read()) == (200, b"following\n")
        with pytest.raises(urllib.error.HTTPError) as metrics_refused:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
        assert metrics_refused.value.code == 401  # /metrics keeps its token
    finally:
        server.stop()


@pytest.mark.kube
def test_a_resigned_leader_releases_at_once_and_lets_a_rival_lead(kube):
    clock = Clock()
    stopped: list[str] = []
    a = elector(kube, "a", clock, on_stopped=lambda: stopped.append("a"))
    b = elector(kube, "b", clock)
    assert a.step() is True
    assert b.step() is False

    a.resign("its watchers would not start")
    assert a.step() is False  # released, and on_stopped queued
    clock.now += TIMING.retry_period
    assert b.step() is True  # no lease to wait out: the Lease was handed back
    clock.now += TIMING.retry_period
    assert a.step() is False  # holding off while b leads
    a.stop()
    b.stop()
    assert stopped == ["a"]
    assert lease_spec(kube)["holderIdentity"] in ("b", "")
