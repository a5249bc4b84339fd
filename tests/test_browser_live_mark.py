"""Issue 31, item 1, in Debian's Chromium: the header's live mark says exactly one of Live (with
the time of the last update), Reconnecting (with how long), Stale, or Not live, on every kind of
page, and nothing overwrites it.

The page's clock is Playwright's fake one (``page.clock``): the mark's timers run when the test
says, so a page is watched for a minute without waiting one. The websocket is routed through
Playwright (``page.route_web_socket``) to cut it and let it back, as a network would.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User
from playwright.sync_api import expect

from akri_site.dashboard.sample import make_cluster
from tests.browser import ARTIFACTS, BrowserLiveServerCase, on_redis_channel_layer
from tests.test_browser_queues import fill as fill_queues

INSTANCE = "akri-onvif-000000"
UPDATED = re.compile(r"^updated \d\d:\d\d:\d\d UTC$")
# Pages without a live feed, one of each kind (the list).
STATIC_PAGES = {
    "scheduling": "/scheduling/",
    "pod": "/pods/apps/work-0/",
    "api-root": "/api/",
    "api-docs": "/api/docs/",
    "search": "/search/?q=onvif",
    "yaml-tab": "/configurations/default/akri-onvif/yaml/",
    "release-confirmation": "/slots/{slot}/release/",
    "not-found": "/no-such-page/",
}


class MarkCase(BrowserLiveServerCase):
    def setUp(self):
        make_cluster(instances=4, capacity=4)
        self.context = self.new_context(color_scheme="light")
        self.page = self.context.new_page()
        self.mark = self.page.locator("#live-mark")
        self.age = self.page.locator("#live-age")
        user = User.objects.create_user("m-operator", is_staff=True)
        user.groups.add(Group.objects.get(name="operator"))
        self.sign_in(self.context, user)

    def tearDown(self):
        self.page.close()
        self.context.close()

    def expect_live(self) -> None:
        expect(self.mark).to_have_text("Live")
        expect(self.mark).to_have_attribute("data-state", "live")
        expect(self.age).to_have_text(UPDATED)

    def watch_for(self, seconds: int, step: int = 5) -> None:
        """Let the page's timers run for ``seconds`` of fake time, a few seconds at a time,
        with real time between the steps for the socket's answers to arrive."""
        for _ in range(seconds // step):
            self.page.clock.run_for(step * 1000)
            self.page.wait_for_timeout(50)


@pytest.mark.browser
@on_redis_channel_layer("akri-mark")
class StaticPagesSayNotLiveTests(MarkCase):
    def test_a_page_without_a_feed_says_not_live_and_nothing_overwrites_it(self):
        from agent.models import Slot

        slot = Slot.objects.get(key=f"{INSTANCE}-0").pk
        page = self.page
        page.clock.install()
        for name, path in STATIC_PAGES.items():
            with self.subTest(page=name):
                page.goto(self.live_server_url + path.format(slot=slot))
                expect(self.mark).to_have_text("Not live")
                expect(self.mark).to_have_attribute("data-state", "static")
                expect(self.age).to_have_text(re.compile(r"^loaded \d\d:\d\d:\d\d UTC$"))
                # Before: live.js's 5 s timer wrote "Connecting…" here and it never ended.
                page.clock.run_for(30_000)
                expect(self.mark).to_have_text("Not live")
                expect(self.mark).to_have_attribute("data-state", "static")
                if name in ("scheduling", "not-found"):
                    page.screenshot(path=str(ARTIFACTS / f"mark-not-live-{name}.png"))

    def test_the_sign_in_page_says_not_live(self):
        context = self.new_context()
        page = context.new_page()
        try:
            page.clock.install()
            page.goto(f"{self.live_server_url}/accounts/login/")
            page.clock.run_for(30_000)
            expect(page.locator("#live-mark")).to_have_text("Not live")
            expect(page.locator("#live-mark")).to_have_attribute("data-state", "static")
        finally:
            context.close()


@pytest.mark.browser
@on_redis_channel_layer("akri-mark")
class LivePagesTests(MarkCase):
    def test_the_slot_map_and_the_overview_stay_live_with_the_time_of_their_last_update(self):
        page = self.page
        page.clock.install()
        for path in ("/slots/", "/"):
            page.goto(self.live_server_url + path)
            self.expect_live()
            self.watch_for(60)  # pings and pongs: "updated" moves on, the mark stays Live
            self.expect_live()

    def test_the_queues_page_stays_live_while_nothing_changes(self):
        fill_queues()
        page = self.page
        page.clock.install()
        page.goto(f"{self.live_server_url}/queues/")
        self.expect_live()
        first = self.age.text_content()
        # Before: every 5 s the mark flipped to "Connecting…" (live.js's timer) until the
        # next update wrote "Live" again.
        for _ in range(8):
            page.clock.run_for(5_000)
            self.expect_live()
            page.wait_for_timeout(50)
        # Pings every 20 s: the time of the last word from the server moved on.
        expect(self.age).not_to_have_text(first)
        page.screenshot(path=str(ARTIFACTS / "mark-live-queues.png"))


@pytest.mark.browser
@on_redis_channel_layer("akri-mark")
class ReconnectingAndStaleTests(MarkCase):
    def route(self, pattern: str) -> dict:
        """Route the page's socket through Playwright: connected to the server while
        ``state["up"]``, refused (closed at once) otherwise; ``state["sockets"]`` the open ones."""
        state: dict = {"up": True, "sockets": []}

        def handler(ws) -> None:
            if state["up"]:
                ws.connect_to_server()
                state["sockets"].append(ws)
            else:
                ws.close(code=1011, reason="test: server away")

        self.page.route_web_socket(pattern, handler)
        return state

    def cut(self, state: dict) -> None:
        state["up"] = False
        for ws in state["sockets"]:
            ws.close(code=1011, reason="test: network cut")
        state["sockets"].clear()

    def check_reconnecting_then_stale_then_live(self, path: str, pattern: str) -> None:
        page = self.page
        state = self.route(pattern)
        page.clock.install()
        page.goto(self.live_server_url + path)
        self.expect_live()

        self.cut(state)
        expect(self.mark).to_have_text("Reconnecting…")
        expect(self.mark).to_have_attribute("data-state", "reconnecting")
        page.clock.run_for(8_000)
        expect(self.age).to_have_text(re.compile(r"^for [5-9] s · data from \d\d:\d\d:\d\d UTC$"))

        page.clock.run_for(20_000)
        expect(self.mark).to_have_text(re.compile(r"^Stale since \d\d:\d\d UTC$"))
        expect(self.mark).to_have_attribute("data-state", "stale")
        expect(self.age).to_have_text(re.compile(r"old · reconnecting$"))

        state["up"] = True
        for _ in range(8):  # the backoff is at most 30 s
            page.clock.run_for(5_000)
            page.wait_for_timeout(100)
        self.expect_live()

    def test_the_slot_map_says_reconnecting_then_stale_then_live_again(self):
        self.check_reconnecting_then_stale_then_live("/slots/", "**/ws/live/**")

    def test_the_queues_page_says_reconnecting_then_stale_then_live_again(self):
        fill_queues()
        self.check_reconnecting_then_stale_then_live("/queues/", "**/ws/queues/**")
