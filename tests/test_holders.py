"""The controller's slot-to-pod map (``Slot.pod_*``) from the pods' own word: the
``akri-site.io/holds`` annotation an agent writes on its node's pods, watched through the API
server (no agent database involved). The annotations are written here as an agent would."""

from __future__ import annotations

import contextlib

import pytest
from django.db import OperationalError
from kubernetes import client

from agent.controller import Controller
from agent.domain.holdings import HOLDS, format_holds
from agent.kube.client import AkriApi
from agent.kube.holders import Holders
from agent.kube.watch import CacheSync
from agent.models import Pod, Slot
from tests.queues_world import held_instance

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAM = "cam-holders"
RESOURCE = f"akri.sh/{CAM}"


@contextlib.contextmanager
def running_controller(kube):
    sync = CacheSync(kube.new_client(), kube.namespace, owner="controller", timeout_seconds=5)
    ctl = Controller(kube.new_client(), kube.namespace, sync=sync, timeout_seconds=5, queues=False)
    sync.start()
    ctl.start()
    assert sync.wait_synced()
    try:
        yield ctl
    finally:
        ctl.stop()
        sync.stop()


@pytest.fixture
def world(kube):
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_instance(held_instance(CAM, "cams", holders=1, capacity=3))
    return api, client.CoreV1Api(kube.api_client)


def says(kube, slots: dict[str, str]) -> str:
    return format_holds({f"{kube.namespace}/{k}": v for k, v in slots.items()})


def make_pod(kube, core, name: str, node: str, holds: dict[str, str] | None) -> dict:
    container = {
        "name": "main",
        "image": "busybox",
        "resources": {"limits": {RESOURCE: "1"}, "requests": {RESOURCE: "1"}},
    }
    meta: dict = {"name": name}
    if holds is not None:
        meta["annotations"] = {HOLDS: says(kube, holds)}
    body = {"metadata": meta, "spec": {"nodeName": node, "containers": [container]}}
    return core.create_namespaced_pod(kube.namespace, body).to_dict()


def annotate(kube, core, name: str, holds: dict[str, str]) -> None:
    core.patch_namespaced_pod(
        name, kube.namespace, {"metadata": {"annotations": {HOLDS: says(kube, holds)}}}
    )


def shown(key: str) -> tuple[str, str, str]:
    row = Slot.objects.filter(key=key).values_list("pod_name", "pod_uid", "container").first()
    return row or ("?", "?", "?")


def test_a_slot_names_the_pod_that_says_it_holds_it(kube, world):
    _, core = world
    with running_controller(kube) as ctl:
        pod = make_pod(kube, core, "user", "node-a", {f"{CAM}-0": "main"})
        kube.wait_for(
            lambda: shown(f"{CAM}-0") == ("user", pod["metadata"]["uid"], "main"),
            message="the slot naming its pod",
        )
        assert ctl.holders.wait_idle()
        # A pod may only name slots its own node holds: slot 1 is free, and stays unnamed.
        annotate(kube, core, "user", {f"{CAM}-0": "main", f"{CAM}-1": "main"})
        assert kube.wait_for(lambda: Pod.objects.filter(name="user", holds__isnull=False).first())
        assert ctl.holders.wait_idle()
        assert shown(f"{CAM}-1") == ("", "", "")


def test_the_pods_word_before_the_claim_is_seen_fills_the_slot_once_it_is(kube, world):
    api, core = world
    with running_controller(kube) as ctl:
        pod = make_pod(kube, core, "early", "node-a", {f"{CAM}-1": "main"})
        kube.wait_for(lambda: Pod.objects.filter(name="early").exists())
        assert ctl.holders.wait_idle()
        assert shown(f"{CAM}-1") == ("", "", "")

        api.patch_instance(
            CAM,
            [
                {"op": "test", "path": f"/spec/deviceUsage/{CAM}-1", "value": ""},
                {"op": "replace", "path": f"/spec/deviceUsage/{CAM}-1", "value": "node-a"},
            ],
        )

        kube.wait_for(
            lambda: shown(f"{CAM}-1") == ("early", pod["metadata"]["uid"], "main"),
            message="the slot filled after its claim arrived",
        )


def test_the_slot_is_cleared_when_its_pod_goes_ends_or_no_longer_holds_it(kube, world):
    _, core = world
    with running_controller(kube):
        make_pod(kube, core, "first", "node-a", {f"{CAM}-0": "main"})
        kube.wait_for(lambda: shown(f"{CAM}-0")[0] == "first")
        annotate(kube, core, "first", {})
        kube.wait_for(lambda: shown(f"{CAM}-0") == ("", "", ""), message="cleared: not held")

        annotate(kube, core, "first", {f"{CAM}-0": "main"})
        kube.wait_for(lambda: shown(f"{CAM}-0")[0] == "first")
        core.patch_namespaced_pod_status("first", kube.namespace, {"status": {"phase": "Failed"}})
        kube.wait_for(lambda: shown(f"{CAM}-0") == ("", "", ""), message="cleared: pod ended")

        make_pod(kube, core, "second", "node-a", {f"{CAM}-0": "main"})
        kube.wait_for(lambda: shown(f"{CAM}-0")[0] == "second")
        core.delete_namespaced_pod("second", kube.namespace, grace_period_seconds=0)
        kube.wait_for(lambda: shown(f"{CAM}-0") == ("", "", ""), message="cleared: pod gone")


def test_a_pod_on_another_node_cannot_name_a_slot_this_node_holds(kube, world):
    _, core = world
    with running_controller(kube) as ctl:
        make_pod(kube, core, "elsewhere", "node-b", {f"{CAM}-0": "main"})
        kube.wait_for(lambda: Pod.objects.filter(name="elsewhere").exists())
        assert ctl.holders.wait_idle()
        assert shown(f"{CAM}-0") == ("", "", "")


def test_a_restarted_controller_converges_on_what_happened_while_it_was_away(kube, world):
    _, core = world
    with running_controller(kube):
        make_pod(kube, core, "stays", "node-a", {f"{CAM}-0": "main"})
        kube.wait_for(lambda: shown(f"{CAM}-0")[0] == "stays")
    # While no controller runs: the pod goes, and a new one says it holds the slot.
    core.delete_namespaced_pod("stays", kube.namespace, grace_period_seconds=0)
    pod = make_pod(kube, core, "next", "node-a", {f"{CAM}-0": "side"})

    with running_controller(kube):
        kube.wait_for(
            lambda: shown(f"{CAM}-0") == ("next", pod["metadata"]["uid"], "side"),
            message="the slot naming the new pod after the restart",
        )


def test_a_relist_rebuilds_the_map(kube, world):
    _, core = world
    with running_controller(kube) as ctl:
        pod = make_pod(kube, core, "listed", "node-a", {f"{CAM}-0": "main"})
        kube.wait_for(lambda: shown(f"{CAM}-0")[0] == "listed")
        # A slot row that names a pod nobody knows (written while the watch was away).
        Slot.objects.filter(key=f"{CAM}-0").update(pod_name="ghost", pod_uid="x")

        ctl.pods.relist_soon()

        kube.wait_for(
            lambda: shown(f"{CAM}-0") == ("listed", pod["metadata"]["uid"], "main"),
            message="the map rebuilt by the relist",
        )


def test_a_database_error_delays_the_map_and_loses_nothing(kube, world, monkeypatch):
    original = Holders._rows
    failures = []

    def failing(self, *args):
        if len(failures) < 2:
            failures.append(1)
            raise OperationalError("too many clients")
        return original(self, *args)

    monkeypatch.setattr(Holders, "_rows", failing)
    _, core = world
    with running_controller(kube) as ctl:
        pod = make_pod(kube, core, "patient", "node-a", {f"{CAM}-0": "main"})
        kube.wait_for(
            lambda: shown(f"{CAM}-0") == ("patient", pod["metadata"]["uid"], "main"),
            message="the slot named once the database answers",
        )
        assert ctl.holders.wait_idle()
    assert len(failures) == 2
