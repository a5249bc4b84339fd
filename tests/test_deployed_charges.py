"""Queue charges with the agents as ``deploy/`` runs them (issue 28, item 1): each agent is a
``manage.py runagent`` process of its own with its own SQLite file, talking to the API server
and its node's kubelet simulator only; the controller runs here, on the test database, and
learns which pod holds which slot from the pods (``akri-site.io/holds``), never from an
agent's database.

A team-a pod holds a slot of an Instance shared by node-a and node-b: the charges name it as
the user and team-a as the owner, the owner label is written, a non-preemptible team-b pod
asking for the same Instance is refused by the webhook, a preemptible one is let in and shown
as the foreign user an operator may evict, and once it is gone it is no user any more.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.test import Client
from kubernetes import client

from agent.charges.facts import AKRI
from agent.controller import Controller
from agent.domain.holdings import HOLDS, parse_holds
from agent.kube.client import AkriApi
from agent.kube.watch import CacheSync
from agent.models import Slot
from agent.queues import queries, webhook
from agent.queues.models import Charge
from agent.simulator.kubelet import KubeletSimulator
from tests.queues_world import LABEL, pod_body
from tests.test_agent_lifecycle import FOO0, configuration_body, healthy
from tests.test_faults import ROOT, ManagedProcess
from tests.test_queues_webhook import POD_REVIEW

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

NODES = ("node-a", "node-b")
RESOURCE = f"akri.sh/{FOO0}"


class DeployedAgent(ManagedProcess):
    """``manage.py runagent`` for one node, configured as deploy/base/agent.yaml configures
    it (agent only, its cache in a local SQLite file, no DATABASE_URL), with this test's
    kubelet simulator and API server."""

    def __init__(self, kube, node: str, root: Path, kubelet: KubeletSimulator) -> None:
        self.database = root / "agent.sqlite3"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "akri_site.settings",
            "NODE_NAME": node,
            "AKRI_AGENT_ONLY": "true",
            "AKRI_REQUIRED_SETTINGS": "NODE_NAME",
            "AKRI_SQLITE_PATH": str(self.database),
            "KUBECONFIG": kube.kubeconfig,
            "AKRI_NAMESPACE": kube.namespace,
            "DEBUG_ECHO_INSTANCES_SHARED": "true",
            "SLOT_RECLAIM_INTERVAL": "0.5",
            "LOG_LEVEL": "INFO",
        }
        for name in ("DATABASE_URL", "REDIS_URL", "AKRI_TEST_REDIS_URL"):
            env.pop(name, None)
        args = [
            sys.executable,
            "manage.py",
            "runagent",
            "--device-plugin-dir",
            kubelet.plugin_dir,
            "--pod-resources-socket",
            kubelet.pod_resources_socket,
            "--registration-socket",
            str(root / "reg.sock"),
            "--debug-echo-availability",
            str(root / "echo"),
        ]
        super().__init__(args, env, root / "agent.log")


def migrated_sqlite(path: Path, env: dict[str, str]) -> None:
    """An agent database as the DaemonSet's init container leaves it."""
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        env={**env, "AKRI_SQLITE_PATH": str(path)},
        cwd=ROOT,
        check=True,
        timeout=300,
    )


@pytest.fixture
def deployed(kube, settings):
    settings.AKRI = {**settings.AKRI, "NAMESPACE": kube.namespace}
    settings.AKRI_QUEUES = {
        **settings.AKRI_QUEUES,
        "DEBOUNCE_SECONDS": 0.05,
        "CRD_RECHECK_SECONDS": 0.5,
        "FULL_MIN_SECONDS": 0.5,
    }
    webhook.forget_world()
    root = Path(tempfile.mkdtemp(prefix="dpl", dir="/tmp"))  # unix socket paths are short
    kubelets, agents = {}, {}
    try:
        for node in NODES:
            home = root / node[-1]
            (home / "dp").mkdir(parents=True)
            kubelets[node] = KubeletSimulator(
                str(home / "dp"), str(home / "pr" / "kubelet.sock"), node_name=node
            )
            kubelets[node].start()
            agents[node] = DeployedAgent(kube, node, home, kubelets[node])
        first = agents[NODES[0]]
        migrated_sqlite(first.database, first.env)
        for agent in agents.values():
            if agent is not first:
                shutil.copy(first.database, agent.database)
        for agent in agents.values():
            agent.start()
        sync = CacheSync(kube.new_client(), kube.namespace, owner="controller", timeout_seconds=5)
        controller = Controller(kube.new_client(), kube.namespace, sync=sync, timeout_seconds=5)
        sync.start()
        controller.start()
        try:
            yield kubelets, agents
        finally:
            controller.stop()
            sync.stop()
    finally:
        for agent in agents.values():
            agent.stop()
        for kubelet in kubelets.values():
            kubelet.stop()
        for node, agent in agents.items():
            if agent.log.exists():
                print(f"--- {node} agent log (tail)\n{agent.log.read_text()[-6000:]}")
        shutil.rmtree(root, ignore_errors=True)
        webhook.forget_world()


def run_pod(kube, kubelet: KubeletSimulator, name: str, queue: str, node: str) -> str:
    """Create the pod bound to ``node`` and have its kubelet admit it; the slot it got."""
    body = pod_body(name, queue, resource=RESOURCE)
    body["spec"]["nodeName"] = node
    pod = client.CoreV1Api(kube.api_client).create_namespaced_pod(kube.namespace, body)
    result = kubelet.admit_pod(
        kube.namespace,
        name,
        [{"name": "main", "requests": {RESOURCE: 1}}],
        uid=pod.metadata.uid,
    )
    assert result.admitted, result.error
    [slot] = result.container("main").devices[RESOURCE]
    return slot


def review_of(kube, name: str, queue: str, priority: int) -> dict:
    """The AdmissionReview the API server sends for a pod asking for the shared Instance."""
    body = copy.deepcopy(POD_REVIEW)
    request = body["request"]
    request["name"], request["namespace"] = name, kube.namespace
    obj = request["object"]
    obj["metadata"] = {
        "name": name,
        "namespace": kube.namespace,
        "labels": {"kai.scheduler/queue": queue},
    }
    obj["spec"] = {
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"limits": {RESOURCE: "1"}}}
        ],
        "priority": priority,
    }
    return body


def admitted(body: dict) -> dict:
    answer = Client().post(
        "/webhooks/pods/validate", data=json.dumps(body), content_type="application/json"
    )
    assert answer.status_code == 200
    return answer.json()["response"]


def holds_of(core, kube, name: str) -> dict[str, str] | None:
    pod = core.read_namespaced_pod(name, kube.namespace)
    return parse_holds((pod.metadata.annotations or {}).get(HOLDS))


def charge() -> Charge | None:
    return Charge.objects.filter(kind=AKRI, name=FOO0).first()


def users(row: Charge | None) -> list[str]:
    return [u["pod"].rpartition("/")[2] for u in row.users] if row else []


def test_queue_charges_work_with_every_agent_on_its_own_sqlite(kube, deployed, settings):
    kubelets, agents = deployed
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_configuration(configuration_body(descriptions=("foo0",), capacity=2))
    for kubelet in kubelets.values():
        kubelet.wait_devices(RESOURCE, lambda d: len(healthy(d)) == 2, timeout=90)
    core = client.CoreV1Api(kube.api_client)

    slot = run_pod(kube, kubelets["node-a"], "cam-a", "team-a", "node-a")

    # The agent says so on the pod; the controller reads it there.
    kube.wait_for(
        lambda: holds_of(core, kube, "cam-a") == {f"{kube.namespace}/{slot}": "main"},
        timeout=30,
        message="node-a's agent naming cam-a's slot on the pod",
    )
    kube.wait_for(
        lambda: Slot.objects.filter(key=slot, pod_name="cam-a").exists(),
        timeout=30,
        message="the controller's slot-to-pod map",
    )
    row = kube.wait_for(
        lambda: (r := charge()) is not None and r.owner == "team-a" and r.source == "label" and r,
        timeout=30,
        message="team-a owning the Instance, by its label",
    )
    assert users(row) == ["cam-a"] and row.problems == []
    assert api.get_instance(FOO0)["metadata"]["labels"][LABEL] == "team-a"

    # A non-preemptible pod of another queue may not join team-a's Instance.
    refused = admitted(review_of(kube, "intruder", "team-b", priority=1000))
    assert refused["allowed"] is False
    assert f"instance {kube.namespace}/{FOO0}" in refused["status"]["message"]
    assert "team-a" in refused["status"]["message"]

    # A preemptible one may; once it holds the Instance's other slot (through node-b), it is
    # the foreign user an operator can evict.
    assert admitted(review_of(kube, "guest", "team-b", priority=0))["allowed"] is True
    other = run_pod(kube, kubelets["node-b"], "guest", "team-b", "node-b")
    assert other != slot
    row = kube.wait_for(
        lambda: (r := charge()) is not None and sorted(users(r)) == ["cam-a", "guest"] and r,
        timeout=30,
        message="both pods using the Instance",
    )
    assert row.owner == "team-a" and row.problems == []
    detail = queries.claim_detail(AKRI, kube.namespace, FOO0)
    assert [u["name"] for u in detail["users"] if u["foreign"]] == ["guest"]

    # team-a opts out of sharing: now even a preemptible pod of another queue is refused.
    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "OPT_OUT": ["team-a"]}
    webhook.forget_world()  # the webhook's view of the queues is kept for a few seconds
    opted = admitted(review_of(kube, "late-guest", "team-b", priority=0))
    assert opted["allowed"] is False
    assert "team-a" in opted["status"]["message"]
    settings.AKRI_QUEUES = {**settings.AKRI_QUEUES, "OPT_OUT": []}
    webhook.forget_world()
    assert admitted(review_of(kube, "late-guest", "team-b", priority=0))["allowed"] is True

    # The guest goes: its slot is freed by node-b's agent and it is no user any more.
    core.delete_namespaced_pod("guest", kube.namespace, grace_period_seconds=0)
    kubelets["node-b"].remove_pod(kube.namespace, "guest")
    kube.wait_for(
        lambda: (r := charge()) is not None and users(r) == ["cam-a"],
        timeout=30,
        message="the guest gone from the charges",
    )
    assert not Slot.objects.filter(pod_name="guest").exists()
    assert all(agent.running for agent in agents.values())

    # node-a's agent restarts, and while it is down the word on cam-a is lost: the restarted
    # agent (its map in its own SQLite file) says it again.
    agents["node-a"].stop()
    core.patch_namespaced_pod("cam-a", kube.namespace, {"metadata": {"annotations": {HOLDS: None}}})
    agents["node-a"].start()
    kube.wait_for(
        lambda: holds_of(core, kube, "cam-a") == {f"{kube.namespace}/{slot}": "main"},
        timeout=60,
        message="the restarted agent's word on cam-a",
    )
    assert users(charge()) == ["cam-a"]
    assert api.get_instance(FOO0)["spec"]["deviceUsage"][slot] == "node-a"
