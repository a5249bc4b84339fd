"""A stuck slot in Debian's Chromium (issue 17): counted on the overview, marked on the slot
map in words, and its fix one click away (the slot map's release confirmation)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from playwright.sync_api import expect

from agent.models import SlotPodBinding
from akri_site.dashboard.sample import make_cluster
from tests.browser import ARTIFACTS, BrowserLiveServerCase

STUCK = "akri-onvif-000000-1"  # held CL by node-a for 30 s, its pod never learned


@pytest.mark.browser
class StuckSlotInBrowserTests(BrowserLiveServerCase):
    def setUp(self):
        make_cluster(instances=4, capacity=4)
        # node-a's slot-to-pod map is in this database, as in the demo.
        SlotPodBinding.objects.create(
            node="node-a", slot="akri-onvif-000000-0", instance="akri-onvif-000000",
            namespace="default", pod_namespace="apps", pod_name="work-0",
            allocated_at=timezone.now(),
        )  # fmt: skip
        operator = User.objects.create_user("olga", is_staff=True)
        operator.groups.add(Group.objects.get(name="operator"))
        self.context = self.new_context(color_scheme="dark")
        self.page = self.context.new_page()
        self.sign_in(self.context, operator)

    def tearDown(self):
        self.page.close()
        self.context.close()

    def test_a_stuck_slot_is_marked_on_the_map_and_links_to_its_release(self):
        page = self.page
        page.goto(f"{self.live_server_url}/")
        box = page.locator("[data-stuck]")
        expect(box).to_contain_text("Stuck")

        box.get_by_role("link", name="pod not known past the grace period").click()

        expect(page).to_have_url(re.compile(r"/slots/\?state=no-pod$"))
        cell = page.locator(f'td[data-slot="{STUCK}"]')
        expect(cell).to_have_class(re.compile(r"\bstuck\b"))
        expect(cell).to_contain_text("⚑ stuck: pod not known past the grace period")
        # The slot whose pod is known, beside it, carries no mark.
        expect(page.locator('td[data-slot="akri-onvif-000000-0"]')).not_to_contain_text("stuck")
        page.screenshot(path=str(ARTIFACTS / "stuck-slot-map.png"), full_page=True)

        cell.get_by_role("link", name=f"Release {STUCK}…").click()

        expect(page).to_have_url(re.compile(r"/slots/\d+/release/\?back=state%3Dno-pod$"))
        expect(page.locator("dl.release-facts")).to_contain_text(STUCK)
        expect(page.locator("#release-cancel")).to_be_focused()
