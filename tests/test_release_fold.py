"""Releases of one Instance that are due together go as one conditional write (issue 32 §5):
one PATCH for the batch, a conflict re-read and retried slot by slot, a live pod's slot beside
them never touched, and event rows and metrics one per slot as before."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client import REGISTRY

from agent import usage as usage_rows
from agent.domain.errors import SlotChanged
from agent.domain.naming import il_resource_name, slot_key
from agent.kube import cache
from agent.kube.claims import ClaimStore
from agent.kube.client import AkriApi
from agent.models import ReconcileRun, ReleaseSample, SlotEvent, SlotPodBinding
from agent.node.reconcile import NodeReconciler, PodInfo
from tests.reconcile_world import (
    FakeClock,
    FakePodResources,
    allocate_il,
    make_instance,
    pod_object,
    usage,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

NAME = "cams-5f01d0"
KEYS = [slot_key(NAME, i) for i in range(4)]
RESOURCE = il_resource_name(NAME)


class CountingApi(AkriApi):
    """Counts the Instance PATCH requests (conflicts included)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.patches: list[list[dict]] = []
        self._lock = threading.Lock()

    def patch_instance(self, name, ops):
        with self._lock:
            self.patches.append(ops)
        return super().patch_instance(name, ops)


@pytest.fixture
def api(kube):
    return AkriApi(kube.api_client, kube.namespace)


@pytest.fixture
def counted(kube):
    return CountingApi(kube.new_client(), kube.namespace)


@pytest.fixture
def store(api):
    """The device plugins' claim store."""
    return ClaimStore(api, "agent:node-a")


@pytest.fixture
def instance(api):
    return make_instance(api, NAME, capacity=4)


@pytest.fixture
def kubelet():
    return FakePodResources()


@pytest.fixture
def reconcilers(kube, kubelet, counted):
    made: list[NodeReconciler] = []

    def make(**kwargs) -> NodeReconciler:
        options = {
            "node": "node-a",
            "namespace": kube.namespace,
            "pod_resources": kubelet,
            "claims": ClaimStore(counted, "agent:node-a"),
            "api_client": kube.new_client(),
            "grace": 20,
            "sweep_interval": 3600,
            "workers": 0,
            "watch_pods": False,
            "read_pods": False,
            "clock": FakeClock(),
        }
        options.update(kwargs)
        reconciler = NodeReconciler(**options)
        reconciler.on_pod_relist([])
        made.append(reconciler)
        return reconciler

    yield make
    for reconciler in made:
        reconciler.stop()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def four_pods(kube, reconciler, store, kubelet) -> list[dict]:
    """Pods web-0..web-3 on node-a, each holding its slot of the Instance, learned."""
    pods = []
    for i, key in enumerate(KEYS):
        allocate_il(reconciler, store, NAME, key)
        pod = pod_object(kube.namespace, f"web-{i}", "node-a")
        reconciler.on_pod_event("ADDED", pod)
        kubelet.hold(kube.namespace, f"web-{i}", RESOURCE, key)
        pods.append(pod)
    reconciler.learn()
    assert reconciler.flush()
    assert [SlotPodBinding.objects.get(slot=k).pod_name for k in KEYS] == [
        f"web-{i}" for i in range(4)
    ]
    return pods


def gone(pods: list[dict]) -> list[PodInfo]:
    return [PodInfo.from_object(pod) for pod in pods]


def test_the_slots_of_pods_gone_together_are_freed_in_one_write(
    kube, api, counted, store, instance, kubelet, reconcilers
):
    reconciler = reconcilers()
    pods = four_pods(kube, reconciler, store, kubelet)
    for pod in pods[:3]:
        kubelet.drop(kube.namespace, pod["metadata"]["name"])
    released = sample("akri_reconcile_slots_total", scope="node", result="released")
    timed = sample("akri_claim_write_seconds_count", op="release")
    counted.patches.clear()

    # The watch relists: web-3 still runs, the others went while nobody watched.
    reconciler.on_pod_relist([pods[3]])

    assert len(counted.patches) == 1
    tests = [op["path"] for op in counted.patches[0] if op["op"] == "test"]
    assert sorted(p for p in tests if "deviceUsage" in p) == sorted(
        f"/spec/deviceUsage/{k}" for k in KEYS[:3]
    )
    assert usage(api, NAME) == {KEYS[0]: "", KEYS[1]: "", KEYS[2]: "", KEYS[3]: "node-a"}
    run = ReconcileRun.objects.get(node="node-a", released=3)
    for i, key in enumerate(KEYS[:3]):
        event = SlotEvent.objects.get(slot=key, cause="reconcile")
        assert (event.before, event.after, event.pod, event.run_id) == (
            "node-a",
            "",
            f"{kube.namespace}/web-{i}",
            run.pk,
        )
        assert event.detail == f"pod {kube.namespace}/web-{i} is gone"
    assert not SlotEvent.objects.filter(slot=KEYS[3]).exclude(cause="allocate").exists()
    assert sample("akri_reconcile_slots_total", scope="node", result="released") == released + 3
    assert sample("akri_claim_write_seconds_count", op="release") == timed + 3
    reconciler.flush()
    assert set(SlotPodBinding.objects.values_list("slot", flat=True)) == {KEYS[3]}


def test_deleted_pods_each_count_a_release_latency_when_freed_together(
    kube, api, counted, store, instance, kubelet, reconcilers
):
    reconciler = reconcilers()
    pods = four_pods(kube, reconciler, store, kubelet)
    for pod in pods[:2]:
        reconciler.pods.apply("DELETED", pod)  # seen deleted: the latency runs from here
    latencies = sample("akri_release_latency_seconds_count")
    counted.patches.clear()

    reconciler.release_pods(gone(pods[:2]))

    assert len(counted.patches) == 1
    assert sample("akri_release_latency_seconds_count") == latencies + 2
    reconciler.flush()
    assert sum(ReleaseSample.objects.filter(node="node-a").values_list("releases", flat=True)) == 2


def test_without_folding_each_slot_is_its_own_write(
    kube, api, counted, store, instance, kubelet, reconcilers
):
    reconciler = reconcilers(fold_releases=False)
    pods = four_pods(kube, reconciler, store, kubelet)
    counted.patches.clear()

    reconciler.release_pods(gone(pods[:3]))

    assert len(counted.patches) == 3
    assert usage(api, NAME) == {KEYS[0]: "", KEYS[1]: "", KEYS[2]: "", KEYS[3]: "node-a"}


def test_a_conflicting_batch_is_re_read_and_frees_the_others(
    kube, api, counted, store, instance, kubelet, reconcilers
):
    reconciler = reconcilers()
    pods = four_pods(kube, reconciler, store, kubelet)
    # Meanwhile someone released web-1's slot by hand and node-b took it: the reconciler's
    # view (the cache) has not heard, so its folded write fails its test and is decided again.
    api.patch_instance(
        NAME,
        [
            {"op": "test", "path": f"/spec/deviceUsage/{KEYS[1]}", "value": "node-a"},
            {"op": "replace", "path": f"/spec/deviceUsage/{KEYS[1]}", "value": "node-b"},
        ],
    )
    counted.patches.clear()

    run = reconciler.release_pods(gone(pods[:3]))

    assert len(counted.patches) == 2  # the batch, refused; then the two still ours
    assert usage(api, NAME) == {KEYS[0]: "", KEYS[1]: "node-b", KEYS[2]: "", KEYS[3]: "node-a"}
    assert (run.released, run.errors) == (2, 0)
    assert f"{KEYS[1]}: not released" in run.detail
    assert not SlotEvent.objects.filter(slot=KEYS[1], cause="reconcile").exists()
    reconciler.flush()
    assert set(SlotPodBinding.objects.values_list("slot", flat=True)) == {KEYS[3]}


def test_a_live_pods_slot_beside_a_batch_is_never_in_its_write(
    kube, api, counted, store, instance, kubelet, reconcilers
):
    reconciler = reconcilers()
    pods = four_pods(kube, reconciler, store, kubelet)
    counted.patches.clear()

    # web-3 is named gone but a pod of that name runs with another uid: not the one bound.
    reconciler.release_pods([*gone(pods[:2]), PodInfo(kube.namespace, "web-3", "another-uid")])

    paths = {op["path"] for ops in counted.patches for op in ops}
    assert f"/spec/deviceUsage/{KEYS[3]}" not in paths
    assert f"/spec/deviceUsage/{KEYS[2]}" not in paths
    assert usage(api, NAME) == {KEYS[0]: "", KEYS[1]: "", KEYS[2]: "node-a", KEYS[3]: "node-a"}


# --- the claim store alone -----------------------------------------------------------------------
def held(api, store) -> dict:
    for key in KEYS:
        store.claim(NAME, key, "node-a", node="node-a")
    return api.get_instance(NAME)


def attributions() -> dict[str, cache.Attribution]:
    return {k: cache.Attribution(SlotEvent.Cause.RECONCILE, "agent:node-a") for k in KEYS}


def test_release_many_answers_slot_by_slot(kube, api, counted, store, instance):
    seen = held(api, store)
    store.release(NAME, KEYS[2], "node-a")  # already free by the time of the batch
    api.patch_instance(
        NAME, [{"op": "replace", "path": f"/spec/deviceUsage/{KEYS[1]}", "value": "node-b"}]
    )
    mine = ClaimStore(counted, "agent:node-a")

    outcomes = mine.release_many(
        NAME, {k: "node-a" for k in KEYS[:3]}, attributions(), current=seen
    )

    assert outcomes[KEYS[0]] == "released"
    assert isinstance(outcomes[KEYS[1]], SlotChanged)
    assert outcomes[KEYS[2]] == "already free"
    assert len(counted.patches) == 2
    assert usage(api, NAME) == {KEYS[0]: "", KEYS[1]: "node-b", KEYS[2]: "", KEYS[3]: "node-a"}
    freed = SlotEvent.objects.filter(actor="agent:node-a", after="").order_by("id")
    assert [e.slot for e in freed] == [
        KEYS[2],
        KEYS[0],
    ]


def test_release_many_tests_the_capacity_once(kube, api, counted, store, instance):
    seen = held(api, store)
    mine = ClaimStore(counted, "agent:node-a")

    mine.release_many(NAME, {k: "node-a" for k in KEYS}, attributions(), current=seen)

    (ops,) = counted.patches
    assert [op["path"] for op in ops].count("/spec/capacity") == 1
    assert sum(op["op"] == "replace" for op in ops) == 4
    assert set(usage(api, NAME).values()) == {""}


def test_releases_due_while_a_write_is_in_flight_go_together_in_the_next(
    kube, api, store, instance, kubelet, reconcilers
):
    entered, proceed = threading.Event(), threading.Event()

    class SlowApi(CountingApi):
        def patch_instance(self, name, ops):
            entered.set()
            assert proceed.wait(10)
            return super().patch_instance(name, ops)

    slow = SlowApi(kube.new_client(), kube.namespace)
    reconciler = reconcilers(workers=2, claims=ClaimStore(slow, "agent:node-a"))
    pods = four_pods(kube, reconciler, store, kubelet)

    reconciler.on_pod_event("DELETED", pods[0])
    assert entered.wait(10)  # web-0's release is being written
    for pod in pods[1:3]:
        reconciler.on_pod_event("DELETED", pod)
    kube.wait_for(lambda: len(reconciler._due.get(NAME, [])) == 2, message="web-1 and web-2 queued")
    proceed.set()

    kube.wait_for(lambda: usage(api, NAME)[KEYS[2]] == "", message="the slots free")
    assert len(slow.patches) == 2  # web-0 alone, then web-1 and web-2 together
    assert usage(api, NAME) == {KEYS[0]: "", KEYS[1]: "", KEYS[2]: "", KEYS[3]: "node-a"}
    # The books are counted after the writes, and written behind.
    run = kube.wait_for(
        lambda: (
            reconciler.flush()
            and ReconcileRun.objects.filter(node="node-a", trigger="event", released=3).first()
        ),
        message="one run counting the three releases",
    )
    assert run.errors == 0
    assert ReconcileRun.objects.filter(node="node-a", trigger="event").count() == 1


def test_the_books_of_a_storm_go_in_few_statements_and_say_what_each_would(
    kube, store, instance, kubelet, reconcilers
):
    """The write-behind folds what a storm's releases queue one by one: a run's counts written
    once, a minute's release latencies in one row update, binding deletions that follow each
    other in one statement; a binding written between them keeps its place."""
    reconciler = reconcilers()
    four_pods(kube, reconciler, store, kubelet)
    book = reconciler._burst_book()
    book.count("released")
    book.count("released")
    now = datetime(2026, 1, 5, 10, 0, 30, tzinfo=UTC)  # minutes of their own, not this one
    later = now + timedelta(minutes=1)
    rebound = replace(reconciler._binding(KEYS[3]), pod_name="web-9", pod_uid="")
    me = reconciler
    batch = [
        (me._delete_binding, (KEYS[0],)),
        (usage_rows.record_release, ("node-a", 0.1, now)),
        (book.finish, ()),
        (me._delete_binding, (KEYS[1],)),
        (usage_rows.record_release, ("node-a", 0.3, now)),
        (usage_rows.record_release, ("node-a", 0.2, later)),
        (book.finish, ()),
        (me._write_binding, (rebound,)),
        (me._delete_binding, (KEYS[2],)),
        (usage_rows.record_release, ("node-a", 0.5)),  # no time given: written as it is
    ]

    folded = reconciler._coalesced(batch)

    assert folded == [
        (usage_rows.record_releases, ("node-a", [0.1, 0.3], now)),
        (usage_rows.record_releases, ("node-a", [0.2], later)),
        (book.finish, ()),
        (me._delete_bindings, ([KEYS[0], KEYS[1]],)),
        (me._write_binding, (rebound,)),
        (usage_rows.record_release, ("node-a", 0.5)),
        (me._delete_bindings, ([KEYS[2]],)),
    ]
    with CaptureQueriesContext(connection) as statements:
        reconciler._write_once(batch)
    sql = [q["sql"] for q in statements.captured_queries]
    assert sum(s.startswith("DELETE") for s in sql) == 2
    assert sum("agent_reconcilerun" in s for s in sql) == 2  # the row made, then written once
    assert sum(s.startswith("UPDATE") and "agent_releasesample" in s for s in sql) == 3
    assert list(SlotPodBinding.objects.values_list("slot", "pod_name")) == [(KEYS[3], "web-9")]
    rows = ReleaseSample.objects.filter(node="node-a").order_by("minute")
    assert [(r.releases, round(r.total_ms), round(r.max_ms)) for r in rows] == [
        (2, 400, 300),
        (1, 200, 200),
        (1, 500, 500),  # the untimed one, in this minute
    ]
    assert ReconcileRun.objects.get(pk=book.row.pk).released == 2
