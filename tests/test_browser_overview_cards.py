"""Issue 31, item 2, in Debian's Chromium: every card of the overview follows the live feed or
says it does not; the "Last reconciliation" card follows runs as they are recorded (written
by agents and Celery workers, which never publish to the channel layer: the web process
watches the history itself)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from playwright.sync_api import expect

from agent.models import ReconcileRun
from akri_site.dashboard.sample import make_cluster
from tests.browser import ARTIFACTS, BrowserLiveServerCase


@pytest.mark.browser
class OverviewCardsTests(BrowserLiveServerCase):
    def setUp(self):
        make_cluster(instances=4, capacity=4)
        self.first = ReconcileRun.objects.create(
            scope="node",
            node="node-a",
            trigger="sweep",
            started_at=timezone.now() - timedelta(minutes=2),
            checked=8,
        )
        self.context = self.new_context(color_scheme="light")
        self.page = self.context.new_page()
        user = User.objects.create_user("cards-viewer")
        user.groups.add(Group.objects.get(name="viewer"))
        self.sign_in(self.context, user)

    def tearDown(self):
        self.page.close()
        self.context.close()

    def test_the_last_reconciliation_card_follows_runs_as_they_are_recorded(self):
        page = self.page
        page.goto(f"{self.live_server_url}/")
        expect(page.locator("#live-mark")).to_have_text("Live")
        card = page.locator('[data-card="last-run"]')
        expect(card.get_by_role("link")).to_have_attribute(
            "href", f"/reconciliation/{self.first.pk}/"
        )

        # An agent records a run (it writes the database, and publishes nothing).
        run = ReconcileRun.objects.create(
            scope="node", node="node-b", trigger="pod", started_at=timezone.now(), checked=3
        )
        expect(card.get_by_role("link")).to_have_attribute(
            "href", f"/reconciliation/{run.pk}/", timeout=15_000
        )
        expect(card.locator("[data-last-run-detail]")).to_contain_text("node node-b, pod")
        # ... and finishes it: the card shows its counts.
        ReconcileRun.objects.filter(pk=run.pk).update(released=1)
        expect(card.locator("[data-last-run-detail]")).to_contain_text("released 1", timeout=15_000)
        page.screenshot(path=str(ARTIFACTS / "overview-cards-live.png"), full_page=True)

    def test_every_card_says_whether_it_follows_the_feed(self):
        page = self.page
        page.goto(f"{self.live_server_url}/")
        cards = page.locator("section.cards .card")
        expect(cards).to_have_count(4)
        for i in range(4):
            card = cards.nth(i)
            follows = card.get_attribute("data-follows")
            words = card.locator(".card-follows")
            if follows == "live":
                expect(words).to_have_text("follows the live feed")
            else:
                assert follows == "load", follows
                expect(words).to_have_text(re.compile(r"^counted at \d\d:\d\d:\d\d UTC, not live"))
        for name in ("Alerts", "Leaders"):
            section = page.locator("section", has=page.get_by_role("heading", name=name))
            expect(section.locator(".card-follows")).to_contain_text("not live")
