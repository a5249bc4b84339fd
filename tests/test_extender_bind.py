"""The bind path as kube-scheduler drives it (issue 30): through the scheduler stand-in, which
sends pods from its own cache, writes ``PodScheduled=False`` after a failed attempt and retries
a failed bind, calling the extender over HTTPS with its client certificate as deploy/ has it.

Two bugs once survived the whole suite here: an assumption dropped when the cache showed the
agent's claim of some of a pod's slots (any, not all), and a binder that retried a conflicting
patch with the resourceVersion it already had instead of reading the pod again.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from agent.extender.binder import Binder, BindError
from agent.extender.service import ExtenderService
from agent.sharing.akri_slots import ASSIGNMENT, CONSUMED
from agent.simulator.scheduler import MiniScheduler, register_nodes, unregister_nodes
from tests.extender_http import make_certs, put_configuration, put_instance

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

SCHEDULER = "system:kube-scheduler"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("bind") / "certs")


class World:
    """Two cameras (capacity 1 each) that two nodes both see, in the cache as the controller
    writes it; no agents: the test plays the agent's claims and marks."""

    def __init__(self, kube, certs) -> None:
        self.kube = kube
        self.core = client.CoreV1Api(kube.api_client)
        tag = kube.namespace[2:]
        self.nodes = [f"{tag}-n1", f"{tag}-n2"]
        self.cams = [f"cam-{tag}{i}" for i in (0, 1)]
        self.rv = 1
        put_configuration(kube.namespace, "cam", capacity=1, unique=True)
        for name in self.cams:
            put_instance(kube.namespace, name, self.nodes)
        self.registered = register_nodes(self.core, self.nodes)
        self.service = ExtenderService(
            kube.new_client(),
            namespace=kube.namespace,
            feed_interval=0.05,
            kube_interval=3600,
            tls=certs.server(SCHEDULER),
        ).start()
        kube.wait_for(lambda: len(self.service.state._instances) == 2, message="books")
        # As deploy/scheduler configures it: the Configuration-level resource is the
        # extender's to count.
        self.scheduler = MiniScheduler(
            self.core,
            kube.namespace,
            self.service.url,
            dict.fromkeys(self.nodes),
            ignored_by_scheduler={"akri.sh/cam"},
            tls=certs.scheduler(),
        )

    def schedule(self, pod: dict):
        """A scheduling cycle (retried after a failed bind), no kubelet to admit the pod."""
        return self.scheduler.schedule(pod, admit=False)

    def stop(self) -> None:
        self.service.stop()
        unregister_nodes(self.core, self.registered)

    def read(self, name: str) -> dict:
        answer = self.core.read_namespaced_pod(name, self.kube.namespace, _preload_content=False)
        return json.loads(answer.data)

    def assigned(self, name: str) -> list[str]:
        annotations = self.read(name)["metadata"].get("annotations") or {}
        return json.loads(annotations[ASSIGNMENT])["slots"]["akri.sh/cam"]

    def next_rv(self) -> str:
        """A newer resourceVersion for the next cache write (the feed reads changed ones)."""
        self.rv += 1
        return str(self.rv)

    def cameras_held_by(self, holder: str) -> None:
        """Both cameras held by another node's pod ("" frees them), as the cache shows it."""
        value = f"C:cam-0:{holder}" if holder else ""
        for name in self.cams:
            put_instance(
                self.kube.namespace, name, self.nodes, usage={f"{name}-0": value}, rv=self.next_rv()
            )
        self.kube.wait_for(
            lambda: all(
                self.service.state._instances[n].usage(f"{n}-0").raw == value for n in self.cams
            ),
            message="the extender's books show the cameras",
        )

    def agent_claims(self, node: str, slots: list[str], pod_name: str) -> None:
        """What the agent does at Allocate: mark the assignment consumed on the pod, then claim
        the slots; the controller's cache shows each claim (here: only ``slots``)."""
        self.core.patch_namespaced_pod(
            pod_name,
            self.kube.namespace,
            {"metadata": {"annotations": {CONSUMED: json.dumps({"akri.sh/cam": 2})}}},
        )
        for name in self.cams:
            held = {0: f"C:cam-0:{node}"} if f"{name}-0" in slots else {}
            usage = {f"{name}-{i}": v for i, v in held.items()}
            put_instance(self.kube.namespace, name, self.nodes, usage=usage, rv=self.next_rv())
        self.kube.wait_for(
            lambda: all(
                self.service.state._instances[name].usage(f"{name}-0").held_by(node)
                == (f"{name}-0" in slots)
                for name in self.cams
            ),
            message="the extender's books show the claims",
        )
        self.service.feed.kube.refresh()  # the pod feed's relist: the pod shows, consumed


@pytest.fixture
def world(kube, certs):
    found = World(kube, certs)
    yield found
    found.stop()


def test_the_unclaimed_slot_of_a_pod_bound_with_two_stays_taken(kube, world):
    """Issue 30 (a), end to end: the cache shows the agent's claim of one of the pod's two
    slots, the pod feed shows the pod with its assignment consumed; the other slot must still
    count as taken for the next pod, on either node."""
    first = world.schedule(world.scheduler.create("two-cams", {"akri.sh/cam": 2}))
    assert (first.node, first.error) == (world.nodes[0], "")
    slots = sorted(world.assigned("two-cams"))

    world.agent_claims(first.node, slots[:1], "two-cams")
    after = world.schedule(world.scheduler.create("one-cam", {"akri.sh/cam": 1}))

    assert after.node == ""
    assert after.filter_result["FailedNodes"] == {
        node: f"1 unique cam devices requested, 0 of 2 free on node {node}" for node in world.nodes
    }
    # Once the cache shows both claims, the books follow the slots themselves.
    world.agent_claims(first.node, slots, "two-cams")
    assert world.service.state.assumptions == {}
    assert world.schedule(world.scheduler.create("later", {"akri.sh/cam": 1})).node == ""


def test_after_a_failed_attempt_the_stand_in_writes_why_and_keeps_its_stale_copy(kube, world):
    """What kube-scheduler does: PodScheduled=False with the reasons, written on the pod (a
    status patch), while its own cache still holds the pod as it was."""
    cached = world.scheduler.create("three-cams", {"akri.sh/cam": 3})

    outcome = world.schedule(cached)

    stored = world.read("three-cams")
    [condition] = stored["status"]["conditions"]
    assert outcome.node == "" and outcome.attempts == 1  # no node fits: not retried at once
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "PodScheduled",
        "False",
        "Unschedulable",
    )
    assert condition["message"] == outcome.message(2)
    assert condition["message"].startswith("0/2 nodes are available: 1 3 unique cam devices")
    assert world.scheduler.cached(cached) is cached
    assert stored["metadata"]["resourceVersion"] != cached["metadata"]["resourceVersion"]
    # The same verdict again writes nothing (kube-scheduler compares the condition).
    world.schedule(cached)
    assert (
        world.read("three-cams")["metadata"]["resourceVersion"]
        == (stored["metadata"]["resourceVersion"])
    )


def test_a_stale_pod_is_bound_once_its_slots_are_free(kube, world):
    """The scheduler's copy predates its own PodScheduled write; the bind still goes through
    on the first attempt, the condition kept and the assignment written."""
    world.cameras_held_by("elsewhere")
    cached = world.scheduler.create("waits", {"akri.sh/cam": 1})
    assert world.schedule(cached).node == ""
    world.cameras_held_by("")

    outcome = world.schedule(cached)

    stored = world.read("waits")
    assert (outcome.node, outcome.attempts, outcome.error) == (world.nodes[0], 1, "")
    assert stored["spec"]["nodeName"] == world.nodes[0]
    assert ASSIGNMENT in stored["metadata"]["annotations"]
    # The Binding turned the scheduler's PodScheduled=False into True, as the API server does.
    assert [(c["type"], c["status"]) for c in stored["status"]["conditions"]] == [
        ("PodScheduled", "True")
    ]


def test_the_binder_reads_the_pod_again_after_a_conflict(kube, world):
    """Issue 30 (b), at the binder: its patch carries a resourceVersion test; given the
    scheduler's stale copy (older than the server's, which holds the PodScheduled condition),
    the patch conflicts, and the binder must read the pod again and patch what it is now."""
    cached = world.scheduler.create("stale", {"akri.sh/cam": 3})
    world.schedule(cached)  # fails; the server's pod moves on
    assert (
        world.read("stale")["metadata"]["resourceVersion"]
        != (cached["metadata"]["resourceVersion"])
    )
    binder = Binder(kube.api_client)

    binder.annotate(cached, {ASSIGNMENT: '{"node": "n", "at": 1, "slots": {}}'})

    stored = world.read("stale")
    assert stored["metadata"]["annotations"][ASSIGNMENT] == '{"node": "n", "at": 1, "slots": {}}'
    assert stored["status"]["conditions"][0]["type"] == "PodScheduled"  # nothing overwritten


def test_a_write_between_the_extenders_read_and_its_patch_does_not_fail_the_bind(kube, world):
    """Issue 30 (b), end to end: someone writes the pod (a controller's label, the scheduler's
    condition) after the extender read it; its conditional patch conflicts, it reads the pod
    again and binds on the first attempt, without the scheduler having to retry."""
    binder = world.service.extender.binder
    read = binder.get_pod
    writes = []

    def read_then_someone_writes(namespace: str, name: str) -> dict:
        pod = read(namespace, name)
        if not writes:
            writes.append(name)
            world.core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": {"t": "1"}}})
        return pod

    binder.get_pod = read_then_someone_writes
    cached = world.scheduler.create("raced", {"akri.sh/cam": 1})

    outcome = world.schedule(cached)

    stored = world.read("raced")
    assert writes == ["raced"]
    assert (outcome.node, outcome.attempts, outcome.failures) == (world.nodes[0], 1, [])
    assert stored["spec"]["nodeName"] == world.nodes[0]
    assert stored["metadata"]["labels"] == {"t": "1"}
    assert (
        len(json.loads(stored["metadata"]["annotations"][ASSIGNMENT])["slots"]["akri.sh/cam"]) == 1
    )


def test_the_scheduler_retries_a_failed_bind_and_says_why_in_between(kube, world):
    """kube-scheduler puts a pod whose bind failed back in its queue (SchedulerError on the
    pod meanwhile) and tries again: the extender gave the slots back, so the retry gets them."""
    binder = world.service.extender.binder
    create_binding = binder.bind
    failures = []

    seen_at_retry = []

    def fails_once(namespace: str, name: str, *rest):
        if not failures:
            failures.append(name)
            raise BindError("cannot bind: the API server hiccuped")
        seen_at_retry.extend(world.read(name)["status"]["conditions"])
        return create_binding(namespace, name, *rest)

    binder.bind = fails_once
    cached = world.scheduler.create("retried", {"akri.sh/cam": 2})

    outcome = world.schedule(cached)

    stored = world.read("retried")
    assert (outcome.node, outcome.attempts) == (world.nodes[0], 2)
    assert outcome.failures == [
        "bind failed: 200 {'Error': 'cannot bind: the API server hiccuped'}"
    ]
    assert stored["spec"]["nodeName"] == world.nodes[0]
    [between] = seen_at_retry
    assert (between["type"], between["status"], between["reason"]) == (
        "PodScheduled",
        "False",
        "SchedulerError",
    )
    assert "the API server hiccuped" in between["message"]
    assert len(world.assigned("retried")) == 2
