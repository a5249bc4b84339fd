"""Least privilege: what each component's ServiceAccount is granted in deploy/ is exactly what
its code calls.

Each component's code paths run against the API server (the simulator, or
AKRI_TEST_KUBECONFIG's) through a recording client; every request is mapped to the
(group, resource, verb, scope) RBAC would check. The test fails when a manifest grants more
(a rule nothing calls) or less (a call no rule allows).

Adding calls: drive the new code path in a scenario below, in the process that runs it in a
deployment (a Celery task's calls are the worker's, not the controller's that enqueues it),
and register it in SCENARIOS under its component; then make the Role/ClusterRole in
deploy/base/rbac-<component>.yaml match what this test reports. resourceNames are not
compared (a rule narrowed to names still counts as its verbs). A grant in an API group the
server does not serve (resource.k8s.io on Kubernetes 1.20) cannot be exercised there and is
not reported as unused on it; the simulator serves that group and checks it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from agent.bench.claims import instance_body
from agent.domain.holdings import HOLDS
from agent.kube.client import AkriApi
from agent.models import Slot, SlotPodBinding
from tests.deploykit import NAMESPACE, render
from tests.test_agent_lifecycle import (
    FOO0,
    AgentCluster,
    configuration_body,
    healthy,
    wait_instances,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

# --- requests to RBAC terms -----------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Access:
    group: str
    resource: str  # with its subresource: pods/binding
    verb: str
    scope: str  # "namespace" (a Role in the install namespace suffices) or "cluster"

    def __str__(self) -> str:
        return f"{self.group or 'core'}/{self.resource} {self.verb} ({self.scope})"


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def access_of(method: str, url: str, home: str = "x") -> Access:
    """The RBAC check the API server makes for one request; a request into a namespace other
    than ``home`` (where akri-site is installed) needs a ClusterRole, so it counts as cluster."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    query = parse_qs(parts.query)
    if segments[0] == "api":
        group, rest = "", segments[2:]
    else:
        group, rest = segments[1], segments[3:]
    scope = "cluster"
    if len(rest) >= 3 and rest[0] == "namespaces":
        scope, rest = ("namespace" if rest[1] == home else "cluster"), rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch") in (["true"], ["1"]) else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _VERBS[method]
    return Access(group, resource, verb, scope)


def normalized(accesses: set[Access]) -> set[Access]:
    """A cluster-wide grant covers the same at namespace scope: keep only the wider one."""
    return {
        a
        for a in accesses
        if a.scope == "cluster" or Access(a.group, a.resource, a.verb, "cluster") not in accesses
    }


def granted(component: str, objects=None) -> set[Access]:
    """What deploy/ grants the component's ServiceAccount (akri-site-<component>)."""
    objects = objects or render("overlays/external")
    account = f"akri-site-{component}"
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"].endswith("Role")}
    out: set[Access] = set()
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == NAMESPACE
            for s in binding["subjects"]
        ):
            continue
        scope = "cluster" if binding["kind"] == "ClusterRoleBinding" else "namespace"
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add(Access(group, resource, verb, scope))
    return normalized(out)


# --- recording clients ----------------------------------------------------------------------


class Recorder:
    """Hands out API clients whose every request is noted."""

    def __init__(self, kube) -> None:
        self.kube = kube
        self.calls: list[tuple[str, str]] = []

    def client(self) -> client.ApiClient:
        api_client = self.kube.new_client()
        rest = api_client.rest_client
        original = rest.request

        def request(method, url, *args, **kwargs):
            self.calls.append((method, url))
            return original(method, url, *args, **kwargs)

        rest.request = request
        return api_client

    def accesses(self) -> set[Access]:
        return normalized({access_of(m, u, self.kube.namespace) for m, u in self.calls})


class RecordingKube:
    """The test's ``kube`` whose new clients record; its own ``api_client`` does not."""

    def __init__(self, kube, recorder: Recorder) -> None:
        self._kube = kube
        self._recorder = recorder

    def new_client(self) -> client.ApiClient:
        return self._recorder.client()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)


# --- API groups a server may not serve -------------------------------------------------------


def served_groups(kube) -> set[str]:
    """The API groups this server serves ("" is core). Kubernetes 1.20 has no resource.k8s.io:
    a grant there cannot be exercised, so it is not reported as unused (see the test)."""
    groups = client.ApisApi(kube.api_client).get_api_versions().groups
    return {""} | {g.name for g in groups}


def served_kinds(kube) -> list:
    from agent.queues.kinds import ALL_KINDS

    groups = served_groups(kube)
    return [w for w in ALL_KINDS if w.group in groups]


@contextlib.contextmanager
def queue_crds(kube):
    """KAI's, Kueue's and Volcano's CRDs served meanwhile (stand-ins from tests/queues_world),
    so that the controller watches their objects; those this test created go afterwards."""
    from agent.queues.kinds import QUEUE_KINDS
    from tests.queues_world import crd_body

    ext = client.ApiextensionsV1Api(kube.api_client)
    made = []
    for w in QUEUE_KINDS:
        kind = w.plural[:-1].capitalize()
        scope = "Namespaced" if w.plural in ("podgroups", "localqueues") else "Cluster"
        try:
            ext.create_custom_resource_definition(
                crd_body(w.group, w.version, w.plural, kind, scope)
            )
            made.append(f"{w.plural}.{w.group}")
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    custom = client.CustomObjectsApi(kube.api_client)

    def served() -> bool:
        try:
            for w in QUEUE_KINDS:
                custom.list_cluster_custom_object(w.group, w.version, w.plural, limit=1)
        except client.ApiException:
            return False
        return True

    try:
        kube.wait_for(served, timeout=30, message="the queue CRDs served")
        yield
    finally:
        for name in made:
            with contextlib.suppress(client.ApiException):
                ext.delete_custom_resource_definition(name)


# --- scenarios: each drives one component's code paths ---------------------------------------


def agent_lifecycle(kube, rec: Recorder, monkeypatch) -> None:
    """Discovery to Instance, a claim by Allocate, the pod's end freeing it, devices gone."""
    core = client.CoreV1Api(kube.api_client)
    core.create_namespaced_secret(
        kube.namespace, {"metadata": {"name": "s"}, "data": {"k": "MQ=="}}
    )
    core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "c"}, "data": {"k": "2"}}
    )
    body = configuration_body(descriptions=("foo0",))
    body["spec"]["discoveryHandler"]["discoveryProperties"] = [
        {
            "name": "S",
            "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "namespace": kube.namespace}},
        },
        {
            "name": "C",
            "valueFrom": {
                "configMapKeyRef": {"name": "c", "key": "k", "namespace": kube.namespace}
            },
        },
    ]
    # Workloads run in namespaces of their own, not in akri-site's.
    # (Created and emptied by the fixture, so nothing is left Terminating on a real server.)
    work = kube.create_namespace()
    _agent_lifecycle(kube, rec, monkeypatch, body, work)


def _agent_lifecycle(kube, rec, monkeypatch, body, work) -> None:
    core = client.CoreV1Api(kube.api_client)
    # A slot whose pod never shows is freed after the grace: short here.
    monkeypatch.setitem(_settings().AKRI, "SLOT_GRACE_SECONDS", 0.3)
    monkeypatch.setitem(_settings().AKRI, "SWEEP_INTERVAL_SECONDS", 0.2)
    cluster = AgentCluster(RecordingKube(kube, rec), nodes=("node-a",), reconcile=True).start()
    try:
        cluster.api.create_configuration(body)
        wait_instances(cluster, {FOO0}, nodes=("node-a",))
        resource = f"akri.sh/{FOO0}"
        kubelet = cluster["node-a"].kubelet
        kubelet.wait_devices(resource, lambda d: len(healthy(d)) == 2)
        container = {"name": "c", "image": "x", "resources": {"limits": {resource: "1"}}}
        pod = core.create_namespaced_pod(
            work,
            {
                "metadata": {"name": "broker"},
                "spec": {"nodeName": "node-a", "containers": [container]},
            },
        )
        result = kubelet.admit_pod(
            work,
            "broker",
            [{"name": "c", "requests": {resource: 1}}],
            uid=pod.metadata.uid,
        )
        assert result.admitted, result.error
        [slot] = result.container("c").devices[resource]
        cluster.wait_for(
            lambda: SlotPodBinding.objects.filter(
                node="node-a", slot=slot, pod_name="broker"
            ).exists(),
            message="the slot bound to its pod",
        )
        # ...and said on the pod (a patch in the workload's namespace).
        cluster.wait_for(
            lambda: HOLDS in (core.read_namespaced_pod("broker", work).metadata.annotations or {}),
            message="the pod told which slot it holds",
        )
        core.delete_namespaced_pod("broker", work, grace_period_seconds=0)
        kubelet.remove_pod(work, "broker")
        cluster.wait_for(lambda: cluster.usage(FOO0)[slot] == "", timeout=10, message="freed")
        # A pod the kubelet runs but the watch has never shown: the reconciler reads it.
        ghost = kubelet.admit_pod(work, "ghost", [{"name": "c", "requests": {resource: 1}}])
        [slot] = ghost.container("c").devices[resource]
        cluster.wait_for(lambda: cluster.usage(FOO0)[slot] == "", timeout=15, message="ghost freed")
        cluster["node-a"].set_available(False)
        cluster.wait_for(lambda: cluster.instances() == {}, timeout=10, message="Instance gone")
    finally:
        cluster.stop()


def agent_taking_an_assignment(kube, rec: Recorder, monkeypatch) -> None:
    """AKRI_AGENT_ASSIGNMENTS: Allocate finds its pod by the extender's assignment (a pod list
    on its node) and marks it consumed (a patch of that pod, in the workload's namespace)."""
    from agent.extender.service import ExtenderService
    from agent.sharing.akri_slots import CONSUMED
    from agent.simulator.scheduler import MiniScheduler, register_nodes, unregister_nodes

    monkeypatch.setitem(_settings().AKRI, "AGENT_ASSIGNMENTS", True)
    work = kube.create_namespace()
    cluster = AgentCluster(RecordingKube(kube, rec), nodes=("node-a",)).start()
    # The extender's own calls are not the agent's: it gets the fixture's plain client.
    service = ExtenderService(
        kube.new_client(), namespace=kube.namespace, feed_interval=0.05, kube_interval=3600
    )
    core = client.CoreV1Api(kube.api_client)
    registered = register_nodes(core, ["node-a"])  # the extender binds to existing nodes only
    try:
        # A Configuration of its own: the earlier agent scenarios' objects may still be there.
        config = "cams-assigned"
        cluster.api.create_configuration(configuration_body(config, ("foo0",)))
        instance = f"{config}-{FOO0.rpartition('-')[2]}"  # the Instance of foo0 on node-a
        resource = f"akri.sh/{instance}"
        kubelet = cluster["node-a"].kubelet
        kubelet.wait_devices(resource, lambda d: len(healthy(d)) == 2, timeout=10)
        service.start()
        scheduler = MiniScheduler(core, work, service.url, {"node-a": kubelet})
        kube.wait_for(lambda: instance in service.state._instances, timeout=10, message="booked")
        outcome = scheduler.schedule(scheduler.create("assigned", {resource: 1}))
        assert (outcome.node, outcome.admitted, outcome.error) == ("node-a", True, "")
        pod = core.read_namespaced_pod("assigned", work)
        assert CONSUMED in (pod.metadata.annotations or {})
        core.delete_namespaced_pod("assigned", work, grace_period_seconds=0)
        kubelet.remove_pod(work, "assigned")
    finally:
        service.stop()
        cluster.stop()
        unregister_nodes(core, registered)


def claim_after_a_lost_race(kube, rec: Recorder, monkeypatch) -> None:
    """Allocate deciding on a stale view: the conditional write fails, the claim re-reads."""
    from agent.domain.errors import SlotTaken
    from agent.kube.claims import ClaimStore

    api = AkriApi(kube.api_client, kube.namespace)
    stale = api.create_instance(instance_body("cams-race", 1, "cams", ("node-a", "node-b")))
    api.patch_instance(
        "cams-race", [{"op": "add", "path": "/spec/deviceUsage/cams-race-0", "value": "node-b"}]
    )
    store = ClaimStore(AkriApi(rec.client(), kube.namespace), "agent:node-a")
    with pytest.raises(SlotTaken):
        store.claim("cams-race", "cams-race-0", "node-a", current=stale)


def controller_term(kube, rec: Recorder, monkeypatch) -> None:
    """runcontroller: win the Lease, watch the cluster into the cache, release on stop."""
    from agent.leader import CONTROLLER_LEASE
    from agent.leader.election import LeaderElector

    monkeypatch.setitem(_settings().AKRI_QUEUES, "CRD_RECHECK_SECONDS", 0.2)
    elector = LeaderElector(rec.client(), kube.namespace, CONTROLLER_LEASE, identity="ctl")
    assert elector.step() and elector.step()  # created, then renewed
    try:
        with queue_crds(kube):
            _controller_run(kube, rec)
    finally:
        elector.stop()


def _controller_run(kube, rec: Recorder) -> None:
    from agent.controller import Controller
    from agent.models import Node

    controller = Controller(rec.client(), kube.namespace).start()
    try:
        assert controller.sync.wait_synced()
        assert controller.queues.wait_probed()  # queue charges: every kind probed once
        # Every queue kind (and DRA, where served) is watched, and the broker watches run.
        watched = {(w.group, w.plural) for w in served_kinds(kube)}
        watched |= {("", "services"), ("batch", "jobs")}
        kube.wait_for(
            lambda: watched <= {(a.group, a.resource) for a in rec.accesses() if a.verb == "watch"},
            timeout=20,
            message="the controller watching queue, DRA and broker objects",
        )
        node = f"rbac-{kube.namespace}"
        core = client.CoreV1Api(kube.api_client)
        core.create_node({"metadata": {"name": node}})
        try:
            kube.wait_for(lambda: Node.objects.filter(name=node).exists(), timeout=10)
        finally:
            core.delete_node(node)
    finally:
        controller.stop()


def cluster_reconciliation(kube, rec: Recorder, monkeypatch) -> None:
    """The Celery task: a gone node's slot freed, an orphaned Instance deleted."""
    from agent.reconcile_cluster import run_cluster_pass

    api = AkriApi(kube.api_client, kube.namespace)
    api.create_configuration(configuration_body(name="cams"))
    held = instance_body("cams-held", 2, "cams", ("node-gone",))
    held["spec"]["deviceUsage"] = {"cams-held-0": "node-gone", "cams-held-1": ""}
    api.create_instance(held)
    api.create_instance(instance_body("orphan-1", 1, "gone-config", ("node-gone",)))
    run = run_cluster_pass(kube.namespace, api_client=rec.client(), grace=0)
    assert run is not None and run.released == 1, run and run.detail
    assert [i["metadata"]["name"] for i in api.list_instances()["items"]] == ["cams-held"]


def broker_runs(kube, rec: Recorder, monkeypatch) -> None:
    """The run_brokers task's work (agent.brokers.dispatch.run_key, on the worker's own client):
    broker pods per node, their Services once one runs, the Configuration's Service, a Job,
    a name taken by a stranger (read), a recreated Instance's Service re-owned, and removals."""
    from agent.brokers import dispatch
    from tests.brokers_world import BrokerWorld

    monkeypatch.setattr(dispatch, "new_api_client", lambda *a, **k: rec.client())
    monkeypatch.setattr(dispatch, "_clients", {})
    sent: list[str] = []
    # What Celery would deliver to another run of this task: run here, in order.
    monkeypatch.setattr(dispatch.Dispatcher, "send", lambda self, key: sent.append(key))
    world = BrokerWorld(kube)
    ns = kube.namespace

    def run(key: str):
        outcome = dispatch.run_key(key)
        while sent:
            dispatch.run_key(sent.pop(0))
        return outcome

    try:
        _broker_steps(world, ns, run)
    finally:
        world.cleanup()


def _broker_steps(world, ns: str, run) -> None:
    from agent.brokers import dispatch

    a = world.node("a")
    world.configuration("brk")
    world.instance("brk-1", (a,), configuration="brk")
    assert run(dispatch.instance_key(ns, "brk", "brk-1")).created == 1
    world.run(f"{a}-brk-1-pod")
    run(dispatch.instance_key(ns, "brk", "brk-1"))
    assert world.services() == {"brk-1-svc", "brk-svc"}
    # The Configuration recreated (a new uid) while its broker runs: its Service re-owned.
    world.akri.custom.delete_namespaced_custom_object("akri.sh", "v0", ns, "configurations", "brk")
    uid = world.configuration("brk")["metadata"]["uid"]
    assert run(dispatch.configuration_key(ns, "brk")).adopted == 1
    owners = world.core.read_namespaced_service("brk-svc", ns).metadata.owner_references
    assert [o.uid for o in owners] == [uid]
    # A stranger holding a broker's name is read, and left alone.
    world.core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": f"{a}-brk-2-pod", "labels": {"app": "mine"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    )
    world.instance("brk-2", (a,), configuration="brk")
    assert "not ours" in " ".join(run(dispatch.instance_key(ns, "brk", "brk-2")).problems)
    job = {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "j", "image": "busybox"}]}}}  # fmt: skip
    world.configuration("brj", brokerSpec={"brokerJobSpec": job})
    world.instance("brj-1", (a,), configuration="brj")
    assert run(dispatch.instance_key(ns, "brj", "brj-1")).created == 1
    world.akri.delete_instance("brj-1")
    world.akri.delete_instance("brk-1")
    run(dispatch.level_key(ns))
    assert not world.batch.list_namespaced_job(ns).items


def charge_labels(kube, rec: Recorder, monkeypatch) -> None:
    """The recompute_charges task: the owner label written on an Akri Instance and, where the
    server serves DRA, on a ResourceClaim in a workload namespace."""
    from agent.kube import client as kube_client
    from agent.queues import cache, tasks
    from agent.queues.models import ResourceClaim
    from tests.queues_world import LABEL, claim_body, device_class_body, held_instance, pod_body

    monkeypatch.setattr(kube_client, "new_api_client", lambda *a, **k: rec.client())
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_instance(held_instance("cam-aaaaaa", "cam", holders=1))
    from agent.kube.watch import CacheSync

    sync = CacheSync(kube.new_client(), kube.namespace, owner="test", timeout_seconds=5).start()
    try:
        assert sync.wait_synced()
        kube.wait_for(lambda: Slot.objects.filter(value="node-a").exists(), timeout=10)
    finally:
        sync.stop()
    core = client.CoreV1Api(kube.api_client)
    work = kube.create_namespace()
    pod = core.create_namespaced_pod(
        work, pod_body("user", "team-a", resource="akri.sh/cam-aaaaaa")
    )
    plain = kube.api_client.sanitize_for_serialization(pod)
    cache.apply_pod("ADDED", plain)
    Slot.objects.filter(key="cam-aaaaaa-0").update(
        pod_namespace=work, pod_name="user", pod_uid=pod.metadata.uid
    )
    dra = "resource.k8s.io" in served_groups(kube)
    if dra:
        custom = client.CustomObjectsApi(kube.api_client)
        klass = f"gpu-{kube.namespace}.example.com"
        custom.create_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", device_class_body(klass)
        )
        custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", work, "resourceclaims", claim_body("shared", klass)
        )
        ResourceClaim.objects.create(
            namespace=work,
            name="shared",
            device_classes=[klass],
            allocated=1,
            reserved_for=[{"resource": "pods", "name": "user", "uid": pod.metadata.uid}],
        )
    try:
        tasks.recompute_charges()
        assert api.get_instance("cam-aaaaaa")["metadata"]["labels"] == {LABEL: "team-a"}
        if dra:
            claim = custom.get_namespaced_custom_object(
                "resource.k8s.io", "v1", work, "resourceclaims", "shared"
            )
            assert claim["metadata"]["labels"] == {LABEL: "team-a"}
    finally:
        if dra:
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", klass)


def beat_election(kube, rec: Recorder, monkeypatch, settings=None) -> None:
    """beat's scheduler: campaign for its Lease, send while leading, release on close."""
    from agent.kube import client as kube_client
    from agent.leader.beat import LeaderScheduler
    from akri_site.celery import app

    monkeypatch.setattr(kube_client, "new_api_client", lambda *a, **k: rec.client())
    monkeypatch.setitem(_settings().AKRI, "NAMESPACE", kube.namespace)
    scheduler = LeaderScheduler(app=app, lazy=True)
    scheduler.setup_schedule()
    try:
        kube.wait_for(scheduler.elector.is_leading, timeout=10, message="beat leads")
    finally:
        scheduler.close()


def web_requests(kube, rec: Recorder, monkeypatch) -> None:
    """The admin's manual release of a slot, and the overview's leaders."""
    from django.contrib.auth.models import User

    from agent.kube import claims
    from agent.kube import client as kube_client
    from agent.leader import status

    monkeypatch.setattr(claims, "new_api_client", lambda *a, **k: rec.client())
    monkeypatch.setattr(kube_client, "new_api_client", lambda *a, **k: rec.client())
    monkeypatch.setattr(claims, "_web_clients", {})
    monkeypatch.setitem(_settings().AKRI, "NAMESPACE", kube.namespace)
    api = AkriApi(kube.api_client, kube.namespace)
    body = instance_body("cams-web", 1, "cams", ("node-a",))
    body["spec"]["deviceUsage"] = {"cams-web-0": "node-a"}
    api.create_instance(body)
    user = User.objects.create_user("rbac-operator")
    claims.manual_release(kube.namespace, "cams-web", "cams-web-0", "node-a", user=user, reason="t")
    assert api.get_instance("cams-web")["spec"]["deviceUsage"]["cams-web-0"] == ""
    status.forget()
    try:
        assert len(status.leaders()) == 2
    finally:
        status.forget()
    web_pod_page(kube, rec, monkeypatch)


def web_pod_page(kube, rec: Recorder, monkeypatch) -> None:
    """A pod's page: its conditions and events, read from the API server."""
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from agent.controller import apply_pod
    from akri_site.dashboard import podstatus

    monkeypatch.setattr(podstatus, "_apis", {})
    podstatus.forget()
    work = kube.create_namespace()
    core = client.CoreV1Api(kube.api_client)
    asked = {"akri.sh/cams": "1"}
    created = core.create_namespaced_pod(
        work,
        {
            "metadata": {"name": "waiting"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"requests": asked, "limits": asked},
                    }
                ]
            },
        },
    )
    apply_pod(kube.api_client.sanitize_for_serialization(created))
    viewer = User.objects.create_user("rbac-viewer")
    viewer.groups.add(Group.objects.get(name="viewer"))
    browser = Client()
    browser.force_login(viewer)
    page = browser.get(f"/pods/{work}/waiting/")
    assert page.status_code == 200
    assert b"the API server answered" not in page.content
    podstatus.forget()


def extender_scheduling(kube, rec: Recorder, monkeypatch) -> None:
    """runextender: its feeds (cache, then Nodes and device-holding pods from the API), filter,
    prioritize and bind (it reads the pod and the node, writes the assignment annotation, then
    the Binding), and a bind of a pod this process never filtered (a restarted extender)."""
    from agent.extender.service import ExtenderService
    from agent.sharing.akri_slots import ASSIGNMENT
    from agent.simulator.scheduler import (
        MiniScheduler,
        pod_body,
        post,
        register_nodes,
        unregister_nodes,
    )
    from tests.extender_http import put_configuration, put_instance

    put_configuration(kube.namespace, "cams")
    for n in range(2):
        put_instance(kube.namespace, f"cams-rbac{n}", ["node-a"])
    work = kube.create_namespace()
    core = client.CoreV1Api(kube.api_client)
    registered = register_nodes(core, ["node-a"])
    service = ExtenderService(
        rec.client(), namespace=kube.namespace, feed_interval=0.05, kube_interval=3600
    ).start()
    try:
        # As deploy/scheduler configures it: the CL resource is the extender's to count.
        scheduler = MiniScheduler(
            core, work, service.url, {"node-a": None}, ignored_by_scheduler={"akri.sh/cams"}
        )
        outcome = scheduler.schedule(scheduler.create("filtered", {"akri.sh/cams": 1}), admit=False)
        assert (outcome.node, outcome.error) == ("node-a", "")
        core.create_namespaced_pod(work, pod_body("unseen", {"akri.sh/cams": 1}))
        uid = core.read_namespaced_pod("unseen", work).metadata.uid
        bind = {"PodName": "unseen", "PodNamespace": work, "PodUID": uid, "Node": "node-a"}
        status, bound = post(service.url + "/bind", bind)
        assert (status, bound["Error"]) == (200, ""), bound
        for name in ("filtered", "unseen"):
            pod = core.read_namespaced_pod(name, work)
            assert pod.spec.node_name == "node-a"
            assert ASSIGNMENT in (pod.metadata.annotations or {})
            core.delete_namespaced_pod(name, work, grace_period_seconds=0)
    finally:
        service.stop()
        unregister_nodes(core, registered)


def web_eviction(kube, rec: Recorder, monkeypatch) -> None:
    """An operator evicts the foreign user of an owned claim from the Queues page."""
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from agent.queues import cache, evict, recompute
    from agent.queues.models import ResourceClaim
    from tests.queues_world import LABEL, pod_body

    monkeypatch.setattr(evict, "new_api_client", lambda *a, **k: rec.client())
    work = kube.create_namespace()
    core = client.CoreV1Api(kube.api_client)
    pods = [
        core.create_namespaced_pod(work, pod_body(name, queue, resource="akri.sh/cam-aaaaaa"))
        for name, queue in (("owner-pod", "team-a"), ("guest-pod", "team-b"))
    ]
    for pod in pods:
        cache.apply_pod("ADDED", kube.api_client.sanitize_for_serialization(pod))
    ResourceClaim.objects.create(
        namespace=work,
        name="shared",
        labels={LABEL: "team-a"},
        device_classes=["gpu"],
        allocated=1,
        reserved_for=[
            {"resource": "pods", "name": p.metadata.name, "uid": p.metadata.uid} for p in pods
        ],
    )
    recompute.recompute(None)
    operator = User.objects.create_user("rbac-evictor", is_staff=True)
    operator.groups.add(Group.objects.get(name="operator"))
    browser = Client()
    browser.force_login(operator)
    guest = f"{work}/guest-pod@{pods[1].metadata.uid}"
    answer = browser.post(
        f"/queues/claims/resourceclaim/{work}/shared/evict/", {"pods": [guest], "reason": "rbac"}
    )
    assert answer.status_code == 302
    assert {p.metadata.name for p in core.list_namespaced_pod(work).items} == {"owner-pod"}


def web_drain(kube, rec: Recorder, monkeypatch) -> None:
    """An operator previews, then drains, an Instance through its JSON endpoint (issue 33)."""
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from agent import cordon, drain
    from agent.domain.holdings import HOLDS, format_holds

    monkeypatch.setattr(cordon, "new_api_client", lambda *a, **k: rec.client())
    monkeypatch.setattr(drain, "new_api_client", lambda *a, **k: rec.client())
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_instance(instance_body("cams-drain", 1, "cams", ("node-a",)))
    work = kube.create_namespace()
    core = client.CoreV1Api(kube.api_client)
    holds = format_holds({f"{kube.namespace}/cams-drain-0": "c"})
    core.create_namespaced_pod(
        work,
        {
            "metadata": {"name": "holder", "annotations": {HOLDS: holds}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x"}]},
        },
    )
    core.patch_namespaced_pod_status("holder", work, {"status": {"phase": "Running"}})
    operator = User.objects.create_user("rbac-drainer", is_staff=True)
    operator.groups.add(Group.objects.get(name="operator"))
    browser = Client()
    browser.force_login(operator)
    url = f"/instances/{kube.namespace}/cams-drain/cordon/"
    for dry_run in (True, False):
        body = {"action": "drain", "dry_run": dry_run, "grace": 0, "reason": "rbac"}
        answer = browser.post(url, body, content_type="application/json")
        assert answer.status_code == 200, answer.content
    assert [p["outcome"] for p in answer.json()["pods"]] == ["evicted"]


def _settings():
    from django.conf import settings

    return settings


Scenario = Callable[..., None]
SCENARIOS: dict[str, list[Scenario]] = {
    "agent": [agent_lifecycle, claim_after_a_lost_race, agent_taking_an_assignment],
    "controller": [controller_term],
    "worker": [cluster_reconciliation, broker_runs, charge_labels],
    "beat": [beat_election],
    "web": [web_requests, web_eviction, web_drain],
    "extender": [extender_scheduling],
}


def test_every_service_account_in_deploy_has_its_scenarios_listed():
    accounts = {
        o["metadata"]["name"].removeprefix("akri-site-")
        for o in render("overlays/external")
        if o["kind"] == "ServiceAccount"
    }
    assert accounts == set(SCENARIOS)


@pytest.mark.parametrize("component", sorted(SCENARIOS))
def test_a_component_is_granted_exactly_what_it_calls(kube, monkeypatch, component):
    if not SCENARIOS[component]:
        pytest.skip(f"no recorded scenario for {component} yet (its code is not on this branch)")
    rec = Recorder(kube)
    for scenario in SCENARIOS[component]:
        scenario(kube, rec, monkeypatch)
    called, allowed = rec.accesses(), granted(component)
    # A grant in a group this server does not serve (DRA on 1.20) cannot be exercised here:
    # its calls are probes that 404; the simulator, which serves it, checks those grants.
    served = served_groups(kube)
    missing = sorted(str(a) for a in called - allowed)
    unused = sorted(str(a) for a in allowed - called if a.group in served)
    assert not missing and not unused, (
        f"{component}: calls that deploy/base/rbac-{component}.yaml does not allow: {missing}; "
        f"grants nothing called: {unused}"
    )


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", "http://h/api/v1/pods?fieldSelector=spec.nodeName%3Dn&watch=true", ("", "pods", "watch", "cluster")),
        ("GET", "http://h/api/v1/namespaces/x/pods/p", ("", "pods", "get", "namespace")),
        ("GET", "http://h/api/v1/namespaces/elsewhere/pods/p", ("", "pods", "get", "cluster")),
        ("POST", "http://h/api/v1/namespaces/x/pods/p/binding", ("", "pods/binding", "create", "namespace")),
        ("PATCH", "http://h/apis/akri.sh/v0/namespaces/x/instances/i", ("akri.sh", "instances", "patch", "namespace")),
        ("DELETE", "http://h/apis/batch/v1/namespaces/x/jobs", ("batch", "jobs", "deletecollection", "namespace")),
        ("PUT", "http://h/apis/coordination.k8s.io/v1/namespaces/x/leases/l", ("coordination.k8s.io", "leases", "update", "namespace")),
        ("GET", "http://h/api/v1/nodes", ("", "nodes", "list", "cluster")),
    ],
)  # fmt: skip
def test_requests_map_to_the_rbac_checks_the_api_server_makes(method, url, expected):
    assert access_of(method, url) == Access(*expected)
