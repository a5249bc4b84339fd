"""Reconciliation history retention: uneventful runs go after the retention, the rest stay."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.test import override_settings
from django.utils import timezone

from agent import retention, tasks
from agent.models import ReconcileRun, SlotEvent
from agent.node.reconcile import NodeReconciler
from tests.reconcile_world import FakePodResources

pytestmark = pytest.mark.django_db

NOW = timezone.now()


def run(hours_ago: float, node: str = "node-a", **counts) -> ReconcileRun:
    return ReconcileRun.objects.create(
        scope=ReconcileRun.Scope.NODE if node else ReconcileRun.Scope.CLUSTER,
        node=node,
        trigger=ReconcileRun.Trigger.SWEEP,
        started_at=NOW - timedelta(hours=hours_ago),
        **counts,
    )


@override_settings(AKRI={"RUN_RETENTION_HOURS": 48})
def test_old_uneventful_runs_go_and_everything_else_stays():
    old_quiet = run(49)
    recent_quiet = run(47)
    old_eventful = [
        run(49, released=1),
        run(49, restored=1),
        run(49, conflicts=1),
        run(49, errors=1),
    ]
    referenced = run(49)  # counts cleared, but a slot event points at it
    SlotEvent.objects.create(
        at=NOW,
        namespace="default",
        instance="i",
        slot="i-0",
        before="",
        after="n",
        cause="reconcile",
        actor="test",
        run=referenced,
    )

    assert retention.prune_runs(now=NOW) == 1

    left = set(ReconcileRun.objects.values_list("pk", flat=True))
    assert old_quiet.pk not in left
    assert {recent_quiet.pk, referenced.pk, *(r.pk for r in old_eventful)} <= left


@override_settings(AKRI={"RUN_RETENTION_HOURS": 1})
def test_a_node_prunes_only_its_own_runs_and_in_batches(monkeypatch):
    monkeypatch.setattr(retention, "BATCH", 3)
    mine = [run(2) for _ in range(7)]
    other = run(2, node="node-b")
    cluster = run(2, node="")

    assert retention.prune_runs(node="node-a", now=NOW) == len(mine)
    assert set(ReconcileRun.objects.values_list("pk", flat=True)) == {other.pk, cluster.pk}
    assert tasks.prune_runs() == 2  # the beat task: every scope, every node


def test_the_node_reconciler_prunes_its_history(settings):
    settings.AKRI = {**settings.AKRI, "RUN_RETENTION_HOURS": 1}
    run(2)
    run(2, node="node-b")
    reconciler = NodeReconciler(
        node="node-a",
        namespace="default",
        pod_resources=FakePodResources(),
        claims=SimpleNamespace(),  # pruning writes nothing to the API server
        workers=0,
        watch_pods=False,
        read_pods=False,
    )
    assert reconciler.prune_runs() == 1
    assert list(ReconcileRun.objects.values_list("node", flat=True)) == ["node-b"]
