"""The project's admission webhook called by an API server, as a cluster calls it (issue 30 §3):
``manage.py runweb --webhook`` (its own TLS listener) on this test's database, registered by the
ValidatingWebhookConfiguration of ``deploy/base/webhook.yaml`` with a ``url:`` client config
(or, on the simulator, its own ``service:`` client config resolved to that listener), and
requests made through the API server: the simulator's admission chain, or a real kube-apiserver
with ``AKRI_TEST_KUBECONFIG``. On a real server the hooks are asked only about the test's
namespace (the configuration is cluster-wide and the server shared); the manifest's own
namespace rule (NotIn kube-system, akri-site) is tested on the simulator.

Also what a slot claim (the agent's claim store) does when the webhook of a labelled Instance
is down or slower than its timeout, under both failure policies.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from kubernetes import client

from agent.kube.claims import ClaimStore, ClaimStoreError, WebhookFailed
from agent.kube.client import AkriApi
from agent.models import Instance
from agent.queues.models import InstanceLabels, Refusal
from agent.queues.review import MANIFEST_LABEL_KEY
from tests.admission import (
    FakeWebhook,
    ProjectWebhook,
    free_port,
    make_tls,
    manifest_configuration,
    only_namespace,
    registered,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]
LABEL = MANIFEST_LABEL_KEY
WRITER = "system:serviceaccount:akri-site:akri-site-worker"
POD_HOOK, LABEL_HOOK = "pods.akri-site.akri.sh", "queue-labels.akri-site.akri.sh"


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls(tmp_path_factory.mktemp("webhook-chain-tls"))


@pytest.fixture
def project_webhook(kube, tls, tmp_path):
    """runweb --webhook for this test: team-a has opted out of sharing; the worker's service
    account of deploy/ is the one label writer."""
    server = ProjectWebhook(
        tls,
        {
            "AKRI_NAMESPACE": kube.namespace,
            "AKRI_QUEUE_OPT_OUT": "team-a",
            "AKRI_QUEUE_LABEL_WRITERS": WRITER,
            "AKRI_QUEUE_LABELS_ALONE": "true",
        },
        tmp_path / "webhook.log",
    ).start()
    try:
        yield server
    finally:
        server.stop()
        print(f"--- runweb --webhook log (tail)\n{server.log.read_text()[-3000:]}")


def rendered(kube, tls, url: str | None, **changes) -> dict:
    """The manifest with this test's CA and URL (None: its own service client config);
    ``changes`` set fields of every hook (failurePolicy, timeoutSeconds)."""
    body = manifest_configuration(tls.ca_bundle, url=url)
    body["metadata"]["name"] = f"akri-site-pods-{uuid.uuid4().hex[:6]}"
    for h in body["webhooks"]:
        h.update(changes)
    if kube.real:
        body["webhooks"] = only_namespace(body["webhooks"], kube.namespace)
    return body


def owned_instance(kube, name: str = "cams-owned", owner: str | None = "team-a") -> dict:
    """An Instance in the API server (labelled with its owner at creation) and in the cache
    the webhook reads."""
    labels = {LABEL: owner} if owner else {}
    body = {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": name, "labels": labels},
        "spec": {"configurationName": "cams", "cdiName": "akri.sh/cams=x", "capacity": 2,
                 "nodes": ["node-a"], "deviceUsage": {f"{name}-0": "", f"{name}-1": ""}},
    }  # fmt: skip
    created = AkriApi(kube.api_client, kube.namespace).create_instance(body)
    Instance.objects.create(
        namespace=kube.namespace,
        name=name,
        configuration_name="cams",
        capacity=2,
        resource_version=created["metadata"]["resourceVersion"],
        device_usage={f"{name}-0": "", f"{name}-1": ""},
    )
    if owner:
        InstanceLabels.objects.create(namespace=kube.namespace, name=name, labels=labels)
    return created


def pod_asking(name: str, instance: str, queue: str) -> dict:
    limits = {f"akri.sh/{instance}": "1"}
    return {
        "metadata": {"name": name, "labels": {"kai.scheduler/queue": queue}},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": limits, "requests": limits}}]},
    }  # fmt: skip


def refused(call) -> tuple[int, dict]:
    with pytest.raises(client.ApiException) as info:
        call()
    return info.value.status, json.loads(info.value.body)


def wait_for(predicate, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# --- pods --------------------------------------------------------------------------------------


def test_a_pod_the_webhook_refuses_is_refused_by_the_api_server(kube, tls, project_webhook):
    core = client.CoreV1Api(kube.api_client)
    owned_instance(kube)
    with registered(kube.api_client, rendered(kube, tls, project_webhook.url)):
        status, body = refused(
            lambda: core.create_namespaced_pod(
                kube.namespace, pod_asking("intruder", "cams-owned", "team-b")
            )
        )
        # The owner's own pod is let in.
        core.create_namespaced_pod(kube.namespace, pod_asking("own", "cams-owned", "team-a"))
    assert status == 403 and body["reason"] == "Forbidden"
    message = body["message"]
    assert message.startswith(f'admission webhook "{POD_HOOK}" denied the request: ')
    assert f"instance {kube.namespace}/cams-owned" in message and "team-a" in message
    assert "(rule: opt-out)" in message
    names = [p.metadata.name for p in core.list_namespaced_pod(kube.namespace).items]
    assert names == ["own"]
    # The webhook's refusal is kept for the Queues page (written in the background).
    wait_for(lambda: Refusal.objects.filter(name="intruder").exists(), what="the refusal row")
    assert Refusal.objects.get(name="intruder").rule == "opt-out"


def test_the_manifests_namespace_rule_keeps_its_own_namespace_out(apiserver, kube, tls,
                                                                  project_webhook):  # fmt: skip
    if kube.real:
        pytest.skip("the manifest's namespace rule is tested on the simulator: a real server "
                    "is shared, so there the hooks are limited to the test's namespace")  # fmt: skip
    owned_instance(kube)
    apiserver.ensure_namespace("akri-site")
    core = client.CoreV1Api(kube.api_client)
    with registered(kube.api_client, rendered(kube, tls, project_webhook.url)):
        apiserver.admission.calls.clear()
        core.create_namespaced_pod("akri-site", pod_asking("inside", "cams-owned", "team-b"))
        assert list(apiserver.admission.calls) == []
        status, _ = refused(
            lambda: core.create_namespaced_pod(
                kube.namespace, pod_asking("outside", "cams-owned", "team-b")
            )
        )
    assert status == 403
    assert [c[0] for c in apiserver.admission.calls] == [POD_HOOK]


def test_the_manifests_service_client_config_reaches_the_webhook(apiserver, kube, tls,
                                                                project_webhook):  # fmt: skip
    if kube.real:
        pytest.skip("a real server reaches a Service through its cluster network; this one "
                    "has none (the url: client config is tested on it)")  # fmt: skip
    owned_instance(kube)
    core = client.CoreV1Api(kube.api_client)
    apiserver.admission.services[("akri-site", "akri-site-webhook", 443)] = (
        "127.0.0.1",
        project_webhook.port,
    )
    try:
        with registered(kube.api_client, rendered(kube, tls, None)):
            status, body = refused(
                lambda: core.create_namespaced_pod(
                    kube.namespace, pod_asking("intruder", "cams-owned", "team-b")
                )
            )
    finally:
        apiserver.admission.services.clear()
    assert status == 403 and body["message"].startswith(f'admission webhook "{POD_HOOK}"'), (
        apiserver.admission.calls
    )


# --- the owner label on Instances --------------------------------------------------------------


def impersonating(kube, user: str) -> client.ApiClient:
    """A client acting as ``user`` (a service account's name); on a real server with RBAC the
    account is first allowed to patch Instances in the test's namespace, as deploy/ allows
    the worker (the simulator authorizes nothing)."""
    if kube.real:
        rbac = client.RbacAuthorizationV1Api(kube.api_client)
        rule = {"apiGroups": ["akri.sh"], "resources": ["instances"], "verbs": ["get", "patch"]}
        rbac.create_namespaced_role(
            kube.namespace, {"metadata": {"name": "label-writer"}, "rules": [rule]}
        )
        rbac.create_namespaced_role_binding(kube.namespace, {
            "metadata": {"name": "label-writer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "label-writer"},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        })  # fmt: skip
    api_client = kube.new_client()
    api_client.set_default_header("Impersonate-User", user)
    return api_client


def test_the_owner_label_is_immutable_through_the_api_server(kube, tls, project_webhook):
    owned_instance(kube)
    owned_instance(kube, "cams-free", owner=None)
    api = AkriApi(kube.api_client, kube.namespace)
    worker = AkriApi(impersonating(kube, WRITER), kube.namespace)
    with registered(kube.api_client, rendered(kube, tls, project_webhook.url)):
        change = [{"op": "replace", "path": "/metadata/labels", "value": {LABEL: "team-b"}}]
        status, body = refused(lambda: api.patch_instance("cams-owned", change))
        assert status == 403
        assert body["message"].startswith(f'admission webhook "{LABEL_HOOK}" denied the request: ')
        assert "immutable" in body["message"] and "team-a" in body["message"]
        # Not even the label writer may change it.
        status, _ = refused(lambda: worker.patch_instance("cams-owned", change))
        assert status == 403
        # A slot write on the labelled Instance is asked and let through.
        slot = [
            {"op": "test", "path": "/spec/deviceUsage/cams-owned-0", "value": ""},
            {"op": "replace", "path": "/spec/deviceUsage/cams-owned-0", "value": "node-a"},
        ]
        api.patch_instance("cams-owned", slot)
        # Adding a label after creation: only the writer.
        add = [{"op": "add", "path": "/metadata/labels", "value": {LABEL: "team-c"}}]
        status, body = refused(lambda: api.patch_instance("cams-free", add))
        assert status == 403 and WRITER in body["message"]
        worker.patch_instance("cams-free", add)
    stored = api.get_instance("cams-owned")
    assert stored["metadata"]["labels"] == {LABEL: "team-a"}
    assert stored["spec"]["deviceUsage"]["cams-owned-0"] == "node-a"
    assert api.get_instance("cams-free")["metadata"]["labels"] == {LABEL: "team-c"}


def test_the_first_binds_owner_label_is_written_through_the_webhook_by_the_writer_only(
    kube, tls, project_webhook
):
    """The worker's own label write (``agent.queues.labels``), through the API server: refused
    for anyone but ``AKRI_QUEUE_LABEL_WRITERS``, written for the worker's service account."""
    from agent.charges.facts import AKRI, ClaimFacts, PodFacts, QueueWorld, Settings
    from agent.charges.owner import decide
    from agent.queues.labels import write_label

    owned_instance(kube, "cams-new", owner=None)
    pod = PodFacts("ns", "p", uid="u", labels={"kai.scheduler/queue": "team-b"}, created="t")
    facts = ClaimFacts(AKRI, kube.namespace, "cams-new", "cams", 1, {}, (pod,))
    world, rules = QueueWorld(), Settings()
    charge = decide(facts, world, rules)
    assert charge.write_label == "team-b"
    api = AkriApi(kube.api_client, kube.namespace)
    with registered(kube.api_client, rendered(kube, tls, project_webhook.url)):
        _, what = write_label(kube.api_client, facts, charge, world, rules)
        assert "403" in what
        assert LABEL not in (api.get_instance("cams-new")["metadata"].get("labels") or {})
        after, what = write_label(impersonating(kube, WRITER), facts, charge, world, rules)
    assert what == "written" and after.owner == "team-b"
    assert api.get_instance("cams-new")["metadata"]["labels"] == {LABEL: "team-b"}


def test_slot_writes_on_unlabelled_instances_never_reach_the_webhook(apiserver, kube, tls,
                                                                     project_webhook):  # fmt: skip
    if kube.real:
        pytest.skip("counts the simulator's webhook calls (a real server does not show them)")
    owned_instance(kube)
    owned_instance(kube, "cams-free", owner=None)
    api = AkriApi(kube.api_client, kube.namespace)
    with registered(kube.api_client, rendered(kube, tls, project_webhook.url)):
        apiserver.admission.calls.clear()
        for name in ("cams-free", "cams-owned"):
            api.patch_instance(name, [
                {"op": "test", "path": f"/spec/deviceUsage/{name}-1", "value": ""},
                {"op": "replace", "path": f"/spec/deviceUsage/{name}-1", "value": "node-a"},
            ])  # fmt: skip
    assert list(apiserver.admission.calls) == [
        (LABEL_HOOK, "UPDATE", "instances", "cams-owned", "allowed")
    ]


# --- a claim while the webhook is down or slow ---------------------------------------------------


def claim_store(kube) -> ClaimStore:
    return ClaimStore(AkriApi(kube.new_client(), kube.namespace), "node-a")


def counting_writes(store: ClaimStore) -> list[list]:
    """Every patch the claim store sends, kept in the returned list (the store's attempts)."""
    sent: list[list] = []
    patch = store.api.patch_instance

    def counted(name, ops, *args, **kwargs):
        sent.append(ops)
        return patch(name, ops, *args, **kwargs)

    store.api.patch_instance = counted
    return sent


def usage(kube, name: str = "cams-owned") -> dict:
    return AkriApi(kube.api_client, kube.namespace).get_instance(name)["spec"]["deviceUsage"]


def assert_refused_at_once(error: ClaimStoreError, writes: list) -> None:
    """A webhook failure is answered after one write, not six (each of which may wait out
    the webhook's timeout): the error names the webhook and says nothing was written."""
    assert isinstance(error, WebhookFailed), repr(error)
    message = str(error)
    assert "writing Instance cams-owned: 500" in message
    assert f'failed calling webhook "{LABEL_HOOK}"' in message
    assert "nothing was written, not retried" in message
    assert len(writes) == 1, writes


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_a_claim_while_the_webhook_is_down(kube, tls, policy):
    owned_instance(kube)
    url = f"https://127.0.0.1:{free_port()}"  # nothing listens: the webhook is down
    store = claim_store(kube)
    writes = counting_writes(store)
    with registered(kube.api_client, rendered(kube, tls, url, failurePolicy=policy)):
        if policy == "Ignore":
            assert store.claim("cams-owned", "cams-owned-0", "node-a") == "claimed"
            assert usage(kube)["cams-owned-0"] == "node-a"
            assert len(writes) == 1
            return
        with pytest.raises(ClaimStoreError) as error:
            store.claim("cams-owned", "cams-owned-0", "node-a")
    assert_refused_at_once(error.value, writes)
    # Nothing was written, and the slot is still there to be claimed.
    assert usage(kube) == {"cams-owned-0": "", "cams-owned-1": ""}
    assert claim_store(kube).claim("cams-owned", "cams-owned-0", "node-b") == "claimed"
    assert usage(kube)["cams-owned-0"] == "node-b"


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_a_claim_while_the_webhook_is_slower_than_its_timeout(kube, tls, policy):
    owned_instance(kube)
    slow = FakeWebhook(tls).start()
    slow.delay = 3.0  # the manifest's webhook answers in milliseconds; this one never in time
    store = claim_store(kube)
    writes = counting_writes(store)
    url = f"https://127.0.0.1:{slow.port}"
    try:
        with registered(kube.api_client,
                        rendered(kube, tls, url, failurePolicy=policy, timeoutSeconds=1)):  # fmt: skip
            if policy == "Ignore":
                assert store.claim("cams-owned", "cams-owned-0", "node-a") == "claimed"
            else:
                with pytest.raises(ClaimStoreError) as error:
                    store.claim("cams-owned", "cams-owned-0", "node-a")
    finally:
        slow.stop()
    # One write, one call of the webhook, cut at its timeout: the claim waited for it once.
    assert len(slow.reviews) == 1
    if policy == "Ignore":
        assert len(writes) == 1  # the API server went on without the webhook
        assert usage(kube)["cams-owned-0"] == "node-a"
        return
    assert_refused_at_once(error.value, writes)
    message = str(error.value)
    assert "context deadline exceeded" in message or "Client.Timeout" in message
    assert usage(kube) == {"cams-owned-0": "", "cams-owned-1": ""}


def test_a_release_while_the_webhook_is_down_is_refused_at_once_and_keeps_the_slot(kube, tls):
    owned_instance(kube)
    assert claim_store(kube).claim("cams-owned", "cams-owned-0", "node-a") == "claimed"
    store = claim_store(kube)
    writes = counting_writes(store)
    url = f"https://127.0.0.1:{free_port()}"
    body = rendered(kube, tls, url, failurePolicy="Fail")
    with registered(kube.api_client, body), pytest.raises(WebhookFailed) as error:
        store.release("cams-owned", "cams-owned-0", "node-a")
    assert_refused_at_once(error.value, writes)
    assert usage(kube)["cams-owned-0"] == "node-a"


def test_the_shipped_objectselector_names_the_label_key_the_settings_accept():
    body = manifest_configuration("")
    [labels_hook] = [h for h in body["webhooks"] if h["name"] == LABEL_HOOK]
    assert labels_hook["objectSelector"] == {
        "matchExpressions": [{"key": MANIFEST_LABEL_KEY, "operator": "Exists"}]
    }


def test_another_label_key_is_refused_at_start_up():
    import os
    import subprocess
    import sys

    from tests.admission import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("AKRI_QUEUE")}
    env["AKRI_QUEUE_LABEL"] = "team.example/queue"
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0
    assert "AKRI_QUEUE_LABEL is 'team.example/queue'" in done.stderr
    assert f"only sent objects labelled {MANIFEST_LABEL_KEY}" in done.stderr
    env["AKRI_QUEUE_LABEL"] = MANIFEST_LABEL_KEY
    assert subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                          capture_output=True, timeout=120).returncode == 0  # fmt: skip


def test_the_queue_demo_admits_its_pods_through_the_chain(monkeypatch, settings):
    """The demo's pods are refused by the API server, its webhook registered as deploy/'s."""
    from agent.queues.demo import QueueDemo
    from agent.simulator.cluster import SimulatedCluster

    monkeypatch.setenv("AKRI_QUEUE_OPT_OUT", "team-c")
    cluster = SimulatedCluster(nodes=1, with_controller=False, namespace="demo").start()
    demo = QueueDemo(cluster)
    try:
        Instance.objects.create(namespace="demo", name="gpu-c", configuration_name="gpus")
        InstanceLabels.objects.create(namespace="demo", name="gpu-c", labels={LABEL: "team-c"})
        demo.webhook = demo._register_webhook()
        assert demo.webhook is not None
        labels = {"kai.scheduler/queue": "team-a"}
        assert cluster.run_pod("peek", "node-a", {"akri.sh/gpu-c": 1}, labels=labels) is False
        assert cluster.apiserver.get_object("pods", "demo", "peek") is None
        [call] = cluster.apiserver.admission.calls
        assert call == (POD_HOOK, "CREATE", "pods", "peek", "denied")
        wait_for(lambda: Refusal.objects.filter(name="peek").exists(), what="the refusal row")
    finally:
        demo.stop()
        cluster.stop()
