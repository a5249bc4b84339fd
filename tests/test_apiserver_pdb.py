"""The simulator's PodDisruptionBudget rules for ``pods/eviction`` (what kube-apiserver and its
disruption controller decide), alone."""

from __future__ import annotations

import pytest

from agent.simulator.apiserver_pdb import check_eviction, desired_healthy, selects
from agent.simulator.apiserver_store import ApiError


def pod(name, labels=None, phase="Running", ready=True, deleting=False):
    meta = {"name": name, "labels": labels or {"app": "a"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T03:00:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": meta, "status": {"phase": phase, "conditions": conditions}}


def budget(name="b", **spec):
    return {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": {"app": "a"}}, **spec}}


def test_selectors_follow_label_selector_rules():
    assert selects({}, {"x": "y"})
    assert selects(
        {"matchExpressions": [{"key": "x", "operator": "In", "values": ["y"]}]}, {"x": "y"}
    )
    assert not selects({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, {})
    assert not selects({"matchLabels": {"app": "a"}}, {"app": "b"})


@pytest.mark.parametrize(
    ("spec", "expected", "desired"),
    [
        ({"minAvailable": 2}, 3, 2),
        ({"minAvailable": "50%"}, 3, 2),
        ({"maxUnavailable": 1}, 3, 2),
        ({"maxUnavailable": "50%"}, 3, 1),
        ({"maxUnavailable": 0}, 3, 3),
    ],
)
def test_desired_healthy(spec, expected, desired):
    assert desired_healthy(spec, expected) == desired


def test_a_budget_with_room_lets_one_go_and_one_without_refuses_with_429():
    pods = [pod("p1"), pod("p2")]
    check_eviction(pods[0], [budget(minAvailable=1)], pods)
    with pytest.raises(ApiError) as refused:
        check_eviction(pods[0], [budget(minAvailable=2)], pods)
    assert refused.value.code == 429
    assert "The disruption budget b needs 2 healthy pods and has 2" in str(refused.value.details)


def test_pending_ended_or_terminating_pods_are_evicted_whatever_the_budget():
    strict = [budget(maxUnavailable=0)]
    for p in (pod("p", phase="Pending"), pod("p", phase="Succeeded"), pod("p", deleting=True)):
        check_eviction(p, strict, [p])


def test_two_budgets_for_one_pod_is_the_servers_500():
    p = pod("p")
    with pytest.raises(ApiError) as refused:
        check_eviction(p, [budget("one", minAvailable=0), budget("two", minAvailable=0)], [p])
    assert refused.value.code == 500
