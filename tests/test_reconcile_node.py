"""Node-local slot reconciliation against the API-server simulator, with a PodResources
stand-in: deletions and terminations, the grace window, seed 002's orderings, restore and
conflicts, agent and kubelet restarts."""

from __future__ import annotations

import threading

import pytest
from kubernetes import client
from prometheus_client import REGISTRY

from agent.domain.naming import il_resource_name, slot_key
from agent.kube.claims import ClaimStore
from agent.kube.client import AkriApi
from agent.models import ReconcileRun, Slot, SlotEvent, SlotPodBinding
from agent.node.reconcile import NodeReconciler
from tests.reconcile_world import (
    FakeClock,
    FakePodResources,
    allocate_cl,
    allocate_il,
    create_pod,
    make_instance,
    pod_object,
    usage,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

NAME = "cams-8120fe"
KEY0, KEY1 = slot_key(NAME, 0), slot_key(NAME, 1)
RESOURCE = il_resource_name(NAME)


@pytest.fixture
def api(kube):
    return AkriApi(kube.api_client, kube.namespace)


@pytest.fixture
def core(kube):
    return client.CoreV1Api(kube.api_client)


@pytest.fixture
def kubelet():
    return FakePodResources()


@pytest.fixture
def store(api):
    """The device plugins' claim store."""
    return ClaimStore(api, "agent:node-a")


@pytest.fixture
def instance(api):
    return make_instance(api, NAME)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def reconcilers(kube, kubelet):
    made: list[NodeReconciler] = []

    def make(**kwargs) -> NodeReconciler:
        options = {
            "node": "node-a",
            "namespace": kube.namespace,
            "pod_resources": kubelet,
            "api_client": kube.new_client(),
            "grace": 20,
            "sweep_interval": 3600,
        }
        options.update(kwargs)
        reconciler = NodeReconciler(**options)
        made.append(reconciler)
        return reconciler

    yield make
    for reconciler in made:
        reconciler.stop()


@pytest.fixture
def direct(reconcilers, clock):
    """A reconciler driven by the test: no threads, no pod watch, fake time."""
    reconciler = reconcilers(workers=0, watch_pods=False, read_pods=False, clock=clock)
    reconciler.on_pod_relist([])
    return reconciler


def binding(slot: str = KEY0) -> SlotPodBinding | None:
    return SlotPodBinding.objects.filter(node="node-a", slot=slot).first()


def finish_pod(core, kubelet: FakePodResources, namespace: str, pod: str) -> None:
    """The pod's end as its kubelet brings it about: deleted (Terminating), stopped, then
    deleted with grace 0, which removes it from the API server."""
    core.delete_namespaced_pod(pod, namespace)
    kubelet.drop(namespace, pod)
    core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)


def causes(slot: str = KEY0) -> list[str]:
    return list(SlotEvent.objects.filter(slot=slot).order_by("id").values_list("cause", flat=True))


def running(
    kube, reconciler: NodeReconciler, kubelet: FakePodResources, pod: str, key: str = KEY0
) -> dict:
    """A pod on node-a that Allocate gave ``key`` and the kubelet now lists."""
    obj = pod_object(kube.namespace, pod, "node-a")
    reconciler.on_pod_event("ADDED", obj)
    kubelet.hold(kube.namespace, pod, RESOURCE, key)
    reconciler.learn()
    assert binding(key).pod_name == pod
    return obj


# --- pods going away, with the real pod watch ---------------------------------------------------
def test_it_releases_a_slot_when_its_pod_is_deleted(
    kube, api, core, store, instance, kubelet, reconcilers
):
    reconciler = reconcilers().start()
    create_pod(core, kube.namespace, "web-1", "node-a")
    create_pod(core, kube.namespace, "never-ready", "node-a")  # Pending: must not hold anything up
    allocate_il(reconciler, store, NAME, KEY0)
    kubelet.hold(kube.namespace, "web-1", RESOURCE, KEY0)
    kube.wait_for(
        lambda: binding() and binding().pod_name == "web-1", message="the pod named by a learn pass"
    )

    finish_pod(core, kubelet, kube.namespace, "web-1")

    kube.wait_for(lambda: usage(api, NAME)[KEY0] == "", message="the slot free")
    run = kube.wait_for(
        lambda: ReconcileRun.objects.filter(node="node-a", trigger="event", released=1).first()
    )
    event = SlotEvent.objects.get(slot=KEY0, cause="reconcile")
    assert (event.before, event.after, event.pod, event.run_id) == (
        "node-a",
        "",
        f"{kube.namespace}/web-1",
        run.pk,
    )
    assert binding() is None
    assert Slot.objects.get(key=KEY0).value == ""


def test_it_releases_a_slot_when_its_pod_terminates(
    kube, api, core, store, instance, kubelet, reconcilers
):
    reconciler = reconcilers().start()
    create_pod(core, kube.namespace, "job-1", "node-a")
    allocate_il(reconciler, store, NAME, KEY0)
    kubelet.hold(kube.namespace, "job-1", RESOURCE, KEY0)
    kube.wait_for(lambda: binding() and binding().pod_name == "job-1")

    # Failed, and the kubelet has not caught up yet: the API server's word is enough.
    core.patch_namespaced_pod_status("job-1", kube.namespace, {"status": {"phase": "Failed"}})

    kube.wait_for(lambda: causes() == ["allocate", "reconcile"], message="the release recorded")
    assert usage(api, NAME)[KEY0] == ""
    kube.wait_for(lambda: binding() is None, message="the binding gone")  # written behind


def test_the_dashboard_slot_shows_the_pod_that_holds_it(kube, store, instance, kubelet, direct):
    allocate_il(direct, store, NAME, KEY0)
    assert Slot.objects.get(key=KEY0).pod_name == ""

    running(kube, direct, kubelet, "web-1")

    slot = Slot.objects.get(key=KEY0)
    assert (slot.pod_namespace, slot.pod_name, slot.container) == (kube.namespace, "web-1", "main")


# --- the grace window ---------------------------------------------------------------------------
def test_a_slot_whose_pod_never_shows_is_kept_for_the_grace_then_released(
    api, store, instance, direct, clock
):
    allocate_il(direct, store, NAME, KEY0)

    clock.advance(19)
    early = direct.sweep()
    assert early.released == 0
    assert usage(api, NAME)[KEY0] == "node-a"

    clock.advance(2)
    late = direct.sweep()
    assert late.released == 1
    assert usage(api, NAME)[KEY0] == ""
    event = SlotEvent.objects.get(slot=KEY0, cause="reconcile")
    assert event.run_id == late.pk and "after Allocate" in event.detail


def test_an_allocation_that_lost_its_slot_is_not_looked_up_at_the_kubelet(
    kube, api, store, instance, kubelet, direct, clock
):
    allocate_il(direct, store, NAME, KEY0)
    store.release(NAME, KEY0, "node-a")  # rolled back, or released by someone, before a pod
    calls = kubelet.calls

    assert direct.learn() is None
    assert kubelet.calls == calls  # no pod to name: the kubelet is not asked

    allocate_il(direct, store, NAME, KEY0)  # held again: now there is something to learn
    running(kube, direct, kubelet, "web-1")  # (asserts the pod was learned)
    assert kubelet.calls == calls + 1


def test_a_pod_seen_within_the_grace_keeps_its_slot_for_good(
    kube, api, store, instance, kubelet, direct, clock
):
    allocate_il(direct, store, NAME, KEY0)
    running(kube, direct, kubelet, "web-1")

    clock.advance(3600)
    run = direct.sweep()

    assert (run.checked, run.released) == (1, 0)
    assert usage(api, NAME)[KEY0] == "node-a"


def test_a_known_pod_that_is_deleted_is_released_without_any_grace(
    kube, api, store, instance, kubelet, direct, clock
):
    allocate_il(direct, store, NAME, KEY0)
    pod = running(kube, direct, kubelet, "web-1")

    direct.on_pod_event("DELETED", pod)  # no time passes at all

    assert usage(api, NAME)[KEY0] == ""
    assert ReconcileRun.objects.get(trigger="event").released == 1


# --- seed 002's orderings -------------------------------------------------------------------------
def test_allocate_after_delete_claims_the_freed_slot_afresh(
    kube, api, store, instance, kubelet, direct
):
    allocate_il(direct, store, NAME, KEY0)
    old = running(kube, direct, kubelet, "old")
    direct.on_pod_event("DELETED", old)
    kubelet.drop(kube.namespace, "old")
    assert usage(api, NAME)[KEY0] == ""

    assert allocate_il(direct, store, NAME, KEY0) == "claimed"

    assert usage(api, NAME)[KEY0] == "node-a"
    assert causes() == ["allocate", "reconcile", "allocate"]
    assert binding().pod_name == ""  # the new allocation, its pod not yet named


def test_allocate_during_delete_waits_for_the_release_then_claims(
    kube, api, store, instance, kubelet, reconcilers
):
    entered, proceed = threading.Event(), threading.Event()

    class SlowStore(ClaimStore):
        def release(self, *args, **kwargs):
            entered.set()
            assert proceed.wait(10)
            return super().release(*args, **kwargs)

    reconciler = reconcilers(
        workers=0,
        watch_pods=False,
        read_pods=False,
        claims=SlowStore(AkriApi(kube.new_client(), kube.namespace), "agent:node-a"),
    )
    reconciler.on_pod_relist([])
    allocate_il(reconciler, store, NAME, KEY0)
    old = running(kube, reconciler, kubelet, "old")
    kubelet.drop(kube.namespace, "old")
    deleting = threading.Thread(target=reconciler.on_pod_event, args=("DELETED", old))
    deleting.start()
    assert entered.wait(10)  # the release is under way, holding the Instance's lock
    allocated: list[str] = []
    allocating = threading.Thread(
        target=lambda: allocated.append(allocate_il(reconciler, store, NAME, KEY0))
    )
    allocating.start()

    proceed.set()
    deleting.join(10)
    allocating.join(10)

    assert allocated == ["claimed"]  # not "already ours": the release went first
    assert usage(api, NAME)[KEY0] == "node-a"
    assert causes() == ["allocate", "reconcile", "allocate"]
    assert binding().pod_name == ""


def test_allocate_before_delete_keeps_the_slot_for_the_new_pod(
    kube, api, store, instance, kubelet, direct
):
    allocate_il(direct, store, NAME, KEY0)
    old = running(kube, direct, kubelet, "old")
    # The kubelet already let go of "old" and hands its device to "new"...
    kubelet.drop(kube.namespace, "old")
    assert allocate_il(direct, store, NAME, KEY0) == "already ours"
    # ...before the reconciler hears that "old" was deleted.
    direct.on_pod_event("DELETED", old)

    assert usage(api, NAME)[KEY0] == "node-a"
    assert causes() == ["allocate"]
    assert not ReconcileRun.objects.filter(released__gt=0).exists()
    new = running(kube, direct, kubelet, "new")
    direct.on_pod_event("DELETED", new)
    assert usage(api, NAME)[KEY0] == ""


# --- restore and conflicts ----------------------------------------------------------------------
def test_a_manually_released_slot_of_a_live_pod_is_claimed_back(
    kube, api, store, instance, kubelet, direct
):
    allocate_il(direct, store, NAME, KEY0)
    running(kube, direct, kubelet, "web-1")
    ClaimStore(api, "user:ops").release(NAME, KEY0, "node-a", cause=SlotEvent.Cause.MANUAL)
    assert usage(api, NAME)[KEY0] == ""

    run = direct.sweep()

    assert run.restored == 1
    assert usage(api, NAME)[KEY0] == "node-a"
    event = SlotEvent.objects.filter(slot=KEY0).order_by("id").last()
    assert (event.cause, event.after, event.run_id) == ("restore", "node-a", run.pk)
    assert binding().pod_name == "web-1"


def test_a_device_in_use_here_but_held_by_another_node_is_a_conflict_never_taken(
    kube, api, instance, kubelet, direct
):
    ClaimStore(api, "agent:node-b").claim(NAME, KEY1, "node-b")
    direct.on_pod_event("ADDED", pod_object(kube.namespace, "web-1", "node-a"))
    kubelet.hold(kube.namespace, "web-1", RESOURCE, KEY1)

    first = direct.sweep()
    second = direct.sweep()

    assert (first.conflicts, second.conflicts) == (1, 1)
    assert usage(api, NAME)[KEY1] == "node-b"
    event = SlotEvent.objects.get(slot=KEY1, cause="conflict")  # shown once, not every sweep
    assert (event.before, event.after, event.run_id) == ("node-b", "node-b", first.pk)
    assert "held by 'node-b'" in first.detail


def test_a_configuration_level_slot_is_found_by_its_vdev(
    kube, api, store, instance, kubelet, direct
):
    allocate_cl(direct, store, NAME, KEY1, "cams", "cams-0")
    pod = pod_object(kube.namespace, "cl-1", "node-a")
    direct.on_pod_event("ADDED", pod)
    kubelet.hold(kube.namespace, "cl-1", "akri.sh/cams", "cams-0")
    direct.learn()
    assert binding(KEY1).pod_name == "cl-1"

    direct.on_pod_event("DELETED", pod)

    assert usage(api, NAME)[KEY1] == ""


def test_a_restored_api_server_gets_a_live_pods_configuration_level_slot_back(
    kube, api, store, instance, kubelet, direct
):
    allocate_cl(direct, store, NAME, KEY1, "cams", "cams-0")
    direct.on_pod_event("ADDED", pod_object(kube.namespace, "cl-1", "node-a"))
    kubelet.hold(kube.namespace, "cl-1", "akri.sh/cams", "cams-0")
    direct.learn()
    # A backup from before the claim: the slot is free again, only our binding knows the vdev.
    ClaimStore(api, "user:ops").release(NAME, KEY1, "C:cams-0:node-a", cause=SlotEvent.Cause.MANUAL)

    run = direct.sweep()

    assert run.restored == 1
    assert usage(api, NAME)[KEY1] == "C:cams-0:node-a"


# --- restarts -------------------------------------------------------------------------------------
def test_a_restarted_agent_releases_slots_of_pods_deleted_while_it_was_down(
    kube, api, core, store, instance, kubelet, reconcilers
):
    first = reconcilers().start()
    create_pod(core, kube.namespace, "web-1", "node-a")
    allocate_il(first, store, NAME, KEY0)
    kubelet.hold(kube.namespace, "web-1", RESOURCE, KEY0)
    kube.wait_for(lambda: binding() and binding().pod_name == "web-1")
    first.stop()
    finish_pod(core, kubelet, kube.namespace, "web-1")

    reconcilers().start()

    event = kube.wait_for(lambda: SlotEvent.objects.filter(slot=KEY0, cause="reconcile").first())
    assert event.run.trigger == "startup"
    assert usage(api, NAME)[KEY0] == ""


def test_a_restarted_agent_keeps_live_pods_slots_and_their_bindings(
    kube, api, store, instance, kubelet, reconcilers, clock
):
    first = reconcilers(workers=0, watch_pods=False, read_pods=False, clock=clock)
    first.on_pod_relist([])
    allocate_il(first, store, NAME, KEY0)
    pod = running(kube, first, kubelet, "web-1")
    first.stop()

    clock.advance(600)
    second = reconcilers(workers=0, watch_pods=False, read_pods=False, clock=clock)
    second.on_pod_relist([pod])
    run = second.sweep(ReconcileRun.Trigger.STARTUP)

    assert (run.released, run.restored, run.errors) == (0, 0, 0)
    assert usage(api, NAME)[KEY0] == "node-a"
    assert second.bindings()[0].pod_name == "web-1"
    second.on_pod_event("DELETED", pod)
    assert usage(api, NAME)[KEY0] == ""


def test_a_claim_the_agent_crashed_before_binding_is_adopted_and_freed_after_grace(
    api, store, instance, reconcilers, clock
):
    store.claim(NAME, KEY0, "node-a")  # claimed; the agent died before on_allocated
    restarted = reconcilers(workers=0, watch_pods=False, read_pods=False, clock=clock)
    restarted.on_pod_relist([])

    adopted = restarted.sweep(ReconcileRun.Trigger.STARTUP)
    assert adopted.released == 0 and binding() is not None
    clock.advance(21)
    freed = restarted.sweep()

    assert freed.released == 1
    assert usage(api, NAME)[KEY0] == ""


def test_an_unavailable_kubelet_frees_nothing_until_it_answers(
    kube, api, store, instance, kubelet, direct, clock
):
    allocate_il(direct, store, NAME, KEY0)
    running(kube, direct, kubelet, "web-1")
    allocate_il(direct, store, NAME, KEY1)  # its pod never shows
    clock.advance(30)
    kubelet.available = False

    blind = direct.sweep()

    assert (blind.errors, blind.released) == (1, 0)
    assert "PodResources unavailable" in blind.detail
    assert usage(api, NAME) == {KEY0: "node-a", KEY1: "node-a"}
    kubelet.available = True
    seeing = direct.sweep()
    assert (seeing.errors, seeing.released) == (0, 1)
    assert usage(api, NAME) == {KEY0: "node-a", KEY1: ""}


def test_a_release_after_a_deletion_is_measured_and_counted(kube, store, instance, kubelet, direct):
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    latency = sample("akri_release_latency_seconds_count")
    runs = sample("akri_reconcile_runs_total", scope="node", trigger="event")
    released = sample("akri_reconcile_slots_total", scope="node", result="released")
    allocate_il(direct, store, NAME, KEY0)
    pod = running(kube, direct, kubelet, "web-1")

    direct.on_pod_event("DELETED", pod)

    assert sample("akri_release_latency_seconds_count") == latency + 1
    assert sample("akri_reconcile_runs_total", scope="node", trigger="event") == runs + 1
    assert sample("akri_reconcile_slots_total", scope="node", result="released") == released + 1


# --- the sweep as the only retry -----------------------------------------------------------------
def allocate_at(level: str, reconciler: NodeReconciler, store: ClaimStore) -> tuple[str, str, str]:
    """(slot, kubelet device id, resource) of an IL or a CL allocation of KEY0."""
    if level == "IL":
        allocate_il(reconciler, store, NAME, KEY0)
        return KEY0, KEY0, RESOURCE
    allocate_cl(reconciler, store, NAME, KEY0, "cams", "cams-0")
    return KEY0, "cams-0", "akri.sh/cams"


@pytest.mark.parametrize("level", ["IL", "CL"])
def test_the_sweep_alone_frees_a_slot_whose_pod_went_without_an_event(
    kube, api, core, store, instance, kubelet, reconcilers, level
):
    # No pod watch: the reconciler learns of pods only by reading them, as after a missed event.
    reconciler = reconcilers(workers=0, watch_pods=False)
    create_pod(core, kube.namespace, "web-1", "node-a")
    slot, device_id, resource = allocate_at(level, reconciler, store)
    kubelet.hold(kube.namespace, "web-1", resource, device_id)
    reconciler.learn()
    assert binding(slot).pod_name == "web-1"
    core.delete_namespaced_pod("web-1", kube.namespace, grace_period_seconds=0)
    kubelet.drop(kube.namespace, "web-1")
    assert usage(api, NAME)[slot] != ""  # nobody told the reconciler

    run = reconciler.sweep()

    assert (run.trigger, run.released) == ("sweep", 1)
    assert usage(api, NAME)[slot] == ""
    assert causes(slot) == ["allocate", "reconcile"]
    assert binding(slot) is None


@pytest.mark.parametrize("level", ["IL", "CL"])
def test_the_sweep_retries_a_gone_pods_release_that_failed(
    kube, api, store, instance, kubelet, direct, level
):
    if kube.simulator is None:
        pytest.skip("fault injection needs the API-server simulator")
    slot, device_id, resource = allocate_at(level, direct, store)
    pod = pod_object(kube.namespace, "web-1", "node-a")
    direct.on_pod_event("ADDED", pod)
    kubelet.hold(kube.namespace, "web-1", resource, device_id)
    direct.learn()
    # Every attempt of the event's release fails (the claim store tries 6 times).
    kube.simulator.inject_fault("PATCH", r"/instances/" + NAME, status=500, times=6)
    direct.on_pod_event("DELETED", pod)
    kubelet.drop(kube.namespace, "web-1")
    assert usage(api, NAME)[slot] != ""
    event_run = ReconcileRun.objects.get(node="node-a", trigger="event")
    assert (event_run.released, event_run.errors) == (0, 1)

    run = direct.sweep()

    assert (run.trigger, run.released) == ("sweep", 1)
    assert usage(api, NAME)[slot] == ""
    assert binding(slot) is None
