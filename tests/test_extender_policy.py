"""The admission policy of deploy/base/extender-policy.yaml on a real API server: the extender's
cluster-wide `patch pods` reaches only pods not bound yet, and only the device annotations it
writes at bind; the extender's own binder still does its work under it. The simulator has no
admission chain: there the test is skipped."""

from __future__ import annotations

import contextlib
import copy
import json
import time

import pytest
import yaml
from kubernetes import client

from agent.extender.binder import Binder
from agent.sharing.akri_slots import ASSIGNMENT
from agent.simulator.scheduler import STAND_IN
from tests.deploykit import DEPLOY
from tests.test_agent_policy import token_client

pytestmark = pytest.mark.kube

EXTENDER_USER = "system:serviceaccount:akri-site:akri-site-extender"
NAME = "akri-site-extender-pending-pods"


def policy_for(user: str, suffix: str) -> tuple[dict, dict]:
    """The shipped policy and its binding, for ``user`` and under names of the test's own."""
    documents = yaml.safe_load_all((DEPLOY / "base" / "extender-policy.yaml").read_text())
    by_kind = {d["kind"]: d for d in documents if d}
    policy = copy.deepcopy(by_kind["ValidatingAdmissionPolicy"])
    binding = copy.deepcopy(by_kind["ValidatingAdmissionPolicyBinding"])
    condition = policy["spec"]["matchConditions"][0]
    assert EXTENDER_USER in condition["expression"]
    condition["expression"] = condition["expression"].replace(EXTENDER_USER, user)
    name = f"{NAME}-{suffix}"
    policy["metadata"]["name"] = binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    return policy, binding


def pod(name: str, node_name: str = "") -> dict:
    # A scheduler name nobody serves: a real kube-scheduler leaves the pending pods pending.
    spec = {"containers": [{"name": "main", "image": "busybox"}], "schedulerName": STAND_IN}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "labels": {"app": "x"}}, "spec": spec}


def patched(core: client.CoreV1Api, namespace: str, name: str, body: dict) -> int:
    try:
        core.patch_namespaced_pod(name, namespace, body)
    except client.ApiException as exc:
        return exc.status
    return 200


def test_the_extender_annotates_only_pods_not_bound_yet_and_nothing_else(kube):
    if not kube.real:
        pytest.skip("admission policies need a real API server: set AKRI_TEST_KUBECONFIG")
    admin = client.CoreV1Api(kube.api_client)
    ns = kube.namespace
    admin.create_namespaced_service_account(ns, {"metadata": {"name": "extender"}})
    registration = client.AdmissionregistrationV1Api(kube.api_client)
    policy, binding = policy_for(f"system:serviceaccount:{ns}:extender", ns[-20:])
    assignment = json.dumps({"node": "n1", "at": 1, "slots": {"akri.sh/cam": ["cam-0"]}})
    try:
        for name, node in (("pending", ""), ("later", ""), ("running", "some-node")):
            admin.create_namespaced_pod(ns, pod(name, node))
        token = admin.create_namespaced_service_account_token(
            "extender", ns, {"spec": {"audiences": [], "expirationSeconds": 600}}
        ).status.token
        registration.create_validating_admission_policy(policy)
        registration.create_validating_admission_policy_binding(binding)
        extender = token_client(kube, token)

        # The policy takes effect once the server has compiled it: wait for its first refusal.
        deadline = time.monotonic() + 30
        while patched(extender, ns, "running", {"metadata": {"annotations": {"x": "1"}}}) == 200:
            assert time.monotonic() < deadline, "the policy never refused a bound pod"
            time.sleep(0.5)

        refusals = {
            "a bound pod's assignment": patched(
                extender, ns, "running", {"metadata": {"annotations": {ASSIGNMENT: assignment}}}
            ),
            "another annotation": patched(
                extender, ns, "pending", {"metadata": {"annotations": {"x": "1"}}}
            ),
            "a label": patched(extender, ns, "pending", {"metadata": {"labels": {"app": "y"}}}),
            "an image": patched(
                extender,
                ns,
                "pending",
                {"spec": {"containers": [{"name": "main", "image": "evil"}]}},
            ),
        }
        assert refusals == dict.fromkeys(refusals, 403)
        # What the extender itself does at bind passes: its conditional JSON patch of the
        # assignment, and the merge patch that takes it off after a failed bind.
        binder = Binder(extender.api_client)
        binder.annotate(binder.get_pod(ns, "pending"), {ASSIGNMENT: assignment})
        assert admin.read_namespaced_pod("pending", ns).metadata.annotations[ASSIGNMENT] == (
            assignment
        )
        binder.annotate(binder.get_pod(ns, "later"), {ASSIGNMENT: assignment})
        binder.unannotate(ns, "later", [ASSIGNMENT])
        assert ASSIGNMENT not in (admin.read_namespaced_pod("later", ns).metadata.annotations or {})
        # A refused write changed nothing.
        stored = admin.read_namespaced_pod("pending", ns)
        assert stored.metadata.labels == {"app": "x"}
        assert stored.spec.containers[0].image == "busybox"
        assert "x" not in stored.metadata.annotations
    finally:
        with contextlib.suppress(client.ApiException):
            registration.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        with contextlib.suppress(client.ApiException):
            registration.delete_validating_admission_policy(policy["metadata"]["name"])
        for name in ("pending", "later", "running"):
            with contextlib.suppress(client.ApiException):
                admin.delete_namespaced_pod(name, ns, grace_period_seconds=0)
