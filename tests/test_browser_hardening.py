"""The Content-Security-Policy in Chromium: the dashboard and the admin run under it, and a
websocket closed for a signed-out session stops the live mark (issue #12)."""

from __future__ import annotations

import os
import re

import pytest
from django.contrib.auth.models import Group, User
from playwright.sync_api import expect

from akri_site.dashboard.sample import make_cluster
from tests.browser import BrowserLiveServerCase


@pytest.mark.browser
class ContentSecurityPolicyInBrowserTests(BrowserLiveServerCase):
    @classmethod
    def setUpClass(cls):
        # The spawned server reads its settings from the environment: check sessions often.
        cls._saved = os.environ.get("AKRI_WS_RECHECK_SECONDS")
        os.environ["AKRI_WS_RECHECK_SECONDS"] = "0.5"
        try:
            super().setUpClass()
        finally:
            if cls._saved is None:
                os.environ.pop("AKRI_WS_RECHECK_SECONDS")
            else:
                os.environ["AKRI_WS_RECHECK_SECONDS"] = cls._saved

    def setUp(self):
        make_cluster(instances=3, capacity=2)
        self.context = self.new_context()
        self.page = self.context.new_page()
        self.violations: list[str] = []
        self.page.on(
            "console",
            lambda msg: (
                self.violations.append(msg.text) if "Content Security Policy" in msg.text else None
            ),
        )

    def tearDown(self):
        self.page.close()
        self.context.close()

    def test_the_dashboard_pages_break_no_rule_of_the_policy(self):
        user = User.objects.create_user("csp-op", is_staff=True)
        user.groups.add(Group.objects.get(name="operator"))
        self.sign_in(self.context, user)

        for path in ("/", "/slots/", "/reconciliation/", "/audit/", "/admin/agent/slot/"):
            self.page.goto(f"{self.live_server_url}{path}", wait_until="networkidle")
        self.page.goto(f"{self.live_server_url}/slots/")
        expect(self.page.locator("#live-mark")).to_have_text("Live")

        assert self.violations == []

    def test_a_socket_closed_for_a_signed_out_session_says_so_and_stops(self):
        user = User.objects.create_user("csp-viewer")
        user.groups.add(Group.objects.get(name="viewer"))
        client = self.sign_in(self.context, user)
        self.page.goto(f"{self.live_server_url}/slots/")
        expect(self.page.locator("#live-mark")).to_have_text("Live")

        client.logout()  # the same session: it ends on the server

        expect(self.page.locator("#live-mark")).to_have_text(re.compile("Not live: signed out"))
        assert self.violations == []

    def test_the_queues_page_socket_closed_for_a_signed_out_session_says_so_and_stops(self):
        user = User.objects.create_user("q-viewer")
        user.groups.add(Group.objects.get(name="viewer"))
        client = self.sign_in(self.context, user)
        self.page.goto(f"{self.live_server_url}/queues/")
        expect(self.page.locator("#live-mark")).to_contain_text("Live")

        client.logout()

        expect(self.page.locator("#live-mark")).to_have_text(re.compile("Not live: signed out"))
        assert self.violations == []
