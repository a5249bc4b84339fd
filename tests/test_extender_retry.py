"""A pod the extender refused reaches room that comes free, through kube-scheduler's own queue.

The stand-in scheduler runs here with kube-scheduler's queue (``QueueRunner``): a refused pod
is retried only on a cluster event, after its backoff, or after 5 minutes. No kubelet runs,
so no node status event comes either: what moves a waiting pod is a pod's deletion, or the
extender asking again (agent.extender.retry) once its books say the pod fits.

On the real node a gpushare pod waited minutes for a card that had come free: kube-scheduler
retried it on the deletion at once, while the extender still counted the deleted pod (its
pod feed relisted every 5 s, and the pod was still assumed from its bind 30 s long), and
then nothing asked again.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from agent.extender.retry import ANNOTATION
from agent.extender.service import ExtenderService
from agent.sharing.gpu_cards import GPU_INDEX, GPU_MEMORY, GPU_NUMBER
from agent.simulator.scheduler import (
    MiniScheduler,
    QueueRunner,
    pod_body,
    register_nodes,
    unregister_nodes,
)
from tests.extender_http import put_configuration, put_instance

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

PLACED_WITHIN = 10.0  # seconds; kube-scheduler alone would wait up to 5 minutes


def wait(what: str, predicate, timeout: float = PLACED_WITHIN):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def read(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod:
    return core.read_namespaced_pod(name, namespace)


@pytest.fixture
def world(kube):
    """A node, the extender (pod feed, cache feed, retries) and the stand-in with its queue."""
    core = client.CoreV1Api(kube.api_client)
    node = f"retry-{kube.namespace}"[:60]
    registered = register_nodes(core, [node])
    service = ExtenderService(
        kube.new_client(),
        namespace=kube.namespace,
        policies=["akri-instance", "akri-configuration", "gpushare"],
        feed_interval=0.05,
        # Nodes are relisted as deploy/ runs it; pods are watched (they used to be relisted at
        # this pace too, which is what kept the freed card from the waiting pod).
        kube_interval=5.0,
    )
    yield core, node, service
    service.stop()
    unregister_nodes(core, registered)


def runner_for(kube, core, node, service, ignored=frozenset()) -> QueueRunner:
    scheduler = MiniScheduler(core, kube.namespace, service.url, {node: None}, ignored)
    return QueueRunner(scheduler).start()


def test_a_freed_gpu_card_reaches_the_waiting_pod(kube, world):
    core, node, service = world
    core.patch_node_status(node, {"status": {"capacity": {GPU_NUMBER: "2", GPU_MEMORY: "2000"}}})
    service.start()
    wait(
        "the extender sees the cards",
        lambda: dict(service.state.status(node))["gpushare"].startswith("2 cards"),
    )
    runner = runner_for(kube, core, node, service, frozenset({GPU_MEMORY, GPU_NUMBER}))
    try:
        for name in ("gpu-a", "gpu-b"):
            core.create_namespaced_pod(kube.namespace, pod_body(name, {GPU_MEMORY: 1000}))
        cards = wait(
            "gpu-a and gpu-b bound",
            lambda: (
                all(
                    (read(core, kube.namespace, n).metadata.annotations or {}).get(GPU_INDEX)
                    and read(core, kube.namespace, n).spec.node_name
                    for n in ("gpu-a", "gpu-b")
                )
                and {
                    n: read(core, kube.namespace, n).metadata.annotations[GPU_INDEX]
                    for n in ("gpu-a", "gpu-b")
                }
            ),
        )
        assert sorted(cards.values()) == ["0", "1"], cards
        waiting = core.create_namespaced_pod(kube.namespace, pod_body("gpu-c", {GPU_MEMORY: 600}))
        wait(
            "gpu-c refused and waiting in the unschedulable pool",
            lambda: runner.queue.where(waiting.metadata.uid) == "unschedulable",
        )
        assert read(core, kube.namespace, "gpu-c").spec.node_name is None

        started = time.monotonic()
        core.delete_namespaced_pod("gpu-a", kube.namespace, grace_period_seconds=0)
        wait("gpu-c bound", lambda: read(core, kube.namespace, "gpu-c").spec.node_name)
        elapsed = time.monotonic() - started
        placed = read(core, kube.namespace, "gpu-c")
        assert placed.spec.node_name == node
        assert placed.metadata.annotations[GPU_INDEX] == cards["gpu-a"], elapsed
    finally:
        runner.stop()


def test_a_configuration_the_cache_learns_late_gets_its_waiting_pod_placed(kube, world):
    """A pod asking for a Configuration-level resource the extender's cache does not know yet
    is refused as Unschedulable with the reason in words (not as an Instance this node cannot
    see, which nothing would change), and is asked about again once the cache knows it."""
    core, node, service = world
    service.start()
    runner = runner_for(kube, core, node, service, frozenset({"akri.sh/late"}))
    try:
        waiting = core.create_namespaced_pod(
            kube.namespace, pod_body("late-0", {"akri.sh/late": 1})
        )
        wait(
            "late-0 refused",
            lambda: runner.queue.where(waiting.metadata.uid) == "unschedulable",
        )
        outcome = service.extender.filter(
            {"Pod": core.api_client.sanitize_for_serialization(waiting), "NodeNames": [node]}
        )
        assert outcome["NodeNames"] == []
        assert not outcome["FailedAndUnresolvableNodes"], outcome
        reason = outcome["FailedNodes"][node]
        assert "akri.sh/late" in reason and "known to the extender yet" in reason, reason

        put_configuration(kube.namespace, "late", capacity=1, unique=True)
        put_instance(kube.namespace, "late-000001", [node])
        wait("late-0 bound", lambda: read(core, kube.namespace, "late-0").spec.node_name)
        placed = read(core, kube.namespace, "late-0")
        assert ANNOTATION in (placed.metadata.annotations or {})
    finally:
        runner.stop()
