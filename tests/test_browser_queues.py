"""The Queues page in Debian's Chromium, against Daphne serving the real ASGI application:
per-queue figures, the chart drawn from the project's own uPlot, drill-down to a claim, and a
figure updated in place when a recompute publishes (Redis shared with the server process)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from playwright.sync_api import expect

from agent.queues import history, live, recompute
from agent.queues.models import QueuePod, ResourceClaim
from tests.browser import ARTIFACTS, BrowserLiveServerCase, on_redis_channel_layer

LABEL = "akri-site.io/queue"


def fill() -> None:
    pods = []
    for name, queue, priority in (("a1", "team-a", 0), ("b1", "team-b", 125), ("b2", "team-b", 0)):
        pods.append(
            QueuePod.objects.create(
                namespace="ml",
                name=name,
                uid=f"uid-{name}",
                labels={"kai.scheduler/queue": queue},
                priority=priority,
            )
        )

    def reserved(*chosen):
        return [{"resource": "pods", "name": p.name, "uid": p.uid} for p in chosen]

    ResourceClaim.objects.create(
        namespace="ml",
        name="shared-gpu",
        labels={LABEL: "team-a"},
        device_classes=["gpu"],
        allocated=1,
        reserved_for=reserved(pods[0], pods[1]),
    )
    ResourceClaim.objects.create(
        namespace="ml", name="orphan", device_classes=["gpu"], allocated=2,
        reserved_for=reserved(pods[0], pods[2]),
    )  # fmt: skip
    recompute.recompute(None)
    history.sample()


@pytest.mark.browser
@on_redis_channel_layer("akri-browser")
class QueuesPageInBrowserTests(BrowserLiveServerCase):
    def setUp(self):
        fill()
        self.context = self.new_context(color_scheme="light")
        self.page = self.context.new_page()
        user = User.objects.create_user("q-viewer")
        user.groups.add(Group.objects.get(name="viewer"))
        self.sign_in(self.context, user)

    def tearDown(self):
        self.page.close()
        self.context.close()

    def test_a_viewer_sees_charges_a_chart_and_drills_down_to_a_claim(self):
        page = self.page
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{self.live_server_url}/queues/")
        row = page.locator('tr[data-queue="team-a"]')
        expect(row.locator('[data-field="total"]')).to_have_text("1")
        expect(row.locator('[data-field="used_by_others"]')).to_have_text("1")
        expect(page.locator('[data-figure="orphans"]')).to_have_text("1")
        expect(page.locator("#queue-chart canvas")).to_have_count(1)  # uPlot drew it
        expect(page.locator("#live-mark")).to_contain_text("Live")
        page.screenshot(path=str(ARTIFACTS / "queues-page.png"), full_page=True)

        page.get_by_role("link", name="team-a").first.click()
        page.get_by_role("link", name="ResourceClaim ml/shared-gpu").first.click()
        expect(page.get_by_role("heading", level=1)).to_have_text("ResourceClaim ml/shared-gpu")
        expect(page.get_by_text("priority 125 >= 100")).to_be_visible()
        assert errors == []

    def test_a_recompute_updates_the_figures_in_place(self):
        page = self.page
        page.goto(f"{self.live_server_url}/queues/")
        expect(page.locator("#live-mark")).to_contain_text("Live")
        page.evaluate("window.__marker = 'same page'")
        cell = page.locator('tr[data-queue="team-b"] [data-field="uses_of_others"]')
        expect(cell).to_have_text("1")

        b2 = QueuePod.objects.get(name="b2")
        claim = ResourceClaim.objects.get(name="shared-gpu")
        claim.reserved_for = claim.reserved_for + [
            {"resource": "pods", "name": "b2", "uid": b2.uid}
        ]
        claim.save()
        extra = ResourceClaim.objects.create(
            namespace="ml", name="second", labels={LABEL: "team-a"}, device_classes=["gpu"],
            allocated=1, reserved_for=[{"resource": "pods", "name": "b2", "uid": b2.uid}],
        )  # fmt: skip
        recompute.recompute(None)
        live.publish_now()

        expect(cell).to_have_text("2")
        expect(page.locator('tr[data-queue="team-a"] [data-field="total"]')).to_have_text("2")
        assert page.evaluate("window.__marker") == "same page"
        assert extra.pk
