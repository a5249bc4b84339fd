"""Issue 17, items 3 and 4, in Debian's Chromium: a stuck slot released from the slot map (the
API-server simulator behind the server process's claim store), releases disabled while the page
is Stale, sorting by a header, the header's search box, a pod's page and an Instance's YAML.

Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import re
import tempfile
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.utils import timezone
from playwright.sync_api import expect

from agent.models import AuditEntry, Slot, SlotPodBinding, SyncState
from agent.simulator.apiserver import ApiServerSimulator
from akri_site.dashboard.sample import make_cluster
from tests.browser import ARTIFACTS, BrowserLiveServerCase

NAME = "cams-8120fe"
STUCK = f"{NAME}-0"  # held by node-a, its pod never learned, past the grace period


class FindCase(BrowserLiveServerCase):
    def open_as(self, role: str) -> None:
        user = User.objects.create_user(f"f-{role}", is_staff=role != "viewer")
        user.groups.add(Group.objects.get(name=role))
        self.context = self.new_context(color_scheme="dark")
        self.page = self.context.new_page()
        self.sign_in(self.context, user)
        self.addCleanup(self.context.close)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.mark.browser
class ReleaseFromTheMapTests(FindCase):
    @classmethod
    def setUpClass(cls):
        # The server process's claim store must reach the simulator: through its kubeconfig.
        cls.sim = ApiServerSimulator().start()
        cls.sim.ensure_namespace("default")
        cls.tmp = tempfile.TemporaryDirectory(prefix="akri-find-")
        cls.kubeconfig = str(cls.sim.write_kubeconfig(f"{cls.tmp.name}/kubeconfig"))
        cls.saved_kubeconfig = settings.AKRI["KUBECONFIG"]
        settings.AKRI["KUBECONFIG"] = cls.kubeconfig
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        settings.AKRI["KUBECONFIG"] = cls.saved_kubeconfig
        cls.sim.stop()
        cls.tmp.cleanup()

    def setUp(self):
        from agent.bench.claims import instance_body
        from agent.kube import cache, claims
        from agent.kube.client import AkriApi, new_api_client

        self.sim.reset()
        self.sim.ensure_namespace("default")
        self.api = AkriApi(new_api_client(self.kubeconfig), "default")
        cache.apply_instance(self.api.create_instance(instance_body(NAME, 2, configuration="cams")))
        claims.ClaimStore(self.api, "agent:node-a").claim(NAME, STUCK, "node-a", node="node-a")
        # Claimed 30 s ago on a node whose slot-to-pod map is here, and no pod learned since.
        Slot.objects.filter(key=STUCK).update(since=timezone.now() - timedelta(seconds=30))
        SlotPodBinding.objects.create(
            node="node-a", slot="other-0", instance="other", namespace="default",
            allocated_at=timezone.now(),
        )  # fmt: skip
        self.sync(timezone.now())

    def sync(self, when) -> None:
        SyncState.objects.update_or_create(
            owner="controller", kind="Instance", defaults={"synced_at": when}
        )

    def usage(self) -> dict:
        return self.api.get_instance(NAME)["spec"]["deviceUsage"]

    def test_a_stuck_slot_is_released_from_the_map_and_the_operator_lands_back_on_it(self):
        self.open_as("operator")
        page = self.page
        page.goto(f"{self.live_server_url}/slots/?state=no-pod&sort=-held", timeout=30_000)
        expect(page.locator("#live-mark")).to_have_text("Live")
        cell = page.locator(f'td[data-slot="{STUCK}"]')
        expect(cell).to_contain_text("⚑ stuck: pod not known past the grace period")

        cell.get_by_role("link", name=f"Release {STUCK}…").click()

        expect(page.get_by_role("heading", name=f"Release slot {STUCK}?")).to_be_visible()
        expect(page.locator("#release-cancel")).to_be_focused()
        page.get_by_label("Reason (optional, kept in the audit log):").fill("pod never came")
        self.shot("find-release-confirm-dark")
        page.get_by_role("button", name=f"Release {STUCK}").click()

        expect(page).to_have_url(re.compile(r"/slots/\?state=no-pod&sort=-held$"))
        expect(page.locator(".messages")).to_contain_text(f"Done: Released 1 slot: {STUCK}.")
        self.shot("find-released-back-on-the-map")
        assert self.usage()[STUCK] == ""
        entry = AuditEntry.objects.get()
        assert (entry.outcome, entry.username, entry.reason) == (
            "done",
            "f-operator",
            "pod never came",
        )

    def test_cancel_goes_back_to_the_same_view_and_changes_nothing(self):
        self.open_as("operator")
        page = self.page
        page.goto(f"{self.live_server_url}/slots/?configuration=cams", timeout=30_000)
        page.get_by_role("link", name=f"Release {STUCK}…").click()
        expect(page.locator("#release-cancel")).to_be_focused()

        page.keyboard.press("Enter")  # the focused control: Cancel

        expect(page).to_have_url(re.compile(r"/slots/\?configuration=cams$"))
        assert self.usage()[STUCK] == "node-a"
        assert not AuditEntry.objects.exists()

    def test_while_the_page_is_stale_its_release_actions_are_disabled_and_it_says_why(self):
        self.sync(timezone.now() - timedelta(minutes=5))  # the cache stopped syncing
        self.open_as("operator")
        page = self.page
        page.goto(f"{self.live_server_url}/slots/", timeout=30_000)

        expect(page.locator("#live-mark")).to_contain_text("Stale")
        link = page.locator(f'td[data-slot="{STUCK}"] a[data-release]')
        expect(link).to_have_attribute("aria-disabled", "true")
        expect(link).not_to_have_attribute("href", re.compile("."))
        expect(page.locator("#release-stale")).to_be_visible()
        expect(page.locator("#release-stale")).to_contain_text(
            "Release is disabled while this page is stale"
        )
        self.shot("find-stale-release-disabled")
        link.click()  # nothing happens: no href
        expect(page).to_have_url(re.compile(r"/slots/$"))

    def test_a_viewer_is_offered_no_release_on_the_map(self):
        self.open_as("viewer")
        page = self.page
        page.goto(f"{self.live_server_url}/slots/", timeout=30_000)

        expect(page.locator(f'td[data-slot="{STUCK}"]')).to_contain_text(
            "An operator can release it"
        )
        expect(page.locator("a[data-release]")).to_have_count(0)
        expect(page.locator("#release-stale")).to_have_count(0)


@pytest.mark.browser
class SortSearchAndPodPagesTests(FindCase):
    def setUp(self):
        make_cluster(instances=10, capacity=4)
        self.open_as("viewer")

    def test_a_header_sorts_its_table_and_says_so(self):
        page = self.page
        page.goto(f"{self.live_server_url}/", timeout=30_000)
        nodes = page.locator("section[aria-labelledby=nodes-h] table")

        nodes.get_by_role("link", name="Held in all").click()

        expect(page).to_have_url(re.compile(r"node_sort=-held"))
        header = page.locator("section[aria-labelledby=nodes-h] th[aria-sort]")
        expect(header).to_have_attribute("aria-sort", "descending")
        expect(header).to_contain_text("Held in all ▼")
        nodes = page.locator("section[aria-labelledby=nodes-h] table")
        nodes.get_by_role("link", name=re.compile("^Held in all")).click()
        expect(page).to_have_url(re.compile(r"node_sort=held"))
        expect(page.locator("section[aria-labelledby=nodes-h] th[aria-sort]")).to_have_attribute(
            "aria-sort", "ascending"
        )
        page.goto(f"{self.live_server_url}/slots/?sort=-instance")
        first = page.locator("tr[data-instance]").first
        expect(first).to_have_attribute("data-instance", "default/akri-onvif-000009")
        self.shot("find-sorted-slot-map")

    def test_the_search_box_finds_a_pod_and_its_page_shows_its_slots(self):
        page = self.page
        page.goto(f"{self.live_server_url}/", timeout=30_000)

        box = page.get_by_role("searchbox", name="Find a Configuration, Instance, node or pod")
        box.fill("work-3")
        box.press("Enter")

        expect(page).to_have_url(re.compile(r"/search/\?q=work-3$"))
        pods = page.locator('section[data-kind="Pods"]')
        expect(pods).to_contain_text("apps/work-3")
        self.shot("find-search-results")
        pods.get_by_role("link", name="apps/work-3").click()

        expect(page.get_by_role("heading", name="Pod apps/work-3")).to_be_visible()
        expect(page.locator('tr[data-slot="akri-onvif-000003-0"]')).to_contain_text("held IL")
        self.shot("find-pod-page")

    def test_an_exact_name_opens_its_page_and_its_yaml_tab(self):
        page = self.page
        page.goto(f"{self.live_server_url}/search/?q=akri-onvif-000002", timeout=30_000)

        expect(
            page.get_by_role("heading", name="Instance default/akri-onvif-000002")
        ).to_be_visible()
        page.get_by_role("navigation", name="Views of this Instance").get_by_role(
            "link", name="YAML"
        ).click()

        expect(page).to_have_url(re.compile(r"/instances/default/akri-onvif-000002/yaml/$"))
        yaml_text = page.locator("pre.yaml")
        expect(yaml_text).to_contain_text("apiVersion: akri.sh/v0")
        expect(yaml_text).to_contain_text("kind: Instance")
        expect(yaml_text).to_contain_text("configurationName: akri-onvif")
        self.shot("find-instance-yaml")
