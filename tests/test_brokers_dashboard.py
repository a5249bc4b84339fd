"""Brokers on the pages: the Instance's brokers and Services, the Configuration's blocking
error, the refreshable block, the mirror the watches keep, and ``akri_broker_pod_count``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.brokers.controller import _mirror
from agent.brokers.models import Broker, BrokerAction, ConfigurationBrokers
from akri_site.dashboard.sample import make_cluster
from tests.test_dashboard_views import login, make_user  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

INSTANCE = "akri-onvif-000000"
POD = f"node-a-{INSTANCE}-pod"


@pytest.fixture
def brokers():
    make_cluster(instances=2, capacity=2)
    created = timezone.now() - timedelta(minutes=3)
    Broker.objects.create(
        namespace="default", kind="Pod", name=POD, configuration="akri-onvif",
        instance=INSTANCE, node="node-a", phase="Running", created_at=created,
    )  # fmt: skip
    Broker.objects.create(
        namespace="default", kind="Service", name=f"{INSTANCE}-svc",
        configuration="akri-onvif", instance=INSTANCE,
    )  # fmt: skip
    Broker.objects.create(
        namespace="default", kind="Service", name="akri-onvif-svc", configuration="akri-onvif"
    )
    BrokerAction.objects.create(
        namespace="default", configuration="akri-onvif", instance=INSTANCE, kind="Pod",
        name=POD, action="created",
    )  # fmt: skip


def test_the_instance_page_lists_its_brokers_by_node_and_its_services(login, brokers):  # noqa: F811
    response = login("viewer").get(f"/instances/default/{INSTANCE}/")

    assert response.status_code == 200
    html = response.content.decode()
    row = html[html.index(f'data-broker="{POD}"') :].split("</tr>")[0]
    assert "node-a" in row and "Running" in row and "created" in row and "3 min" in row
    assert f"/slots/?pod=default%2F{POD}" in row  # the slots the broker holds
    assert f'data-service="{INSTANCE}-svc"' in html and 'data-service="akri-onvif-svc"' in html
    assert "brokers/brokers.js" in html


def test_the_broker_block_refreshes_on_its_own_for_viewers_only(client, login, brokers):  # noqa: F811
    url = f"/brokers/instances/default/{INSTANCE}/"

    anonymous = client.get(url)
    assert anonymous.status_code == 302
    viewer = login("viewer")
    response = viewer.get(url)
    assert response.status_code == 200
    assert POD in response.content.decode() and "<script" not in response.content.decode()
    assert viewer.get("/brokers/instances/default/nope/").status_code == 404


def test_a_configuration_whose_brokers_are_blocked_says_why(login, brokers):  # noqa: F811
    ConfigurationBrokers.objects.create(
        namespace="default",
        configuration="akri-onvif",
        error="the API server refused Pod x: 422 Invalid",
        blocked_key="1:abc",
    )

    response = login("viewer").get("/configurations/default/akri-onvif/")

    assert response.status_code == 200
    html = response.content.decode()
    assert "Brokers are not deployed: the API server refused Pod x: 422 Invalid" in html
    assert "until this Configuration changes" in html
    assert "1 Pod Running" in html


def test_metrics_count_broker_pods_by_configuration_and_node(client, brokers):
    Broker.objects.create(
        namespace="default", kind="Pod", name="gone", configuration="akri-onvif", node="node-a",
        deleting=True,
    )  # fmt: skip

    text = client.get("/metrics").content.decode()

    assert 'akri_broker_pod_count{configuration="akri-onvif",node="node-a"} 1.0' in text


def test_the_watch_mirror_keeps_phase_node_and_age():
    pod = {
        "metadata": {
            "name": POD,
            "uid": "u1",
            "creationTimestamp": "2026-01-01T12:00:00Z",
            "labels": {
                "akri.sh/configuration": "akri-onvif",
                "akri.sh/instance": INSTANCE,
                "akri.sh/target-node": "node-a",
            },
        },
        "status": {"phase": "Pending"},
    }
    _mirror("default", "Pod", pod)
    pod["status"]["phase"] = "Running"
    _mirror("default", "Pod", pod)

    row = Broker.objects.get(name=POD)
    assert (row.phase, row.node, row.instance, row.uid) == ("Running", "node-a", INSTANCE, "u1")
    assert row.created_at.year == 2026 and Broker.objects.count() == 1


def test_broker_history_past_the_retention_is_pruned(settings):
    from agent.brokers.tasks import prune_actions

    settings.AKRI = {**settings.AKRI, "RUN_RETENTION_HOURS": 1.0}
    old = BrokerAction.objects.create(
        namespace="default", configuration="c", kind="Pod", name="p", action="created"
    )
    BrokerAction.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(hours=2))
    BrokerAction.objects.create(
        namespace="default", configuration="c", kind="Pod", name="p", action="deleted"
    )

    assert prune_actions() == 1
    assert list(BrokerAction.objects.values_list("action", flat=True)) == ["deleted"]
