"""Small screens, consistency and keyboard (issue 17, item 6) in Debian's Chromium.

At 375 px every page keeps its header on one line and never scrolls sideways (a wide table
scrolls inside its own box); the admin and the browsable API wear the dashboard's dark theme;
the skip link is the first thing Tab reaches; times use the one format. Screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import re
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from playwright.sync_api import expect

from agent.models import AuditEntry, ReconcileRun, Slot
from agent.scheduling.models import PodVerdict
from akri_site.dashboard import live
from akri_site.dashboard.sample import make_cluster
from tests.browser import ARTIFACTS, BrowserLiveServerCase, on_redis_channel_layer

PHONE = {"width": 375, "height": 740}
INSTANCE = "akri-onvif-000000"
# Every page an operator reaches, by a name for its screenshot.
PAGES = {
    "overview": "/",
    "slots": "/slots/",
    "instance": f"/instances/default/{INSTANCE}/",
    "configuration": "/configurations/default/akri-onvif/",
    "node": "/nodes/node-a/",
    "reconciliation": "/reconciliation/",
    "run": "/reconciliation/{run}/",
    "audit": "/audit/",
    "scheduling": "/scheduling/",
    "queues": "/queues/",
    "admin": "/admin/",
    "admin-slots": "/admin/agent/slot/",
    "api": "/api/slots/",
    "api-docs": "/api/docs/",
}

WIDTH_AND_HEADER = """() => {
  const header = document.querySelector("header.top");
  return {
    scrollWidth: document.documentElement.scrollWidth,
    headerHeight: header ? header.getBoundingClientRect().height : null,
  };
}"""


def seed_history() -> ReconcileRun:
    now = timezone.now()
    long_name = "a-pod-with-a-rather-long-generated-name-7d9f8c6b5-x2x4z"
    AuditEntry.objects.create(
        at=now,
        username="ada",
        action="release",
        target=f"default/{INSTANCE}-0",
        holder="node-a",
        reason="the pod is gone but the slot was still held, see the incident notes",
        outcome="done",
    )
    PodVerdict.objects.create(
        namespace="apps",
        name=long_name,
        at=now,
        failed={"node-a": "Instance akri-onvif-000000 has no free slot"},
        reasons={"Instance akri-onvif-000000 has no free slot": 1},
    )
    return ReconcileRun.objects.create(
        scope="cluster",
        trigger="sweep",
        started_at=now - timedelta(minutes=3),
        released=1,
        detail="released default/akri-onvif-000000-0 (pod apps/work-0 gone)",
    )


@pytest.mark.browser
class SmallScreenTests(BrowserLiveServerCase):
    def setUp(self):
        make_cluster(instances=10, capacity=4)
        self.run_row = seed_history()
        self.user = User.objects.create_user("ada", is_staff=True)
        self.user.groups.add(Group.objects.get(name="admin"))

    def phone(self, **options):
        context = self.new_context(viewport=PHONE, color_scheme="light", **options)
        return context, context.new_page()

    def test_no_page_scrolls_sideways_at_375_px_and_the_header_is_one_line(self):
        context, page = self.phone()
        self.sign_in(context, self.user)
        too_wide, too_tall = [], []
        for name, path in PAGES.items():
            response = page.goto(self.live_server_url + path.format(run=self.run_row.pk))
            assert response.status == 200, (name, response.status)
            page.wait_for_load_state("load")
            if name == "api-docs":  # Swagger UI draws after the schema arrives
                page.locator(".opblock").first.wait_for()
            measured = page.evaluate(WIDTH_AND_HEADER)
            page.screenshot(path=str(ARTIFACTS / f"375-{name}.png"), full_page=True)
            if measured["scrollWidth"] > PHONE["width"]:
                too_wide.append((name, measured["scrollWidth"]))
            # Our header (the admin has its own): one line of controls, about 2.7 rem.
            if measured["headerHeight"] is not None and measured["headerHeight"] > 52:
                too_tall.append((name, measured["headerHeight"]))
        context.close()

        assert too_wide == []
        assert too_tall == []

    def test_the_sign_in_page_fits_375_px(self):
        context, page = self.phone()
        response = page.goto(f"{self.live_server_url}/accounts/login/")

        assert response.status == 200
        measured = page.evaluate(WIDTH_AND_HEADER)
        page.screenshot(path=str(ARTIFACTS / "375-login.png"), full_page=True)
        context.close()
        assert measured["scrollWidth"] <= PHONE["width"]
        assert measured["headerHeight"] <= 52

    def test_the_menu_button_opens_the_navigation_by_keyboard_and_escape_closes_it(self):
        context, page = self.phone()
        self.sign_in(context, self.user)
        page.goto(f"{self.live_server_url}/slots/")
        menu = page.get_by_role("button", name="Menu")
        expect(page.get_by_role("link", name="Audit log")).to_be_hidden()

        menu.focus()
        page.keyboard.press("Enter")

        expect(menu).to_have_attribute("aria-expanded", "true")
        expect(page.get_by_role("link", name="Audit log")).to_be_visible()
        expect(page.get_by_role("link", name="Overview")).to_be_focused()
        page.screenshot(path=str(ARTIFACTS / "375-menu-open.png"))
        page.keyboard.press("Escape")
        expect(menu).to_have_attribute("aria-expanded", "false")
        expect(page.get_by_role("link", name="Audit log")).to_be_hidden()
        expect(menu).to_be_focused()
        context.close()

    def test_a_wide_table_scrolls_inside_its_own_box(self):
        context, page = self.phone()
        self.sign_in(context, self.user)
        page.goto(f"{self.live_server_url}/slots/")

        table = page.locator("table.slotgrid").first
        sizes = table.evaluate("t => ({scroll: t.scrollWidth, client: t.clientWidth})")
        context.close()
        assert sizes["scroll"] > sizes["client"]  # wider than the screen: it scrolls itself
        assert sizes["client"] <= PHONE["width"]


@pytest.mark.browser
class ConsistencyTests(BrowserLiveServerCase):
    def setUp(self):
        make_cluster(instances=4, capacity=4)
        self.user = User.objects.create_user("ada", is_staff=True)
        self.user.groups.add(Group.objects.get(name="admin"))

    def desktop(self, **options):
        context = self.new_context(**options)
        self.sign_in(context, self.user)
        return context, context.new_page()

    def test_the_skip_link_is_the_first_tab_stop_and_jumps_to_the_first_slot_table(self):
        context, page = self.desktop(color_scheme="light")
        page.goto(f"{self.live_server_url}/slots/")

        page.keyboard.press("Tab")

        skip = page.get_by_role("link", name="Skip to the slot table")
        expect(skip).to_be_focused()
        expect(skip).to_be_visible()
        assert skip.bounding_box()["x"] >= 0
        page.screenshot(path=str(ARTIFACTS / "skip-link-focused.png"))
        page.keyboard.press("Enter")
        expect(page.locator("#first-slot-table")).to_be_focused()
        page.keyboard.press("Tab")  # onwards from the table: its first link
        focused = page.evaluate("document.activeElement.closest('#first-slot-table') !== null")
        context.close()
        assert focused

    def test_a_wide_screen_shows_the_navigation_without_a_menu_button(self):
        context, page = self.desktop(color_scheme="light")
        page.goto(f"{self.live_server_url}/slots/")

        expect(page.get_by_role("link", name="Audit log")).to_be_visible()
        expect(page.get_by_role("button", name="Menu")).to_be_hidden()
        context.close()

    def test_the_skip_link_goes_to_the_content_on_pages_without_slots(self):
        context, page = self.desktop(color_scheme="light")
        page.goto(f"{self.live_server_url}/audit/")

        page.keyboard.press("Tab")

        skip = page.get_by_role("link", name="Skip to content")
        expect(skip).to_be_focused()
        page.keyboard.press("Enter")
        expect(page.locator("#main")).to_be_focused()
        context.close()

    def test_the_admin_follows_the_dashboards_dark_theme(self):
        context, page = self.desktop(color_scheme="dark")
        page.goto(f"{self.live_server_url}/admin/agent/slot/")

        expect(page.get_by_role("heading", name=re.compile("Select slot"))).to_be_visible()
        colours = page.evaluate(
            """() => ({
              body: getComputedStyle(document.body).backgroundColor,
              header: getComputedStyle(document.getElementById("header")).backgroundColor,
            })"""
        )
        page.screenshot(path=str(ARTIFACTS / "admin-dark.png"), full_page=True)
        context.close()
        assert colours["body"] == "rgb(18, 20, 23)"  # the dashboard's dark --bg
        assert colours["header"] == "rgb(26, 29, 33)"  # its dark --panel

    def test_the_admin_follows_the_dashboards_light_theme(self):
        context, page = self.desktop(color_scheme="light")
        page.goto(f"{self.live_server_url}/admin/")

        body = page.evaluate("getComputedStyle(document.body).backgroundColor")
        page.screenshot(path=str(ARTIFACTS / "admin-light.png"), full_page=True)
        context.close()
        assert body == "rgb(251, 251, 252)"

    def test_the_browsable_api_follows_the_dashboards_dark_theme(self):
        context, page = self.desktop(color_scheme="dark")
        response = page.goto(f"{self.live_server_url}/api/slots/")

        assert response.status == 200
        expect(page.locator("header.top .brand")).to_have_text("akri-site")
        colours = page.evaluate(
            """() => ({
              body: getComputedStyle(document.body).backgroundColor,
              pre: getComputedStyle(document.querySelector(".response-info pre")).backgroundColor,
            })"""
        )
        page.screenshot(path=str(ARTIFACTS / "api-dark.png"), full_page=True)
        context.close()
        assert colours["body"] == "rgb(18, 20, 23)"
        assert colours["pre"] == "rgb(26, 29, 33)"

    def test_the_api_docs_load_from_this_site_alone(self):
        context, page = self.desktop(color_scheme="light")
        origins = []
        page.on("request", lambda request: origins.append(request.url))

        response = page.goto(f"{self.live_server_url}/api/docs/")

        assert response.status == 200
        expect(page.get_by_role("heading", name=re.compile("akri-site API"))).to_be_visible()
        expect(page.locator(".opblock-summary-path", has_text="/api/slots/").first).to_be_visible()
        page.locator(".opblock-summary-path", has_text=re.compile(r"^/api/slots/$")).click()
        expect(page.get_by_text("Fields to order by").first).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "api-docs.png"), full_page=True)
        context.close()
        assert any("/api/schema/" in url for url in origins)
        assert [u for u in origins if not u.startswith(self.live_server_url)] == []


LOCAL_ZONE = "Asia/Kolkata"  # not UTC, and not a whole hour off it


@pytest.mark.browser
@on_redis_channel_layer("akri-polish")
class LiveDateFormatTests(BrowserLiveServerCase):
    def test_a_live_updated_cell_shows_the_one_date_format_in_the_viewers_zone(self):
        make_cluster(instances=2, capacity=4)
        user = User.objects.create_user("vera")
        user.groups.add(Group.objects.get(name="viewer"))
        context = self.new_context(timezone_id=LOCAL_ZONE)
        self.sign_in(context, user)
        page = context.new_page()
        page.goto(f"{self.live_server_url}/slots/")
        expect(page.locator("#live-mark")).to_have_text("Live")
        cell = page.locator(f'td[data-slot="{INSTANCE}-3"]')
        expect(cell).to_have_attribute("data-state", "free")

        since = (timezone.now() - timedelta(seconds=90)).replace(microsecond=0)
        slot = Slot.objects.select_related("instance").get(key=f"{INSTANCE}-3")
        Slot.objects.filter(pk=slot.pk).update(
            value="node-b", level="IL", holder_node="node-b", since=since
        )
        live.publish_instances([slot.instance.pk])

        expect(cell).to_have_attribute("data-state", "held")
        local = since.astimezone(ZoneInfo(LOCAL_ZONE)).strftime("%Y-%m-%d %H:%M:%S")
        stamp = cell.locator("time")
        expect(stamp).to_have_text(re.compile(rf"^{local} GMT\+5:30 \(9\d s ago\)$"))
        expect(stamp).to_have_attribute("title", re.compile(rf"^{since:%Y-%m-%d %H:%M:%S} UTC "))
        page.screenshot(path=str(ARTIFACTS / "live-cell-local-time.png"))

        page.get_by_role("button", name="UTC").click()

        expect(stamp).to_have_text(re.compile(rf"^{since:%Y-%m-%d %H:%M:%S} UTC \(9\d s ago\)$"))
        context.close()
