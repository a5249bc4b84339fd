"""The usage and release latency charts in Debian's Chromium, against Daphne serving the real
ASGI application: drawn from the samples with the project's own uPlot, in words as well, in the
dark theme, and following new samples while the page is open. Screenshots go to
``test-artifacts/``."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from playwright.sync_api import expect

from agent import usage
from agent.models import Slot, UsageSample
from agent.simulator.cluster import SimulatedCluster, debug_echo_configuration
from akri_site.dashboard.sample import make_cluster
from tests.browser import ARTIFACTS, BrowserLiveServerCase
from tests.test_browser_cluster import CONFIG, INSTANCE, wait_for


def fill_history() -> None:
    """Ten minutes of samples of a small cluster, and a few releases on node-a."""
    make_cluster(instances=10, capacity=4)
    now = timezone.now()
    for minutes_ago in range(10, 0, -1):
        usage.sample(now - timedelta(minutes=minutes_ago))
        usage.record_release("node-a", 0.05 * minutes_ago, now=now - timedelta(minutes=minutes_ago))


@pytest.mark.browser
class ChartsInBrowserTests(BrowserLiveServerCase):
    def setUp(self):
        fill_history()
        user = User.objects.create_user("chart-viewer")
        user.groups.add(Group.objects.get(name="viewer"))
        self.user = user

    def open(self, path: str, scheme: str = "light"):
        context = self.new_context(color_scheme=scheme)
        self.addCleanup(context.close)
        self.sign_in(context, self.user)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{self.live_server_url}{path}", timeout=30_000)
        return page, errors

    def test_the_overview_draws_usage_and_latency_from_the_samples_and_follows_new_ones(self):
        page, errors = self.open("/")

        usage_chart = page.locator('figure[data-chart="usage"]')
        expect(usage_chart).to_have_attribute("data-state", "drawn")
        expect(usage_chart.locator("canvas")).to_have_count(1)
        expect(usage_chart.locator("[data-chart-summary]")).to_contain_text(
            "20 held, 19 free, 1 foreign"
        )
        assert int(usage_chart.get_attribute("data-points")) >= 9
        latency = page.locator('figure[data-chart="latency"]')
        expect(latency).to_have_attribute("data-state", "drawn")
        expect(latency.locator("[data-chart-summary]")).to_contain_text("10 releases")
        expect(page.locator('nav[aria-label="Time range"] a[aria-current]')).to_have_text("1h")
        page.screenshot(path=str(ARTIFACTS / "charts-overview.png"), full_page=True)

        # A new sample (half the CL slots freed) reaches the open page without a reload.
        page.evaluate("window.__marker = 'same page'")
        freed = Slot.objects.filter(level=Slot.Level.CL)[:4]
        Slot.objects.filter(pk__in=[s.pk for s in freed]).update(
            level=Slot.Level.FREE, value="", holder_node=""
        )
        usage.sample()
        expect(usage_chart.locator("[data-chart-summary]")).to_contain_text(
            "16 held, 23 free, 1 foreign", timeout=25_000
        )
        assert json.loads(usage_chart.get_attribute("data-latest"))["held"] == 16
        assert page.evaluate("window.__marker") == "same page"
        assert errors == []

    def test_a_node_chart_in_the_dark_theme_and_a_preset_kept_in_the_url(self):
        page, errors = self.open("/nodes/node-a/", scheme="dark")

        page.get_by_role("link", name="24h").click()

        expect(page).to_have_url(f"{self.live_server_url}/nodes/node-a/?range=24h#charts")
        usage_chart = page.locator('figure[data-chart="usage"]')
        expect(usage_chart).to_have_attribute("data-state", "drawn")
        expect(usage_chart.locator("[data-chart-summary]")).to_contain_text("10 held, 19 free")
        # Axis labels use the dark theme's text colour, not uPlot's black.
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background not in ("rgb(255, 255, 255)", "rgba(0, 0, 0, 0)"), background
        usage_chart.locator("summary", has_text="Data as a table").click()
        expect(usage_chart.locator("[data-chart-table] tbody tr").first).to_contain_text("UTC")
        usage_chart.screenshot(path=str(ARTIFACTS / "charts-node-dark.png"))
        assert errors == []


@pytest.mark.browser
class ChartsFromASimulatedClusterTests(BrowserLiveServerCase):
    """The chart drawn from the samples the cluster's own controller takes (as in the demo)."""

    serialized_rollback = False

    @classmethod
    def setUpClass(cls):
        cls.cluster = SimulatedCluster(
            nodes=2,
            namespace="default",
            configurations=[debug_echo_configuration(CONFIG, ["foo0", "foo1"], capacity=2)],
        )
        super().setUpClass()
        cls.cluster.start()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        super().tearDownClass()

    def setUp(self):
        self.addCleanup(self.cluster.stop)

    def test_the_overview_chart_shows_the_controllers_samples_of_the_cluster(self):
        wait_for(lambda: Slot.objects.filter(instance__name=INSTANCE).count() == 2, what="slots")
        sampler = self.cluster.controller.usage

        def sampled(free: int, held: int) -> bool:
            sampler.step(0)  # the sampler's next tick, now rather than in a minute
            return UsageSample.objects.filter(
                node="", configuration=CONFIG, free=free, held=held
            ).exists()

        wait_for(lambda: sampled(4, 0), what="a sample of the 4 free slots")
        user = User.objects.create_user("cluster-chart-viewer")
        user.groups.add(Group.objects.get(name="viewer"))
        context = self.new_context()
        self.addCleanup(context.close)
        self.sign_in(context, user)
        page = context.new_page()
        page.goto(f"{self.live_server_url}/", timeout=30_000)
        chart = page.locator('figure[data-chart="usage"]')
        expect(chart.locator("[data-chart-summary]")).to_contain_text("0 held, 4 free")

        # A claim in the API server reaches the cache, the next sample, and the open chart.
        self.cluster.akri.patch_instance(
            INSTANCE,
            [
                {"op": "test", "path": f"/spec/deviceUsage/{INSTANCE}-1", "value": ""},
                {"op": "replace", "path": f"/spec/deviceUsage/{INSTANCE}-1", "value": "node-b"},
            ],
        )
        wait_for(lambda: sampled(3, 1), what="a sample of the claim")
        expect(chart.locator("[data-chart-summary]")).to_contain_text(
            "1 held, 3 free", timeout=25_000
        )
        page.screenshot(path=str(ARTIFACTS / "charts-cluster.png"), full_page=True)
