"""The claim store over real HTTP: conditional writes, conflicts, idempotence, history."""

from __future__ import annotations

import pytest

from agent.bench.claims import instance_body, run_contention
from agent.domain.naming import slot_key
from agent.kube import cache
from agent.kube.claims import ClaimStore, ClaimStoreError, SlotChanged, SlotTaken, UnknownSlot
from agent.kube.client import AkriApi
from agent.models import Instance, Slot, SlotEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

NAME = "cams-8120fe"


@pytest.fixture
def api(kube):
    return AkriApi(kube.api_client, kube.namespace)


@pytest.fixture
def instance(api):
    created = api.create_instance(instance_body(NAME, 3, configuration="cams"))
    cache.apply_instance(created)
    return created


def usage(api, name=NAME):
    return api.get_instance(name)["spec"].get("deviceUsage") or {}


def test_it_claims_a_free_slot_and_records_it(api, instance):
    store = ClaimStore(api, "agent:node-a")

    assert store.claim(NAME, slot_key(NAME, 0), "node-a", node="node-a") == "claimed"

    assert usage(api)[slot_key(NAME, 0)] == "node-a"
    slot = Slot.objects.get(key=slot_key(NAME, 0))
    assert (slot.value, slot.level, slot.holder_node) == ("node-a", "IL", "node-a")
    event = SlotEvent.objects.get(slot=slot_key(NAME, 0))
    assert (event.before, event.after, event.cause, event.actor) == (
        "",
        "node-a",
        "allocate",
        "agent:node-a",
    )


def test_claiming_what_is_already_ours_is_success_without_a_write(api, instance):
    store = ClaimStore(api, "agent:node-a")
    store.claim(NAME, slot_key(NAME, 1), "node-a")
    rv = api.get_instance(NAME)["metadata"]["resourceVersion"]

    assert store.claim(NAME, slot_key(NAME, 1), "node-a") == "already ours"

    assert api.get_instance(NAME)["metadata"]["resourceVersion"] == rv
    assert SlotEvent.objects.filter(slot=slot_key(NAME, 1)).count() == 1


def test_a_slot_held_by_another_node_is_slot_taken_and_unchanged(api, instance):
    ClaimStore(api, "agent:node-b").claim(NAME, slot_key(NAME, 0), "node-b")

    with pytest.raises(SlotTaken):
        ClaimStore(api, "agent:node-a").claim(NAME, slot_key(NAME, 0), "node-a")

    assert usage(api)[slot_key(NAME, 0)] == "node-b"


def test_a_stale_cache_re_reads_and_decides(api, instance, kube):
    # Another writer changes slot 0 behind the cache's back.
    other = AkriApi(kube.new_client(), kube.namespace)
    other.patch_instance(
        NAME,
        [{"op": "replace", "path": f"/spec/deviceUsage/{slot_key(NAME, 0)}", "value": "node-b"}],
    )
    store = ClaimStore(api, "agent:node-a")

    with pytest.raises(SlotTaken):
        store.claim(NAME, slot_key(NAME, 0), "node-a")
    assert store.claim(NAME, slot_key(NAME, 1), "node-a") == "claimed"

    assert usage(api) == {
        slot_key(NAME, 0): "node-b",
        slot_key(NAME, 1): "node-a",
        slot_key(NAME, 2): "",
    }


def test_release_frees_only_the_expected_holder(api, instance):
    store = ClaimStore(api, "agent:node-a")
    store.claim(NAME, slot_key(NAME, 2), "node-a")

    with pytest.raises(SlotChanged):
        store.release(NAME, slot_key(NAME, 2), "node-b")
    assert usage(api)[slot_key(NAME, 2)] == "node-a"

    assert store.release(NAME, slot_key(NAME, 2), "node-a") == "released"
    assert usage(api)[slot_key(NAME, 2)] == ""
    assert store.release(NAME, slot_key(NAME, 2), "node-a") == "already free"
    causes = list(
        SlotEvent.objects.filter(slot=slot_key(NAME, 2))
        .order_by("id")
        .values_list("cause", flat=True)
    )
    assert causes == ["allocate", "release"]


def test_a_foreign_value_is_never_overwritten(api, instance):
    api.patch_instance(
        NAME,
        [
            {
                "op": "replace",
                "path": f"/spec/deviceUsage/{slot_key(NAME, 0)}",
                "value": "N:odd:value:x",
            }
        ],
    )
    store = ClaimStore(api, "agent:node-a")

    with pytest.raises(SlotTaken):
        store.claim(NAME, slot_key(NAME, 0), "node-a")
    with pytest.raises(SlotChanged):
        store.release(NAME, slot_key(NAME, 0), "node-a")

    assert usage(api)[slot_key(NAME, 0)] == "N:odd:value:x"


def test_an_unknown_slot_is_refused(api, instance):
    with pytest.raises(UnknownSlot):
        ClaimStore(api, "agent:node-a").claim(NAME, slot_key(NAME, 7), "node-a")
    with pytest.raises(UnknownSlot):
        ClaimStore(api, "agent:node-a").claim(NAME, "someone-else-0", "node-a")


def test_it_claims_on_an_akri_v013_instance_without_free_keys(api):
    # Akri v0.13 writes only held keys (server-side apply); a free slot is an absent key.
    body = instance_body("cams-a19705", 2, configuration="cams")
    del body["spec"]["deviceUsage"]
    cache.apply_instance(api.create_instance(body))
    store = ClaimStore(api, "agent:node-a")

    assert store.claim("cams-a19705", "cams-a19705-1", "C:cams-0:node-a") == "claimed"
    assert store.claim("cams-a19705", "cams-a19705-0", "node-a") == "claimed"

    assert usage(api, "cams-a19705") == {
        "cams-a19705-1": "C:cams-0:node-a",
        "cams-a19705-0": "node-a",
    }


def test_transient_errors_are_retried(api, instance, kube):
    if kube.simulator is None:
        pytest.skip("needs a fault only the simulator injects: 5xx answers to PATCH")
    kube.simulator.inject_fault("PATCH", r"/instances/" + NAME, status=500, times=2)

    assert ClaimStore(api, "agent:node-a").claim(NAME, slot_key(NAME, 0), "node-a") == "claimed"
    assert usage(api)[slot_key(NAME, 0)] == "node-a"


def test_it_gives_up_after_bounded_retries(api, instance, kube):
    if kube.simulator is None:
        pytest.skip("needs a fault only the simulator injects: 5xx answers to PATCH")
    kube.simulator.inject_fault("PATCH", r"/instances/" + NAME, status=503, times=50)

    with pytest.raises(ClaimStoreError):
        ClaimStore(api, "agent:node-a", attempts=3, backoff=0.001).claim(
            NAME, slot_key(NAME, 0), "node-a"
        )
    assert usage(api)[slot_key(NAME, 0)] == ""
    assert not SlotEvent.objects.filter(slot=slot_key(NAME, 0)).exists()


def test_twenty_claimers_race_for_three_slots(kube):
    clients = [kube.new_client() for _ in range(20)]

    figures = run_contention(clients, kube.namespace, rounds=200)

    assert figures["double_holders"] == 0
    assert figures["wrong_winner_counts"] == 0
    assert figures["losers_told_taken"] == 200 * 17
    assert figures["losers_other"] == 0


def test_the_cache_never_steps_back_to_an_older_watch_event(api, instance):
    store = ClaimStore(api, "agent:node-a")
    older = api.get_instance(NAME)
    store.claim(NAME, slot_key(NAME, 0), "node-a")

    # The watch delivers the version before our write after we applied our write.
    _, applied = cache.apply_instance(older)

    assert not applied
    assert Instance.objects.get(name=NAME).device_usage[slot_key(NAME, 0)] == "node-a"
