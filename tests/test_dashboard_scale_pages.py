"""The pages at a large cluster's shape (issue 32 §4): what they trim and where they link,
the kept counts recounted in the background, the warm-up, and stuck counts in one pass."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent.models import Instance, Node, Pod, Slot, SlotEvent
from akri_site.dashboard import queries, slotmap, views
from akri_site.dashboard.sample import make_cluster
from akri_site.dashboard.slotmap import CostlyReuse, StuckRules

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("pages-viewer")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return client


def _nodes(n: int) -> tuple[str, ...]:
    return tuple(f"node-{i:03d}" for i in range(n))


def test_the_overview_lists_the_first_nodes_of_its_order_and_links_to_the_nodes_list(viewer):
    # Instance n is held by node n % 30 (a slot IL and a slot CL): of 59 Instances node-029
    # holds one, every other node two. By "held", ascending, node-029 comes first.
    make_cluster(instances=59, nodes=_nodes(30))
    body = viewer.get("/?node_sort=held").content.decode()

    rows = re.findall(r'<tr><th scope="row"><a href="/nodes/(node-\d+)/"', body)
    assert len(rows) == queries.OVERVIEW_NODE_ROWS
    assert rows == ["node-029"] + [f"node-{i:03d}" for i in range(queries.OVERVIEW_NODE_ROWS - 1)]
    assert f"The first {queries.OVERVIEW_NODE_ROWS} of 30 nodes" in body
    assert 'href="/nodes/?sort=held">the Nodes list</a>' in body  # the same order, every node
    assert "30 of 30 nodes Ready" in body  # the card counts them all


def test_a_small_cluster_overview_lists_every_node_without_the_note(viewer):
    make_cluster(instances=2, nodes=_nodes(3))
    body = viewer.get("/").content.decode()
    assert len(re.findall(r'<tr><th scope="row"><a href="/nodes/', body)) == 3
    assert "The first" not in body


def test_past_ten_not_ready_nodes_holding_slots_the_rest_are_one_alert_to_the_nodes_list():
    make_cluster(instances=24, nodes=_nodes(12))
    Node.objects.update(ready=False)
    found = [a for a in queries.alerts() if "not Ready" in a["title"]]
    named = [a for a in found if a["title"].startswith("Node ")]
    assert len(named) == queries.NODE_ALERTS
    (rest,) = [a for a in found if a not in named]
    holding = Slot.objects.exclude(holder_node="").values("holder_node").distinct().count()
    assert rest["title"].startswith(f"{holding - queries.NODE_ALERTS} more nodes")
    assert rest["url"] == "/nodes/?state=not-ready&sort=-held"


def test_many_nodes_make_the_slot_maps_node_filter_a_text_field_and_its_summary_short(
    viewer, monkeypatch
):
    monkeypatch.setattr(views, "NODE_CHOICES", 5)
    monkeypatch.setattr(views, "SUMMARY_NODES", 3)
    make_cluster(instances=slotmap.PAGE + 8, nodes=_nodes(8))
    body = viewer.get("/slots/").content.decode()

    assert '<select name="node">' not in body
    assert '<input type="search" name="node" value=""' in body
    summary = body[body.index("summary-nodes") :]
    assert summary.count('<li><a href="?node=') == 3
    assert 'href="/nodes/?sort=-held">the Nodes list</a>' in summary
    # A name typed in is still checked: one nobody knows is a 400 with its message.
    unknown = viewer.get("/slots/?node=nowhere")
    assert unknown.status_code == 400
    assert "No node named “nowhere” is known." in unknown.content.decode()
    assert viewer.get("/slots/?node=node-003").status_code == 200


def _node_rows(body: str) -> list[tuple[str, str, str, str]]:
    """(node, instances link, held link, pods link with its count) of each Nodes list row."""
    return re.findall(
        r'<tr><th scope="row"><a href="/nodes/([^/]+)/">.*?'
        r'<a href="(/instances/[^"]*)">.*?<a href="(/slots/[^"]*)">.*?'
        r'<a href="(/pods/[^"]*">\d+)</a></td></tr>',
        body,
        re.S,
    )


def test_the_nodes_list_counts_pods_of_the_shown_page_and_sorts_by_pods_across_pages(viewer):
    # 130 nodes, more than a page: node-i runs i % 7 pods. The page's rows count their own
    # pods; sorted by pods, the order is every node's.
    names = _nodes(130)
    Node.objects.bulk_create(Node(name=n, ready=True) for n in names)
    Pod.objects.bulk_create(
        Pod(namespace="work", name=f"p-{i}-{k}", node_name=n, phase="Running")
        for i, n in enumerate(names)
        for k in range(i % 7)
    )
    pods = {n: i % 7 for i, n in enumerate(names)}

    second = _node_rows(viewer.get("/nodes/?page=2").content.decode())
    assert [row[0] for row in second] == list(names[100:])
    for node, instances, held, pod_link in second:
        assert instances == f"/instances/?node={node}"
        assert held == f"/slots/?node={node}&amp;state=held"
        assert pod_link == f'/pods/?node={node}">{pods[node]}'

    by_pods = [
        _node_rows(viewer.get(f"/nodes/?sort=-pods&page={p}").content.decode()) for p in (1, 2)
    ]
    shown = [(row[0], int(row[3].rsplit(">", 1)[1])) for page in by_pods for row in page]
    assert len(shown) == 130
    assert [n for n, _ in shown] == sorted(names, key=lambda n: -pods[n])  # stable: by name
    assert all(count == pods[n] for n, count in shown)


def test_stuck_counts_in_one_pass_agree_with_a_count_per_kind():
    make_cluster(instances=30, nodes=_nodes(3))
    now = timezone.now()
    Slot.objects.filter(level="IL", instance__name__endswith="1").update(
        since=now - timedelta(days=3)
    )
    Slot.objects.filter(level="CL", instance__name__endswith="2").update(surplus=True)
    free = Slot.objects.filter(level="free").first()
    SlotEvent.objects.create(
        at=now, namespace="default", instance=free.instance.name, slot=free.key,
        cause="conflict", actor="test",
    )  # fmt: skip
    rules = StuckRules.at()

    with CaptureQueriesContext(connection) as captured:
        counts = slotmap.stuck_counts(rules)

    assert len(captured) == 1
    for kind in slotmap.STUCK_STATES:
        assert counts[kind] == Slot.objects.filter(rules.query(kind)).count(), kind
    assert counts["old"] > 0 and counts["conflict"] == 1 and counts["foreign"] > 0
    held_surplus = Slot.objects.filter(surplus=True).exclude(level="free").count()
    assert counts["held_surplus"] == held_surplus > 0


def test_the_instance_list_reads_no_row_twice(viewer):
    make_cluster(instances=40)
    viewer.get("/instances/")
    with CaptureQueriesContext(connection) as few:
        viewer.get("/instances/?q=akri-onvif-00000")  # 10 rows
    with CaptureQueriesContext(connection) as many:
        assert viewer.get("/instances/").status_code == 200  # 40 rows
    assert len(many) == len(few)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def test_a_due_count_is_served_while_one_thread_counts_again(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(slotmap, "time", clock)
    monkeypatch.setattr(CostlyReuse, "refresh_in_background", True)
    release, started = threading.Event(), threading.Event()
    calls = []

    def count():
        calls.append(1)
        if len(calls) > 1:
            started.set()
            assert release.wait(10)
        clock.now += 0.1  # each count "takes" 0.1 s
        return len(calls)

    reuse = CostlyReuse(count, factor=4)
    try:
        assert reuse() == 1
        clock.now += 0.5  # past 4 x 0.1 s: due
        assert reuse() == 1  # the kept answer, at once
        assert started.wait(10)
        assert reuse() == 1 and len(calls) == 2  # one recount at a time
        release.set()
        reuse.join(10)
        assert reuse() == 2
        # Kept past its time by more than STALE_SECONDS (a recount that never ends), the
        # request counts itself.
        clock.now += reuse.factor * 0.1 + CostlyReuse.STALE_SECONDS + 1
        assert reuse() == 3
    finally:
        release.set()
        reuse.join(10)
        CostlyReuse._all.remove(reuse)


def test_without_background_refresh_a_due_count_is_made_by_the_request(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(slotmap, "time", clock)
    calls = []

    def count():
        calls.append(1)
        clock.now += 0.1
        return len(calls)

    reuse = CostlyReuse(count, factor=4)
    try:
        assert reuse() == 1
        clock.now += 0.5
        assert reuse() == 2 and reuse._refresher is None
    finally:
        CostlyReuse._all.remove(reuse)


def test_warm_up_makes_the_counts_and_turns_background_refresh_on(monkeypatch):
    from akri_site.dashboard import warmup

    monkeypatch.setattr(CostlyReuse, "refresh_in_background", False)
    made = []
    monkeypatch.setattr(slotmap, "summary", lambda: made.append("summary"))
    monkeypatch.setattr(queries, "visible_per_node", lambda: made.append("visible"))
    monkeypatch.setattr(queries, "instances_per_configuration", lambda: made.append("per-conf"))
    monkeypatch.setattr(queries, "stuck", lambda: made.append("stuck"))

    assert warmup.warm_up() >= 0
    assert made == ["summary", "visible", "per-conf", "stuck"]
    assert CostlyReuse.refresh_in_background is True


def test_visible_per_node_counts_each_instance_once_per_node_it_lists():
    make_cluster(instances=3, nodes=("node-a", "node-b"))
    for name, nodes in (("b1", ["node-b"]), ("b2", ["node-b"]), ("odd", {}), ("none", [])):
        Instance.objects.create(namespace="default", name=name, configuration_name="x", nodes=nodes)
    assert queries._count_visible_per_node() == {"node-a": 3, "node-b": 5}
