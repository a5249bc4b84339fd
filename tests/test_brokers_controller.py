"""The controller's broker part: which events enqueue which keys (a recording dispatcher; no
watch runs), and what the mirror keeps."""

from __future__ import annotations

import copy

import pytest

from agent.brokers.controller import BrokerController
from agent.brokers.models import Broker
from agent.models import Configuration, Instance

pytestmark = pytest.mark.django_db

NS = "default"
BROKERED = {"capacity": 2, "brokerSpec": {"brokerPodSpec": {"containers": [{"name": "b"}]}}}


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def instance(self, namespace, configuration, instance):
        self.sent.append(("instance", configuration, instance))

    def configuration(self, namespace, configuration):
        self.sent.append(("configuration", configuration))

    def level(self, namespace):
        self.sent.append(("level",))

    def stop(self):
        pass


class NoSync:
    def subscribe(self, fn):
        pass

    def unsubscribe(self, fn):
        pass


@pytest.fixture
def controller():
    from kubernetes import client

    recorder = Recorder()
    c = BrokerController(client.ApiClient(), NS, NoSync(), dispatcher=recorder)
    return c, recorder


def instance_obj(nodes=("node-a",), usage=None, uid="u1"):
    return {
        "metadata": {"name": "cams-8120fe", "uid": uid},
        "spec": {
            "configurationName": "cams",
            "shared": True,
            "nodes": list(nodes),
            "deviceUsage": usage or {},
        },
    }


def pod(phase="Pending", deleting=False, instance="cams-8120fe"):
    labels = {"akri.sh/configuration": "cams", "akri.sh/target-node": "node-a"}
    if instance:
        labels["akri.sh/instance"] = instance
    meta = {"name": "node-a-cams-8120fe-pod", "uid": "p1", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {}, "status": {"phase": phase}}


def test_an_instance_change_that_matters_to_brokers_enqueues_it_and_a_slot_change_does_not(
    controller,
):
    c, sent = controller
    Configuration.objects.create(namespace=NS, name="cams", spec=BROKERED)
    c._on_sync("instance", "cams-8120fe", instance_obj())
    c._on_sync("instance", "cams-8120fe", instance_obj(usage={"cams-8120fe-0": "node-a"}))
    c._on_sync("instance", "cams-8120fe", instance_obj(nodes=("node-a", "node-b")))
    c._on_sync("instance", "cams-8120fe", None)

    assert sent.sent == [("instance", "cams", "cams-8120fe")] * 3


def test_an_instance_of_a_configuration_without_brokers_enqueues_nothing(controller):
    c, sent = controller
    Configuration.objects.create(namespace=NS, name="cams", spec={"capacity": 2})
    c._on_sync("instance", "cams-8120fe", instance_obj())
    c._on_sync("instance", "cams-8120fe", None)
    assert sent.sent == []

    # Brokers left over from an earlier brokerSpec still need their runs (they remove them).
    Broker.objects.create(namespace=NS, kind="Pod", name="x", configuration="cams")
    c._on_sync("configuration", "", None)  # a relist: what is known is looked up afresh
    sent.sent.clear()
    c._on_sync("instance", "cams-8120fe", instance_obj(uid="u2"))
    assert sent.sent == [("instance", "cams", "cams-8120fe")]


def test_a_configuration_change_enqueues_it_and_its_instances_and_a_relist_every_one(controller):
    c, sent = controller
    Instance.objects.create(namespace=NS, name="cams-8120fe", configuration_name="cams")
    Broker.objects.create(namespace=NS, kind="Pod", name="x", configuration="gone")

    c._on_sync("configuration", "cams", {"metadata": {"name": "cams"}})
    c._on_sync("configuration", "cams", None)
    c._on_sync("configuration", "", None)

    assert sent.sent == [
        ("configuration", "cams"),
        ("instance", "cams", "cams-8120fe"),
        ("configuration", "cams"),
        ("configuration", "gone"),  # known only by its brokers: its objects must go
    ]


def test_a_broker_pod_phase_change_or_deletion_enqueues_its_instance(controller):
    c, sent = controller
    c._event("Pod", "ADDED", pod())
    c._event("Pod", "MODIFIED", pod())  # nothing new
    c._event("Pod", "MODIFIED", pod("Running"))
    c._event("Pod", "MODIFIED", pod("Running", deleting=True))
    c._event("Pod", "DELETED", pod("Running", deleting=True))

    assert sent.sent == [("instance", "cams", "cams-8120fe")] * 3
    assert not Broker.objects.exists()


def test_a_replica_pods_events_enqueue_its_configuration(controller):
    c, sent = controller
    c._event("Pod", "ADDED", pod(instance=None))
    c._event("Pod", "MODIFIED", pod("Failed", instance=None))

    assert sent.sent == [("configuration", "cams")]
    assert Broker.objects.get().phase == "Failed"


def test_a_relist_of_broker_pods_drops_rows_of_pods_gone_and_wakes_their_keys(controller):
    c, sent = controller
    Broker.objects.create(namespace=NS, kind="Pod", name="gone", configuration="cams")
    kept = copy.deepcopy(pod("Running"))

    c._relist("Pod", [kept])

    assert list(Broker.objects.values_list("name", "phase")) == [
        ("node-a-cams-8120fe-pod", "Running")
    ]
    # The replica gone during the gap wakes its Configuration, as its DELETED event would.
    assert ("configuration", "cams") in sent.sent


def test_starting_enqueues_what_the_cache_already_holds(controller):
    c, sent = controller
    Configuration.objects.create(namespace=NS, name="cams", spec=BROKERED)
    Instance.objects.create(namespace=NS, name="cams-8120fe", configuration_name="cams")
    Instance.objects.create(namespace=NS, name="plain-000001", configuration_name="plain")
    c.watchers = []  # no watch threads in this test

    c.start()

    # The Instance without brokers is left alone; the relist pass covers the Configuration.
    assert sent.sent == [("instance", "cams", "cams-8120fe"), ("configuration", "cams")]


def test_a_lookup_that_raced_a_configuration_write_is_not_kept(controller, monkeypatch):
    """``start`` looks Configurations up on its own thread while the sync's applier writes
    them. A lookup that read "no brokers" just before the applier wrote and announced the
    Configuration must not keep that answer: it did, and every later Instance of a
    Configuration with brokers was skipped (the brokers bench, 100 of them, never converged)."""
    c, sent = controller

    class RacingBroker:
        class objects:  # noqa: N801 - stands in for the model's manager
            @staticmethod
            def filter(**kwargs):
                # The applier's turn, between the lookup's two reads.
                Configuration.objects.create(namespace=NS, name="cams", spec=BROKERED)
                c._on_sync("configuration", "cams", None)
                return Broker.objects.filter(**kwargs)

    monkeypatch.setattr("agent.brokers.controller.Broker", RacingBroker)
    assert c._has_brokers("cams") is False  # what it read, before the write
    monkeypatch.undo()

    c._instance("cams-8120fe", instance_obj())

    assert ("instance", "cams", "cams-8120fe") in sent.sent


def test_a_broker_pod_first_seen_running_or_finished_enqueues_its_key(controller):
    """The pod watch can start behind the first runs (``start`` enqueues before its threads
    list): a pod first listed, or first heard of, already Running needs its Services. That
    went unheard, and the brokers bench waited on one Service until it gave up."""
    c, sent = controller
    c._relist("Pod", [pod("Running")])
    c._relist("Pod", [pod("Running")])  # nothing new
    fresh = pod()  # first seen Pending: what the run that made it expects
    fresh["metadata"]["name"] = "node-a-cams-8120fe-pod-2"
    c._event("Pod", "ADDED", fresh)
    replica = pod("Failed", instance=None)
    replica["metadata"]["name"] = "cams-replica-0"
    c._event("Pod", "ADDED", replica)

    assert sent.sent == [("instance", "cams", "cams-8120fe"), ("configuration", "cams")]
