"""Less noise, more live (issue 17, item 5) in Debian's Chromium: the reconciliation history's
"did something" default and its show-all toggle, and the audit log and a run's page following
new rows without a reload (Redis shared with the server process). Screenshots go to
``test-artifacts/``."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from playwright.sync_api import expect

from agent.models import AuditEntry, ReconcileRun, SlotEvent, SyncState
from akri_site.dashboard import live
from tests.browser import ARTIFACTS, BrowserLiveServerCase, on_redis_channel_layer


@pytest.mark.browser
@on_redis_channel_layer("akri-browser")
class HistoryInBrowserTests(BrowserLiveServerCase):
    def setUp(self):
        now = timezone.now()
        # A synced cache: the header says Live (the feed connected), not Stale.
        SyncState.objects.create(owner="controller", kind="Instance", synced_at=now)
        self.busy = ReconcileRun.objects.create(
            scope="node", node="node-a", trigger="event", started_at=now, released=1, checked=4
        )
        self.quiet = ReconcileRun.objects.create(
            scope="node", node="node-a", trigger="sweep", started_at=now, checked=4
        )
        user = User.objects.create_user("history-viewer")
        user.groups.add(Group.objects.get(name="viewer"))
        self.context = self.new_context()
        self.addCleanup(self.context.close)
        self.sign_in(self.context, user)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def test_the_history_shows_runs_that_did_something_and_toggles_to_all_in_the_url(self):
        page = self.page
        page.goto(f"{self.live_server_url}/reconciliation/", timeout=30_000)

        expect(page.locator(f'tr[data-run="{self.busy.pk}"]')).to_have_count(1)
        expect(page.locator(f'tr[data-run="{self.quiet.pk}"]')).to_have_count(0)
        expect(page.locator("[data-runs-toggle]")).to_contain_text(
            "1 run that changed nothing is hidden"
        )
        page.screenshot(path=str(ARTIFACTS / "runs-default.png"), full_page=True)

        page.get_by_role("link", name="Show all runs").click()

        expect(page).to_have_url(f"{self.live_server_url}/reconciliation/?show=all")
        expect(page.locator(f'tr[data-run="{self.quiet.pk}"]')).to_have_count(1)
        page.go_back()
        expect(page.locator(f'tr[data-run="{self.quiet.pk}"]')).to_have_count(0)
        assert self.errors == []

    def test_the_audit_log_shows_a_new_entry_without_a_reload(self):
        page = self.page
        page.goto(f"{self.live_server_url}/audit/", timeout=30_000)
        expect(page.locator("#live-mark")).to_have_text("Live")
        expect(page.get_by_text("No manual actions in this range.")).to_be_visible()
        page.evaluate("window.__marker = 'same page'")

        AuditEntry.objects.create(
            at=timezone.now(),
            username="olga",
            action="release_slot",
            target="default/cam-1/cam-1-0",
            outcome="done",
        )

        expect(page.get_by_role("rowheader", name="default/cam-1/cam-1-0")).to_be_visible()
        expect(page.locator(".lead")).to_contain_text("1 entries")
        assert page.evaluate("window.__marker") == "same page"
        page.screenshot(path=str(ARTIFACTS / "audit-live.png"), full_page=True)
        assert self.errors == []

    def test_a_runs_page_follows_the_run_as_it_is_recorded(self):
        page = self.page
        page.goto(f"{self.live_server_url}/reconciliation/{self.quiet.pk}/", timeout=30_000)
        expect(page.locator("#live-mark")).to_have_text("Live")
        expect(page.get_by_text("this run changed no slot")).to_be_visible()
        page.evaluate("window.__marker = 'same page'")

        SlotEvent.objects.create(
            at=timezone.now(),
            namespace="default",
            instance="cam-1",
            configuration="cam",
            slot="cam-1-2",
            before="node-a",
            cause="reconcile",
            actor="agent:node-a",
            node="node-a",
            detail="pod apps/gone-7 is gone",
            run=self.quiet,
        )
        ReconcileRun.objects.filter(pk=self.quiet.pk).update(released=1)
        live.publish_run(self.quiet.pk)

        expect(page.get_by_text("pod apps/gone-7 is gone")).to_be_visible()
        expect(page.get_by_text("released 1, restored 0")).to_be_visible()
        assert page.evaluate("window.__marker") == "same page"
        assert self.errors == []
