"""The admission policies of deploy/base/agent-policy.yaml on a real API server: an agent may
change only the pods of its own node, and only the annotations it writes there; the web evicts
workloads, never the cluster's own pods or the product's.

The node comes from the agent's bound ServiceAccount token (the API server records the node of
the pod a token is bound to), so the test makes the agent's pod, a token bound to it and a
client that presents it. The simulator has no admission chain: there the test is skipped.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time

import pytest
import yaml
from kubernetes import client

from agent.domain.holdings import HOLDS
from tests.deploykit import DEPLOY

pytestmark = pytest.mark.kube

AGENT_USER = "system:serviceaccount:akri-site:akri-site-agent"
WEB_USER = "system:serviceaccount:akri-site:akri-site-web"


def policy_for(policy_name: str, user: str, shipped_user: str, suffix: str) -> tuple[dict, dict]:
    """A shipped policy and its binding, for ``user`` and under names of the test's own."""
    documents = [
        d for d in yaml.safe_load_all((DEPLOY / "base" / "agent-policy.yaml").read_text()) if d
    ]
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    policy = copy.deepcopy(by_name[("ValidatingAdmissionPolicy", policy_name)])
    binding = copy.deepcopy(by_name[("ValidatingAdmissionPolicyBinding", policy_name)])
    condition = policy["spec"]["matchConditions"][0]
    assert shipped_user in condition["expression"]
    condition["expression"] = condition["expression"].replace(shipped_user, user)
    name = f"{policy_name}-{suffix}"
    policy["metadata"]["name"] = binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    return policy, binding


def token_client(kube, token: str) -> client.CoreV1Api:
    """A client of its own that presents ``token`` (a copy of the admin's would keep its
    kubeconfig's token refresh, which puts the admin's back)."""
    admin_conf = kube.api_client.configuration
    configuration = client.Configuration(host=admin_conf.host)
    configuration.ssl_ca_cert = admin_conf.ssl_ca_cert
    configuration.verify_ssl = admin_conf.verify_ssl
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.CoreV1Api(client.ApiClient(configuration))


def node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def pod(name: str, node_name: str, account: str = "default") -> dict:
    return {
        "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {
            "nodeName": node_name,
            "serviceAccountName": account,
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


def annotate(core: client.CoreV1Api, namespace: str, name: str, annotations: dict) -> int:
    """Patch ``annotations`` onto the pod; the HTTP status (200, or the refusal's)."""
    try:
        core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})
    except client.ApiException as exc:
        return exc.status
    return 200


def test_an_agent_changes_only_its_own_nodes_pods_and_only_its_annotations(kube):
    if not kube.real:
        pytest.skip("admission policies need a real API server: set AKRI_TEST_KUBECONFIG")
    admin = client.CoreV1Api(kube.api_client)
    ns = kube.namespace
    suffix = ns[-20:]
    here, there = f"agent-node-{suffix}", f"other-node-{suffix}"
    admin.create_namespaced_service_account(ns, {"metadata": {"name": "agent"}})
    for name in (here, there):
        admin.create_node(node(name))
    registration = client.AdmissionregistrationV1Api(kube.api_client)
    policy, binding = policy_for(
        "akri-site-agent-own-node", f"system:serviceaccount:{ns}:agent", AGENT_USER, suffix
    )
    try:
        admin.create_namespaced_pod(ns, pod("the-agent", here, account="agent"))
        admin.create_namespaced_pod(ns, pod("mine", here))
        admin.create_namespaced_pod(ns, pod("theirs", there))
        agent_pod = admin.read_namespaced_pod("the-agent", ns)
        request = {
            "spec": {
                "audiences": [],
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": "the-agent",
                    "uid": agent_pod.metadata.uid,
                },
            }
        }
        token = admin.create_namespaced_service_account_token("agent", ns, request).status.token
        registration.create_validating_admission_policy(policy)
        registration.create_validating_admission_policy_binding(binding)
        agent = token_client(kube, token)
        holds = json.dumps({f"{ns}/cam-0": "main"})

        # The policy takes effect once the server has compiled it: wait for its first refusal.
        deadline = time.monotonic() + 30
        while annotate(agent, ns, "theirs", {HOLDS: holds}) == 200:
            assert time.monotonic() < deadline, "the policy never refused the other node's pod"
            time.sleep(0.5)

        assert annotate(agent, ns, "theirs", {HOLDS: "{}"}) == 403
        assert annotate(agent, ns, "mine", {HOLDS: holds}) == 200
        assert annotate(agent, ns, "mine", {"akri.sh/assignment-consumed": "{}"}) == 200
        assert annotate(agent, ns, "mine", {"something-else": "x"}) == 403
        with pytest.raises(client.ApiException) as refused:
            agent.patch_namespaced_pod("mine", ns, {"metadata": {"labels": {"app": "y"}}})
        assert refused.value.status == 403
        assert "may not change a pod's spec or labels" in refused.value.body
        # Anyone else is not concerned.
        assert annotate(admin, ns, "theirs", {"something-else": "x"}) == 200
        # A refused write changed nothing.
        stored = admin.read_namespaced_pod("theirs", ns).metadata.annotations
        assert stored.get(HOLDS) != "{}"
        assert "something-else" not in admin.read_namespaced_pod("mine", ns).metadata.annotations
    finally:
        for kind, name in (("binding", binding), ("policy", policy)):
            try:
                if kind == "binding":
                    registration.delete_validating_admission_policy_binding(
                        name["metadata"]["name"]
                    )
                else:
                    registration.delete_validating_admission_policy(name["metadata"]["name"])
            except client.ApiException:
                pass
        for name in ("the-agent", "mine", "theirs"):
            with contextlib.suppress(client.ApiException):
                admin.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        for name in (here, there):
            admin.delete_node(name)


def test_the_web_evicts_workloads_but_never_system_pods(kube):
    if not kube.real:
        pytest.skip("admission policies need a real API server: set AKRI_TEST_KUBECONFIG")
    admin = client.CoreV1Api(kube.api_client)
    ns = kube.namespace
    admin.create_namespaced_service_account(ns, {"metadata": {"name": "web"}})
    registration = client.AdmissionregistrationV1Api(kube.api_client)
    policy, binding = policy_for(
        "akri-site-web-evicts-workloads", f"system:serviceaccount:{ns}:web", WEB_USER, ns[-20:]
    )
    victim = f"akri-site-test-{ns[-20:]}"
    try:
        admin.create_namespaced_pod("kube-system", pod(victim, ""))
        token = admin.create_namespaced_service_account_token(
            "web", ns, {"spec": {"audiences": [], "expirationSeconds": 600}}
        ).status.token
        registration.create_validating_admission_policy(policy)
        registration.create_validating_admission_policy_binding(binding)
        web = token_client(kube, token)

        def evict(namespace: str, name: str) -> int:
            body = {"metadata": {"name": name, "namespace": namespace}}
            try:
                web.create_namespaced_pod_eviction(name, namespace, body)
            except client.ApiException as exc:
                return exc.status
            return 201

        deadline = time.monotonic() + 30
        status = evict("kube-system", victim)
        while status != 403:
            assert time.monotonic() < deadline, f"never refused: {status}"
            admin.create_namespaced_pod("kube-system", pod(victim, ""))
            time.sleep(0.5)
            status = evict("kube-system", victim)
        assert admin.read_namespaced_pod(victim, "kube-system").metadata.name == victim
        admin.create_namespaced_pod(ns, pod("workload", ""))
        assert evict(ns, "workload") == 201
    finally:
        for kind, doc in (("binding", binding), ("policy", policy)):
            with contextlib.suppress(client.ApiException):
                if kind == "binding":
                    registration.delete_validating_admission_policy_binding(doc["metadata"]["name"])
                else:
                    registration.delete_validating_admission_policy(doc["metadata"]["name"])
        with contextlib.suppress(client.ApiException):
            admin.delete_namespaced_pod(victim, "kube-system", grace_period_seconds=0)
