"""The dashboard in Debian's Chromium, against Daphne serving the real ASGI application.

Screenshots go to ``test-artifacts/``. The live-update test needs a channel layer shared by this
process and the server process, i.e. Redis (``AKRI_TEST_REDIS_URL``, which ``scripts/test``
always sets).
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from playwright.sync_api import expect

from agent.models import Slot
from akri_site.dashboard import live
from akri_site.dashboard.sample import make_cluster
from tests.browser import ARTIFACTS, BrowserLiveServerCase, on_redis_channel_layer

INSTANCE = "akri-onvif-000000"


class BrowserCase(BrowserLiveServerCase):
    """A sample cluster in the database and a fresh context (cookies, theme) per test."""

    def setUp(self):
        make_cluster(instances=10, capacity=4)
        self.context = self.new_context(color_scheme="light")
        self.page = self.context.new_page()

    def tearDown(self):
        self.page.close()
        self.context.close()

    def sign_in_as(self, role: str, staff: bool = False) -> User:
        user = User.objects.create_user(f"b-{role}", is_staff=staff)
        user.groups.add(Group.objects.get(name=role))
        self.sign_in(self.context, user)
        return user

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.mark.browser
class DashboardInBrowserTests(BrowserCase):
    def test_a_viewer_signs_in_and_sees_the_live_slot_map_without_release_actions(self):
        User.objects.create_user("vera", password="s3cret-pass").groups.add(
            Group.objects.get(name="viewer")
        )
        page = self.page
        page.goto(f"{self.live_server_url}/slots/")
        expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/slots/"))
        page.get_by_label("Username").fill("vera")
        page.get_by_label("Password").fill("s3cret-pass")
        page.get_by_role("button", name="Sign in").click()

        expect(page.get_by_role("heading", name="Slot map")).to_be_visible()
        expect(page.locator("#live-mark")).to_have_text("Live")
        row = page.get_by_role("row", name=re.compile(INSTANCE))
        expect(row).to_contain_text("node-a")
        expect(row).to_contain_text("apps/work-0 / main")
        expect(page.locator("td[data-slot]")).to_have_count(40)
        expect(page.get_by_role("link", name=re.compile("^Release"))).to_have_count(0)
        expect(page.get_by_role("link", name="Admin")).to_have_count(0)
        self.shot("slot-map-viewer")

        page.get_by_label("State").select_option("foreign")
        page.get_by_role("button", name="Apply").click()
        expect(page).to_have_url(re.compile(r"state=foreign"))
        expect(page.locator("tr[data-instance]")).to_have_count(1)
        expect(page.locator('td[data-state="foreign"]')).to_contain_text("C:broken")
        page.get_by_label("Instance name contains").fill("no-such-camera")
        page.get_by_role("button", name="Apply").click()
        expect(page.get_by_text("No slot matches these filters.")).to_be_visible()
        page.go_back()  # filters live in the URL: Back restores them
        expect(page.get_by_label("State")).to_have_value("foreign")

    def test_an_operator_is_asked_to_confirm_with_cancel_focused(self):
        self.sign_in_as("operator", staff=True)
        page = self.page
        page.goto(f"{self.live_server_url}/slots/?configuration=akri-onvif")

        page.get_by_role("link", name=f"Release {INSTANCE}-0…").click()

        expect(page.get_by_role("heading", name=f"Release slot {INSTANCE}-0?")).to_be_visible()
        expect(page.get_by_text("held by a pod that still runs")).to_be_visible()
        expect(page.get_by_role("link", name="Cancel")).to_be_focused()
        self.shot("release-confirmation")
        page.keyboard.press("Enter")  # Enter on the focused control: Cancel
        expect(page).to_have_url(re.compile(r"/slots/\?configuration=akri-onvif$"))
        assert Slot.objects.get(key=f"{INSTANCE}-0").value == "node-a"

    def test_the_overview_shows_totals_and_alerts(self):
        self.sign_in_as("viewer")
        page = self.page
        page.goto(f"{self.live_server_url}/")

        expect(page.locator("#live-mark")).to_have_text("Live")
        expect(page.get_by_role("heading", name="Alerts")).to_be_visible()
        expect(page.get_by_text("slot holds a value that is not a node")).to_be_visible()
        config_row = page.get_by_role("row", name=re.compile(r"^default.akri-onvif "))
        expect(config_row.get_by_role("cell")).to_have_text(
            ["10", "4", "40", "20", "19", "1", "0", re.compile("valid")]
        )
        self.shot("overview-light")

    def test_the_dark_theme_follows_the_system(self):
        self.page.emulate_media(color_scheme="dark")
        self.sign_in_as("viewer")
        self.page.goto(f"{self.live_server_url}/slots/")

        background = self.page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(18, 20, 23)"
        self.shot("slot-map-dark")
        self.page.get_by_label("Theme").select_option("light")  # a person's choice wins
        background = self.page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(251, 251, 252)"
        self.page.emulate_media(color_scheme="light")
        self.page.get_by_label("Theme").select_option("dark")  # and against the system's too
        background = self.page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(18, 20, 23)"

    def test_a_user_without_a_role_is_told_so(self):
        self.sign_in(self.context, User.objects.create_user("nobody"))
        response = self.page.goto(f"{self.live_server_url}/slots/")

        assert response.status == 403
        expect(self.page.get_by_text("no dashboard role")).to_be_visible()


@pytest.mark.browser
@on_redis_channel_layer("akri-browser")
class LiveUpdatesInBrowserTests(BrowserCase):
    def test_a_slot_taken_elsewhere_appears_without_a_reload(self):
        self.sign_in_as("viewer")
        page = self.page
        page.goto(f"{self.live_server_url}/slots/?node=node-b")
        expect(page.locator("#live-mark")).to_have_text("Live")
        cell = page.locator(f'td[data-slot="{INSTANCE}-3"]')
        expect(cell).to_have_attribute("data-state", "free")
        page.evaluate("window.__marker = 'same page'")

        slot = Slot.objects.select_related("instance").get(key=f"{INSTANCE}-3")
        Slot.objects.filter(pk=slot.pk).update(
            value="node-b", level="IL", holder_node="node-b", since=timezone.now()
        )
        live.publish_instances([slot.instance.pk])

        expect(cell).to_have_attribute("data-state", "held")
        expect(cell).to_contain_text("node-b")
        assert page.evaluate("window.__marker") == "same page"  # updated in place
        self.shot("slot-map-live-update")
