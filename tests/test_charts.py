"""Slot usage and release latency history (agent.usage) and its chart data (dashboard.charts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.test import override_settings

from agent import usage
from agent.models import ReleaseSample, Slot, UsageSample
from akri_site.dashboard import charts, tokens
from akri_site.dashboard.sample import make_cluster

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def cluster():
    return make_cluster(instances=10, capacity=4)


@pytest.fixture
def viewer_client(client):
    user = User.objects.create_user("chart-viewer")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return client


def rows_at(minute: int) -> dict[str, tuple[int, int, int]]:
    return {r.node: (r.held, r.free, r.foreign) for r in UsageSample.objects.filter(minute=minute)}


# --- sampling ---------------------------------------------------------------------------------


def test_a_sample_counts_the_cluster_once_and_each_node_as_it_sees_it(cluster):
    written = usage.sample(NOW)

    assert written == 3  # cluster-wide, node-a, node-b
    rows = rows_at(usage.minute_of(NOW))
    assert rows[""] == (20, 19, 1)  # 10 Instances x 4: IL+CL held each, one foreign
    assert rows["node-a"] == (10, 19, 1)  # holds half; sees every (shared) Instance
    assert rows["node-b"] == (10, 19, 1)


def test_a_second_sample_in_the_same_minute_replaces_the_first(cluster):
    usage.sample(NOW)
    Slot.objects.filter(level=Slot.Level.CL).update(level=Slot.Level.FREE, value="", holder_node="")

    usage.sample(NOW + timedelta(seconds=20))

    assert UsageSample.objects.count() == 3
    assert rows_at(usage.minute_of(NOW))[""] == (10, 29, 1)


def test_a_release_adds_to_its_nodes_minute(cluster):
    usage.record_release("node-a", 0.2, now=NOW)
    usage.record_release("node-a", 0.6, now=NOW + timedelta(seconds=10))
    usage.record_release("node-b", 1.0, now=NOW)

    row = ReleaseSample.objects.get(node="node-a")
    assert (row.releases, round(row.total_ms), round(row.max_ms)) == (2, 800, 600)
    assert ReleaseSample.objects.count() == 2


@override_settings(AKRI={**__import__("django.conf").conf.settings.AKRI, "USAGE_HISTORY_HOURS": 2})
def test_prune_drops_samples_past_the_retention_and_keeps_the_rest(cluster):
    usage.sample(NOW - timedelta(hours=3))
    usage.sample(NOW - timedelta(hours=1))
    usage.record_release("node-a", 0.1, now=NOW - timedelta(hours=3))
    usage.record_release("node-a", 0.1, now=NOW)

    deleted = usage.prune(NOW)

    assert deleted == 4  # three usage rows and one release row of 3 hours ago
    assert set(UsageSample.objects.values_list("minute", flat=True)) == {
        usage.minute_of(NOW - timedelta(hours=1))
    }
    assert ReleaseSample.objects.get().minute == usage.minute_of(NOW)


def test_the_sampler_step_samples_and_prunes_once_an_hour(cluster):
    sampler = usage.UsageSampler(interval=60)

    pruned_at = sampler.step(None)
    again = sampler.step(pruned_at)

    assert pruned_at is not None and again == pruned_at
    assert UsageSample.objects.filter(node="").count() == 1


# --- downsampling -----------------------------------------------------------------------------


def fill_minutes(start: datetime, minutes: int, held=lambda m: 5) -> None:
    first = usage.minute_of(start)
    UsageSample.objects.bulk_create(
        UsageSample(
            minute=first + m, namespace="default", configuration="c", node="", held=held(m), free=1
        )
        for m in range(minutes)
    )


def test_seven_days_come_back_as_at_most_360_points_per_series():
    start = NOW - timedelta(days=7)
    fill_minutes(start, 7 * 24 * 60)

    data = charts.usage(start, NOW)

    assert len(data["t"]) <= charts.MAX_POINTS + 1
    assert len(data["held"]) == len(data["t"]) == len(data["free"])
    assert data["step_seconds"] == 28 * 60  # 10,080 minutes in 361 points or fewer
    assert data["rows"] == 7 * 24 * 60
    assert set(v for v in data["held"] if v is not None) == {5.0}


def test_a_bucket_is_the_mean_of_its_minutes_and_a_missing_one_is_null():
    start = NOW - timedelta(hours=24)
    fill_minutes(start, 60, held=lambda m: m % 2 * 10)  # 0, 10, 0, 10, ...

    data = charts.usage(start, NOW)

    step = data["step_seconds"] // 60
    assert step == 4
    full = [v for v in data["held"] if v is not None]
    assert full and all(v == 5.0 for v in full[1:-1])
    assert data["held"][-1] is None  # nothing sampled at the end of the range: no data, not 0


def test_latency_buckets_give_the_mean_over_releases_and_the_worst():
    start = NOW - timedelta(hours=1)
    usage.record_release("n1", 0.1, now=start + timedelta(minutes=5))
    usage.record_release("n1", 0.3, now=start + timedelta(minutes=5))
    usage.record_release("n2", 0.5, now=start + timedelta(minutes=5))

    data = charts.release_latency(start, NOW)
    mine = charts.release_latency(start, NOW, node="n1")

    i = next(i for i, v in enumerate(data["releases"]) if v)
    assert (data["releases"][i], data["mean_ms"][i], data["max_ms"][i]) == (3, 300.0, 500.0)
    j = next(i for i, v in enumerate(mine["releases"]) if v)
    assert (mine["releases"][j], mine["mean_ms"][j], mine["max_ms"][j]) == (2, 200.0, 300.0)


# --- the API --------------------------------------------------------------------------------------


def test_the_usage_endpoint_serves_a_nodes_chart_to_a_viewer(viewer_client, cluster):
    usage.sample()

    response = viewer_client.get("/api/charts/usage/?range=6h&node=node-a")

    assert response.status_code == 200
    data = response.json()
    assert data["latest"]["held"] == 10 and data["latest"]["free"] == 19
    assert [v for v in data["held"] if v is not None] == [10.0]


def test_the_usage_endpoint_answers_400_to_an_unknown_parameter(viewer_client, cluster):
    response = viewer_client.get("/api/charts/usage/?range=6h&nod=node-a")

    assert response.status_code == 400
    assert "nod" in response.json()


def test_the_chart_endpoints_answer_400_to_unknown_nodes_ranges_and_bad_custom_ranges(
    viewer_client, cluster
):
    for url in (
        "/api/charts/usage/?node=nowhere",
        "/api/charts/usage/?configuration=nothing",
        "/api/charts/usage/?range=30d",
        "/api/charts/usage/?range=custom",
        "/api/charts/release-latency/?range=custom&start=2026-03-02T00:00&end=2026-03-01T00:00",
        "/api/charts/release-latency/?configuration=akri-onvif",
    ):
        response = viewer_client.get(url)
        assert response.status_code == 400, url


def test_the_chart_endpoints_need_a_role_and_take_a_token(client, cluster):
    nobody = client.get("/api/charts/usage/")
    user = User.objects.create_user("bot")
    user.groups.add(Group.objects.get(name="viewer"))
    _, key = tokens.issue(user)

    with_token = client.get(
        "/api/charts/release-latency/?range=1h", HTTP_AUTHORIZATION=f"Token {key}"
    )

    assert nobody.status_code == 401
    assert with_token.status_code == 200
    assert len(with_token.json()["t"]) == 61


# --- the pages ------------------------------------------------------------------------------------


def test_the_overview_node_and_configuration_pages_carry_their_charts(viewer_client, cluster):
    for url, expected in (
        ("/?range=24h", "/api/charts/usage/?range=24h"),
        ("/nodes/node-a/?range=7d", "/api/charts/usage/?range=7d&amp;node=node-a"),
        (
            "/configurations/default/akri-onvif/",
            "/api/charts/usage/?range=1h&amp;configuration=akri-onvif&amp;namespace=default",
        ),
    ):
        response = viewer_client.get(url)
        assert response.status_code == 200, url
        assert expected in response.content.decode(), url


def test_a_page_with_a_bad_chart_range_says_so_with_400(viewer_client, cluster):
    response = viewer_client.get(
        "/nodes/node-a/?range=custom&start=2026-03-02T00:00&end=2026-03-01"
    )

    assert response.status_code == 400
    assert "must be after its start" in response.content.decode()


# --- per-object slot events, paged over the time range -----------------------------------------


def make_events(node: str, n: int, ago: timedelta = timedelta(minutes=1)) -> None:
    from django.utils import timezone

    from agent.models import SlotEvent

    at = timezone.now() - ago
    SlotEvent.objects.bulk_create(
        SlotEvent(
            at=at,
            namespace="default",
            instance="akri-onvif-000000",
            configuration="akri-onvif",
            slot=f"akri-onvif-000000-{i % 4}",
            after=node,
            cause="allocate",
            actor=f"agent:{node}",
            node=node,
        )
        for i in range(n)
    )


def test_a_node_page_lists_its_events_a_page_at_a_time_in_the_time_range(viewer_client, cluster):
    make_events("node-a", 60)
    make_events("node-a", 1, ago=timedelta(hours=3))

    first = viewer_client.get("/nodes/node-a/")
    second = viewer_client.get("/nodes/node-a/?events_page=2")
    day = viewer_client.get("/nodes/node-a/?range=24h")

    assert first.status_code == second.status_code == day.status_code == 200
    assert first.content.decode().count('<tr class="cause-allocate">') == 50
    assert "60 events from" in first.content.decode()
    assert 'href="?events_page=2#events"' in first.content.decode()
    assert second.content.decode().count('<tr class="cause-allocate">') == 10
    assert "61 events from" in day.content.decode()


def test_an_instance_page_takes_the_range_for_its_events(viewer_client, cluster):
    make_events("node-b", 3, ago=timedelta(hours=2))

    hour = viewer_client.get("/instances/default/akri-onvif-000000/")
    six = viewer_client.get("/instances/default/akri-onvif-000000/?range=6h")

    assert hour.status_code == six.status_code == 200
    assert "No slot events recorded for this Instance in this time range" in hour.content.decode()
    assert six.content.decode().count('<tr class="cause-allocate">') == 3


@pytest.mark.parametrize("query", ["events_page=x", "events_page=0", "events_page=9", "range=2y"])
def test_bad_event_pages_and_ranges_are_a_400(viewer_client, cluster, query):
    make_events("node-a", 2)

    for url in ("/nodes/node-a/", "/configurations/default/akri-onvif/",
                "/instances/default/akri-onvif-000000/"):  # fmt: skip
        response = viewer_client.get(f"{url}?{query}")
        assert response.status_code == 400, (url, query)
