"""Cordon and drain on the real node (issue 33). Opt-in, as tests/test_real_node.py:

    AKRI_TEST_REAL_NODE=1 python -m pytest -q -s tests/test_real_node_cordon.py     # as root

The agent runs as in tests/test_real_node.py (its ``real`` fixture); the operator's commands
(``manage.py cordon``, ``drain``, ``uncordon``) run as an operator runs them, with the admin
kubeconfig and a database of their own for the audit. What is shown here with the real kubelet
and kube-scheduler: a cordoned Instance's free slots leave the node's allocatable while its
held slot stays held, so a pod asking for it stays Pending with the scheduler's reason and a
Configuration-level pod lands on the other Instance (after a drain, the freed slot goes to no
pod either); a kubelet restart (every plugin registering again) keeps it; a drain
is blocked by a PodDisruptionBudget and says so, then evicts the holder once the budget allows,
and its slot comes free; uncordon lets the waiting pod in.
"""

from __future__ import annotations

import time

import pytest

from tests import realnode as rn
from tests import test_real_node as e2e
from tests.test_real_node import ENABLED, REASON, figure, held, make_configuration

# The real node and a namespace per test, as tests/test_real_node.py makes them.
real = e2e.real
ns = e2e.ns

pytestmark = [pytest.mark.skipif(not ENABLED, reason=REASON), pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def operator_env(real, tmp_path_factory):
    """The environment an operator's ``manage.py`` runs in: the admin kubeconfig, Akri's
    namespace, and a migrated SQLite file for the audit rows."""
    db = tmp_path_factory.mktemp("operator") / "operator.sqlite3"
    env = rn.base_env(real.kubeconfig, AKRI_NAMESPACE=rn.AKRI_NAMESPACE, AKRI_SQLITE_PATH=str(db))
    rn.run([rn.PYTHON, "manage.py", "migrate", "--noinput", "-v0"], env=env, timeout=300)
    return env


def manage(env: dict, *args: str, check: bool = True):
    return rn.run([rn.PYTHON, "manage.py", *args], env=env, timeout=180, check=check)


def pending_reason(real, ns: str, pod: str) -> str:
    found = real.core.read_namespaced_pod(pod, ns)
    if found.status.phase != "Pending" or found.spec.node_name:
        return ""
    for condition in found.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition.message or ""
    return ""


def test_cordon_holds_new_pods_off_keeps_held_slots_and_drain_honours_budgets(
    real, ns, operator_env
):
    config = "akri-e2e-cordon"
    instances = make_configuration(real, config, ["cam0", "cam1"], capacity=2)
    cordoned, other = instances
    resource = f"akri.sh/{cordoned}"
    try:
        real.core.create_namespaced_pod(
            ns, rn.device_pod("holder", resource, labels={"app": "holder"})
        )
        real.wait_running(ns, "holder")
        holder_slots = [k for k, v in held(real.usage(config)).items() if k.startswith(cordoned)]
        assert len(holder_slots) == 1

        t0 = time.monotonic()
        out = manage(
            operator_env, "cordon", cordoned, "--reason", "replacing lens", "--user", "e2e"
        )
        assert f"{cordoned}: " in out.stdout, out.stdout
        # The free slot goes Unhealthy: allocatable keeps the held one only (requests 1).
        rn.wait_for(f"{resource} allocatable 1", lambda: real.allocatable(resource) == 1, 60, 0.1)
        figure("cordon to the node's allocatable dropping", time.monotonic() - t0)
        assert held(real.usage(config)).keys() >= set(holder_slots)

        # A pod asking for the cordoned Instance waits, with the scheduler's reason.
        real.core.create_namespaced_pod(ns, rn.device_pod("waiting", resource))
        reason, _ = rn.wait_for(
            "waiting Pending with a reason",
            lambda: pending_reason(real, ns, "waiting"),
            60,
            0.2,
        )
        assert f"Insufficient {resource}" in reason, reason
        # A Configuration-level pod lands on the other Instance.
        real.core.create_namespaced_pod(ns, rn.device_pod("cl", f"akri.sh/{config}"))
        real.wait_running(ns, "cl")
        cl_slots = [k for k, v in held(real.usage(config)).items() if v.startswith("C:")]
        assert len(cl_slots) == 1 and cl_slots[0].startswith(other), real.usage(config)

        # A kubelet restart: every plugin registers again and reports the cordon again.
        t0 = time.monotonic()
        real.node_control.restart_kubelet()
        # Until the plugins register again the node has no healthy device of the resource;
        # then the held one is back and the free one is Unhealthy still.
        rn.wait_for(
            f"{resource} allocatable 1 again", lambda: real.allocatable(resource) == 1, 90, 0.2
        )
        figure("kubelet restart to the cordoned allocatable back", time.monotonic() - t0)
        time.sleep(3)
        assert real.allocatable(resource) == 1
        assert pending_reason(real, ns, "waiting")
        assert real.phase(ns, "holder") == "Running"

        # A budget that allows no disruption blocks the drain, which says so.
        from kubernetes import client

        policy = client.PolicyV1Api(real.api_client)
        policy.create_namespaced_pod_disruption_budget(
            ns,
            {
                "metadata": {"name": "keep-holder"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "holder"}}},
            },
        )
        rn.wait_for(
            "the budget's status",
            lambda: (
                policy.read_namespaced_pod_disruption_budget(
                    "keep-holder", ns
                ).status.observed_generation
            ),
            60,
            0.2,
        )
        preview = manage(operator_env, "drain", cordoned, "--dry-run")
        assert f"{ns}/holder" in preview.stdout and "budget" in preview.stdout, preview.stdout
        blocked = manage(
            operator_env, "drain", cordoned, "--reason", "lens", "--timeout", "20", check=False
        )
        assert blocked.returncode != 0 and "blocked by a budget" in blocked.stdout, blocked
        assert real.phase(ns, "holder") == "Running"

        policy.delete_namespaced_pod_disruption_budget("keep-holder", ns)
        t0 = time.monotonic()
        drained = manage(operator_env, "drain", cordoned, "--reason", "lens", "--grace", "1")
        assert "evicted" in drained.stdout, drained.stdout
        rn.wait_for(
            "the holder's slot free",
            lambda: not any(k.startswith(cordoned) for k in held(real.usage(config))),
            60,
            0.05,
        )
        figure("drain to the holder's slot free", time.monotonic() - t0)
        # Still cordoned: the freed slot goes to nobody. kube-scheduler alone (no extender
        # here) counts the node's allocatable, which still has the drained pod's device until
        # the kubelet's next status update (10 s): it may bind the waiting pod in between, and
        # the kubelet then refuses it at admission, since the device is Unhealthy. Either way
        # no pod gets the slot; with the extender the reason is given before any bind.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert real.phase(ns, "waiting") != "Running"
            assert not any(k.startswith(cordoned) for k in held(real.usage(config)))
            time.sleep(0.5)
        waiting = real.core.read_namespaced_pod("waiting", ns)
        rn.log(f"after the drain, waiting: {waiting.status.phase} {waiting.status.reason or ''}")
        if waiting.status.phase == "Failed":
            assert waiting.status.reason == "UnexpectedAdmissionError", waiting.status
            real.core.create_namespaced_pod(ns, rn.device_pod("waiting-2", resource))
            waiter = "waiting-2"
        else:
            assert pending_reason(real, ns, "waiting")
            waiter = "waiting"
        assert real.allocatable(resource) == 0

        t0 = time.monotonic()
        manage(operator_env, "uncordon", cordoned, "--user", "e2e")
        real.wait_running(ns, waiter, timeout=120)
        figure("uncordon to the waiting pod Running", time.monotonic() - t0)
    finally:
        real.delete_configuration(config)
