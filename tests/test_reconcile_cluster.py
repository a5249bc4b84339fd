"""Cluster-wide reconciliation: lost nodes, orphaned Instances, foreign values, the lock, and
the Celery task (called directly, and once through a real worker on Redis)."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from kubernetes import client

from agent import tasks
from agent.controller import Controller
from agent.domain.naming import slot_key
from agent.kube.claims import ClaimStore
from agent.kube.client import AkriApi
from agent.models import ReconcileRun, SlotEvent
from agent.reconcile_cluster import NodeFacts, node_gone, pass_lock, run_cluster_pass
from akri_site.celery import app, on_broker
from tests.reconcile_world import configuration_body, make_instance, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAMS = "cams-8120fe"
MICS = "cams-a19705"
NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def node_body(name: str, ready: bool = True, since: datetime = NOW - timedelta(hours=1)) -> dict:
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "lastTransitionTime": since.isoformat(),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"conditions": [condition]},
    }


@pytest.fixture
def api(kube):
    return AkriApi(kube.api_client, kube.namespace)


@pytest.fixture
def core(kube):
    core = client.CoreV1Api(kube.api_client)
    yield core
    if kube.real:  # cluster-scoped: ours to clean up on a real server
        for name in ("node-a", "node-b"):
            try:
                core.delete_node(name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def world(api, core):
    """node-a Ready; node-b holds slots of two Instances but has no Node object any more."""
    core.create_node(node_body("node-a"))
    api.create_configuration(configuration_body("cams"))
    make_instance(api, CAMS, nodes=("node-a", "node-b"))
    make_instance(api, MICS, nodes=("node-b",))
    ClaimStore(api, "agent:node-b").claim(CAMS, slot_key(CAMS, 0), "node-b")
    ClaimStore(api, "agent:node-a").claim(CAMS, slot_key(CAMS, 1), "node-a")
    ClaimStore(api, "agent:node-b").claim(MICS, slot_key(MICS, 0), "C:cams-0:node-b")


def cluster_pass(kube, **kwargs) -> ReconcileRun:
    return run_cluster_pass(kube.namespace, api_client=kube.api_client, **kwargs)


def test_a_deleted_nodes_slots_are_freed_and_it_leaves_every_instance(kube, api, world):
    run = cluster_pass(kube)

    assert (run.scope, run.released, run.errors) == ("cluster", 2, 0)
    assert usage(api, CAMS) == {slot_key(CAMS, 0): "", slot_key(CAMS, 1): "node-a"}
    assert usage(api, MICS) == {slot_key(MICS, 0): "", slot_key(MICS, 1): ""}
    assert api.get_instance(CAMS)["spec"]["nodes"] == ["node-a"]
    assert api.get_instance(MICS)["spec"]["nodes"] == []
    events = SlotEvent.objects.filter(cause="node_gone").order_by("slot")
    assert [(e.slot, e.before, e.node, e.run_id) for e in events] == [
        (slot_key(CAMS, 0), "node-b", "node-b", run.pk),
        (slot_key(MICS, 0), "C:cams-0:node-b", "node-b", run.pk),
    ]
    assert "node node-b gone (deleted)" in run.detail


def test_a_second_pass_finds_nothing_more_to_do(kube, api, world):
    cluster_pass(kube)

    again = cluster_pass(kube)

    assert (again.released, again.errors) == (0, 0)
    assert SlotEvent.objects.filter(cause="node_gone").count() == 2


def test_a_not_ready_node_keeps_its_slots_until_its_grace_runs_out(kube, api, core, world):
    core.create_node(node_body("node-b", ready=False, since=NOW - timedelta(seconds=30)))

    early = cluster_pass(kube, now=NOW, grace=60)
    assert early.released == 0
    assert usage(api, CAMS)[slot_key(CAMS, 0)] == "node-b"

    late = cluster_pass(kube, now=NOW + timedelta(seconds=31), grace=60)
    assert late.released == 2
    assert usage(api, CAMS)[slot_key(CAMS, 0)] == ""
    assert "NotReady since" in late.detail


def test_a_node_that_is_ready_again_keeps_everything(kube, api, core, world):
    core.create_node(node_body("node-b", ready=True))

    run = cluster_pass(kube, now=NOW, grace=0)

    assert run.released == 0
    assert usage(api, CAMS)[slot_key(CAMS, 0)] == "node-b"
    assert sorted(api.get_instance(CAMS)["spec"]["nodes"]) == ["node-a", "node-b"]


def test_instances_of_a_deleted_configuration_are_deleted(kube, api, core, world):
    core.create_node(node_body("node-b"))
    make_instance(api, "gone-8120fe", nodes=("node-a",), configuration="gone")

    run = cluster_pass(kube)

    names = {o["metadata"]["name"] for o in api.list_instances()["items"]}
    assert names == {CAMS, MICS}
    assert "gone-8120fe: deleted, its Configuration gone is gone" in run.detail


def test_foreign_values_and_stray_keys_are_reported_and_left_alone(kube, api, core, world):
    core.create_node(node_body("node-b"))
    api.patch_instance(
        CAMS,
        [
            {
                "op": "replace",
                "path": f"/spec/deviceUsage/{slot_key(CAMS, 1)}",
                "value": "C:node-a",
            },
            {"op": "add", "path": "/spec/deviceUsage/junk", "value": "x"},
        ],
    )

    run = cluster_pass(kube)

    assert run.released == 0
    assert f"{slot_key(CAMS, 1)}='C:node-a'" in run.detail and "junk='x'" in run.detail
    assert run.detail.startswith("2 foreign deviceUsage entries reported")
    assert usage(api, CAMS)[slot_key(CAMS, 1)] == "C:node-a"


def test_a_pass_that_finds_another_running_does_nothing(kube, world):
    with pass_lock(f"reconcile-cluster:{kube.namespace}") as got:
        assert got
        assert cluster_pass(kube) is None

    assert not ReconcileRun.objects.exists()


def test_a_not_ready_node_without_a_transition_time_is_never_old_enough():
    assert node_gone(NodeFacts("n", False, None), NOW, timedelta(0)) == ""
    assert node_gone(None, NOW, timedelta(hours=1)) == "deleted"
    assert node_gone(NodeFacts("n", True, NOW - timedelta(days=9)), NOW, timedelta(0)) == ""


def test_the_task_runs_one_pass(kube, api, world, settings):
    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig}

    tasks.reconcile_cluster.apply(kwargs={"namespace": kube.namespace, "trigger": "manual"})

    run = ReconcileRun.objects.get(scope="cluster")
    assert (run.trigger, run.released) == ("manual", 2)
    assert usage(api, CAMS)[slot_key(CAMS, 0)] == ""


def test_the_beat_schedule_runs_the_task_with_an_expiry():
    entry = app.conf.beat_schedule["reconcile-cluster"]

    assert entry["task"] == tasks.reconcile_cluster.name
    assert 0 < entry["options"]["expires"] <= entry["schedule"]
    assert tasks.reconcile_cluster.acks_late
    prune = app.conf.beat_schedule["prune-runs"]
    assert prune["task"] == tasks.prune_runs.name
    assert 0 < prune["options"]["expires"] <= prune["schedule"]


@pytest.fixture
def redis_broker():
    url = os.environ.get("AKRI_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
    queue = f"test-reconcile-{uuid.uuid4().hex[:8]}"  # other runs on this Redis never take ours
    with on_broker(url, queue):
        yield queue


def test_a_real_worker_frees_a_lost_nodes_slots(kube, api, world, settings, redis_broker):
    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig}

    with start_worker(
        app, pool="solo", perform_ping_check=False, queues=[redis_broker], shutdown_timeout=20
    ):
        sent = tasks.reconcile_cluster.apply_async(
            kwargs={"namespace": kube.namespace}, queue=redis_broker
        )
        run = kube.wait_for(
            lambda: ReconcileRun.objects.filter(task_id=sent.id).exclude(duration_ms=0).first(),
            timeout=20,
            message="the worker's run",
        )

    assert (run.scope, run.trigger, run.released) == ("cluster", "schedule", 2)
    assert usage(api, CAMS)[slot_key(CAMS, 0)] == ""
    assert SlotEvent.objects.filter(cause="node_gone", run=run).count() == 2


def test_a_stopped_controller_runs_none_of_the_cluster_passes_it_had_waiting(
    kube, settings, monkeypatch
):
    """Without a broker (the embedded default) the controller waits out a lost node's grace
    in a timer. A stopped controller's timers go with it: one left behind ran its pass later
    on whatever the process's settings then named (in the suite: another test's cluster)."""
    settings.AKRI = {**settings.AKRI, "NODE_GONE_GRACE_SECONDS": 0}  # the pass 1 s after
    settings.CELERY_TASK_ALWAYS_EAGER = True
    ran = []
    monkeypatch.setattr(tasks.reconcile_cluster, "apply", lambda **kwargs: ran.append(kwargs))
    ctl = Controller(kube.new_client(), kube.namespace, timeout_seconds=5).start()
    try:
        ctl._enqueue_cluster_reconcile("node node-a deleted")
        kube.wait_for(lambda: ran, timeout=10, message="the pass of a running controller")
        ctl._enqueue_cluster_reconcile("node node-b deleted")
        waiting = [t for t in ctl._timers if t.is_alive()]
    finally:
        ctl.stop()

    # stop() cancels and joins its timers: none is left to run later, whatever the machine's
    # load (a timer it forgot would have run its pass before the join returned).
    assert waiting and not any(t.is_alive() for t in waiting)
    assert ran == [{"kwargs": {"trigger": "event"}}]
