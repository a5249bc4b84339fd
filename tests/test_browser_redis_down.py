"""Redis stopped under a running cluster and an open dashboard, then started again.

A private ``redis-server`` (never the machine's shared one) carries the channel layer between
the cluster's controller (this process) and Daphne (a spawned process). While it is down,
Allocate and reconciliation go on as before (they never need Redis), the cache keeps
following the API server, and the open page says Stale; once it is back, the page says Live
again and shows what changed meanwhile, without a reload.
"""

from __future__ import annotations

import time
import uuid

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import override_settings
from playwright.sync_api import expect

from agent.models import Slot
from agent.simulator.cluster import SimulatedCluster, debug_echo_configuration
from tests.browser import ARTIFACTS, BrowserLiveServerCase
from tests.servers import PrivateRedis, wait_until

CONFIG = "akri-debug-echo-foo"
INSTANCE = f"{CONFIG}-8120fe"
RESOURCE = f"akri.sh/{INSTANCE}"


@pytest.mark.browser
class RedisDownInBrowserTests(BrowserLiveServerCase):
    serialized_rollback = False

    @classmethod
    def setUpClass(cls):
        cls.redis = PrivateRedis().start()
        layer = {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [cls.redis.url], "prefix": f"akri-down-{uuid.uuid4().hex[:6]}"},
        }
        cls.layers = override_settings(CHANNEL_LAYERS={"default": layer})
        cls.layers.enable()
        cls.cluster = SimulatedCluster(
            nodes=1,
            namespace="default",
            configurations=[debug_echo_configuration(CONFIG, ["foo0"], capacity=2)],
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
        cls.layers.disable()
        cls.redis.remove()

    def setUp(self):
        self.addCleanup(self.cluster.stop)

    def usage(self) -> dict[str, str]:
        return self.cluster.akri.get_instance(INSTANCE)["spec"]["deviceUsage"]

    def test_the_dashboard_says_stale_while_redis_is_down_and_recovers_by_itself(self):
        wait_until(lambda: Slot.objects.filter(instance__name=INSTANCE).count() == 2, 30, "slots")
        kubelet = self.cluster.node("node-a").kubelet
        kubelet.wait_devices(RESOURCE, lambda d: len(d) == 2, timeout=30)
        user = User.objects.create_user("redis-viewer")
        user.groups.add(Group.objects.get(name="viewer"))
        context = self.new_context()
        self.sign_in(context, user)
        page = context.new_page()
        page.goto(f"{self.live_server_url}/slots/", timeout=30_000)
        mark = page.locator("#live-mark")
        expect(mark).to_have_text("Live")
        page.evaluate("window.__marker = 'same page'")

        self.redis.stop()

        # Allocate and reconciliation need no Redis: a pod gets a slot, and when it ends the
        # slot is free again; the cache follows the API server all along.
        assert self.cluster.run_pod("web-1", "node-a", {RESOURCE: 1})
        [held] = [k for k, v in self.usage().items() if v == "node-a"]
        wait_until(lambda: Slot.objects.get(key=held).value == "node-a", 30, "the claim cached")
        self.cluster.end_pod("web-1", "node-a")
        wait_until(lambda: self.usage()[held] == "", 30, "the slot freed by reconciliation")
        assert self.cluster.run_pod("web-2", "node-a", {RESOURCE: 2})
        wait_until(lambda: Slot.objects.get(key=held).value == "node-a", 30, "the claim cached")
        # The page cannot be told, and says so.
        expect(mark).to_contain_text("Stale since", timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "redis-down-stale.png"), full_page=True)

        started = time.monotonic()
        self.redis.start()

        expect(mark).to_have_text("Live", timeout=60_000)
        cell = page.locator(f'td[data-slot="{held}"]')
        expect(cell).to_have_attribute("data-state", "held", timeout=30_000)
        assert page.evaluate("window.__marker") == "same page"  # no reload
        page.screenshot(path=str(ARTIFACTS / "redis-back-live.png"), full_page=True)
        assert time.monotonic() - started < 120  # generous: the browser's backoff is <= 30 s
        context.close()
