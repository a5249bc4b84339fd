"""Broker deployment end to end: the controller's watches enqueue work, a real Celery worker
on Redis does it. Also the task's retry and serialization, and the embedded runner."""

from __future__ import annotations

import os
import uuid

import pytest
from celery import signals
from celery.contrib.testing.worker import start_worker
from django.db import connections

from agent.brokers import dispatch, tasks
from agent.controller import Controller
from agent.reconcile_cluster import pass_lock
from akri_site.celery import app, on_broker
from tests.brokers_world import BrokerWorld

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAMS = "cams-8120fe"
REDIS_URL = os.environ.get("AKRI_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"


@pytest.fixture
def world(kube, settings):
    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig, "NAMESPACE": kube.namespace}
    w = BrokerWorld(kube)
    yield w
    w.cleanup()


@pytest.fixture
def redis_broker(settings):
    # The worker re-reads the Django settings when it starts: set both places.
    settings.CELERY_BROKER_URL, settings.CELERY_TASK_ALWAYS_EAGER = REDIS_URL, False
    queue = f"test-brokers-{uuid.uuid4().hex[:8]}"  # other runs on this Redis never take ours
    # The in-thread worker's thread ends with the test: its connections must end too (a
    # worker process keeps them for reuse, which is what CONN_MAX_AGE is for).
    signals.task_postrun.connect(_close_connections, weak=False)
    with on_broker(REDIS_URL, queue):
        yield queue
    signals.task_postrun.disconnect(_close_connections)


def _close_connections(**kwargs):
    connections.close_all()


@pytest.fixture
def controller(kube, world):
    running = Controller(kube.new_client(), kube.namespace, timeout_seconds=5).start()
    yield running
    running.stop()


def test_a_real_worker_deploys_brokers_and_takes_them_away(kube, world, redis_broker, controller):
    a, b = world.node("a"), world.node("b")
    pod_a, pod_b = f"{a}-{CAMS}-pod", f"{b}-{CAMS}-pod"
    with start_worker(
        app, pool="solo", perform_ping_check=False, queues=[redis_broker], shutdown_timeout=20
    ):
        world.configuration()
        world.instance(CAMS, (a, b))
        kube.wait_for(lambda: world.pod_names() == {pod_a, pod_b}, 20, message="broker pods")
        assert world.services() == set()

        world.run(pod_a)  # the kubelet's report; no kubelet runs on a bare API server
        kube.wait_for(
            lambda: world.services() == {f"{CAMS}-svc", "cams-svc"}, 20, message="services"
        )

        world.akri.patch_instance(CAMS, [{"op": "replace", "path": "/spec/nodes", "value": [a]}])
        kube.wait_for(lambda: world.pod_names() == {pod_a}, 20, message="node b's broker gone")

        world.akri.custom.delete_namespaced_custom_object(
            "akri.sh", "v0", world.namespace, "configurations", "cams"
        )
        kube.wait_for(
            lambda: not world.pod_names() and not world.services(), 20, message="all gone"
        )


def test_a_busy_key_is_retried_after_the_run_holding_it(kube, world, redis_broker):
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    key = dispatch.instance_key(kube.namespace, "cams", CAMS)
    retried = []

    def on_retry(**kwargs):
        retried.append(kwargs.get("reason"))

    signals.task_retry.connect(on_retry, weak=False)
    try:
        with start_worker(
            app, pool="solo", perform_ping_check=False, queues=[redis_broker], shutdown_timeout=20
        ):
            with pass_lock(f"brokers:{key}", REDIS_URL) as got:
                assert got
                tasks.run_brokers.apply_async(kwargs={"key": key}, queue=redis_broker)
                kube.wait_for(lambda: retried, 20, message="the task to meet the lock")
                assert world.pod_names() == set()
            kube.wait_for(lambda: world.pod_names() == {f"{a}-{CAMS}-pod"}, 20, message="pod")
    finally:
        signals.task_retry.disconnect(on_retry)


def test_an_api_error_is_retried_with_backoff(kube, world, apiserver):
    if kube.real:
        pytest.skip("injects API-server faults: the simulator's test hook")
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    apiserver.inject_fault("POST", r"/pods$", status=500, times=2)
    key = dispatch.instance_key(kube.namespace, "cams", CAMS)

    runner = dispatch.LocalRunner(dispatch.run_key).start()
    try:
        runner.put(key)
        kube.wait_for(lambda: world.pod_names() == {f"{a}-{CAMS}-pod"}, 20, message="pod")
    finally:
        runner.stop()
    assert runner._retries.get(key) is None  # succeeded in the end


def test_events_for_one_key_collapse_into_one_waiting_task(kube, redis_broker):
    sent = []
    real = tasks.run_brokers.apply_async
    tasks.run_brokers.apply_async = lambda **kw: sent.append(kw)
    key = dispatch.configuration_key(kube.namespace, f"c-{uuid.uuid4().hex[:6]}")
    try:
        d = dispatch.Dispatcher(app)
        for _ in range(5):
            d.send(key)
        dispatch.clear_pending(REDIS_URL, key)  # the task started: the next event counts
        d.send(key)
    finally:
        tasks.run_brokers.apply_async = real
    assert sent == [{"kwargs": {"key": key}}] * 2
