"""A relist into the cache: bulk for new and unchanged Instances, exact for changed ones."""

from __future__ import annotations

import pytest

from agent.bench.claims import instance_body
from agent.kube import cache
from agent.models import Instance, Slot, SlotEvent

pytestmark = pytest.mark.django_db


def listed(name: str, rv: str, usage: dict[str, str] | None = None, capacity: int = 3) -> dict:
    body = instance_body(name, capacity, configuration="cams", nodes=("node-a", "node-b"))
    body["metadata"] |= {"namespace": "default", "resourceVersion": rv, "uid": f"uid-{name}"}
    body["spec"]["deviceUsage"] |= usage or {}
    return body


def snapshot(names: list[str]) -> dict:
    """Everything a reader sees of these Instances, without ids and times."""
    out = {}
    for row in Instance.objects.filter(name__in=names):
        slots = Slot.objects.filter(instance=row).order_by("key")
        out[row.name] = {
            "instance": (row.resource_version, row.capacity, row.device_usage, row.nodes),
            "slots": [
                (s.key, s.index, s.value, s.level, s.holder_node, s.vdev, s.surplus, bool(s.since))
                for s in slots
            ],
            "events": sorted(
                SlotEvent.objects.filter(instance=row.name).values_list(
                    "slot", "before", "after", "cause", "actor", "node", "resource_version"
                )
            ),
        }
    return out


def test_a_relist_into_an_empty_cache_writes_what_one_apply_per_instance_writes():
    objects = [
        listed("cams-a", "11", {"cams-a-0": "node-a", "cams-a-2": "C:0:node-b"}),
        listed("cams-b", "12"),
        listed("cams-c", "13", {"cams-c-1": "weird"}, capacity=2),
    ]
    for obj in objects:
        cache.apply_instance(obj, relist=True)
    one_by_one = snapshot(["cams-a", "cams-b", "cams-c"])
    Instance.objects.all().delete()
    SlotEvent.objects.all().delete()

    cache.replace_all_instances("default", objects)

    assert snapshot(["cams-a", "cams-b", "cams-c"]) == one_by_one
    assert SlotEvent.objects.count() == 3  # the held slots, each once


def test_a_relist_skips_unchanged_instances_applies_changed_ones_and_drops_gone_ones():
    cache.replace_all_instances(
        "default",
        [listed("keep", "5", {"keep-0": "node-a"}), listed("move", "6"), listed("gone", "7")],
    )
    kept_at = Instance.objects.get(name="keep").updated_at
    events = SlotEvent.objects.count()

    cache.replace_all_instances(
        "default",
        [
            listed("keep", "5", {"keep-0": "node-a"}),
            listed("move", "9", {"move-1": "node-b"}),
            listed("new", "10"),
        ],
    )

    assert set(Instance.objects.values_list("name", flat=True)) == {"keep", "move", "new"}
    assert Instance.objects.get(name="keep").updated_at == kept_at  # not rewritten
    move = Instance.objects.get(name="move")
    assert move.resource_version == "9"
    assert Slot.objects.get(instance=move, key="move-1").value == "node-b"
    assert SlotEvent.objects.count() == events + 1
    assert not Slot.objects.filter(instance__name="gone").exists()


def test_a_relist_clears_a_pending_echo_even_at_the_same_version():
    obj = listed("cams-p", "20", {"cams-p-0": "node-a"})
    cache.apply_instance(obj, direct=True)
    assert Instance.objects.get(name="cams-p").pending_rv == "20"

    cache.replace_all_instances("default", [obj])

    assert Instance.objects.get(name="cams-p").pending_rv == ""


def test_a_relist_of_thousands_stays_within_the_databases_parameter_limits():
    objects = [listed(f"many-{i:05d}", str(100 + i), capacity=1) for i in range(1200)]
    cache.replace_all_instances("default", objects)
    assert Instance.objects.count() == 1200
    assert Slot.objects.count() == 1200

    cache.replace_all_instances("default", objects[:5])

    assert Instance.objects.count() == 5


def pod(name: str, node: str = "node-a", phase: str = "Running", ask: str = "akri.sh/cams") -> dict:
    return {
        "metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {ask: "1"}}}],
        },
        "status": {"phase": phase},
    }


def test_a_pod_relist_keeps_the_cache_equal_to_the_list_and_rewrites_only_changes():
    from agent.controller import replace_all_pods
    from agent.models import Pod

    replace_all_pods([pod("same"), pod("moves"), pod("gone"), pod("plain", ask="cpu")])
    same_at = Pod.objects.get(name="same").updated_at
    assert set(Pod.objects.values_list("name", flat=True)) == {"same", "moves", "gone"}

    replace_all_pods([pod("same"), pod("moves", phase="Succeeded"), pod("new", node="node-b")])

    assert set(Pod.objects.values_list("name", flat=True)) == {"same", "moves", "new"}
    assert Pod.objects.get(name="same").updated_at == same_at
    moved = Pod.objects.get(name="moves")
    assert moved.phase == "Succeeded" and moved.updated_at > same_at
    assert Pod.objects.get(name="new").node_name == "node-b"
    assert Pod.objects.get(name="new").resources == {"akri.sh/cams": 1}


def test_the_end_of_a_relist_keeps_what_is_newer_than_its_list():
    """An answer to our own write applied while the pages came in (an Instance created
    after the list's snapshot) is not gone; one the list should have shown is."""
    cache.replace_all_instances("default", [listed("old", "5"), listed("stale", "6")])
    cache.apply_instance(listed("made-meanwhile", "12"), direct=True)

    removed = cache.remove_unlisted("default", {"old"}, listed_rv="10")

    assert removed == ["stale"]
    assert set(Instance.objects.values_list("name", flat=True)) == {"old", "made-meanwhile"}
    # Opaque versions say nothing about order: the list is taken at its word.
    assert cache.remove_unlisted("default", {"old"}, listed_rv="abc") == ["made-meanwhile"]
