"""History does not invent authors for writes of unknown origin (issue #12, item 7)."""

from __future__ import annotations

import pytest
from kubernetes import client

from agent.domain.naming import slot_key
from agent.kube import cache
from agent.kube.client import AkriApi
from agent.models import Node, SlotEvent
from agent.reconcile_cluster import run_cluster_pass
from tests.reconcile_world import configuration_body, make_instance, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

CAMS = "cams-8120fe"


@pytest.fixture
def api(kube):
    api = AkriApi(kube.api_client, kube.namespace)
    api.create_configuration(configuration_body("cams"))
    make_instance(api, CAMS, nodes=("node-a",))
    return api


@pytest.fixture
def node_a(kube):
    core = client.CoreV1Api(kube.api_client)
    core.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "node-a"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    yield
    if kube.real:
        core.delete_node("node-a")


def write_directly(api: AkriApi, key: str, value: str) -> None:
    """What someone with kubectl does: a plain patch, then the watch's echo into the cache."""
    ops = [{"op": "add", "path": f"/spec/deviceUsage/{key}", "value": value}]
    cache.apply_instance(api.patch_instance(CAMS, ops))


def test_an_unknown_value_written_directly_is_observed_by_an_unknown_actor(api):
    key = slot_key(CAMS, 0)

    write_directly(api, key, "weird-value-123")

    event = SlotEvent.objects.get(slot=key)
    assert (event.before, event.after) == ("", "weird-value-123")
    assert (event.cause, event.actor) == ("observed", "unknown")


def test_a_value_naming_a_known_node_is_still_credited_to_its_agent(api):
    key = slot_key(CAMS, 1)

    write_directly(api, key, "node-a")

    event = SlotEvent.objects.get(slot=key)
    assert (event.cause, event.actor, event.node) == ("allocate", "agent:node-a", "node-a")


def test_a_node_mirrored_from_the_node_list_counts_as_known(api):
    Node.objects.create(name="node-z", ready=True)
    key = slot_key(CAMS, 0)

    write_directly(api, key, "node-z")

    assert SlotEvent.objects.get(slot=key).actor == "agent:node-z"


def test_freeing_it_later_does_not_blame_a_deleted_node_that_never_existed(kube, api, node_a):
    key = slot_key(CAMS, 0)
    write_directly(api, key, "weird-value-123")

    run = run_cluster_pass(kube.namespace, api_client=kube.api_client)

    assert usage(api, CAMS)[key] == ""
    freed = SlotEvent.objects.get(slot=key, run=run)
    assert "deleted" not in freed.detail
    assert freed.detail == "node weird-value-123 was never a node of this cluster"
    assert "deleted" not in run.detail
    assert "'weird-value-123' was never a node of this cluster" in run.detail
