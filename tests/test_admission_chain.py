"""Validating admission webhooks as the API server calls them: the simulator's admission chain
(``agent.simulator.apiserver_admission``), and the same tests against a real kube-apiserver
(``AKRI_TEST_KUBECONFIG``), where the webhook is registered with a ``url:`` client config on
127.0.0.1. Each hook is asked only about the test's namespace (``only_namespace``), so that on a
shared real server no other run reaches it; the one test of the manifest's own selector
(NotIn kube-system) runs on the simulator only, where nobody else creates pods.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest
from kubernetes import client

from tests.admission import (
    FakeWebhook,
    allow,
    configuration,
    deny,
    free_port,
    hook,
    make_tls,
    only_namespace,
    registered,
)

pytestmark = pytest.mark.kube


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls(tmp_path_factory.mktemp("admission-tls"))


@pytest.fixture
def webhook(tls):
    fake = FakeWebhook(tls).start()
    try:
        yield fake
    finally:
        fake.stop()


def register(kube, hooks: list[dict]):
    """The hooks, asked only about the test's namespace, registered for the block."""
    name = f"akri-test-{uuid.uuid4().hex[:8]}"
    return registered(kube.api_client, configuration(name, only_namespace(hooks, kube.namespace)))


def pod(name: str, labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def create_pod(kube, name: str, labels: dict | None = None):
    return client.CoreV1Api(kube.api_client).create_namespaced_pod(
        kube.namespace, pod(name, labels)
    )


def refused(call) -> client.ApiException:
    with pytest.raises(client.ApiException) as info:
        call()
    return info.value


def status_of(error: client.ApiException) -> dict:
    import json

    return json.loads(error.body)


def pod_names(kube) -> list[str]:
    pods = client.CoreV1Api(kube.api_client).list_namespaced_pod(kube.namespace).items
    return sorted(p.metadata.name for p in pods)


def test_a_denial_is_the_api_servers_error_and_nothing_is_stored(kube, webhook, tls):
    webhook.answer = deny("no pods today")
    with register(kube, [hook("deny.akri-site.test", webhook.url, tls.ca_bundle)]):
        error = refused(lambda: create_pod(kube, "p1"))
    assert error.status == 403
    status = status_of(error)
    assert status["kind"] == "Status" and status["status"] == "Failure"
    assert status["reason"] == "Forbidden" and status["code"] == 403
    assert status["message"] == (
        'admission webhook "deny.akri-site.test" denied the request: no pods today'
    )
    assert pod_names(kube) == []


def test_every_matching_hook_is_asked_and_one_refusal_refuses(kube, tls):
    first, second = FakeWebhook(tls).start(), FakeWebhook(tls).start()
    try:
        second.answer = deny("the second says no")
        hooks = [
            hook("one.akri-site.test", first.url, tls.ca_bundle),
            hook("two.akri-site.test", second.url, tls.ca_bundle),
        ]
        with register(kube, hooks):
            error = refused(lambda: create_pod(kube, "p1"))
    finally:
        first.stop()
        second.stop()
    assert status_of(error)["message"] == (
        'admission webhook "two.akri-site.test" denied the request: the second says no'
    )
    assert len(first.reviews) == len(second.reviews) == 1
    assert pod_names(kube) == []


def test_the_review_is_shaped_as_the_real_server_sends_it(kube, webhook, tls):
    with register(kube, [hook("look.akri-site.test", webhook.url, tls.ca_bundle,
                              timeoutSeconds=7)]):  # fmt: skip
        created = create_pod(kube, "p1", {"team": "a"})
    [review] = webhook.reviews
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    assert review["path"] == "/validate?timeout=7s"
    request = review["request"]
    assert request["operation"] == "CREATE"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert request["requestResource"] == request["resource"]
    assert request["namespace"] == kube.namespace and request["name"] == "p1"
    assert request["dryRun"] is False and request["oldObject"] is None
    assert request["options"]["kind"] == "CreateOptions"
    assert request["userInfo"]["username"]
    sent = request["object"]
    assert sent["metadata"]["labels"] == {"team": "a"}
    # The object the webhook sees is the one stored: server fields are already set.
    assert sent["metadata"]["uid"] == created.metadata.uid


def test_an_allowed_request_with_a_warning_is_stored(kube, webhook, tls):
    def warn(review):
        status, body = allow(review)
        body["response"]["warnings"] = ["mind the gap"]
        return status, body

    webhook.answer = warn
    with register(kube, [hook("warn.akri-site.test", webhook.url, tls.ca_bundle)]):
        create_pod(kube, "p1")
    assert pod_names(kube) == ["p1"]


def test_rules_select_operation_resource_and_subresource(kube, webhook, tls):
    core = client.CoreV1Api(kube.api_client)
    webhook.answer = deny("caught")
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
              "resources": ["configmaps"], "scope": "*"}]  # fmt: skip
    with register(kube, [hook("cm.akri-site.test", webhook.url, tls.ca_bundle, rules=rules)]):
        # CREATE is not asked, nor are other resources.
        core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "c"}})
        core.create_namespaced_secret(kube.namespace, {"metadata": {"name": "s"}})
        create_pod(kube, "p1")
        error = refused(
            lambda: core.patch_namespaced_config_map("c", kube.namespace, {"data": {"k": "v"}})
        )
    assert error.status == 403 and "caught" in status_of(error)["message"]
    assert [r["request"]["operation"] for r in webhook.reviews] == ["UPDATE"]
    assert webhook.reviews[0]["request"]["oldObject"]["metadata"]["name"] == "c"
    assert core.read_namespaced_config_map("c", kube.namespace).data is None


def test_a_status_update_is_asked_only_by_a_rule_naming_the_subresource(kube, webhook, tls):
    core = client.CoreV1Api(kube.api_client)
    create_pod(kube, "p1")
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
              "resources": ["pods"]}]  # fmt: skip
    with register(kube, [hook("pods.akri-site.test", webhook.url, tls.ca_bundle, rules=rules)]):
        core.patch_namespaced_pod_status("p1", kube.namespace, {"status": {"phase": "Running"}})
        assert webhook.reviews == []
    rules[0]["resources"] = ["pods/status"]
    webhook.answer = deny("status frozen")
    with register(kube, [hook("status.akri-site.test", webhook.url, tls.ca_bundle, rules=rules)]):
        error = refused(
            lambda: core.patch_namespaced_pod_status(
                "p1", kube.namespace, {"status": {"phase": "Failed"}}
            )
        )
    assert error.status == 403
    [review] = webhook.reviews
    assert review["request"]["subResource"] == "status"
    assert core.read_namespaced_pod("p1", kube.namespace).status.phase == "Running"


def test_the_object_selector_matches_the_new_or_the_old_object(kube, webhook, tls):
    core = client.CoreV1Api(kube.api_client)
    webhook.answer = deny("owned")
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
              "resources": ["configmaps"]}]  # fmt: skip
    selector = {"matchExpressions": [{"key": "owner", "operator": "Exists"}]}
    with register(kube, [hook("obj.akri-site.test", webhook.url, tls.ca_bundle, rules=rules,
                              objectSelector=selector)]):  # fmt: skip
        core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "plain"}})
        core.patch_namespaced_config_map("plain", kube.namespace, {"data": {"k": "v"}})
        assert webhook.reviews == []
        webhook.answer = allow
        core.create_namespaced_config_map(
            kube.namespace, {"metadata": {"name": "owned", "labels": {"owner": "a"}}}
        )
        webhook.answer = deny("the owner label stays")
        # Removing the label: the new object does not match, the old one does.
        error = refused(
            lambda: core.patch_namespaced_config_map(
                "owned", kube.namespace, {"metadata": {"labels": {"owner": None}}}
            )
        )
    assert "the owner label stays" in status_of(error)["message"]
    assert [r["request"]["name"] for r in webhook.reviews] == ["owned", "owned"]
    labels = core.read_namespaced_config_map("owned", kube.namespace).metadata.labels
    assert labels == {"owner": "a"}


def test_the_namespace_selector_leaves_other_namespaces_alone(kube, webhook, tls):
    other = kube.create_namespace()
    webhook.answer = deny("not here")
    # only_namespace restricts the hook to kube.namespace.
    with register(kube, [hook("ns.akri-site.test", webhook.url, tls.ca_bundle)]):
        client.CoreV1Api(kube.api_client).create_namespaced_pod(other, pod("elsewhere"))
        error = refused(lambda: create_pod(kube, "here"))
    assert error.status == 403
    assert [r["request"]["namespace"] for r in webhook.reviews] == [kube.namespace]


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_a_webhook_that_is_down_fails_by_its_policy(kube, tls, policy):
    port = free_port()  # nothing listens there
    url = f"https://127.0.0.1:{port}/validate"
    with register(kube, [hook("down.akri-site.test", url, tls.ca_bundle, failurePolicy=policy,
                              timeoutSeconds=2)]):  # fmt: skip
        if policy == "Ignore":
            create_pod(kube, "p1")
            assert pod_names(kube) == ["p1"]
            return
        error = refused(lambda: create_pod(kube, "p1"))
    assert error.status == 500
    status = status_of(error)
    assert status["reason"] == "InternalError"
    assert status["message"].startswith(
        'Internal error occurred: failed calling webhook "down.akri-site.test": failed to call '
        f'webhook: Post "https://127.0.0.1:{port}/validate?timeout=2s": dial tcp 127.0.0.1:{port}'
    )
    assert "connection refused" in status["message"]
    assert pod_names(kube) == []


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_a_webhook_slower_than_its_timeout_fails_by_its_policy(kube, webhook, tls, policy):
    webhook.delay = 3.0
    webhook.answer = deny("too late to matter")
    started = time.monotonic()
    with register(kube, [hook("slow.akri-site.test", webhook.url, tls.ca_bundle,
                              failurePolicy=policy, timeoutSeconds=1)]):  # fmt: skip
        if policy == "Ignore":
            create_pod(kube, "p1")
        else:
            error = refused(lambda: create_pod(kube, "p1"))
    waited = time.monotonic() - started
    assert 0.9 <= waited < 2.9, waited  # the timeout, not the webhook's 3 s
    if policy == "Ignore":
        assert pod_names(kube) == ["p1"]
        return
    assert error.status == 500
    message = status_of(error)["message"]
    assert 'failed calling webhook "slow.akri-site.test"' in message
    assert "context deadline exceeded" in message or "Client.Timeout" in message
    assert pod_names(kube) == []


def test_a_certificate_the_ca_bundle_did_not_sign_is_a_failed_call(kube, webhook, tmp_path):
    stranger = make_tls(tmp_path / "other-ca")
    with register(kube, [hook("tls.akri-site.test", webhook.url, stranger.ca_bundle)]):
        error = refused(lambda: create_pod(kube, "p1"))
    assert error.status == 500
    message = status_of(error)["message"]
    assert 'failed calling webhook "tls.akri-site.test": failed to call webhook: Post' in message
    assert "certificate" in message
    assert webhook.reviews == [] and pod_names(kube) == []


def test_an_answer_for_another_request_is_a_failed_call(kube, webhook, tls):
    def wrong_uid(review):
        status, body = allow(review)
        body["response"]["uid"] = "someone-else"
        return status, body

    webhook.answer = wrong_uid
    with register(kube, [hook("uid.akri-site.test", webhook.url, tls.ca_bundle)]):
        error = refused(lambda: create_pod(kube, "p1"))
    message = status_of(error)["message"]
    assert error.status == 500
    assert 'failed calling webhook "uid.akri-site.test": received invalid webhook response: ' in (
        message
    )
    assert 'expected response.uid="' in message and 'got "someone-else"' in message


def test_a_webhook_answering_503_is_a_failed_call(kube, webhook, tls):
    webhook.answer = lambda review: (503, {"error": "database unavailable"})
    with register(kube, [hook("busy.akri-site.test", webhook.url, tls.ca_bundle)]):
        error = refused(lambda: create_pod(kube, "p1"))
    assert error.status == 500
    assert status_of(error)["message"] == (
        'Internal error occurred: failed calling webhook "busy.akri-site.test": failed to call '
        "webhook: the server is currently unable to handle the request"
    )


def test_a_dry_run_is_asked_with_dry_run_and_stores_nothing(kube, webhook, tls):
    core = client.CoreV1Api(kube.api_client)
    with register(kube, [hook("dry.akri-site.test", webhook.url, tls.ca_bundle)]):
        core.create_namespaced_pod(kube.namespace, pod("p1"), dry_run="All")
        webhook.answer = deny("not even in a dry run")
        error = refused(
            lambda: core.create_namespaced_pod(kube.namespace, pod("p2"), dry_run="All")
        )
    assert error.status == 403
    assert [r["request"]["dryRun"] for r in webhook.reviews] == [True, True]
    assert webhook.reviews[0]["request"]["options"]["dryRun"] == ["All"]
    assert pod_names(kube) == []


def test_a_configuration_the_real_server_refuses_is_refused(kube, tls):
    body = hook("bad.akri-site.test", "http://127.0.0.1:1/validate", tls.ca_bundle,
                sideEffects="Some")  # fmt: skip
    error = refused(lambda: register(kube, [body]).__enter__())
    assert error.status == 422
    message = status_of(error)["message"]
    assert 'webhooks[0].sideEffects: Unsupported value: "Some": supported values: "None", ' in (
        message
    )
    assert "webhooks[0].clientConfig.url" in message and "'https' is the only allowed" in message


def test_deleting_is_asked_with_the_old_object(kube, webhook, tls):
    core = client.CoreV1Api(kube.api_client)
    core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "keep"}})
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"],
              "resources": ["configmaps"]}]  # fmt: skip
    webhook.answer = deny("kept")
    with register(kube, [hook("del.akri-site.test", webhook.url, tls.ca_bundle, rules=rules)]):
        error = refused(lambda: core.delete_namespaced_config_map("keep", kube.namespace))
    assert error.status == 403
    [review] = webhook.reviews
    assert review["request"]["object"] is None
    assert review["request"]["oldObject"]["metadata"]["name"] == "keep"
    assert review["request"]["options"]["kind"] == "DeleteOptions"
    assert core.read_namespaced_config_map("keep", kube.namespace).metadata.name == "keep"


# --- simulator only -----------------------------------------------------------------------------


def test_a_service_client_config_is_called_at_the_address_the_test_resolves(apiserver, tls):
    """kube-apiserver reaches a service through its cluster; the simulator through
    ``admission.services``, with the certificate checked against the service's DNS name."""
    from kubernetes import client as k8s

    fake = FakeWebhook(tls).start()
    apiserver.ensure_namespace("svc-test")
    api = apiserver.api_client()
    try:
        fake.answer = deny("by service")
        service = {"name": "akri-site-webhook", "namespace": "akri-site", "path": "/validate",
                   "port": 443}  # fmt: skip
        body = hook("svc.akri-site.test", "", tls.ca_bundle)
        body["clientConfig"] = {"service": service, "caBundle": tls.ca_bundle}
        with registered(api, configuration("svc-test", [body])):
            unresolved = refused(
                lambda: k8s.CoreV1Api(api).create_namespaced_pod("svc-test", pod("p0"))
            )
            assert 'service "akri-site-webhook" not found' in status_of(unresolved)["message"]
            apiserver.admission.services[("akri-site", "akri-site-webhook", 443)] = (
                "127.0.0.1",
                fake.port,
            )
            error = refused(lambda: k8s.CoreV1Api(api).create_namespaced_pod("svc-test", pod("p1")))
        assert status_of(error)["message"].endswith("denied the request: by service")
        assert [r["path"] for r in fake.reviews] == ["/validate?timeout=10s"]
    finally:
        apiserver.admission.services.clear()
        api.close()
        fake.stop()
        apiserver.reset()


def test_matching_is_free_until_a_configuration_exists(apiserver):
    from agent.simulator.apiserver_admission import Request

    pods = apiserver.store.types[("", "pods")]
    request = Request("CREATE", pods, "v1", "", "default", "p")
    assert apiserver.admission.admitter(request, []) is None


WIDGETS = ("admtest.akri-site.io", "widgets")


@pytest.fixture
def two_version_crd(kube):
    """A custom resource served at v1 and v2 (no conversion webhook), for matchPolicy."""
    ext = client.ApiextensionsV1Api(kube.api_client)
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    name = f"{WIDGETS[1]}.{WIDGETS[0]}"
    ext.create_custom_resource_definition({
        "metadata": {"name": name},
        "spec": {
            "group": WIDGETS[0], "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": schema},
                {"name": "v2", "served": True, "storage": False, "schema": schema},
            ],
        },
    })  # fmt: skip
    try:
        kube.wait_for(
            lambda: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(name).status.conditions or []
            ),
            timeout=30,
            message="the CRD Established",
        )
        # Served once discovery has it (a real server takes a moment after Established).
        kube.wait_for(lambda: _widgets_served(kube), timeout=30, message="widgets served")
        yield
    finally:
        with contextlib.suppress(client.ApiException):
            ext.delete_custom_resource_definition(name)


def _widgets_served(kube) -> bool:
    try:
        client.CustomObjectsApi(kube.api_client).list_namespaced_custom_object(
            WIDGETS[0], "v2", kube.namespace, "widgets"
        )
        return True
    except client.ApiException:
        return False


@pytest.mark.parametrize("policy", ["Equivalent", "Exact"])
def test_match_policy_equivalent_asks_about_another_version(kube, webhook, tls, two_version_crd,
                                                            policy):  # fmt: skip
    rules = [{"apiGroups": [WIDGETS[0]], "apiVersions": ["v1"], "operations": ["CREATE"],
              "resources": ["widgets"]}]  # fmt: skip
    webhook.answer = deny("no widgets")
    body = {"apiVersion": f"{WIDGETS[0]}/v2", "kind": "Widget", "metadata": {"name": "w"}}
    custom = client.CustomObjectsApi(kube.api_client)
    with register(kube, [hook("widgets.akri-site.test", webhook.url, tls.ca_bundle, rules=rules,
                              matchPolicy=policy)]):  # fmt: skip
        create = lambda: custom.create_namespaced_custom_object(  # noqa: E731
            WIDGETS[0], "v2", kube.namespace, "widgets", body
        )
        if policy == "Exact":
            create()
            assert webhook.reviews == []
            return
        error = refused(create)
    assert error.status == 403
    [review] = webhook.reviews
    request = review["request"]
    assert request["resource"] == {"group": WIDGETS[0], "version": "v1", "resource": "widgets"}
    assert request["requestResource"]["version"] == "v2"
    assert request["kind"]["version"] == "v1" and request["requestKind"]["version"] == "v2"
    assert request["object"]["apiVersion"] == f"{WIDGETS[0]}/v1"


def test_an_object_changed_while_the_webhook_decides_is_updated_and_asked_again(kube, webhook, tls):
    """kube-apiserver admits an update inside its storage's optimistic loop: when the object
    changed meanwhile, a patch is applied again to the new state and asked about again, and a
    PUT of the old resourceVersion is a conflict."""
    core = client.CoreV1Api(kube.api_client)
    other = client.CoreV1Api(kube.new_client())
    core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "c"}, "data": {"a": "1"}}
    )
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
              "resources": ["configmaps"]}]  # fmt: skip
    changed = []

    def meanwhile(review):
        if not changed and "x" in (review["request"]["object"].get("data") or {}):
            changed.append(1)
            other.patch_namespaced_config_map("c", kube.namespace, {"data": {"b": "2"}})
        return allow(review)

    webhook.answer = meanwhile
    with register(kube, [hook("race.akri-site.test", webhook.url, tls.ca_bundle, rules=rules)]):
        stale = core.read_namespaced_config_map("c", kube.namespace)
        core.patch_namespaced_config_map("c", kube.namespace, {"data": {"x": "3"}})
        asked = [r["request"] for r in webhook.reviews if "x" in r["request"]["object"]["data"]]
        assert len(asked) >= 2
        assert asked[-1]["oldObject"]["data"] == {"a": "1", "b": "2"}
        assert core.read_namespaced_config_map("c", kube.namespace).data == {
            "a": "1", "b": "2", "x": "3"
        }  # fmt: skip
        stale.data = {"a": "9"}
        error = refused(lambda: core.replace_namespaced_config_map("c", kube.namespace, stale))
    assert error.status == 409
    assert core.read_namespaced_config_map("c", kube.namespace).data["a"] == "1"
