"""Akri's broker rules (agent.domain.brokers): names, bodies, the plan, and a property test of
the level pass against a model cluster with failing writes and arbitrary interleavings."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.domain import brokers as rules
from agent.domain.brokers import (
    BrokerSpecError,
    ConfigFacts,
    Found,
    InstanceFacts,
    broker_kind,
    plan,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
POD_SPEC = {
    "containers": [
        {
            "name": "broker",
            "image": "nginx",
            "resources": {"limits": {"{{PLACEHOLDER}}": "1"}, "requests": {"{{PLACEHOLDER}}": "1"}},
        }
    ],
    "initContainers": [
        {"name": "init", "image": "busybox", "resources": {"limits": {"{{PLACEHOLDER}}": "1"}}}
    ],
}
SERVICE_SPEC = {"ports": [{"name": "grpc", "port": 80, "targetPort": 8083}], "type": "ClusterIP"}


def config(name="cams", broker=None, *, uid="cfg-uid", generation=1, annotations=None, **spec):
    body = {"capacity": 2, **spec}
    if broker is not None:
        body["brokerSpec"] = broker
    return ConfigFacts(name, uid, generation, body, annotations or {})


def pod_config(**kwargs):
    return config(
        broker={"brokerPodSpec": POD_SPEC},
        instanceServiceSpec=SERVICE_SPEC,
        configurationServiceSpec=SERVICE_SPEC,
        **kwargs,
    )


def instance(name="cams-8120fe", nodes=("node-a",), shared=True, uid=None, deleting=False):
    return InstanceFacts(name, uid or f"{name}-uid", "cams", shared, tuple(nodes), deleting)


def found_of(body, uid="u", **status):
    return rules.found_from_body(body, uid, **status)


def names(bodies):
    return sorted(b["metadata"]["name"] for b in bodies)


# --- names and bodies -----------------------------------------------------------------------
def test_names_follow_akri():
    assert rules.pod_name("instance.name", "node", True) == "node-instance-name-pod"
    assert rules.pod_name("instance.name", "node", False) == "instance-name-pod"
    assert rules.pod_name("1-0-0-1", "node", True) == "node-1-0-0-1-pod"
    assert rules.job_name("cams-8120fe", 3) == "cams-8120fe-3-job"
    assert rules.instance_service_name("cams.8120fe") == "cams-8120fe-svc"
    assert rules.configuration_service_name("cams") == "cams-svc"


def test_a_broker_pod_has_akris_labels_owner_affinity_and_resource():
    c, i = pod_config(), instance()
    body = rules.broker_pod(c, i, "node-a", POD_SPEC, rules.fingerprint(c))

    meta = body["metadata"]
    assert meta["name"] == "node-a-cams-8120fe-pod"
    assert meta["labels"] == {
        "app": "node-a-cams-8120fe-pod",
        "controller": "akri.sh",
        "akri.sh/configuration": "cams",
        "akri.sh/instance": "cams-8120fe",
        "akri.sh/target-node": "node-a",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "akri.sh/v0",
            "kind": "Instance",
            "name": "cams-8120fe",
            "uid": "cams-8120fe-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    terms = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
    ]
    broker, init = body["spec"]["containers"][0], body["spec"]["initContainers"][0]
    assert broker["resources"] == {
        "limits": {"akri.sh/cams-8120fe": "1"},
        "requests": {"akri.sh/cams-8120fe": "1"},
    }
    assert init["resources"]["limits"] == {"akri.sh/cams-8120fe": "1"}
    assert POD_SPEC["containers"][0]["resources"]["limits"] == {"{{PLACEHOLDER}}": "1"}


def test_an_existing_affinity_term_is_kept_and_ours_appended():
    spec = {
        **POD_SPEC,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [{"key": "x", "operator": "In"}]}]
                }
            }
        },
    }
    body = rules.broker_pod(pod_config(), instance(), "node-a", spec, "f")

    terms = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [t["matchFields"][0]["key"] for t in terms] == ["x", "metadata.name"]
    assert len(spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]) == 1  # fmt: skip


def test_a_job_has_akris_name_labels_and_template_labels():
    job_spec = {"template": {"spec": POD_SPEC}, "backoffLimit": 2}
    c = config(broker={"brokerJobSpec": job_spec}, generation=4)
    body = rules.broker_job(c, instance(), job_spec, "f")

    assert body["metadata"]["name"] == "cams-8120fe-4-job"
    assert body["metadata"]["labels"] == {
        "akri.sh/configuration": "cams",
        "akri.sh/instance": "cams-8120fe",
        "app": "cams-8120fe-4-job",
        "controller": "akri.sh",
    }
    assert body["spec"]["template"]["metadata"]["labels"] == {
        "akri.sh/configuration": "cams",
        "akri.sh/instance": "cams-8120fe",
    }
    assert "affinity" not in body["spec"]["template"]["spec"]
    assert body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "akri.sh/cams-8120fe": "1"
    }


def test_services_select_akris_labels_and_are_owned_by_their_object():
    c, i = pod_config(), instance()
    svc = rules.instance_service(c, i)
    conf_svc = rules.configuration_service(c)

    assert svc["metadata"]["name"] == "cams-8120fe-svc"
    assert svc["spec"]["selector"] == {"controller": "akri.sh", "akri.sh/instance": "cams-8120fe"}
    assert svc["metadata"]["labels"]["app"] == "cams-8120fe-svc"
    assert svc["metadata"]["ownerReferences"][0]["kind"] == "Instance"
    assert conf_svc["metadata"]["name"] == "cams-svc"
    assert conf_svc["spec"]["selector"] == {
        "controller": "akri.sh",
        "akri.sh/configuration": "cams",
    }
    assert conf_svc["metadata"]["ownerReferences"][0]["uid"] == "cfg-uid"


# --- the broker spec ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "broker, message",
    [
        ({"brokerPodSpec": POD_SPEC, "brokerJobSpec": {"template": {"spec": POD_SPEC}}}, "both"),
        ({"brokerPodSpec": {"containers": []}}, "non-empty"),
        ({"brokerPodSpec": "nginx"}, "must be an object"),
        ({"brokerJobSpec": {"template": "x"}}, "template"),
        ("pod", "brokerSpec must be an object"),
    ],
)
def test_an_unusable_broker_spec_is_an_error(broker, message):
    with pytest.raises(BrokerSpecError, match=message):
        broker_kind(config(broker=broker))


def test_the_replicas_annotation_is_checked():
    with pytest.raises(BrokerSpecError, match="whole number"):
        broker_kind(pod_config(annotations={rules.REPLICAS: "two"}))
    with pytest.raises(BrokerSpecError, match="0..100"):
        broker_kind(pod_config(annotations={rules.REPLICAS: "101"}))
    with pytest.raises(BrokerSpecError, match="brokerPodSpec only"):
        broker_kind(config(broker={"brokerJobSpec": {"template": {"spec": POD_SPEC}}}, annotations={rules.REPLICAS: "1"}))  # fmt: skip
    assert broker_kind(pod_config(annotations={rules.REPLICAS: " 3 "})).replicas == 3


def test_a_spec_error_plans_nothing_and_keeps_existing_brokers():
    good = pod_config()
    existing = rules.wanted_brokers(good, broker_kind(good), [instance()], None)
    bad = config(broker={"brokerPodSpec": POD_SPEC, "brokerJobSpec": {}}, generation=2)

    result = plan(bad, [instance()], [found_of(b) for b in existing.values()], configuration="cams", live_nodes=None, now=NOW)  # fmt: skip

    assert result.empty() and "both" in result.error


# --- the plan -------------------------------------------------------------------------------
def test_one_pod_per_node_of_a_shared_instance_and_none_for_a_missing_node():
    i = instance(nodes=("node-a", "node-b", "node-c"))

    result = plan(pod_config(), [i], [], configuration="cams", live_nodes={"node-a", "node-b"}, now=NOW)  # fmt: skip

    assert names(result.create) == ["node-a-cams-8120fe-pod", "node-b-cams-8120fe-pod"]


def test_an_unshared_instance_gets_one_pod_named_after_it():
    i = instance(name="cams-e77db4", shared=False)

    result = plan(pod_config(), [i], [], configuration="cams", live_nodes=None, now=NOW)

    assert names(result.create) == ["cams-e77db4-pod"]


def test_services_come_only_once_a_broker_pod_runs():
    c, i = pod_config(), instance()
    pod = rules.broker_pod(c, i, "node-a", POD_SPEC, rules.fingerprint(c))

    pending = plan(c, [i], [found_of(pod)], configuration="cams", live_nodes=None, now=NOW)
    running = plan(c, [i], [found_of(pod, phase="Running")], configuration="cams", live_nodes=None, now=NOW)  # fmt: skip

    assert pending.empty()
    assert names(running.create) == ["cams-8120fe-svc", "cams-svc"]


def test_services_go_when_no_broker_pod_is_left():
    c, i = pod_config(), instance(nodes=())
    svc = found_of(rules.instance_service(c, i))
    conf_svc = found_of(rules.configuration_service(c))

    result = plan(c, [i], [svc, conf_svc], configuration="cams", live_nodes=None, now=NOW)

    assert sorted(d.name for d in result.delete) == ["cams-8120fe-svc", "cams-svc"]


def test_a_pending_pod_is_replaced_after_five_minutes_and_a_failed_one_at_once():
    c, i = pod_config(), instance(nodes=("node-a", "node-b"))
    mark = rules.fingerprint(c)
    young = found_of(rules.broker_pod(c, i, "node-a", POD_SPEC, mark), started=NOW - timedelta(minutes=4))  # fmt: skip
    failed = found_of(rules.broker_pod(c, i, "node-b", POD_SPEC, mark), phase="Failed")

    result = plan(c, [i], [young, failed], configuration="cams", live_nodes=None, now=NOW)
    later = plan(c, [i], [young], configuration="cams", live_nodes=None, now=NOW + timedelta(minutes=2))  # fmt: skip

    assert [(d.name, d.why) for d in result.delete] == [("node-b-cams-8120fe-pod", "phase Failed")]
    assert [d.name for d in later.delete] == ["node-a-cams-8120fe-pod"]


def test_the_pending_grace_of_a_pod_that_never_started_counts_from_its_creation():
    """Read as the API server shows a pod: no ``status.startTime`` until a kubelet starts it
    (a pod never scheduled never gets one). Akri waits for ever for such a pod."""
    c, i = pod_config(), instance(nodes=("node-a",))
    body = rules.broker_pod(c, i, "node-a", POD_SPEC, rules.fingerprint(c))

    def as_served(created: datetime, started: datetime | None = None) -> rules.Found:
        obj = copy.deepcopy(body)
        obj["metadata"].update(uid="u", creationTimestamp=f"{created:%Y-%m-%dT%H:%M:%SZ}")
        obj["status"] = {"phase": "Pending"}
        if started is not None:
            obj["status"]["startTime"] = f"{started:%Y-%m-%dT%H:%M:%SZ}"
        return rules.Found.from_object(rules.POD, obj)

    def deleted(found: rules.Found) -> list[tuple[str, str]]:
        result = plan(c, [i], [found], configuration="cams", live_nodes=None, now=NOW)
        return [(d.name, d.why) for d in result.delete]

    never = as_served(NOW - timedelta(minutes=6))
    assert deleted(never) == [("node-a-cams-8120fe-pod", "Pending for more than 5 minutes")]
    assert deleted(as_served(NOW - timedelta(minutes=4))) == []
    # Started late: from its start.
    assert deleted(as_served(NOW - timedelta(minutes=9), NOW - timedelta(minutes=2))) == []


def test_a_pod_on_a_node_that_left_the_instance_goes():
    c = pod_config()
    pod = found_of(rules.broker_pod(c, instance(nodes=("node-a",)), "node-a", POD_SPEC, rules.fingerprint(c)))  # fmt: skip

    result = plan(c, [instance(nodes=("node-b",))], [pod], configuration="cams", live_nodes=None, now=NOW)  # fmt: skip

    assert [d.name for d in result.delete] == ["node-a-cams-8120fe-pod"]
    assert names(result.create) == ["node-b-cams-8120fe-pod"]


def test_a_changed_broker_spec_or_properties_rolls_the_brokers():
    old, i = pod_config(), instance()
    pod = found_of(rules.broker_pod(old, i, "node-a", POD_SPEC, rules.fingerprint(old)), phase="Running")  # fmt: skip
    new = pod_config(brokerProperties={"RESOLUTION": "720p"}, generation=2)

    result = plan(new, [i], [pod], configuration="cams", live_nodes=None, now=NOW)

    assert [d.why for d in result.delete] == ["made from an older brokerSpec or brokerProperties"]


def test_a_pod_owned_by_an_older_instance_of_that_name_is_replaced():
    c = pod_config()
    old = found_of(rules.broker_pod(c, instance(uid="old"), "node-a", POD_SPEC, rules.fingerprint(c)))  # fmt: skip

    result = plan(c, [instance(uid="new")], [old], configuration="cams", live_nodes=None, now=NOW)

    assert [d.why for d in result.delete] == ["owned by an older object of that name"]


def test_what_is_not_ours_is_never_touched():
    c, i = pod_config(), instance()
    stranger = Found(rules.POD, "node-a-cams-8120fe-pod", "x", {"akri.sh/configuration": "cams"})
    unowned = Found(rules.POD, "other-pod", "y", {"controller": "akri.sh", "akri.sh/configuration": "cams"})  # fmt: skip

    result = plan(c, [i], [stranger, unowned], configuration="cams", live_nodes=None, now=NOW)

    assert result.delete == [] and result.create == []
    assert "not ours" in result.problems[0]


def test_a_deleted_configuration_takes_everything_of_ours():
    c, i = pod_config(), instance()
    pod = found_of(rules.broker_pod(c, i, "node-a", POD_SPEC, rules.fingerprint(c)), phase="Running")  # fmt: skip
    svc = found_of(rules.configuration_service(c))

    result = plan(None, [i], [pod, svc], configuration="cams", live_nodes=None, now=NOW)

    assert sorted(d.name for d in result.delete) == ["cams-svc", "node-a-cams-8120fe-pod"]


def test_the_configuration_level_strategy_makes_n_replicas_asking_for_the_configuration():
    c = pod_config(annotations={rules.REPLICAS: "2"})

    result = plan(c, [instance(), instance("cams-a19705")], [], configuration="cams", live_nodes=None, now=NOW)  # fmt: skip

    assert names(result.create) == ["cams-0-broker", "cams-1-broker"]
    body = result.create[0]
    assert body["metadata"]["ownerReferences"][0]["kind"] == "Configuration"
    assert body["spec"]["containers"][0]["resources"]["limits"] == {"akri.sh/cams": "1"}
    assert "affinity" not in body["spec"]


def test_an_instance_scoped_plan_leaves_the_configuration_service_alone():
    c, i = pod_config(), instance(nodes=())
    conf_svc = found_of(rules.configuration_service(c))

    result = plan(c, [i], [conf_svc], configuration="cams", live_nodes=None, now=NOW, scope=rules.Scope(instance=i.name))  # fmt: skip

    assert result.delete == []


# --- property: the level pass converges -----------------------------------------------------
class ModelCluster:
    """Objects by (kind, name), each create getting a fresh uid; writes may fail."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Found] = {}
        self.uids = itertools.count()

    def apply(self, result: rules.Plan, fail_after: int | None = None) -> None:
        """Carry out a plan; stop (as a task that hit an API error) after ``fail_after``."""
        steps = [("d", d) for d in result.delete] + [("c", b) for b in result.create]
        steps += [("a", a) for a in result.adopt]
        for n, (op, item) in enumerate(steps):
            if fail_after is not None and n >= fail_after:
                return
            if op == "d":
                current = self.objects.get((item.kind, item.name))
                if current is not None and current.uid == item.uid:  # uid precondition
                    del self.objects[(item.kind, item.name)]
            elif op == "c":
                key = (item["kind"], item["metadata"]["name"])
                self.objects.setdefault(key, found_of(item, uid=f"u{next(self.uids)}"))
            else:
                old = self.objects[(item.kind, item.name)]
                owners = ((item.owner["kind"], item.owner["name"], item.owner["uid"]),)
                self.objects[(item.kind, item.name)] = Found(**{**old.__dict__, "owners": owners})

    def run_pods(self) -> None:
        """The kubelet: Pending pods start; a Failed one stays Failed."""
        for key, f in list(self.objects.items()):
            if f.kind == rules.POD and f.phase == "Pending":
                self.objects[key] = Found(**{**f.__dict__, "phase": "Running"})


nodes_st = st.lists(st.sampled_from(["node-a", "node-b", "node-c"]), max_size=3, unique=True)
event_st = st.one_of(
    st.tuples(st.just("instance"), st.sampled_from(["cams-1", "cams-2", "cams-3"]), nodes_st),
    st.tuples(st.just("remove"), st.sampled_from(["cams-1", "cams-2", "cams-3"])),
    st.tuples(st.just("delete-broker"), st.integers(0, 20)),
    st.tuples(
        st.just("run"), st.sampled_from(["cams-1", "cams-2", "cams-3", None]), st.integers(0, 4)
    ),  # fmt: skip
    st.tuples(st.just("kubelet")),
    st.tuples(st.just("fail-pod"), st.integers(0, 20)),
)


@settings(max_examples=150, deadline=None)
@given(events=st.lists(event_st, max_size=30), shared=st.booleans())
def test_any_interleaving_ends_in_the_desired_set_without_duplicates(events, shared):
    c = pod_config()
    cluster = ModelCluster()
    instances: dict[str, InstanceFacts] = {}
    uid = itertools.count()

    def run(which, fail_after=None):
        scope = rules.Scope(configuration_level=True) if which == "config" else rules.Scope(which)
        result = plan(c, instances.values(), cluster.objects.values(), configuration="cams", live_nodes=None, now=NOW, scope=scope)  # fmt: skip
        cluster.apply(result, fail_after)

    for event in events:
        if event[0] == "instance":
            old = instances.get(event[1])
            instances[event[1]] = InstanceFacts(event[1], old.uid if old else f"i{next(uid)}", "cams", shared, tuple(event[2]))  # fmt: skip
        elif event[0] == "remove":
            instances.pop(event[1], None)
        elif event[0] in ("delete-broker", "fail-pod") and cluster.objects:
            key = sorted(cluster.objects)[event[1] % len(cluster.objects)]
            if event[0] == "delete-broker":
                del cluster.objects[key]
            elif key[0] == rules.POD:
                cluster.objects[key] = Found(**{**cluster.objects[key].__dict__, "phase": "Failed"})  # fmt: skip
        elif event[0] == "run":
            run(event[1], fail_after=event[2])  # a task that fails part way, retried later
        elif event[0] == "kubelet":
            cluster.run_pods()

    for _ in range(6):  # the level pass, again after the kubelet ran what it made
        run(None)
        cluster.run_pods()
    run(None)

    final = plan(c, instances.values(), cluster.objects.values(), configuration="cams", live_nodes=None, now=NOW)  # fmt: skip
    assert final.empty()
    wanted = rules.wanted_brokers(c, broker_kind(c), instances.values(), None)
    pods = {name for kind, name in cluster.objects if kind == rules.POD}
    assert pods == set(wanted)
    assert all(f.phase == "Running" for f in cluster.objects.values() if f.kind == rules.POD)
    targets = [(f.labels[rules.INSTANCE_LABEL], f.labels[rules.TARGET_NODE_LABEL]) for f in cluster.objects.values() if f.kind == rules.POD]  # fmt: skip
    assert len(targets) == len(set(targets))
    services = {name for kind, name in cluster.objects if kind == rules.SERVICE}
    with_pods = {i.name for i in instances.values() if i.nodes}
    expected = {rules.instance_service_name(n) for n in with_pods}
    assert services == expected | ({"cams-svc"} if with_pods else set())


def test_names_too_long_for_akris_labels_get_no_broker_and_say_why():
    long = instance(name="cams-" + "x" * 60)

    result = plan(pod_config(), [long, instance()], [], configuration="cams", live_nodes=None, now=NOW)  # fmt: skip

    assert names(result.create) == ["node-a-cams-8120fe-pod"]
    assert "not a valid label value" in result.problems[0] and result.error == ""
