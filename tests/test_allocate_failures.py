"""Allocate when the claim store fails: the API server answers 500, times out, or keeps
answering 409. Real gRPC to the IL and CL plugins, faults injected in the API-server simulator.

Each failure must end the same way: the kubelet is refused with Akri's wording, the API server
holds nothing for this node, the plugin advertises the slots again, and the next Allocate, with
the server healthy again, is granted.
"""

from __future__ import annotations

import grpc
import pytest
from kubernetes import client

from agent.protos import deviceplugin_pb2 as dp

from .test_agent_lifecycle import (
    CONFIG,
    FOO0,
    FOO1,
    AgentCluster,
    allocate,
    configuration_body,
    healthy,
    wait_instances,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

IL_RESOURCE = f"akri.sh/{FOO0}"
CL_RESOURCE = f"akri.sh/{CONFIG}"
FAILURES = ("500", "timeout", "conflicts")
# The claim store tries 6 times; every one of them fails.
EVERY_ATTEMPT = 6


@pytest.fixture
def cluster(kube):
    if kube.simulator is None:
        pytest.skip("fault injection needs the API-server simulator")
    started = AgentCluster(kube, nodes=("node-a",)).start()
    started.api.create_configuration(configuration_body())
    wait_instances(started, {FOO0, FOO1}, nodes=("node-a",))
    for resource in (IL_RESOURCE, f"akri.sh/{FOO1}", CL_RESOURCE):
        started["node-a"].kubelet.wait_devices(resource, lambda d: len(healthy(d)) == 2)
    yield started
    started.stop()


def fail_writes(cluster: AgentCluster, failure: str, instance: str) -> None:
    """Every claim write to ``instance`` fails as ``failure`` says."""
    sim = cluster.kube.simulator
    path = r"/instances/" + instance + "$"
    if failure == "500":
        sim.inject_fault("PATCH", path, status=500, times=EVERY_ATTEMPT)
    elif failure == "conflicts":
        sim.inject_fault("PATCH", path, status=409, reason="Conflict", times=EVERY_ATTEMPT)
    else:
        # The server applies each write after the agent stopped waiting for it: the outcome
        # of a timed-out write is unknown to the agent, and the first one did claim the slot
        # (it lands well before the agent's last attempt gives up, so the roll-back sees it;
        # one landing later still is left to the reconciler's grace period).
        # Generous figures: an undelayed request (the roll-back's) must never time out on a
        # loaded machine.
        cluster["node-a"].agent.api.request_timeout = 0.6
        sim.inject_fault("PATCH", path, status=0, delay=0.8, times=EVERY_ATTEMPT)


def heal(cluster: AgentCluster) -> None:
    cluster.kube.simulator.clear_faults()
    cluster["node-a"].agent.api.request_timeout = 10.0


def all_free(cluster: AgentCluster, *instances: str) -> bool:
    return all(v == "" for name in instances for v in cluster.usage(name).values())


def assert_refused(answer: object) -> grpc.RpcError:
    assert isinstance(answer, grpc.RpcError), answer
    assert answer.code() == grpc.StatusCode.UNKNOWN
    assert answer.details().startswith("Unable to claim slot"), answer.details()
    return answer


@pytest.mark.parametrize("failure", FAILURES)
def test_an_il_allocate_whose_claim_fails_is_refused_and_leaves_the_slot_free(cluster, failure):
    kubelet = cluster["node-a"].kubelet
    slot = f"{FOO0}-0"
    fail_writes(cluster, failure, FOO0)

    answer = allocate(kubelet, IL_RESOURCE, [slot])

    assert f"Unable to claim slot {slot}" in assert_refused(answer).details()
    heal(cluster)
    cluster.wait_for(lambda: all_free(cluster, FOO0), timeout=20, message="the slot free again")
    if failure != "timeout":  # a timed-out write did happen, and was rolled back
        assert cluster.events(instance=FOO0) == []
    kubelet.wait_devices(IL_RESOURCE, lambda d: len(healthy(d)) == 2)
    again = allocate(kubelet, IL_RESOURCE, [slot])
    assert isinstance(again, dp.AllocateResponse), again
    assert cluster.usage(FOO0) == {slot: "node-a", f"{FOO0}-1": ""}


@pytest.mark.parametrize("failure", FAILURES)
def test_an_il_allocate_rolls_back_the_slots_it_claimed_before_one_failed(cluster, failure):
    kubelet = cluster["node-a"].kubelet
    first, second = f"{FOO0}-0", f"{FOO0}-1"
    # The first claim goes through; every write after it fails.
    sim = cluster.kube.simulator
    sim.inject_fault("PATCH", r"/instances/" + FOO0 + "$", status=0, times=1)
    fail_writes(cluster, failure, FOO0)

    answer = allocate(kubelet, IL_RESOURCE, [first, second])

    assert f"Unable to claim slot {second}" in assert_refused(answer).details()
    heal(cluster)
    cluster.wait_for(lambda: all_free(cluster, FOO0), timeout=20, message="both slots free")
    kubelet.wait_devices(IL_RESOURCE, lambda d: len(healthy(d)) == 2)
    again = allocate(kubelet, IL_RESOURCE, [first, second])
    assert isinstance(again, dp.AllocateResponse), again
    assert cluster.usage(FOO0) == {first: "node-a", second: "node-a"}


@pytest.mark.parametrize("failure", FAILURES)
def test_a_cl_allocate_whose_claim_fails_is_refused_and_claims_nothing(cluster, failure):
    kubelet = cluster["node-a"].kubelet
    # Two unique devices: one slot of each Instance; only FOO1's writes fail, so the claim
    # on FOO0 stands until the refusal rolls it back.
    fail_writes(cluster, failure, FOO1)

    answer = allocate(kubelet, CL_RESOURCE, [f"{CONFIG}-0", f"{CONFIG}-1"])

    assert f"of Instance {FOO1}" in assert_refused(answer).details() or FOO1 in answer.details()
    heal(cluster)
    cluster.wait_for(
        lambda: all_free(cluster, FOO0, FOO1), timeout=20, message="every slot free again"
    )
    kubelet.wait_devices(CL_RESOURCE, lambda d: len(healthy(d)) == 2)
    again = allocate(kubelet, CL_RESOURCE, [f"{CONFIG}-0", f"{CONFIG}-1"])
    assert isinstance(again, dp.AllocateResponse), again
    held = [v for name in (FOO0, FOO1) for v in cluster.usage(name).values() if v]
    assert sorted(held) == [f"C:{CONFIG}-0:node-a", f"C:{CONFIG}-1:node-a"]


def test_an_il_allocate_while_a_required_webhook_is_down_is_refused_after_one_write(cluster):
    """Under failurePolicy Fail a webhook that cannot be called makes the API server answer
    500 "failed calling webhook": no write was made and asking again waits out the webhook's
    timeout again, so the claim is not retried (six attempts of a 5 s timeout kept the kubelet
    half a minute). Through the simulator's admission chain."""
    from tests.admission import CONFIGS, free_port

    kubelet = cluster["node-a"].kubelet
    slot = f"{FOO0}-0"
    writes = slot_writes(cluster, slot)
    hook = {
        "name": "slots.example.test",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 5,
        "clientConfig": {"url": f"https://127.0.0.1:{free_port()}/"},  # nothing listens
        "rules": [{"apiGroups": ["akri.sh"], "apiVersions": ["*"], "operations": ["UPDATE"],
                   "resources": ["instances"], "scope": "Namespaced"}],
    }  # fmt: skip
    body = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "slots-down"},
        "webhooks": [hook],
    }
    custom = client.CustomObjectsApi(cluster.kube.api_client)
    custom.create_cluster_custom_object(*CONFIGS, body)
    cluster.kube.simulator.admission.calls.clear()
    try:
        answer = allocate(kubelet, IL_RESOURCE, [slot])
    finally:
        custom.delete_cluster_custom_object(*CONFIGS, "slots-down")

    details = assert_refused(answer).details()
    assert f"Unable to claim slot {slot}" in details
    assert 'failed calling webhook "slots.example.test"' in details
    assert "not retried" in details
    assert len(writes) == 1, writes
    # Called by the API server, and failed (other writes of the agent may be asked too).
    calls = list(cluster.kube.simulator.admission.calls)
    assert ("slots.example.test", "UPDATE", "instances", FOO0, "failed") in calls
    assert cluster.usage(FOO0) == {slot: "", f"{FOO0}-1": ""}
    assert cluster.events(instance=FOO0) == []
    again = allocate(kubelet, IL_RESOURCE, [slot])
    assert isinstance(again, dp.AllocateResponse), again
    assert cluster.usage(FOO0) == {slot: "node-a", f"{FOO0}-1": ""}


def slot_writes(cluster: AgentCluster, slot: str) -> list[list]:
    """The agent's patches that write ``slot`` (its claim store's attempts), kept in a list."""
    api = cluster["node-a"].agent.claims.api
    patch, sent = api.patch_instance, []

    def counted(name, ops, *args, **kwargs):
        if any(op.get("path") == f"/spec/deviceUsage/{slot}" for op in ops):
            sent.append(ops)
        return patch(name, ops, *args, **kwargs)

    api.patch_instance = counted
    return sent
