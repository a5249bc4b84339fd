"""Background work through a database outage (issue 28): every Celery task and every thread of
queue charges and broker deployment retries, backing off, and does its work once the database
(or the API server) is back.

The outage is forced where the driver would report it: the first statements that touch one
table, from any thread but the test's own, raise ``OperationalError("sorry, too many clients
already")``, PostgreSQL's answer when it is out of connections; so it happens on SQLite and
PostgreSQL alike. Tasks run on a real Celery worker (in a thread, on the test Redis), so their
retries are Celery's own, with countdowns.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from celery import signals
from celery.contrib.testing.worker import start_worker
from django.db import OperationalError, connections
from django.db.backends.utils import CursorWrapper
from django.db.models import Model
from django.utils import timezone
from kubernetes import client
from kubernetes.client.rest import ApiException

from agent.brokers import dispatch
from agent.brokers import tasks as broker_tasks
from agent.brokers.models import BrokerAction, ConfigurationBrokers
from agent.controller import Controller
from agent.kube.client import AkriApi
from agent.kube.watch import CacheSync
from agent.models import Slot
from agent.queues import cache as queue_cache
from agent.queues import tasks as queue_tasks
from agent.queues import watch as queue_watch
from agent.queues.fastpath import RefusalWriter
from agent.queues.models import Charge, InstanceLabels, QueueSystem, Refusal
from agent.queues.review import Request
from agent.queues.watch import Debouncer, QueueWatch
from agent.retrying import ApiAway, Backoff
from akri_site.celery import app, on_broker
from tests.brokers_world import BrokerWorld
from tests.queues_world import LABEL, crd_body, held_instance, pod_body

pytestmark = [pytest.mark.django_db(transaction=True)]

REDIS_URL = os.environ.get("AKRI_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
TOO_MANY = "sorry, too many clients already"


class DatabaseAway:
    """The first ``times`` statements on ``model``'s table from threads other than the test's
    fail as they do when PostgreSQL is out of connections; the rest go through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, model: type[Model], times: int) -> None:
        self.table = f'"{model._meta.db_table}"'
        self.left, self.failed = times, 0
        self._lock = threading.Lock()
        self._test_thread = threading.current_thread()
        execute, executemany = CursorWrapper.execute, CursorWrapper.executemany

        def failing_execute(cursor: CursorWrapper, sql: str, params: Any = None) -> Any:
            self._maybe_fail(sql)
            return execute(cursor, sql, params)

        def failing_executemany(cursor: CursorWrapper, sql: str, param_list: Any) -> Any:
            self._maybe_fail(sql)
            return executemany(cursor, sql, param_list)

        monkeypatch.setattr(CursorWrapper, "execute", failing_execute)
        monkeypatch.setattr(CursorWrapper, "executemany", failing_executemany)

    def _maybe_fail(self, sql: str) -> None:
        if threading.current_thread() is self._test_thread or self.table not in str(sql):
            return
        with self._lock:
            if self.left <= 0:
                return
            self.left -= 1
            self.failed += 1
        raise OperationalError(TOO_MANY)


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.01)


@pytest.fixture
def fast(settings):
    settings.AKRI_QUEUES = {
        **settings.AKRI_QUEUES,
        "DEBOUNCE_SECONDS": 0.05,
        "CRD_RECHECK_SECONDS": 0.2,
        "FULL_MIN_SECONDS": 0.5,
    }
    return settings


@pytest.fixture
def worker(settings, kube):
    """A real Celery worker in a thread, on a queue of this test's own on the test Redis; the
    retries it makes, by task name."""
    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig, "NAMESPACE": kube.namespace}
    settings.CELERY_BROKER_URL, settings.CELERY_TASK_ALWAYS_EAGER = REDIS_URL, False
    queue = f"test-outage-{uuid.uuid4().hex[:8]}"
    retries: list[str] = []

    def on_retry(sender: Any = None, **kwargs: Any) -> None:
        retries.append(sender.name)

    def close_connections(**kwargs: Any) -> None:
        connections.close_all()  # the worker's thread ends with the test: so do its connections

    signals.task_retry.connect(on_retry, weak=False)
    signals.task_postrun.connect(close_connections, weak=False)
    try:
        with (
            on_broker(REDIS_URL, queue),
            start_worker(
                app, pool="solo", perform_ping_check=False, queues=[queue], shutdown_timeout=20
            ),
        ):
            yield retries
    finally:
        signals.task_retry.disconnect(on_retry)
        signals.task_postrun.disconnect(close_connections)
        with contextlib.suppress(Exception):
            import redis

            redis.Redis.from_url(REDIS_URL).delete(
                queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"
            )


def cached_instance(kube, name: str, holders: int = 1) -> AkriApi:
    """An Instance held through node-a's plugin, in the API server and in the cache."""
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_instance(held_instance(name, "cam", holders=holders))
    sync = CacheSync(kube.new_client(), kube.namespace, owner="test", timeout_seconds=5).start()
    try:
        assert sync.wait_synced()
        kube.wait_for(lambda: Slot.objects.filter(key=f"{name}-0", value="node-a").exists())
    finally:
        sync.stop()
    return api


# --- Celery tasks ----------------------------------------------------------------------------
def test_every_task_retries_when_the_database_or_the_api_server_is_away():
    app.loader.import_default_modules()  # every app's tasks module, as a worker loads them
    ours = {name: task for name, task in app.tasks.items() if name.startswith("agent.")}

    assert {
        "agent.tasks.reconcile_cluster",
        "agent.queues.tasks.recompute_charges",
        "agent.brokers.tasks.level_pass",
        "agent.brokers.tasks.run_brokers",
    } <= set(ours)
    for name, task in ours.items():
        assert OperationalError in task.autoretry_for, name
        assert ApiAway in task.autoretry_for, name
        assert task.retry_backoff and task.max_retries, name  # backing off, and bounded


@pytest.mark.kube
def test_recompute_charges_is_retried_through_a_database_outage(kube, fast, worker, monkeypatch):
    cached_instance(kube, "cam-aaaaaa")
    away = DatabaseAway(monkeypatch, Charge, times=2)

    queue_tasks.recompute_charges.apply_async(kwargs={"keys": None})

    row = kube.wait_for(
        lambda: Charge.objects.filter(kind="instance", name="cam-aaaaaa").first(),
        timeout=30,
        message="the charge stored once the database is back",
    )
    assert (row.source, row.uncharged) == ("no-queue", 1)
    assert away.failed == 2
    assert worker.count("agent.queues.tasks.recompute_charges") == 2


@pytest.mark.kube
def test_recompute_charges_is_retried_when_the_api_server_fails_a_label_write(
    kube, apiserver, fast, worker
):
    if kube.real:
        pytest.skip("injects API-server faults: the simulator's test hook")
    api = cached_instance(kube, "cam-bbbbbb")
    pod = client.CoreV1Api(kube.api_client).create_namespaced_pod(
        kube.namespace, pod_body("cam-user", "team-a", resource="akri.sh/cam-bbbbbb")
    )
    queue_cache.apply_pod("ADDED", kube.api_client.sanitize_for_serialization(pod))
    Slot.objects.filter(key="cam-bbbbbb-0").update(
        pod_namespace=kube.namespace, pod_name="cam-user", pod_uid=pod.metadata.uid
    )
    apiserver.inject_fault("PATCH", r"/instances/cam-bbbbbb$", status=503, times=2)

    queue_tasks.recompute_charges.apply_async(kwargs={"keys": None})

    kube.wait_for(
        lambda: (api.get_instance("cam-bbbbbb")["metadata"].get("labels") or {}).get(LABEL),
        timeout=30,
        message="the owner label written by a retry",
    )
    assert api.get_instance("cam-bbbbbb")["metadata"]["labels"][LABEL] == "team-a"
    assert worker.count("agent.queues.tasks.recompute_charges") == 2
    row = kube.wait_for(lambda: Charge.objects.filter(name="cam-bbbbbb", source="label").first())
    assert (row.owner, row.charged) == ("team-a", 1)


@pytest.mark.kube
def test_the_broker_level_pass_is_retried_through_a_database_outage(
    kube, worker, settings, monkeypatch
):
    settings.AKRI = {**settings.AKRI, "RUN_RETENTION_HOURS": 1}
    old = BrokerAction.objects.create(
        namespace=kube.namespace, configuration="cams", kind="pod", name="p", action="created"
    )
    BrokerAction.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(hours=2))
    away = DatabaseAway(monkeypatch, BrokerAction, times=2)

    broker_tasks.level_pass.apply_async()

    kube.wait_for(
        lambda: not BrokerAction.objects.filter(pk=old.pk).exists(),
        timeout=30,
        message="old broker history pruned once the database is back",
    )
    assert away.failed == 2
    assert worker.count("agent.brokers.tasks.level_pass") == 2


@pytest.mark.kube
def test_a_broker_run_is_retried_through_a_database_outage(kube, worker, monkeypatch):
    world = BrokerWorld(kube)
    try:
        a = world.node("a")
        world.configuration()
        world.instance("cams-8120fe", (a,))
        away = DatabaseAway(monkeypatch, ConfigurationBrokers, times=2)

        broker_tasks.run_brokers.apply_async(
            kwargs={"key": dispatch.instance_key(kube.namespace, "cams", "cams-8120fe")}
        )

        kube.wait_for(
            lambda: world.pod_names() == {f"{a}-cams-8120fe-pod"},
            timeout=30,
            message="the broker pod deployed once the database is back",
        )
        assert away.failed == 2
        assert worker.count("agent.brokers.tasks.run_brokers") == 2
    finally:
        world.cleanup()


# --- the controller's queue probe --------------------------------------------------------------
KAI_CRD = crd_body("scheduling.run.ai", "v2", "queues", "Queue", "Cluster")


@pytest.mark.kube
def test_the_queue_probe_outlives_a_database_outage_and_watches_a_crd_made_later(
    kube, fast, monkeypatch
):
    ext = client.ApiextensionsV1Api(kube.api_client)
    with contextlib.suppress(ApiException):  # a CRD another test left behind
        ext.delete_custom_resource_definition(KAI_CRD["metadata"]["name"])
    monkeypatch.setattr(queue_watch, "PROBE_RETRY_SECONDS", 0.05)
    away = DatabaseAway(monkeypatch, QueueSystem, times=5)
    watch = QueueWatch(kube.new_client(), fire=lambda keys: None, timeout_seconds=5).start()
    try:
        kube.wait_for(lambda: away.failed == 5, message="the probe meeting the outage")
        kube.wait_for(
            lambda: QueueSystem.objects.filter(kind="kai-queue", present=False).exists(),
            message="the probe's pass done once the database is back",
        )
        probe = next(t for t in watch._threads if t.name == "queues-probe")
        assert probe.is_alive()

        ext.create_custom_resource_definition(KAI_CRD)

        kube.wait_for(lambda: watch.present("kai-queue"), timeout=30, message="a KAI watcher")
        kube.wait_for(
            lambda: QueueSystem.objects.filter(kind="kai-queue", present=True).exists(),
            message="the KAI Queue CRD recorded",
        )
    finally:
        watch.stop()
        with contextlib.suppress(ApiException):
            ext.delete_custom_resource_definition(KAI_CRD["metadata"]["name"])
    assert not any(t.is_alive() for t in watch._threads)


# --- the charge debouncer --------------------------------------------------------------------
def test_the_debouncer_keeps_keys_until_they_are_fired_and_backs_off_between_tries():
    fired: list[list[str] | None] = []
    failures = [OperationalError(TOO_MANY)] * 3

    def fire(keys: list[str] | None) -> None:
        if failures:
            debouncer.mark({"late"})  # marked while a try is under way
            raise failures.pop()
        fired.append(keys)

    debouncer = Debouncer(fire, 0.01, retry=Backoff(first=0.02, cap=0.1))
    try:
        started = time.monotonic()
        debouncer.mark({"a", "b"})

        wait_until(lambda: fired, what="the keys fired after the outage")
        took = time.monotonic() - started
    finally:
        debouncer.stop()

    assert fired == [["a", "b", "late"]]
    assert debouncer.failures == 3
    assert took >= 0.01 + 3 * 0.01  # each retry waited at least half its backoff


def test_a_full_recompute_that_fails_is_tried_again():
    fired: list[list[str] | None] = []
    failures = [OperationalError(TOO_MANY)]

    def fire(keys: list[str] | None) -> None:
        if failures:
            raise failures.pop()
        fired.append(keys)

    debouncer = Debouncer(fire, 0.01, full_every=60, retry=Backoff(first=0.02, cap=0.1))
    try:
        debouncer.mark(None)
        wait_until(lambda: fired, what="the full recompute after the outage")
    finally:
        debouncer.stop()
    assert fired == [None]


def test_the_instance_labels_of_a_failed_flush_are_written_by_its_retry(fast, monkeypatch):
    away = DatabaseAway(monkeypatch, InstanceLabels, times=3)
    fired: list[list[str] | None] = []
    watch = QueueWatch(client.ApiClient(), fire=fired.append)
    try:
        instance = {"metadata": {"name": "cam-cccccc", "labels": {LABEL: "team-a"}}}
        watch.instance_changed("ns", "cam-cccccc", instance)

        wait_until(lambda: fired, what="the recompute started after the outage")
    finally:
        watch.stop()
    assert fired == [["instance:ns/cam-cccccc"]]
    assert away.failed == 3
    assert InstanceLabels.objects.get(namespace="ns", name="cam-cccccc").labels == {LABEL: "team-a"}


@pytest.mark.kube
def test_the_controller_charges_an_instance_once_the_database_is_back(kube, fast, monkeypatch):
    # The embedded default: the controller's debouncer runs the recompute itself.
    away = DatabaseAway(monkeypatch, Charge, times=3)
    sync = CacheSync(kube.new_client(), kube.namespace, owner="controller", timeout_seconds=5)
    controller = Controller(kube.new_client(), kube.namespace, sync=sync, timeout_seconds=5)
    sync.start()
    controller.start()
    try:
        AkriApi(kube.api_client, kube.namespace).create_instance(
            held_instance("cam-dddddd", "cam", holders=1)
        )

        row = kube.wait_for(
            lambda: Charge.objects.filter(kind="instance", name="cam-dddddd").first(),
            timeout=30,
            message="the Instance charged after the outage",
        )
    finally:
        controller.stop()
        sync.stop()
    assert row.source == "no-queue"
    assert away.failed == 3
    assert controller.queues.debouncer.failures >= 1


# --- the webhook's refusal writer ------------------------------------------------------------
def test_refusals_are_recorded_once_the_database_is_back(monkeypatch):
    from agent.charges.admission import Verdict

    monkeypatch.setattr(RefusalWriter, "RETRY_FIRST", 0.01)
    away = DatabaseAway(monkeypatch, Refusal, times=3)
    writer = RefusalWriter()
    review = Request("uid-1", "admission.k8s.io/v1", "", "pods", "CREATE", "ns", "bob", None, None)
    pod = {"metadata": {"name": "p"}}
    try:
        writer(review, Verdict(False, "refused", claim="instance ns/cam", rule="locking"))
        writer(
            Request("uid-2", "admission.k8s.io/v1", "", "pods", "CREATE", "ns", "bob", pod, None),
            Verdict(False, "refused again", rule="opt-out"),
        )

        wait_until(lambda: Refusal.objects.count() == 2, what="both refusals recorded")
    finally:
        writer.stop()
    assert away.failed == 3
    assert writer.failures == 3
    assert not writer._thread.is_alive()
