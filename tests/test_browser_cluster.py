"""The dashboard end to end in Debian's Chromium: a simulated cluster (API-server simulator,
agents, kubelet simulators, the controller) in this process, Daphne in its own process, and
the Redis channel layer between them.

A claim written to the API server must reach the open page within a second, without a reload;
a release through the admin must show on the map; a viewer gets no release action and a forged
POST changes nothing. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import os
import time

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import override_settings
from playwright.sync_api import expect

from agent.models import Instance, Slot
from agent.simulator.cluster import SimulatedCluster, debug_echo_configuration
from tests.browser import ARTIFACTS, BrowserLiveServerCase

REDIS_URL = os.environ.get("AKRI_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CONFIG = "akri-debug-echo-foo"
INSTANCE = f"{CONFIG}-8120fe"
SLOT = f"{INSTANCE}-1"


def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.browser
@override_settings(
    CHANNEL_LAYERS={
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": f"akri-test-{os.getpid()}"},
        }
    }
)
class ClusterInBrowserTests(BrowserLiveServerCase):
    serialized_rollback = False

    @classmethod
    def setUpClass(cls):
        # The server process must know where the cluster's kubeconfig is, for the admin's
        # release (the file is written when the cluster starts).
        cls.cluster = SimulatedCluster(
            nodes=2,
            namespace="default",
            configurations=[debug_echo_configuration(CONFIG, ["foo0", "foo1"], capacity=2)],
        )
        cls.saved_kubeconfig = settings.AKRI["KUBECONFIG"]
        settings.AKRI["KUBECONFIG"] = cls.cluster.kubeconfig
        super().setUpClass()
        cls.cluster.start()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        settings.AKRI["KUBECONFIG"] = cls.saved_kubeconfig
        super().tearDownClass()

    def setUp(self):
        # Stop the cluster's writers before the database is flushed after the test.
        self.addCleanup(self.cluster.stop)

    def context_as(self, role: str):
        user = User.objects.create_user(f"e2e-{role}", is_staff=role != "viewer")
        user.groups.add(Group.objects.get(name=role))
        context = self.new_context()
        return context, self.sign_in(context, user)

    def usage(self) -> dict:
        return self.cluster.akri.get_instance(INSTANCE)["spec"]["deviceUsage"]

    def test_the_slot_map_follows_the_cluster_live(self):
        wait_for(
            lambda: Slot.objects.filter(instance__name=INSTANCE).count() == 2, what="Instances"
        )
        viewer, viewer_client = self.context_as("viewer")
        page = viewer.new_page()
        # The first request also warms up the server process: allow it more time.
        page.goto(f"{self.live_server_url}/slots/", timeout=30_000)
        expect(page.locator("#live-mark")).to_have_text("Live")
        expect(page.get_by_text(INSTANCE).first).to_be_visible()
        expect(page.get_by_text(f"{CONFIG}-a19705").first).to_be_visible()
        # A viewer is offered no release, and a forged POST changes nothing.
        expect(page.get_by_role("button", name="Release…")).to_have_count(0)
        expect(page.get_by_role("link", name="Release…")).to_have_count(0)
        slot = Slot.objects.get(key=SLOT)
        forged = viewer_client.post(
            "/admin/agent/slot/",
            {
                "action": "release_slots",
                "post": "yes",
                "_selected_action": [slot.pk],
                f"expected_{slot.pk}": "",
            },
        )
        assert forged.status_code in (302, 403)
        assert self.usage()[SLOT] == ""
        page.evaluate("window.__marker = 'same page'")

        # A claim written to the API server (as another node's agent would) shows without a
        # reload (how fast is the live bench's).
        cell = page.locator(f'td[data-slot="{SLOT}"]')
        expect(cell).to_have_attribute("data-state", "free")
        self.cluster.akri.patch_instance(
            INSTANCE,
            [
                {"op": "test", "path": f"/spec/deviceUsage/{SLOT}", "value": ""},
                {"op": "replace", "path": f"/spec/deviceUsage/{SLOT}", "value": "node-b"},
            ],
        )
        expect(cell).to_have_attribute("data-state", "held", timeout=10_000)
        expect(cell).to_contain_text("node-b")
        assert page.evaluate("window.__marker") == "same page"
        page.screenshot(path=str(ARTIFACTS / "e2e-claim-live.png"), full_page=True)

        # An operator releases it through the admin, with a reason; the open map follows.
        operator, _ = self.context_as("operator")
        admin_page = operator.new_page()
        wait_for(lambda: Slot.objects.get(key=SLOT).value == "node-b", what="cache row")
        admin_page.goto(
            f"{self.live_server_url}/admin/agent/slot/{Slot.objects.get(key=SLOT).pk}/release/"
        )
        expect(admin_page.locator("#release-cancel")).to_be_focused()
        admin_page.fill("#id_reason", "e2e: device reset")
        admin_page.screenshot(path=str(ARTIFACTS / "e2e-release-confirm.png"), full_page=True)
        admin_page.locator(".release-submit").click()
        expect(admin_page.locator(".messagelist")).to_contain_text(f"Released 1 slot: {SLOT}")
        assert self.usage()[SLOT] == ""
        expect(cell).to_have_attribute("data-state", "free", timeout=10_000)
        page.screenshot(path=str(ARTIFACTS / "e2e-release-live.png"), full_page=True)
        assert Instance.objects.filter(name=INSTANCE).exists()
        operator.close()
        viewer.close()
