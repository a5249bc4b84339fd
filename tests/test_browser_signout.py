"""Signing out, from the dashboard and from the admin, in Debian's Chromium: both land on the
dashboard's own sign-in page, never on Django's stock "logged out" page."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User
from playwright.sync_api import expect

from tests.browser import ARTIFACTS, BrowserLiveServerCase

PASSWORD = "s3cret-pass"


@pytest.mark.browser
class SignOutInBrowserTests(BrowserLiveServerCase):
    def setUp(self):
        self.context = self.new_context(color_scheme="light")
        self.page = self.context.new_page()

    def tearDown(self):
        self.page.close()
        self.context.close()

    def sign_in_with_form(self, url: str, username: str) -> None:
        page = self.page
        page.goto(url)
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name=re.compile("^(Sign in|Log in)$")).click()

    def expect_the_dashboards_sign_in_page(self) -> None:
        page = self.page
        expect(page).to_have_url(re.compile(r"/accounts/login/\?signed_out=1$"))
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        expect(page.get_by_role("status").filter(has_text="signed out")).to_have_text(
            "✔ You are signed out."
        )
        expect(page.get_by_text("Thanks for spending some quality time")).to_have_count(0)
        page.screenshot(path=str(ARTIFACTS / "signed-out.png"), full_page=True)
        # Signed out for real: the dashboard sends us back to sign in.
        page.goto(f"{self.live_server_url}/")
        expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
        expect(page.get_by_text("You are signed out.")).to_have_count(0)

    def test_signing_out_of_the_dashboard_returns_to_its_sign_in_page(self):
        User.objects.create_user("vera", password=PASSWORD).groups.add(
            Group.objects.get(name="viewer")
        )
        self.sign_in_with_form(f"{self.live_server_url}/accounts/login/", "vera")
        expect(self.page.get_by_role("button", name="Sign out")).to_be_visible()

        self.page.get_by_role("button", name="Sign out").click()

        self.expect_the_dashboards_sign_in_page()

    def test_signing_out_of_the_admin_returns_to_the_dashboards_sign_in_page(self):
        User.objects.create_superuser("ada", password=PASSWORD)
        self.sign_in_with_form(f"{self.live_server_url}/admin/login/?next=/admin/", "ada")
        expect(self.page.get_by_role("button", name="Log out")).to_be_visible()

        self.page.get_by_role("button", name="Log out").click()

        self.expect_the_dashboards_sign_in_page()
