"""Broker deployment against an API server (the simulator, or a real one): the engine's three
scopes, idempotence, ownership, refusals, and the Configuration-level strategy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from kubernetes.client.rest import ApiException

from agent.brokers import engine
from agent.brokers.models import BrokerAction, ConfigurationBrokers
from agent.brokers.specs import with_brokers
from agent.domain import brokers as rules
from tests.brokers_world import BrokerWorld
from tests.reconcile_world import configuration_body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAMS = "cams-8120fe"
MICS = "cams-a19705"


@pytest.fixture
def world(kube):
    w = BrokerWorld(kube)
    yield w
    w.cleanup()


@pytest.fixture
def api(kube):
    return engine.BrokerApi(kube.api_client, kube.namespace)


def test_an_instance_gets_a_broker_pod_per_node_and_services_once_one_runs(world, api):
    a, b = world.node("a"), world.node("b")
    world.configuration()
    world.instance(CAMS, (a, b))

    first = engine.reconcile_instance(api, "cams", CAMS)

    assert (first.created, first.error) == (2, "")
    pods = world.pods()
    assert set(pods) == {f"{a}-{CAMS}-pod", f"{b}-{CAMS}-pod"}
    pod = pods[f"{a}-{CAMS}-pod"]
    assert pod["metadata"]["labels"]["akri.sh/target-node"] == a
    assert pod["metadata"]["ownerReferences"][0]["name"] == CAMS
    assert pod["spec"]["containers"][0]["resources"]["limits"][f"akri.sh/{CAMS}"] == "1"
    assert world.services() == set()

    world.run(f"{a}-{CAMS}-pod")
    second = engine.reconcile_instance(api, "cams", CAMS)

    assert (second.created, second.needs_configuration) == (1, True)
    assert world.services() == {f"{CAMS}-svc"}
    third = engine.reconcile_configuration(api, "cams")  # what needs_configuration enqueues
    assert third.created == 1
    assert world.services() == {f"{CAMS}-svc", "cams-svc"}
    svc = world.core.read_namespaced_service(f"{CAMS}-svc", world.namespace)
    assert svc.spec.selector == {"controller": "akri.sh", "akri.sh/instance": CAMS}
    assert svc.metadata.owner_references[0].kind == "Instance"
    actions = set(BrokerAction.objects.values_list("name", "action"))
    assert (f"{a}-{CAMS}-pod", "created") in actions and ("cams-svc", "created") in actions


def test_a_second_run_writes_nothing(world, api):
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    engine.reconcile_instance(api, "cams", CAMS)
    world.run(f"{a}-{CAMS}-pod")
    engine.level_pass(api)
    writes = api.writes

    again = engine.reconcile_instance(api, "cams", CAMS)
    level = engine.level_pass(api)

    assert (again.created, again.deleted, level.created, level.deleted) == (0, 0, 0, 0)
    assert api.writes == writes


def test_a_node_that_leaves_the_instance_or_is_deleted_loses_its_broker(world, api):
    a, b = world.node("a"), world.node("b")
    world.configuration()
    world.instance(CAMS, (a, b))
    engine.reconcile_instance(api, "cams", CAMS)

    world.delete_node(b)
    run = engine.level_pass(api)

    assert run.deleted == 1
    assert world.pod_names() == {f"{a}-{CAMS}-pod"}


def test_a_deleted_instance_takes_its_brokers_and_service(world, api):
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    world.instance(MICS, (a,))
    engine.level_pass(api)
    world.run(f"{a}-{CAMS}-pod")
    engine.level_pass(api)
    assert world.services() == {f"{CAMS}-svc", "cams-svc"}

    world.akri.delete_instance(CAMS)
    run = engine.reconcile_instance(api, "cams", CAMS)

    assert run.deleted == 2
    assert world.pod_names() == {f"{a}-{MICS}-pod"}
    assert world.services() == {"cams-svc"}  # the other Instance's pod may still run


def test_a_deleted_configuration_takes_everything(world, api):
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    engine.level_pass(api)
    world.run(f"{a}-{CAMS}-pod")
    engine.level_pass(api)
    assert world.services() == {f"{CAMS}-svc", "cams-svc"}

    world.akri.custom.delete_namespaced_custom_object(
        "akri.sh", "v0", world.namespace, "configurations", "cams"
    )
    engine.reconcile_configuration(api, "cams")

    assert world.pod_names() == set() and world.services() == set()


def test_the_level_pass_brings_back_a_broker_deleted_by_hand(world, api):
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    engine.level_pass(api)
    world.core.delete_namespaced_pod(f"{a}-{CAMS}-pod", world.namespace, grace_period_seconds=0)

    run = engine.level_pass(api)

    assert run.created == 1
    assert world.pod_names() == {f"{a}-{CAMS}-pod"}


def test_a_pod_pending_too_long_is_replaced(world, api):
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    engine.level_pass(api)
    uid = world.pods()[f"{a}-{CAMS}-pod"]["metadata"]["uid"]

    early = engine.level_pass(api, now=timezone.now() + timedelta(minutes=4))
    late = engine.level_pass(api, now=timezone.now() + timedelta(minutes=6))
    after = engine.level_pass(api)

    assert (early.deleted, late.deleted, after.created) == (0, 1, 1)
    assert world.pods()[f"{a}-{CAMS}-pod"]["metadata"]["uid"] != uid


def test_a_changed_broker_properties_rolls_the_brokers(world, api):
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    engine.level_pass(api)
    uid = world.pods()[f"{a}-{CAMS}-pod"]["metadata"]["uid"]

    world.akri.patch_configuration(
        "cams", [{"op": "add", "path": "/spec/brokerProperties", "value": {"FPS": "30"}}]
    )
    rolled = engine.reconcile_instance(api, "cams", CAMS)
    remade = engine.reconcile_instance(api, "cams", CAMS)

    assert (rolled.deleted, remade.created) == (1, 1)
    assert world.pods()[f"{a}-{CAMS}-pod"]["metadata"]["uid"] != uid


def test_an_existing_broker_of_ours_is_adopted_and_a_stranger_left_alone(world, api):
    a = world.node("a")
    world.configuration()
    created = world.instance(CAMS, (a,))
    config = rules.ConfigFacts.from_object(world.akri.get_configuration("cams"))
    inst = rules.InstanceFacts.from_object(created)
    ours = rules.broker_pod(config, inst, a, rules.broker_kind(config).spec, rules.fingerprint(config))  # fmt: skip
    world.core.create_namespaced_pod(world.namespace, ours)
    world.instance(MICS, (a,))
    stranger = {
        "metadata": {"name": f"{a}-{MICS}-pod", "labels": {"app": "mine"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    world.core.create_namespaced_pod(world.namespace, stranger)

    run = engine.level_pass(api)

    assert (run.created, run.deleted) == (0, 0)
    assert any("not ours" in p for p in run.problems)
    assert world.pods()[f"{a}-{MICS}-pod"]["metadata"]["labels"] == {"app": "mine"}
    row = ConfigurationBrokers.objects.get(configuration="cams")
    assert "not ours" in row.problems and row.error == ""


def test_a_pod_the_api_server_refuses_blocks_only_its_configuration_until_it_changes(world, api):
    a = world.node("a")
    # The pod's app label, <node>-<instance>-pod, is too long for a label value (63 at most):
    # the server refuses the broker pod (Akri's names, Akri's limit).
    long = "c" * 43
    world.configuration(long)
    world.configuration("cams")
    world.instance(f"{long}-8120fe", (a,), configuration=long)
    world.instance(CAMS, (a,))

    first = engine.level_pass(api)

    assert first.created == 1 and "refused" in first.error
    assert world.pod_names() == {f"{a}-{CAMS}-pod"}
    row = ConfigurationBrokers.objects.get(configuration=long)
    assert "refused" in row.error and row.blocked_key
    writes = api.writes
    again = engine.reconcile_instance(api, long, f"{long}-8120fe")
    assert api.writes == writes and "refused" in again.error
    assert BrokerAction.objects.filter(configuration=long, action="refused").count() == 1

    world.akri.patch_configuration(
        long, [{"op": "add", "path": "/spec/brokerProperties", "value": {"X": "1"}}]
    )
    engine.reconcile_instance(api, long, f"{long}-8120fe")

    assert api.writes == writes + 1  # tried again once the Configuration changed
    assert BrokerAction.objects.filter(configuration=long, action="refused").count() == 2


def test_a_job_spec_makes_one_job_per_instance(world, api):
    a, b = world.node("a"), world.node("b")
    job = {
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "job",
                        "image": "busybox",
                        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
                    }
                ],
            }
        },
        "backoffLimit": 1,
    }
    world.configuration(brokerSpec={"brokerJobSpec": job})
    world.instance(CAMS, (a, b))

    run = engine.reconcile_instance(api, "cams", CAMS)

    assert run.created == 1
    jobs = world.batch.list_namespaced_job(world.namespace).items
    assert [j.metadata.name for j in jobs] == [f"{CAMS}-1-job"]
    assert jobs[0].spec.template.metadata.labels["akri.sh/instance"] == CAMS

    world.akri.delete_instance(CAMS)
    engine.reconcile_instance(api, "cams", CAMS)
    assert [j.metadata.name for j in world.batch.list_namespaced_job(world.namespace).items] == []


def test_the_configuration_level_strategy_runs_n_replicas(world, api):
    a = world.node("a")
    world.akri.create_configuration(_with_replicas("2"))
    world.instance(CAMS, (a,))

    run = engine.reconcile_configuration(api, "cams")

    assert run.created == 2
    pods = world.pods()
    assert set(pods) == {"cams-0-broker", "cams-1-broker"}
    limits = pods["cams-0-broker"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["akri.sh/cams"] == "1"
    assert pods["cams-0-broker"]["metadata"]["ownerReferences"][0]["kind"] == "Configuration"


def _created(pod: dict):
    return parse_datetime(pod["metadata"]["creationTimestamp"])


def test_a_configuration_level_broker_that_never_started_is_replaced_five_minutes_after_creation(
    world, api
):
    """A pod never scheduled has no startTime: its Pending grace counts from its creation (Akri
    waits for ever)."""
    world.node("a")
    world.akri.create_configuration(_with_replicas("1"))
    engine.reconcile_configuration(api, "cams")
    pod = world.pods()["cams-0-broker"]
    assert "startTime" not in (pod.get("status") or {})
    created = _created(pod)

    early = engine.reconcile_configuration(api, "cams", now=created + timedelta(minutes=4.9))
    late = engine.reconcile_configuration(api, "cams", now=created + timedelta(minutes=5.1))
    after = engine.reconcile_configuration(api, "cams")

    assert (early.deleted, late.deleted, after.created) == (0, 1, 1)
    assert world.pods()["cams-0-broker"]["metadata"]["uid"] != pod["metadata"]["uid"]
    [deleted] = BrokerAction.objects.filter(name="cams-0-broker", action="deleted")
    assert "Pending for more than 5 minutes" in deleted.detail


def test_a_broker_that_started_late_has_its_pending_grace_from_its_start(world, api):
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    engine.level_pass(api)
    name = f"{a}-{CAMS}-pod"
    created = _created(world.pods()[name])
    started = created + timedelta(minutes=3)  # scheduled late; its containers still pulling
    status = {"phase": "Pending", "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")}
    world.core.patch_namespaced_pod_status(name, world.namespace, {"status": status})

    kept = engine.level_pass(api, now=created + timedelta(minutes=6))
    late = engine.level_pass(api, now=started + timedelta(minutes=5.1))

    assert (kept.deleted, late.deleted) == (0, 1)


def _with_replicas(replicas: str) -> dict:
    body = with_brokers(configuration_body("cams"))
    body["metadata"]["annotations"] = {rules.REPLICAS: replicas}
    return body


def test_a_broker_spec_we_cannot_use_is_reported_and_blocks_only_its_configuration(
    world, api, caplog
):
    a = world.node("a")
    world.configuration("mics", brokerSpec={"brokerPodSpec": {"containers": []}})
    world.configuration("cams")
    world.instance("mics-8120fe", (a,), configuration="mics")
    world.instance(CAMS, (a,))

    with caplog.at_level("ERROR", logger="agent.brokers.engine"):
        run = engine.level_pass(api)

    assert "containers must be a non-empty list" in run.error
    assert world.pod_names() == {f"{a}-{CAMS}-pod"}
    row = ConfigurationBrokers.objects.get(configuration="mics")
    assert "containers must be a non-empty list" in row.error
    assert "mics blocked" in caplog.text
    assert not ConfigurationBrokers.objects.filter(configuration="cams").exclude(error="").exists()


def test_both_pod_and_job_specs_are_refused_by_the_crd_or_reported(world, api):
    a = world.node("a")
    both = {
        "brokerPodSpec": {"containers": [{"name": "b", "image": "nginx"}]},
        "brokerJobSpec": {"template": {"spec": {"containers": [{"name": "j", "image": "x"}]}}},
    }
    try:
        world.configuration("cams", brokerSpec=both)
    except ApiException as exc:  # the CRD's oneOf (a real server validates it)
        assert exc.status == 422 and "brokerSpec" in exc.body
        return
    world.instance(CAMS, (a,))

    run = engine.reconcile_instance(api, "cams", CAMS)

    assert "both brokerPodSpec and brokerJobSpec" in run.error
    assert world.pod_names() == set()
    assert "both" in ConfigurationBrokers.objects.get(configuration="cams").error


def test_a_recreated_configurations_service_is_re_owned_by_the_new_one(world, api):
    a = world.node("a")
    world.configuration()
    world.instance(CAMS, (a,))
    engine.level_pass(api)
    world.run(f"{a}-{CAMS}-pod")
    engine.level_pass(api)
    world.akri.custom.delete_namespaced_custom_object(
        "akri.sh", "v0", world.namespace, "configurations", "cams"
    )
    uid = world.configuration()["metadata"]["uid"]

    run = engine.reconcile_configuration(api, "cams")

    assert (run.adopted, run.error) == (1, "")
    svc = world.core.read_namespaced_service("cams-svc", world.namespace)
    assert [o.uid for o in svc.metadata.owner_references] == [uid]
