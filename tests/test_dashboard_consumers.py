"""The live websocket: access, snapshot, deltas from live.py, bad frames, and the Coalescer."""

from __future__ import annotations

import json
import threading
import time
from http.cookies import SimpleCookie

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from agent.metrics import WEBSOCKET_CLIENTS
from agent.models import AuditEntry, Instance, ReconcileRun, Slot
from akri_site.asgi import application
from akri_site.dashboard import live
from akri_site.dashboard.consumers import LiveConsumer
from akri_site.dashboard.sample import make_cluster

pytestmark = pytest.mark.django_db(transaction=True)

FIRST = "default/akri-onvif-000000"
ORIGIN = (b"origin", b"http://localhost")
HOST = (b"host", b"localhost")


def user_with(role: str | None) -> User:
    user = User.objects.create_user(f"ws-{role}")
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def socket(user: User | None, query: str = "") -> WebsocketCommunicator:
    """The consumer itself, with the user the auth middleware would have put in the scope."""
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), f"/ws/live/?{query}")
    if user is not None:
        communicator.scope["user"] = user
    return communicator


def run(scenario):
    """Drive an async scenario from a sync test (no pytest-asyncio needed)."""
    return async_to_sync(scenario)()


@pytest.fixture
def cluster():
    return make_cluster(instances=10, capacity=4)


@pytest.fixture
def viewer():
    return user_with("viewer")


def take_slot(key: str, node: str) -> Instance:
    slot = Slot.objects.select_related("instance").get(key=key)
    Slot.objects.filter(pk=slot.pk).update(
        value=node, level="IL", holder_node=node, since=timezone.now()
    )
    return slot.instance


@pytest.mark.django_db(transaction=True)
def test_a_socket_on_one_page_of_a_large_map_gets_only_that_pages_rows(viewer, settings):
    from akri_site.dashboard import slotmap

    make_cluster(instances=7, capacity=2)
    names = sorted(Instance.objects.values_list("name", flat=True))

    async def scenario():
        communicator = socket(viewer, "page=2")
        assert (await communicator.connect())[0]
        snapshot = await communicator.receive_json_from()
        assert snapshot["page"] == 2
        assert [row["name"] for row in snapshot["instances"]] == names[3:6]

        # A change on page 1 is not this socket's; one on page 2 is.
        for name in (names[0], names[4]):
            pk = await database_sync_to_async(lambda n=name: take_slot(f"{n}-1", "node-b").pk)()
            await database_sync_to_async(live.publish_instances)([pk])
        off_page, on_page = [await communicator.receive_json_from() for _ in range(2)]
        assert off_page["instances"] == [] and off_page["html"] == {}
        assert off_page["summary"]["totals"]["held"] > 0  # the totals still follow
        assert [row["name"] for row in on_page["instances"]] == [names[4]]
        await communicator.disconnect()

    original = slotmap.PAGE
    slotmap_page(3)
    try:
        run(scenario)
    finally:
        slotmap_page(original)


def slotmap_page(n: int) -> None:
    from akri_site.dashboard import consumers, slotmap

    slotmap.PAGE = consumers.PAGE = n


def test_anonymous_users_are_refused_before_the_handshake(cluster):
    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN, HOST])
        connected, code = await communicator.connect()
        assert (connected, code) == (False, 4403)

    run(scenario)


def test_a_user_without_a_role_is_refused(cluster):
    outsider = user_with(None)

    async def scenario():
        connected, code = await socket(outsider).connect()
        assert (connected, code) == (False, 4403)

    run(scenario)


def test_a_signed_in_viewer_connects_through_the_full_stack(cluster, viewer):
    client = Client()
    client.force_login(viewer)
    cookie = SimpleCookie()
    cookie[settings.SESSION_COOKIE_NAME] = client.cookies[settings.SESSION_COOKIE_NAME].value

    async def scenario():
        communicator = WebsocketCommunicator(
            application,
            "/ws/live/?view=overview",
            headers=[ORIGIN, HOST, (b"cookie", cookie.output(header="", sep=";").strip().encode())],
        )
        connected, _ = await communicator.connect()
        assert connected
        snapshot = await communicator.receive_json_from()
        assert snapshot["type"] == "snapshot" and snapshot["view"] == "overview"
        assert snapshot["instances"] == []  # the overview needs counts, not rows
        assert snapshot["summary"]["totals"]["total"] == 40
        await communicator.disconnect()

    run(scenario)


def test_a_foreign_origin_is_refused(cluster):
    async def scenario():
        communicator = WebsocketCommunicator(
            application, "/ws/live/", headers=[(b"origin", b"http://evil.example")]
        )
        connected, _ = await communicator.connect()
        assert not connected

    run(scenario)


def test_the_snapshot_on_connect_is_the_filtered_slot_map(cluster, viewer):
    async def scenario():
        communicator = socket(viewer, "state=foreign")
        assert (await communicator.connect())[0]
        snapshot = await communicator.receive_json_from()
        assert snapshot["type"] == "snapshot"
        assert snapshot["filters"] == {"state": "foreign"}
        (instance,) = snapshot["instances"]
        assert instance["key"] == "default/akri-onvif-000009"
        assert instance["match"] == ["akri-onvif-000009-3"]
        assert len(instance["slots"]) == 4  # the whole row, for context
        assert 'data-state="foreign"' in snapshot["html"][instance["key"]]
        assert not snapshot["truncated"]
        await communicator.disconnect()

    run(scenario)


def test_a_change_published_after_commit_reaches_the_socket_as_a_delta(cluster, viewer):
    async def scenario():
        communicator = socket(viewer)
        assert (await communicator.connect())[0]
        first = await communicator.receive_json_from()
        assert len(first["instances"]) == 10

        instance = await database_sync_to_async(take_slot)("akri-onvif-000000-3", "node-b")
        await database_sync_to_async(live.publish_instances)([instance.pk])

        delta = await communicator.receive_json_from()
        assert delta["type"] == "delta"
        (row,) = delta["instances"]
        assert row["key"] == FIRST
        slot = row["slots"][3]
        assert (slot["state"], slot["node"], slot["level"]) == ("held", "node-b", "IL")
        assert 'data-slot="akri-onvif-000000-3" data-state="held"' in delta["html"][FIRST]
        assert delta["summary"]["totals"]["held"] == 21
        assert delta["removed"] == [] and delta["runs"] == []
        await communicator.disconnect()

    run(scenario)


def test_removed_instances_and_runs_are_published(cluster, viewer):
    started = timezone.now()
    run_row = ReconcileRun.objects.create(
        scope="cluster", trigger="sweep", started_at=started, released=2
    )

    async def scenario():
        communicator = socket(viewer)
        assert (await communicator.connect())[0]
        await communicator.receive_json_from()

        await database_sync_to_async(Instance.objects.filter(name="akri-onvif-000001").delete)()
        await database_sync_to_async(live.publish_removed)(["default/akri-onvif-000001"])
        delta = await communicator.receive_json_from()
        assert delta["removed"] == ["default/akri-onvif-000001"]

        await database_sync_to_async(live.publish_run)(run_row.pk)
        delta = await communicator.receive_json_from()
        (published,) = delta["runs"]
        assert (published["id"], published["result"]) == (run_row.pk, "changed")
        assert f'data-run="{run_row.pk}"' in delta["runs_html"][str(run_row.pk)]
        await communicator.disconnect()

    run(scenario)


def test_a_new_audit_entry_is_published_as_an_audit_delta(cluster, viewer):
    async def scenario():
        communicator = socket(viewer)
        assert (await communicator.connect())[0]
        first = await communicator.receive_json_from()
        assert "audit" not in first

        await database_sync_to_async(AuditEntry.objects.create)(
            at=timezone.now(), username="olga", action="release_slot", target="x", outcome="done"
        )
        delta = await communicator.receive_json_from()
        assert delta["type"] == "delta" and delta["audit"] is True
        assert delta["instances"] == [] and delta["runs"] == []
        await communicator.disconnect()

    run(scenario)


def test_a_delta_that_no_longer_matches_the_filters_removes_the_row(cluster, viewer):
    async def scenario():
        communicator = socket(viewer)
        assert (await communicator.connect())[0]
        await communicator.receive_json_from()
        await communicator.send_json_to({"type": "subscribe", "filters": {"state": "foreign"}})
        snapshot = await communicator.receive_json_from()
        assert [i["key"] for i in snapshot["instances"]] == ["default/akri-onvif-000009"]

        instance = await database_sync_to_async(take_slot)("akri-onvif-000009-3", "node-a")
        await database_sync_to_async(live.publish_instances)(["default/akri-onvif-000009"])
        delta = await communicator.receive_json_from()
        assert delta["instances"] == []
        assert delta["removed"] == ["default/akri-onvif-000009"]
        assert instance.pk
        await communicator.disconnect()

    run(scenario)


def test_a_pod_filter_follows_the_pod_to_its_new_slot(cluster, viewer):
    def move_pod() -> None:
        Slot.objects.filter(key="akri-onvif-000002-0").update(pod_namespace="", pod_name="")
        Slot.objects.filter(key="akri-onvif-000005-3").update(
            value="node-b",
            level="IL",
            holder_node="node-b",
            since=timezone.now(),
            pod_namespace="apps",
            pod_name="work-2",
        )

    async def scenario():
        communicator = socket(viewer, "pod=apps/work-2")
        assert (await communicator.connect())[0]
        snapshot = await communicator.receive_json_from()
        assert snapshot["filters"] == {"pod": "apps/work-2"}
        (instance,) = snapshot["instances"]
        assert instance["match"] == ["akri-onvif-000002-0"]

        await database_sync_to_async(move_pod)()
        await database_sync_to_async(live.publish_instances)(
            ["default/akri-onvif-000002", "default/akri-onvif-000005"]
        )
        delta = await communicator.receive_json_from()
        assert delta["removed"] == ["default/akri-onvif-000002"]
        (row,) = delta["instances"]
        assert (row["key"], row["match"]) == ("default/akri-onvif-000005", ["akri-onvif-000005-3"])
        await communicator.disconnect()

    run(scenario)


def test_ping_gets_pong_with_the_cache_freshness(cluster, viewer):
    async def scenario():
        communicator = socket(viewer)
        assert (await communicator.connect())[0]
        await communicator.receive_json_from()
        await communicator.send_json_to({"type": "ping"})
        pong = await communicator.receive_json_from()
        assert pong["type"] == "pong"
        assert pong["sync"]["watchers"] == 1 and pong["sync"]["stale"] == []
        await communicator.disconnect()

    run(scenario)


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        ("this is not json", "frame is not JSON"),
        (b"\x00\x01", "binary frames are not understood"),
        ("[1, 2]", 'a frame is a JSON object with a "type"'),
        ('{"type": 5}', 'a frame is a JSON object with a "type"'),
        ('{"type": "dance"}', "unknown frame type 'dance'"),
        ('{"type": "subscribe", "filters": [1]}', "filters must be an object of strings"),
        ('{"type": "subscribe", "filters": {"node": "nope"}}', "No node named"),
        ("x" * 20000, "frame larger than"),
    ],
)
def test_a_garbage_frame_closes_that_socket_only(cluster, viewer, frame, error):
    async def scenario():
        bad, good = socket(viewer), socket(viewer)
        for communicator in (bad, good):
            assert (await communicator.connect())[0]
            await communicator.receive_json_from()

        if isinstance(frame, bytes):
            await bad.send_to(bytes_data=frame)
        else:
            await bad.send_to(text_data=frame)
        answer = await bad.receive_json_from()
        assert answer["type"] == "error" and error in answer["error"]
        closed = await bad.receive_output()
        assert closed["type"] == "websocket.close" and closed["code"] == 4400

        instance = await database_sync_to_async(take_slot)("akri-onvif-000002-3", "node-b")
        await database_sync_to_async(live.publish_instances)([instance.pk])
        delta = await good.receive_json_from()
        assert delta["type"] == "delta" and delta["instances"][0]["key"].endswith("000002")
        await good.disconnect()
        await bad.disconnect()

    run(scenario)


@pytest.mark.parametrize(
    ("query", "field"), [("state=bogus", "state"), ("page=abc", "page"), ("page=0", "page")]
)
def test_bad_filters_in_the_url_close_the_socket_with_a_reason(cluster, viewer, query, field):
    async def scenario():
        communicator = socket(viewer, query)
        assert (await communicator.connect())[0]
        answer = await communicator.receive_json_from()
        assert answer["type"] == "error" and field in answer["error"]
        closed = await communicator.receive_output()
        assert closed["code"] == 4400 and closed["reason"].startswith("bad filters")

    run(scenario)


def test_connected_clients_are_counted(cluster, viewer):
    before = WEBSOCKET_CLIENTS._value.get()

    async def scenario():
        communicator = socket(viewer)
        assert (await communicator.connect())[0]
        await communicator.receive_json_from()
        assert WEBSOCKET_CLIENTS._value.get() == before + 1
        await communicator.disconnect()

    run(scenario)
    assert WEBSOCKET_CLIENTS._value.get() == before


def test_messages_are_chunked_and_a_key_that_is_gone_is_sent_as_removed(cluster):
    messages = live.build_messages(
        instances=[i.pk for i in Instance.objects.all()] + ["default/never-was"], runs=[]
    )
    assert len(messages) == 1
    assert len(messages[0]["instances"]) == 10
    assert messages[0]["removed"] == ["default/never-was"]
    assert json.loads(json.dumps(messages[0])) == messages[0]  # plain JSON all through

    live.CHUNK, saved = 4, live.CHUNK
    try:
        chunks = live.build_messages(instances=[i.pk for i in Instance.objects.all()])
    finally:
        live.CHUNK = saved
    assert [len(m["instances"]) for m in chunks] == [4, 4, 2]
    assert live.build_messages() == []


# --- Coalescer (no database: a fake send) -----------------------------------------------------


class Recorder:
    def __init__(self):
        self.calls = []
        self.event = threading.Event()

    def __call__(self, **batch):
        self.calls.append((time.monotonic(), batch))
        self.event.set()


class HandClock:
    """A clock the test moves: the coalescer decides on it, so no assertion here depends on
    how fast a loaded machine runs its threads."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _sent(send: Recorder, count: int) -> None:
    """Wait (real time, generously) until ``count`` batches went out."""
    deadline = time.monotonic() + 10
    while len(send.calls) < count and time.monotonic() < deadline:
        send.event.wait(0.05)
        send.event.clear()
    assert len(send.calls) >= count, send.calls


@pytest.mark.django_db(transaction=False)
def test_the_coalescer_sends_a_lone_change_at_once_and_a_burst_once_per_window():
    clock = HandClock()
    send = Recorder()
    sent_at: list[float] = []
    send_on_clock = lambda **batch: (sent_at.append(clock.now), send(**batch))  # noqa: E731
    coalescer = live.Coalescer(window_ms=100, send=send_on_clock, clock=clock).start()
    try:
        coalescer.add([99])
        _sent(send, 1)  # the clock has not moved: sent at once
        clock.now += 0.01
        for n in range(20):
            coalescer.add([n])
        coalescer.add_removed(["default/gone"])
        coalescer.add_run(7)
        coalescer.nudge()
        # Within the window nothing goes out, however long the machine takes to look.
        time.sleep(0.2)
        assert len(send.calls) == 1
        clock.now += 0.089
        coalescer.nudge()
        time.sleep(0.05)
        assert len(send.calls) == 1  # 1 ms of the window left
        clock.now += 0.001
        coalescer.nudge()
        _sent(send, 2)
    finally:
        coalescer.stop()
    (_, first), (_, batch) = send.calls
    assert first["instances"] == [99] and sent_at[0] == 100.0
    assert sorted(batch["instances"]) == list(range(20))
    assert batch["removed"] == ["default/gone"] and batch["runs"] == [7]
    assert sent_at[1] == pytest.approx(100.1)


def test_the_coalescer_spaces_slow_deliveries_by_three_times_their_cost():
    # At 40,000 Instances one delivery reads and counts for hundreds of milliseconds: the
    # feed must not spend more than a third of its time on it while changes keep coming.
    clock = HandClock()
    sent_at: list[float] = []
    delivered = threading.Event()

    def slow_send(**batch):
        # When the coalescer decided to deliver (the clock may move between that and this
        # call while the test thread runs on).
        sent_at.append(coalescer._last_sent)
        clock.now += 0.2  # the delivery costs 0.2 s on the coalescer's clock
        delivered.set()

    coalescer = live.Coalescer(window_ms=10, send=slow_send, clock=clock).start()
    try:
        n = 0
        while clock.now < 102.0:
            coalescer.add([n])
            n += 1
            clock.now += 0.005
            coalescer.nudge()
            if delivered.wait(0.002):
                delivered.clear()
    finally:
        coalescer.stop(flush=False)
    gaps = [round(b - a, 6) for a, b in zip(sent_at, sent_at[1:], strict=False)]
    assert len(sent_at) >= 2, sent_at
    assert min(gaps) >= 0.6, gaps  # 3 x 0.2 s; 0.21 without the rule


@pytest.mark.django_db(transaction=False)
def test_the_coalescer_flushes_what_is_pending_when_stopped():
    send = Recorder()
    coalescer = live.Coalescer(window_ms=5000, send=send).start()
    coalescer.add("default/cam-1")  # one reference, not its characters
    coalescer.stop()

    assert [batch["instances"] for _, batch in send.calls] == [["default/cam-1"]]
    assert not coalescer.pending()


@pytest.mark.django_db(transaction=False)
def test_a_bad_reference_fails_in_the_caller_not_in_the_batch():
    coalescer = live.Coalescer(window_ms=10, send=Recorder())

    with pytest.raises(TypeError):
        coalescer.add([None])
    assert not coalescer.pending()


@pytest.mark.django_db(transaction=False)
def test_a_failing_send_does_not_stop_the_coalescer():
    failed, ready = threading.Event(), threading.Event()
    sent = []

    def send(**batch):
        if not failed.is_set():
            failed.set()
            raise RuntimeError("channel layer down")
        sent.append(batch)
        ready.set()

    coalescer = live.Coalescer(window_ms=10, send=send).start()
    try:
        coalescer.add([1])
        assert failed.wait(2)
        coalescer.add([2])
        assert ready.wait(2)
    finally:
        coalescer.stop()
    assert sent[0]["instances"] == [2]


@pytest.mark.django_db
def test_a_burst_of_thousands_of_changed_instances_is_published_whole():
    # One OR'ed condition per key went past SQLite's expression depth at 500 keys and the
    # whole update was dropped; grouped name lookups in bounded chunks keep every row.
    make_cluster(instances=2500, capacity=1)
    keys = [f"default/{name}" for name in Instance.objects.values_list("name", flat=True)]
    messages = live.build_messages(instances=keys + [Instance.objects.first().pk])
    sent = [row["key"] for m in messages for row in m["instances"]]
    assert len(sent) == 2500
    assert set(sent) == set(keys)
    assert all(m["removed"] == [] for m in messages)


@pytest.mark.django_db(transaction=False)
def test_a_relist_sized_burst_is_one_reload_a_while_and_a_lone_change_after_is_its_row(
    monkeypatch,
):
    # A relist hands the feed every Instance it wrote: their rows would be read and sent to
    # every socket. Past RELOAD_OVER the window is one reload (the totals, no rows), the next
    # such window waits RELOAD_SECONDS, and a lone change after that goes out as its row.
    monkeypatch.setattr(live, "RELOAD_OVER", 5)
    clock = HandClock()
    send = Recorder()
    coalescer = live.Coalescer(window_ms=100, send=send, clock=clock).start()
    try:
        coalescer.add([f"default/i-{n}" for n in range(20)])
        _sent(send, 1)
        clock.now += 0.1
        coalescer.add([f"default/j-{n}" for n in range(20)])
        coalescer.add_run(3)
        coalescer.nudge()
        time.sleep(0.2)
        assert len(send.calls) == 1  # the window is over, the reload's wait is not
        clock.now += live.RELOAD_SECONDS - 0.1
        coalescer.nudge()
        _sent(send, 2)
        clock.now += 0.1
        coalescer.add(["default/lone"])
        coalescer.nudge()
        _sent(send, 3)
    finally:
        coalescer.stop()
    (_, first), (_, second), (_, lone) = send.calls
    assert first == {"runs": [], "instances": [], "removed": [], "reload": True}
    assert second == {"runs": [3], "instances": [], "removed": [], "reload": True}
    assert lone == {"runs": [], "instances": ["default/lone"], "removed": []}


def test_a_reload_message_carries_the_totals_and_no_rows(cluster):
    (message,) = live.build_messages(instances=[i.pk for i in Instance.objects.all()], reload=True)
    assert message["reload"] is True
    assert message["instances"] == [] and message["removed"] == []
    assert message["summary"]["totals"]["total"] == Slot.objects.count()


def test_a_reload_makes_each_socket_read_its_own_page_again(viewer, settings):
    make_cluster(instances=7, capacity=2)
    names = sorted(Instance.objects.values_list("name", flat=True))

    async def scenario():
        communicator = socket(viewer, "page=2")
        assert (await communicator.connect())[0]
        await communicator.receive_json_from()
        pk = await database_sync_to_async(lambda: take_slot(f"{names[4]}-1", "node-b").pk)()
        await database_sync_to_async(live.send_now)(instances=[pk], reload=True)
        snapshot = await communicator.receive_json_from()
        assert snapshot["type"] == "snapshot" and snapshot["page"] == 2
        row = next(r for r in snapshot["instances"] if r["name"] == names[4])
        assert any(s["value"] == "node-b" for s in row["slots"])
        await communicator.disconnect()

    original = slotmap_page_size()
    slotmap_page(3)
    try:
        run(scenario)
    finally:
        slotmap_page(original)


def slotmap_page_size() -> int:
    from akri_site.dashboard import slotmap

    return slotmap.PAGE
