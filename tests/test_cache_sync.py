"""Watching Configurations and Instances into the ORM cache, over real HTTP."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from kubernetes import client

from agent.bench.claims import instance_body
from agent.kube import cache
from agent.kube.client import AkriApi
from agent.kube.watch import CacheSync
from agent.models import Configuration, Instance, Slot, SlotEvent, SyncState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]


def configuration_body(name: str, **spec) -> dict:
    base = {
        "discoveryHandler": {
            "name": "debugEcho",
            "discoveryDetails": "descriptions:\n- foo0\n- foo1\n",
        },
        "capacity": 2,
    }
    base.update(spec)
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name},
        "spec": base,
    }


@pytest.fixture
def api(kube):
    return AkriApi(kube.api_client, kube.namespace)


@pytest.fixture
def sync(kube):
    sync = CacheSync(kube.new_client(), kube.namespace, owner="test", timeout_seconds=5)
    yield sync
    sync.stop()


def test_it_lists_then_watches_into_the_cache(api, sync, kube):
    api.create_configuration(configuration_body("cams"))
    api.create_instance(instance_body("cams-8120fe", 2, configuration="cams"))
    seen = []
    sync.subscribe(lambda kind, name, obj: seen.append((kind, name)))

    sync.start()
    assert sync.wait_synced()
    kube.wait_for(lambda: Instance.objects.filter(name="cams-8120fe").exists())
    assert Configuration.objects.get(name="cams").capacity == 2
    assert Slot.objects.filter(instance__name="cams-8120fe").count() == 2

    api.patch_instance(
        "cams-8120fe",
        [{"op": "replace", "path": "/spec/deviceUsage/cams-8120fe-1", "value": "node-b"}],
    )
    kube.wait_for(lambda: Slot.objects.get(key="cams-8120fe-1").value == "node-b")
    slot = Slot.objects.get(key="cams-8120fe-1")
    assert (slot.level, slot.holder_node) == ("IL", "node-b")
    assert ("instance", "cams-8120fe") in seen

    api.custom.delete_namespaced_custom_object(
        "akri.sh", "v0", kube.namespace, "instances", "cams-8120fe"
    )
    kube.wait_for(lambda: not Instance.objects.filter(name="cams-8120fe").exists())


def test_a_malformed_configuration_is_kept_with_a_clear_error(api, sync, kube):
    """Our CRD refuses a Configuration without a discovery handler name (422), but a cluster
    that runs Akri's own CRD, which checks less, serves one: it arrives here as that cluster's
    watch would bring it."""
    sync.start()
    sync.wait_synced()
    broken = configuration_body("broken", discoveryHandler={"discoveryDetails": "x"})
    with pytest.raises(client.ApiException) as refused:
        api.create_configuration(broken)
    assert refused.value.status == 422
    broken["metadata"].update(namespace=kube.namespace, uid="u-broken", resourceVersion="1")

    sync.configurations.on_event("ADDED", broken)

    kube.wait_for(lambda: Configuration.objects.filter(name="broken").exists())
    row = Configuration.objects.get(name="broken")
    assert "discoveryHandler.name is required" in row.error


def test_it_resumes_from_the_stored_resource_version(api, kube):
    first = CacheSync(kube.new_client(), kube.namespace, owner="resume", timeout_seconds=5).start()
    first.wait_synced()
    api.create_instance(instance_body("cams-a19705", 1, configuration="cams"))
    kube.wait_for(lambda: Instance.objects.filter(name="cams-a19705").exists())
    first.stop()
    relists = first.instances.relists

    # While nobody watches, the Instance changes; a new sync resumes and catches up.
    api.patch_instance(
        "cams-a19705",
        [{"op": "replace", "path": "/spec/deviceUsage/cams-a19705-0", "value": "node-c"}],
    )
    second = CacheSync(kube.new_client(), kube.namespace, owner="resume", timeout_seconds=5).start()
    try:
        kube.wait_for(lambda: Slot.objects.get(key="cams-a19705-0").value == "node-c")
        assert second.instances.relists == 0, "resumed from the stored version, no relist"
        assert relists == 1
    finally:
        second.stop()


def test_it_relists_when_the_version_is_too_old(api, kube):
    if kube.simulator is None:
        pytest.skip("needs a fault only the simulator injects: 410 Gone from a one-event history")
    SyncState.objects.create(owner="gone", kind=f"{kube.namespace}/instances", resource_version="1")
    Instance.objects.create(
        namespace=kube.namespace, name="ghost-000000", configuration_name="cams"
    )
    api.create_instance(instance_body("cams-d46b65", 1, configuration="cams"))
    kube.simulator.set_history_limit(1)
    for value in ("a", "b", "c"):
        api.patch_instance(
            "cams-d46b65",
            [{"op": "replace", "path": "/spec/deviceUsage/cams-d46b65-0", "value": value}],
        )
    sync = CacheSync(kube.new_client(), kube.namespace, owner="gone", timeout_seconds=5).start()
    try:
        kube.wait_for(lambda: sync.instances.relists >= 1)
        kube.wait_for(lambda: Slot.objects.filter(key="cams-d46b65-0", value="c").exists())
        # The relist is the truth: what it no longer has is gone from the cache once its
        # last page is in (pages are written as they come; the end removes the rest).
        kube.wait_for(lambda: not Instance.objects.filter(name="ghost-000000").exists())
    finally:
        sync.stop()
        kube.simulator.set_history_limit(10000)


def test_applying_the_same_state_twice_changes_nothing(api, kube):
    from agent.kube import cache
    from agent.models import SlotEvent

    obj = api.create_instance(instance_body("cams-ab76e6", 2, configuration="cams"))
    obj = api.patch_instance(
        "cams-ab76e6",
        [{"op": "replace", "path": "/spec/deviceUsage/cams-ab76e6-0", "value": "node-a"}],
    )
    cache.apply_instance(obj)
    events = SlotEvent.objects.count()

    cache.apply_instance(obj)

    assert SlotEvent.objects.count() == events
    assert Slot.objects.get(key="cams-ab76e6-0").value == "node-a"


def test_our_writes_keep_their_cause_whichever_path_reaches_the_cache_first(api, sync, kube):
    from agent.kube.claims import ClaimStore
    from agent.models import SlotEvent

    sync.start()
    sync.wait_synced()
    api.create_instance(instance_body("cams-4294ea", 2, configuration="cams"))
    kube.wait_for(lambda: Instance.objects.filter(name="cams-4294ea").exists())
    store = ClaimStore(api, "agent:node-a", sync=sync)

    for _ in range(5):
        store.claim("cams-4294ea", "cams-4294ea-0", "node-a", node="node-a")
        store.release("cams-4294ea", "cams-4294ea-0", "node-a", node="node-a")
    assert sync.drain()

    events = SlotEvent.objects.filter(slot="cams-4294ea-0").order_by("id")
    assert [e.cause for e in events] == ["allocate", "release"] * 5
    assert {e.actor for e in events} == {"agent:node-a"}


def test_wait_watched_returns_once_the_echo_of_a_write_is_in_the_cache(api, sync):
    api.create_instance(instance_body("cams-8120fe", 2, configuration="cams"))
    sync.start()
    assert sync.wait_synced()
    answer = api.patch_instance(
        "cams-8120fe",
        [{"op": "replace", "path": "/spec/deviceUsage/cams-8120fe-0", "value": "node-a"}],
    )
    rv = answer["metadata"]["resourceVersion"]

    assert sync.wait_watched("cams-8120fe", rv)
    assert Instance.objects.get(name="cams-8120fe").resource_version == rv
    assert Slot.objects.get(key="cams-8120fe-0").value == "node-a"
    # A version that never comes: False once the timeout is over (resourceVersions are
    # integers on etcd and the simulator; elsewhere they are opaque and this says nothing).
    if rv.isdigit():
        assert not sync.wait_watched("cams-8120fe", str(int(rv) + 10_000), timeout=0.3)


def test_two_writers_of_one_instance_row_take_turns():
    """The applier and a claim store applying its answer inline each read the row, decide
    and write what differs: the second must read after the first has written, or it keeps
    the first's pending echo beside an older version and the cache stays behind."""
    body = instance_body("cams-8120fe", 2, configuration="cams")
    body["metadata"].update(namespace="default", resourceVersion="1")
    cache.apply_instance(body)
    newer = {**body, "metadata": {**body["metadata"], "resourceVersion": "2"}}
    holding, let_go = threading.Event(), threading.Event()

    def first() -> None:
        with transaction.atomic():
            cache._instance_row("default", "cams-8120fe")
            holding.set()
            let_go.wait(10)
        connection.close()

    def second() -> None:
        holding.wait(10)
        cache.apply_instance(newer)
        connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert holding.wait(10)
    threads[1].join(timeout=0.3)
    assert threads[1].is_alive()  # waits for the first writer's transaction
    let_go.set()
    for thread in threads:
        thread.join(timeout=10)
    assert Instance.objects.get(name="cams-8120fe").resource_version == "2"


def test_a_relist_reads_the_list_in_pages_and_keeps_every_instance(api, kube, monkeypatch):
    from agent.kube import watch as watch_module

    monkeypatch.setattr(watch_module, "LIST_PAGE", 7)
    for i in range(20):
        api.create_instance(instance_body(f"paged-{i:02d}", 1, configuration="cams"))
    sync = CacheSync(kube.new_client(), kube.namespace, owner="paged", timeout_seconds=5)
    try:
        sync.start()
        assert sync.wait_synced()
        assert Instance.objects.filter(name__startswith="paged-").count() == 20
    finally:
        sync.stop()
    if kube.simulator is not None:
        lists = [
            r
            for r in kube.simulator.request_log
            if r.method == "GET" and r.path.endswith("/instances") and "watch" not in r.query
        ]
        assert len(lists) == 3  # 7 + 7 + 6
        assert all(r.query.get("limit") == "7" for r in lists)


def test_a_relist_in_pages_mirrors_every_page_and_drops_what_it_no_longer_lists(
    api, kube, monkeypatch
):
    from agent.kube import watch

    # Three Instances a page: seven Instances make three pages, and the applier is never
    # more than two pages behind the list (the watch thread waits for it).
    monkeypatch.setattr(watch, "LIST_PAGE", 3)
    names = [f"cams-{n:06x}" for n in range(7)]
    for name in names:
        api.create_instance(instance_body(name, 2, configuration="cams"))
    Instance.objects.create(
        namespace=kube.namespace, name="ghost-000000", configuration_name="cams"
    )
    seen: list[tuple[str, str]] = []
    listing: list[bool] = []

    def heard(kind, name, obj):
        seen.append((kind, name))
        if kind != "instance":
            return
        state = SyncState.objects.filter(owner="pages", kind=f"{kube.namespace}/instances")
        listing.append(state.values_list("listing_since", flat=True).first() is not None)

    sync = CacheSync(kube.new_client(), kube.namespace, owner="pages", timeout_seconds=5)
    sync.subscribe(heard)
    sync.start()
    try:
        assert sync.wait_synced()
        assert sorted(Instance.objects.values_list("name", flat=True)) == names
        assert Slot.objects.filter(instance__name__in=names).count() == 14
        assert sync._pages_ahead._value == watch.RELIST_PAGES_AHEAD  # every page taken
        # Subscribers hear of every listed Instance, then of the relist's end.
        assert [n for k, n in seen if k == "instance"] == [*names, ""]
        # Marked as listing while the pages came in (the dashboard says "syncing"), not after.
        assert listing[0] is True
        assert not SyncState.objects.filter(listing_since__isnull=False).exists()
    finally:
        sync.stop()


def watched(name: str, rv: int) -> dict:
    obj = instance_body(name, 2)
    obj["metadata"].update(namespace="default", resourceVersion=str(rv), uid=f"uid-{name}")
    return obj


def test_a_batch_of_watched_changes_is_applied_in_one_transaction(kube, monkeypatch):
    """Three watch events queued together go through one transaction, with no fallback."""
    sync = CacheSync(kube.new_client(), "default", owner="batch-test", timeout_seconds=5)
    one_by_one: list = []
    monkeypatch.setattr(sync, "_apply_until_done", one_by_one.append)
    batch = [("event", "ADDED", watched(f"batch-{i:06x}", 10 + i)) for i in range(3)]
    commits = []
    real_commit = connection.commit
    monkeypatch.setattr(connection, "commit", lambda: commits.append(1) or real_commit())

    sync._apply_batch(batch)

    assert one_by_one == []
    assert sync.batch_fallbacks == 0
    assert commits == [1]  # the outermost atomic block commits once, for all three
    assert Instance.objects.filter(namespace="default", name__startswith="batch-").count() == 3


def test_a_batch_with_a_change_it_cannot_take_falls_back_loudly(kube, monkeypatch, caplog):
    from agent import metrics

    sync = CacheSync(kube.new_client(), "default", owner="fallback-test", timeout_seconds=5)
    bad = watched("batch-bad000", 30)
    bad["metadata"].pop("name")  # a handler fault: no name to key the row by
    batch = [
        ("event", "ADDED", watched("batch-good01", 31)),
        ("event", "ADDED", bad),
        ("event", "ADDED", watched("batch-good02", 32)),
    ]
    monkeypatch.setattr(sync.instances, "relist_soon", lambda: None)
    counter = metrics.CACHE_BATCH_FALLBACKS.labels("fallback-test")
    before = counter._value.get()

    sync._apply_batch(batch)

    assert sync.batch_fallbacks == 1
    assert counter._value.get() == before + 1
    assert "applying them one by one" in caplog.text
    names = set(Instance.objects.filter(name__startswith="batch-").values_list("name", flat=True))
    assert names == {"batch-good01", "batch-good02"}


def test_the_cache_takes_long_strings_the_api_server_accepts_and_the_watch_goes_on(api, sync):
    """A 20 kB deviceUsage value and a 5 kB discoveryHandler name (the CRDs bound neither, nor
    does Akri) go into the cache like any other, and the objects after them too."""
    long_value = "C:" + "v" * 20_000 + ":node-a"
    long_handler = "h" * 5_000
    api.create_configuration(
        configuration_body("long-handler", discoveryHandler={"name": long_handler})
    )
    body = instance_body("long-000001", 2, configuration="long-cfg")
    body["spec"]["deviceUsage"]["long-000001-0"] = long_value
    body["spec"]["cdiName"] = "akri.sh/long-cfg=" + "c" * 3_000
    api.create_instance(body)
    api.create_instance(instance_body("after-000001", 2, configuration="long-cfg"))
    sync.start()
    assert sync.wait_synced()

    def landed() -> bool:
        return (
            Instance.objects.filter(name="after-000001").exists()
            and Slot.objects.filter(key="long-000001-0", value=long_value).exists()
        )

    deadline = time.monotonic() + 10
    while not landed():
        assert time.monotonic() < deadline, "the long Instance never reached the cache"
        time.sleep(0.05)
    assert Configuration.objects.get(name="long-handler").discovery_handler == long_handler
    assert Instance.objects.get(name="long-000001").cdi_name.endswith("c" * 3_000)
    assert sync.apply_failures == 0


def _version(namespace: str, name: str, rv: int, capacity: int = 2, **usage: str) -> dict:
    """Version ``rv`` of Instance ``name``; ``s0="node-a"``: slot 0 held by node-a."""
    obj = instance_body(name, capacity)
    obj["metadata"].update(namespace=namespace, resourceVersion=str(rv), uid=f"uid-{name}")
    obj["spec"]["deviceUsage"].update({f"{name}-{k[1:]}": v for k, v in usage.items()})
    return obj


def _changes(namespace: str) -> list[tuple]:
    """A run of watch events and our own answers over a few Instances of ``namespace``:
    created, claimed, released, resized, deleted and created again; an answer ahead of its
    echo, an older event skipped meanwhile, the echo; a replay; an Instance known before."""
    ns = namespace
    mine = cache.Attribution("allocate", "agent:node-a", node="node-a", pod="p1")
    return [
        ("event", "ADDED", _version(ns, "eq-a", 10)),
        ("event", "MODIFIED", _version(ns, "eq-a", 11, s0="node-a")),
        ("event", "MODIFIED", _version(ns, "eq-b", 12, s1="node-b")),
        ("event", "MODIFIED", _version(ns, "eq-a", 13, 3, s1="C:0:node-a")),
        ("direct", _version(ns, "eq-c", 20, s0="node-a"), {"eq-c-0": mine}),
        ("event", "MODIFIED", _version(ns, "eq-c", 19)),  # older than our answer: skipped
        ("event", "MODIFIED", _version(ns, "eq-c", 20, s0="node-a")),  # its echo
        ("event", "MODIFIED", _version(ns, "eq-c", 21, s0="node-a", s1="node-a")),
        ("event", "MODIFIED", _version(ns, "eq-c", 21, s0="node-a", s1="node-a")),  # a replay
        ("event", "DELETED", _version(ns, "eq-a", 14, 3, s1="C:0:node-a")),
        ("event", "ADDED", _version(ns, "eq-a", 15, s0="node-b")),
        ("event", "MODIFIED", _version(ns, "eq-b", 16)),
    ]


def _state(namespace: str) -> tuple:
    rows = Instance.objects.filter(namespace=namespace).order_by("name")
    slots = Slot.objects.filter(instance__namespace=namespace).order_by("instance__name", "key")
    events = SlotEvent.objects.filter(namespace=namespace).order_by("id")
    return (
        list(
            rows.values_list("name", "resource_version", "capacity", "device_usage", "pending_rv")
        ),
        list(slots.values_list("instance__name", "key", "index", "value", "level", "holder_node")),
        list(events.values_list("instance", "slot", "before", "after", "cause", "actor", "pod")),
    )


def test_a_batch_leaves_the_cache_as_its_changes_applied_one_by_one_would(kube, monkeypatch):
    """The same run of changes, applied one per transaction in one namespace and as one batch
    in another, leaves the same rows, the same slot events in the same order, and tells
    subscribers the same things."""
    told: dict[str, list] = {"one": [], "all": []}
    syncs = {}
    for namespace, seen in told.items():
        sync = syncs[namespace] = CacheSync(kube.new_client(), namespace, owner=namespace)
        cache.apply_instance(_version(namespace, "eq-b", 5))  # known before the run
        sync.expect("eq-b", "eq-b-1", "node-b", cache.Attribution("allocate", "agent:node-b"))
        sync.subscribe(lambda kind, name, obj, seen=seen: seen.append((kind, name, obj)))
        monkeypatch.setattr(sync.instances, "relist_soon", lambda: pytest.fail("relisted"))

    for item in _changes("one"):
        syncs["one"]._apply_until_done(item)
    syncs["all"]._apply_batch(_changes("all"))

    assert syncs["all"].batch_fallbacks == 0 and not syncs["all"]._carry
    assert syncs["one"].apply_failures == syncs["all"].apply_failures == 0
    one = _state("one")
    assert len(one[2]) == 8, one[2]  # the run records changes (so this test can fail)
    assert _state("all") == one
    rv = [[(k, n, o and o["metadata"]["resourceVersion"]) for k, n, o in told[ns]] for ns in told]
    assert rv[0] == rv[1]


@pytest.mark.parametrize("path", ["one", "batch"])
def test_a_slot_row_out_of_step_with_its_value_is_put_right_though_the_value_stays(kube, path):
    """A change that leaves a slot's value alone compares the row's other columns too: a row
    whose level or holder disagrees with its value (written by hand, say) is put right, and
    the pod it names, which the cache's other writer keeps, is left as it is."""
    namespace = f"{kube.namespace}-{path}"
    cache.apply_instance(_version(namespace, "fix-a", 5, s0="node-a"))
    row = Slot.objects.filter(instance__namespace=namespace, key="fix-a-0")
    row.update(level="free", holder_node="node-x", pod_name="web-0")
    later = _version(namespace, "fix-a", 6, s0="node-a", s1="node-b")

    if path == "one":
        cache.apply_instance(later)
    else:
        with transaction.atomic():
            batch = cache.InstanceBatch([(namespace, "fix-a")])
            batch.apply(later)
            batch.flush()

    assert list(row.values_list("value", "level", "holder_node", "pod_name")) == [
        ("node-a", "IL", "node-a", "web-0")
    ]
    other = Slot.objects.get(instance__namespace=namespace, key="fix-a-1")
    assert (other.value, other.level, other.holder_node) == ("node-b", "IL", "node-b")
    # Only slot 1 changed value: one event, none for the row put right.
    events = SlotEvent.objects.filter(namespace=namespace).order_by("id")
    assert list(events.values_list("slot", "before", "after")) == [
        ("fix-a-0", "", "node-a"),
        ("fix-a-1", "", "node-b"),
    ]
