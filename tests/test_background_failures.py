"""Background loops when their database or API call fails: the cache applier, the
reconciler's write-behind, learn passes and retention, and the cluster pass. Each failure is
followed by a pass that repairs what the failed one left; nothing is dropped.

Database failures are forced (``OperationalError("database is locked")`` raised from the
call the loop makes), so they happen on SQLite and PostgreSQL alike; API failures come from
the simulator's fault injection.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import OperationalError
from kubernetes import client

from agent import retention
from agent.domain.naming import il_resource_name, slot_key
from agent.kube import cache
from agent.kube.claims import ClaimStore
from agent.kube.client import AkriApi
from agent.kube.watch import CacheSync
from agent.models import Instance, ReconcileRun, SlotPodBinding
from agent.node import reconcile
from agent.node.reconcile import NodeReconciler
from agent.reconcile_cluster import run_cluster_pass
from tests.reconcile_world import (
    FakePodResources,
    allocate_il,
    configuration_body,
    make_instance,
    pod_object,
    usage,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

NAME = "cams-8120fe"
KEY0 = slot_key(NAME, 0)
ROOT = Path(__file__).resolve().parents[1]


class FailingFirst:
    """Wraps ``fn``: the first ``times`` calls raise ``error``, the rest go through. A plain
    function stands in for it (``wrapper``), so it can replace a method too."""

    def __init__(self, fn, times: int, error: Exception | None = None) -> None:
        self.fn, self.left = fn, times
        self.error = error or OperationalError("database is locked")
        self.failed = 0

        def wrapper(*args, **kwargs):
            if self.left > 0:
                self.left -= 1
                self.failed += 1
                raise self.error
            return self.fn(*args, **kwargs)

        self.wrapper = wrapper


def another_node_claims(api: AkriApi, key: str, holder: str) -> None:
    """A write this process did not make: it reaches the cache through the watch only."""
    path = f"/spec/deviceUsage/{key}"
    api.patch_instance(
        NAME,
        [
            {"op": "test", "path": path, "value": ""},
            {"op": "replace", "path": path, "value": holder},
        ],
    )


@pytest.fixture
def api(kube):
    return AkriApi(kube.api_client, kube.namespace)


@pytest.fixture
def sync(kube):
    started = CacheSync(kube.new_client(), kube.namespace, owner=f"t-{uuid.uuid4().hex[:6]}")
    started.start()
    assert started.wait_synced()
    yield started
    started.stop()


def cached_value(key: str) -> str | None:
    row = Instance.objects.filter(name=NAME).first()
    return None if row is None else row.device_usage.get(key)


# --- the cache applier ------------------------------------------------------------------------
def test_a_cache_update_that_meets_a_locked_database_is_retried_not_dropped(
    kube, api, sync, monkeypatch
):
    api.create_instance(make_body())
    kube.wait_for(lambda: cached_value(KEY0) == "", message="the Instance in the cache")
    failing = FailingFirst(cache.apply_instance, 3)
    monkeypatch.setattr(cache, "apply_instance", failing.wrapper)

    another_node_claims(api, KEY0, "node-b")

    kube.wait_for(lambda: cached_value(KEY0) == "node-b", timeout=10, message="the claim cached")
    assert failing.failed == 3
    assert sync.apply_failures == 3


def test_a_cache_update_that_fails_otherwise_is_repaired_by_a_relist(kube, api, sync, monkeypatch):
    api.create_instance(make_body())
    kube.wait_for(lambda: cached_value(KEY0) == "", message="the Instance in the cache")
    relists = sync.instances.relists
    # A fault in handling one event (not the database): that event cannot be applied as it
    # is, so the applier asks for a relist, which brings the cache up to date.
    failing = FailingFirst(cache.apply_instance, 1, ValueError("unexpected object"))
    monkeypatch.setattr(cache, "apply_instance", failing.wrapper)

    another_node_claims(api, KEY0, "node-b")

    kube.wait_for(lambda: cached_value(KEY0) == "node-b", timeout=10, message="the claim cached")
    assert failing.failed == 1
    assert sync.instances.relists > relists


def make_body() -> dict:
    from agent.bench.claims import instance_body

    return instance_body(NAME, 2, "cams", ("node-a", "node-b"))


def test_any_sqlite_database_url_gets_wal_and_a_busy_timeout(tmp_path):
    path = tmp_path / "agent.sqlite3"
    script = (
        "import django, json; django.setup();"
        "from django.db import connection; c = connection.cursor();"
        "c.execute('PRAGMA journal_mode'); mode = c.fetchone()[0];"
        "c.execute('PRAGMA busy_timeout'); busy = c.fetchone()[0];"
        "print(json.dumps([mode, busy]))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "akri_site.settings",
        "DATABASE_URL": f"sqlite:///{path}",
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    mode, busy = json.loads(out.stdout.strip().splitlines()[-1])
    assert mode == "wal"
    assert busy >= 10_000  # milliseconds: writers wait for the lock instead of failing


# --- the node reconciler --------------------------------------------------------------------------
@pytest.fixture
def reconciler(kube):
    made: list[NodeReconciler] = []

    def make(**kwargs) -> NodeReconciler:
        options = {
            "node": "node-a",
            "namespace": kube.namespace,
            "pod_resources": FakePodResources(),
            "api_client": kube.new_client(),
            "grace": 20,
            "sweep_interval": 3600,
            "watch_pods": False,
            "read_pods": False,
        }
        options.update(kwargs)
        made.append(NodeReconciler(**options))
        return made[-1]

    yield make
    for each in made:
        each.stop()


def test_the_reconcilers_rows_are_written_again_after_a_locked_database(
    kube, api, reconciler, monkeypatch
):
    make_instance(api, NAME)
    node = reconciler()
    failing = FailingFirst(NodeReconciler._write_binding, 2)
    monkeypatch.setattr(NodeReconciler, "_write_binding", failing.wrapper)

    allocate_il(node, ClaimStore(api, "agent:node-a"), NAME, KEY0)

    assert node.flush(timeout=10)
    assert failing.failed == 2
    row = SlotPodBinding.objects.get(node="node-a", slot=KEY0)
    assert (row.instance, row.device_id) == (NAME, KEY0)


def test_a_learn_pass_that_fails_is_tried_again(kube, api, reconciler, monkeypatch):
    make_instance(api, NAME)
    kubelet = FakePodResources()
    node = reconciler(pod_resources=kubelet).start()
    failing = FailingFirst(NodeReconciler._still_held, 2)
    monkeypatch.setattr(NodeReconciler, "_still_held", failing.wrapper)
    node.on_pod_event("ADDED", pod_object(kube.namespace, "web-1", "node-a"))

    allocate_il(node, ClaimStore(api, "agent:node-a"), NAME, KEY0)
    kubelet.hold(kube.namespace, "web-1", il_resource_name(NAME), KEY0)

    kube.wait_for(
        lambda: any(b.pod_name == "web-1" for b in node.bindings()),
        timeout=10,
        message="the pod named by a later learn pass",
    )
    assert failing.failed == 2


def test_a_prune_that_fails_is_tried_again_soon(kube, reconciler, monkeypatch, settings):
    settings.AKRI = {**settings.AKRI, "RUN_RETENTION_HOURS": 0}
    old = ReconcileRun.objects.create(
        scope=ReconcileRun.Scope.NODE,
        node="node-a",
        trigger=ReconcileRun.Trigger.SWEEP,
        started_at="2020-01-01T00:00:00Z",
    )
    monkeypatch.setattr(reconcile, "PRUNE_RETRY", 0.2)
    failing = FailingFirst(retention.prune_runs, 1)
    monkeypatch.setattr(retention, "prune_runs", failing.wrapper)

    reconciler(sweep_interval=0.1).start()

    kube.wait_for(
        lambda: not ReconcileRun.objects.filter(pk=old.pk).exists(),
        timeout=10,
        message="the old run pruned by the next try",
    )
    assert failing.failed == 1


# --- the cluster pass -------------------------------------------------------------------------------
def test_a_cluster_pass_that_cannot_read_the_cluster_leaves_it_to_the_next(kube, api):
    if kube.simulator is None:
        pytest.skip("fault injection needs the API-server simulator")
    core = client.CoreV1Api(kube.api_client)
    api.create_configuration(configuration_body("cams"))
    make_instance(api, NAME, nodes=("node-b",))  # node-b has no Node object: it is gone
    ClaimStore(api, "agent:node-b").claim(NAME, KEY0, "node-b")
    assert "node-b" not in {n.metadata.name for n in core.list_node().items}
    kube.simulator.inject_fault("GET", r"/api/v1/nodes$", status=500, times=1)

    failed = run_cluster_pass(kube.namespace, api_client=kube.api_client)

    assert (failed.released, failed.errors) == (0, 1)
    assert "cannot read the cluster now, will retry" in failed.detail
    assert usage(api, NAME)[KEY0] == "node-b"
    repaired = run_cluster_pass(kube.namespace, api_client=kube.api_client)
    assert (repaired.released, repaired.errors) == (1, 0)
    assert usage(api, NAME)[KEY0] == ""


def test_a_cluster_pass_whose_release_fails_frees_the_slot_next_time(kube, api):
    if kube.simulator is None:
        pytest.skip("fault injection needs the API-server simulator")
    api.create_configuration(configuration_body("cams"))
    make_instance(api, NAME, nodes=("node-b",))
    ClaimStore(api, "agent:node-b").claim(NAME, KEY0, "node-b")
    kube.simulator.inject_fault("PATCH", r"/instances/" + NAME, status=500, times=20)

    failed = run_cluster_pass(kube.namespace, api_client=kube.api_client)

    assert failed.errors >= 1 and failed.released == 0
    assert usage(api, NAME)[KEY0] == "node-b"
    kube.simulator.clear_faults()
    repaired = run_cluster_pass(kube.namespace, api_client=kube.api_client)
    assert (repaired.released, repaired.errors) == (1, 0)
    assert usage(api, NAME)[KEY0] == ""
