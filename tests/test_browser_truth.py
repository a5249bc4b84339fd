"""Issue 31 in Debian's Chromium: the list pages, the small things a person trips over (the
live mark at 390 px, the charts' clocks, ticks and legends) and screenshots of the overview,
the slot map, the Queues page and a list page at 1280 and 390 px (``test-artifacts/``, named
``truth-<page>-<width>.png``)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from playwright.sync_api import expect

from agent import usage
from agent.queues.models import Refusal
from tests.browser import ARTIFACTS, BrowserLiveServerCase, on_redis_channel_layer
from tests.test_browser_queues import fill as fill_queues

WIDTHS = (1280, 390)
PAGES = {"overview": "/", "slot-map": "/slots/", "queues": "/queues/", "instances": "/instances/"}


def fill() -> None:
    from akri_site.dashboard.sample import make_cluster

    make_cluster(instances=12, capacity=4)
    now = timezone.now()
    for minutes_ago in range(10, 0, -1):
        usage.sample(now - timedelta(minutes=minutes_ago))
    fill_queues()
    Refusal.objects.bulk_create(
        Refusal(
            at=now - timedelta(seconds=7 * i),
            operation="CREATE",
            resource="pods",
            namespace="ml",
            name="b-train",
            queue="team-b",
            claim="Instance default/akri-onvif-000001",
            owner="team-a",
            rule="non-preemptible",
            message="non-preemptible pod of queue team-b may not join team-a's Instance",
        )
        for i in range(40)
    )


@pytest.mark.browser
@on_redis_channel_layer("akri-truth")
class TruthInBrowserTests(BrowserLiveServerCase):
    def setUp(self):
        fill()
        self.user = User.objects.create_user("truth-operator", is_staff=True)
        self.user.groups.add(Group.objects.get(name="operator"))

    def open(self, path: str, width: int = 1280, height: int = 900):
        context = self.new_context(
            color_scheme="light", viewport={"width": width, "height": height}
        )
        self.addCleanup(context.close)
        self.sign_in(context, self.user)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{self.live_server_url}{path}", timeout=30_000)
        return page, errors

    def test_screenshots_of_the_main_pages_at_1280_and_390_px(self):
        for width in WIDTHS:
            for name, path in PAGES.items():
                with self.subTest(page=name, width=width):
                    page, errors = self.open(path, width)
                    if name != "instances":
                        expect(page.locator("#live-mark")).to_have_text("Live")
                    else:
                        expect(page.locator("#live-mark")).to_have_text("Not live")
                    if name in ("overview", "queues"):
                        charts = page.locator("canvas")
                        expect(charts.first).to_be_visible()
                    # The page never scrolls sideways, whatever the width.
                    scroll = page.evaluate("document.documentElement.scrollWidth")
                    assert scroll <= width, (name, width, scroll)
                    page.screenshot(
                        path=str(ARTIFACTS / f"truth-{name}-{width}.png"), full_page=True
                    )
                    # What a phone shows first (the header and the top of the page).
                    if width < 800:
                        page.screenshot(path=str(ARTIFACTS / f"truth-{name}-{width}-top.png"))
                    assert errors == [], errors

    def test_at_390_px_the_live_mark_shows_its_whole_word(self):
        for path, word in (("/slots/", "Live"), ("/scheduling/", "Not live")):
            page, _ = self.open(path, 390, 740)
            mark = page.locator("#live-mark")
            expect(mark).to_have_text(word)
            box = mark.bounding_box()
            assert box is not None and box["x"] + box["width"] <= 390, box
            # Before: cut to "L…" by an ellipsis, the state told by colour alone.
            clipped = mark.evaluate("el => el.scrollWidth > el.clientWidth + 1")
            assert not clipped, path
            style = mark.evaluate("el => getComputedStyle(el).textOverflow")
            assert style != "ellipsis"

    def test_the_queue_chart_reads_24_hour_utc_and_whole_devices(self):
        page, errors = self.open("/queues/", 1280)
        expect(page.locator("#queue-chart canvas")).to_have_count(1)
        axes = page.evaluate(
            "() => document.getElementById('queue-chart').chart.axes.map(a => a._values)"
        )
        times, devices = axes[0], axes[1]
        assert times and all(re.fullmatch(r"\d\d:\d\d", t) for t in times), times
        assert devices and all(re.fullmatch(r"\d+", str(d)) for d in devices), devices
        legend = page.locator("#queue-chart .u-legend")
        expect(legend).to_contain_text("(latest)")
        expect(legend).not_to_contain_text("no data")
        assert errors == []

    def test_chart_legends_show_the_latest_value_not_no_data(self):
        page, errors = self.open("/", 1280)
        usage_chart = page.locator('figure[data-chart="usage"]')
        expect(usage_chart).to_have_attribute("data-state", "drawn")
        legend = usage_chart.locator(".u-legend")
        held = legend.locator("tr", has_text="held")
        # Before: "held: no data" under a line that has data (the cursor is not on the chart).
        expect(held).to_contain_text(re.compile(r"held:?\s*\d+ \(latest\)"))
        expect(legend).not_to_contain_text("no data")
        assert errors == []

    def test_refusals_are_one_row_per_group_with_links_to_the_pods(self):
        page, _ = self.open("/queues/", 1280)
        groups = page.locator("tr[data-refusal-group]")
        expect(groups).to_have_count(1)
        expect(groups.locator('[data-field="count"]')).to_have_text("40")
        groups.get_by_role("link", name="ml/b-train").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Pod ml/b-train")
        expect(page.get_by_role("heading", name="Refused by the admission webhook")).to_be_visible()

    def test_the_navigation_reaches_every_list_and_a_list_sorts_and_pages_in_the_url(self):
        page, errors = self.open("/", 1280)
        for name in ("Configurations", "Instances", "Nodes", "Pods", "Brokers"):
            page.get_by_role("navigation", name="Main").get_by_role("link", name=name).click()
            expect(page.get_by_role("heading", level=1)).to_have_text(name)
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Instances").click()
        page.get_by_role("link", name=re.compile("^Capacity")).click()
        expect(page).to_have_url(re.compile(r"sort=-capacity"))
        page.get_by_label("Name contains").fill("00000a")
        page.get_by_role("button", name="Apply").click()
        expect(page).to_have_url(re.compile(r"q=00000a&.*sort=-capacity"))
        expect(page.locator("[data-list-count]")).to_contain_text("1 Instance matching q")
        expect(page.locator("table[data-list] tbody tr")).to_have_count(1)
        page.go_back()  # the view is the URL: Back restores the whole list
        expect(page.locator("table[data-list] tbody tr")).to_have_count(12)
        assert errors == []

    def test_releasing_a_running_pods_slot_says_it_comes_back_and_leads_to_eviction(self):
        from agent.models import Slot

        slot = Slot.objects.get(key="akri-onvif-000000-0")  # node-a, pod apps/work-0 Running
        page, errors = self.open(f"/slots/{slot.pk}/release/", 1280)
        warning = page.locator("[data-running-holder]")
        expect(warning).to_contain_text("Releasing will not free the device.")
        expect(warning).to_contain_text("node-a's agent sees the pod using it")
        page.screenshot(path=str(ARTIFACTS / "truth-release-running.png"), full_page=True)
        warning.get_by_role("link", name="Evict pod apps/work-0…").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Evict pod apps/work-0?")
        expect(page.get_by_role("link", name="Cancel")).to_be_focused()
        expect(page.get_by_text("akri-onvif-000000-0")).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "truth-evict-confirm.png"), full_page=True)
        page.keyboard.press("Enter")  # Cancel: back to the pod's page, nothing done
        expect(page.get_by_role("heading", level=1)).to_have_text("Pod apps/work-0")
        assert errors == []
