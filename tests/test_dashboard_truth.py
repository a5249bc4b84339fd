"""Issue 31 ("the dashboard tells the truth at 2 a.m."): view and unit tests of what the pages
say. The browser tests of the same issue are ``tests/test_browser_live_mark.py``,
``test_browser_overview_cards.py`` and ``test_browser_truth.py``."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from agent.models import AuditEntry, Configuration, Instance, Pod, ReconcileRun, Slot
from akri_site.dashboard.consumers import RunWatch
from akri_site.dashboard.sample import make_cluster

INSTANCE = "akri-onvif-000000"  # slot 0 held IL by node-a for pod apps/work-0 (Running)


def run(**fields) -> ReconcileRun:
    return ReconcileRun.objects.create(
        scope="node", node="node-a", trigger="sweep", started_at=timezone.now(), **fields
    )


@pytest.mark.django_db
def test_the_run_watch_sends_runs_written_since_and_runs_whose_counts_changed():
    old = run()
    watch = RunWatch()
    assert watch.poll() == []  # the sockets' snapshots had it
    # The newest runs are read again once: one written between a snapshot and the first poll
    # is not missed.
    assert [r["id"] for r in watch.poll()] == [old.pk]
    assert watch.poll() == []

    new = run()
    assert [r["id"] for r in watch.poll()] == [new.pk]
    assert watch.poll() == []

    ReconcileRun.objects.filter(pk=new.pk).update(released=2)  # the run finished
    (changed,) = watch.poll()
    assert changed["id"] == new.pk and changed["released"] == 2 and changed["result"] == "changed"
    assert watch.poll() == []


# --- item 3: a release of a running pod's slot; evicting the pod ----------------------------


def operator_client(client, role: str = "operator"):
    user = User.objects.create_user(f"t-{role}", is_staff=role != "viewer")
    user.groups.add(Group.objects.get(name=role))
    client.force_login(user)
    return client


def messages_of(response) -> list[tuple[str, str]]:
    return [(m.level_tag, m.message) for m in response.context["messages"]]


@pytest.mark.django_db
def test_the_confirmation_says_a_running_pods_slot_comes_back_and_offers_eviction(client):
    make_cluster(instances=2, capacity=4)
    slot = Slot.objects.get(key=f"{INSTANCE}-0")  # held by node-a, pod apps/work-0 Running
    page = operator_client(client).get(f"/slots/{slot.pk}/release/").content.decode()
    assert "Releasing will not free the device." in page
    assert "node-a's agent sees the pod using it" in page
    assert 'href="/pods/apps/work-0/evict/"' in page and "Evict pod apps/work-0…" in page


@pytest.fixture
def held_by_running_pod(kube, settings, monkeypatch):
    """An Instance on the API server whose slot 0 node-a holds for pod apps/work-0 (Running)."""
    from agent.bench.claims import instance_body
    from agent.kube import cache, claims
    from agent.kube.client import AkriApi

    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig}
    monkeypatch.setattr(claims, "_web_clients", {})  # clients built from the setting above
    api = AkriApi(kube.api_client, kube.namespace)
    name = "cams-8120fe"
    cache.apply_instance(api.create_instance(instance_body(name, 2, configuration="cams")))
    claims.ClaimStore(api, "agent:node-a").claim(name, f"{name}-0", "node-a", node="node-a")
    Slot.objects.filter(key=f"{name}-0").update(pod_namespace="apps", pod_name="work-0")
    Pod.objects.create(
        namespace="apps", name="work-0", uid="u-1", node_name="node-a", phase="Running"
    )
    return api, name


class Restorer:
    """node-a's agent, as far as this test needs it: the slot of its running pod, found free
    in deviceUsage, is claimed back (the reconciler's RESTORE)."""

    def __init__(self, api, name: str) -> None:
        from agent.kube.claims import ClaimStore

        self.api, self.name = api, name
        self.store = ClaimStore(api, "agent:node-a")
        self.stop = threading.Event()
        self.restored = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        from django.db import connection

        key = f"{self.name}-0"
        try:
            while not self.stop.wait(0.01):
                if self.api.get_instance(self.name)["spec"]["deviceUsage"][key] == "":
                    self.store.claim(self.name, key, "node-a", node="node-a")
                    self.restored.set()
                    return
        finally:
            connection.close()

    def __enter__(self) -> Restorer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.mark.kube
@pytest.mark.django_db(transaction=True)
def test_a_release_its_node_undoes_at_once_is_reported_as_restored_not_done(
    client, held_by_running_pod
):
    api, name = held_by_running_pod
    slot = Slot.objects.get(key=f"{name}-0")
    with Restorer(api, name) as restorer:
        response = operator_client(client).post(
            f"/slots/{slot.pk}/release/", {"expected": "node-a"}, follow=True
        )
        assert restorer.restored.wait(10)
    ((level, text),) = messages_of(response)
    assert level == "warning", text
    assert text.startswith("Released, but not free: taken again at once.")
    assert f"{name}-0 (restored by node-a " in text
    assert "pod apps/work-0 still runs there" in text
    assert text.endswith("To free the device, evict or delete the pod.")
    assert "Released 1 slot" not in text
    assert api.get_instance(name)["spec"]["deviceUsage"][f"{name}-0"] == "node-a"
    page = response.content.decode()
    assert "Warning:" in page and "restored by node-a" in page


@pytest.mark.kube
@pytest.mark.django_db(transaction=True)
def test_a_release_that_stays_free_is_reported_as_released(client, held_by_running_pod):
    api, name = held_by_running_pod
    Pod.objects.filter(name="work-0").update(phase="Succeeded")  # the pod ended
    slot = Slot.objects.get(key=f"{name}-0")
    response = operator_client(client).post(
        f"/slots/{slot.pk}/release/", {"expected": "node-a"}, follow=True
    )
    assert messages_of(response) == [("success", f"Released 1 slot: {name}-0.")]
    assert api.get_instance(name)["spec"]["deviceUsage"][f"{name}-0"] == ""


@pytest.mark.django_db
def test_a_viewers_forged_release_is_refused_and_audited(client):
    make_cluster(instances=2, capacity=4)
    slot = Slot.objects.get(key=f"{INSTANCE}-0")
    viewer = operator_client(client, "viewer")
    response = viewer.post(f"/slots/{slot.pk}/release/", {"expected": "node-a", "reason": "x"})
    assert response.status_code == 403
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.outcome, entry.username) == ("release_slot", "refused", "t-viewer")
    assert entry.target == f"default/{INSTANCE}/{INSTANCE}-0" and entry.holder == "node-a"
    assert "operator role" in entry.detail
    assert Slot.objects.get(pk=slot.pk).value == "node-a"


@pytest.mark.kube
@pytest.mark.django_db
def test_an_operator_evicts_a_running_pod_from_its_page_and_it_is_audited(client, kube, settings):
    from kubernetes import client as k8s

    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig}
    core = k8s.CoreV1Api(kube.api_client)
    body = {
        "metadata": {"name": "work-0", "namespace": kube.namespace},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    made = core.create_namespaced_pod(kube.namespace, body)
    Pod.objects.create(
        namespace=kube.namespace, name="work-0", uid=made.metadata.uid, phase="Running"
    )
    op = operator_client(client)
    url = f"/pods/{kube.namespace}/work-0/evict/"
    page = op.get(url).content.decode()
    assert "Evict pod" in page and 'id="release-cancel"' in page and made.metadata.uid in page

    response = op.post(url, {"uid": made.metadata.uid, "reason": "frees the camera"}, follow=True)

    ((level, text),) = messages_of(response)
    assert level == "success" and text.startswith(f"Evicted pod {kube.namespace}/work-0")

    def evicted() -> bool:
        pods = core.list_namespaced_pod(kube.namespace).items
        return all(p.metadata.deletion_timestamp for p in pods)  # gone, or going

    kube.wait_for(evicted, 10, message="the pod evicted")
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.outcome, entry.reason) == ("evict_pod", "done", "frees the camera")


@pytest.mark.django_db
def test_a_viewer_may_not_evict_and_the_forged_post_is_audited(client):
    Pod.objects.create(namespace="apps", name="work-0", uid="u-1", phase="Running")
    viewer = operator_client(client, "viewer")
    assert viewer.get("/pods/apps/work-0/evict/").status_code == 403
    assert viewer.post("/pods/apps/work-0/evict/", {"uid": "u-1"}).status_code == 403
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.outcome) == ("evict_pod", "refused")


# --- item 4: refusals grouped on the Queues page -------------------------------------------


def refusals(
    n: int, name: str, rule: str = "opted-out", queue: str = "team-a", ago: int = 0
) -> None:
    from agent.queues.models import Refusal

    now = timezone.now() - timedelta(minutes=ago)
    Refusal.objects.bulk_create(
        Refusal(
            at=now - timedelta(seconds=5 * i),
            operation="CREATE",
            resource="pods",
            namespace="ml",
            name=name,
            queue=queue,
            claim="Instance default/cam-1",
            owner="team-c",
            rule=rule,
            message=f"team-c opted out of sharing (attempt {i})",
        )
        for i in range(n)
    )


@pytest.mark.django_db
def test_refusals_are_grouped_by_rule_claim_and_queue_with_a_count_and_the_pods(client):
    refusals(25, "p1")
    refusals(5, "p2")
    refusals(2, "p3", rule="non-preemptible", queue="team-b", ago=10)
    page = operator_client(client, "viewer").get("/queues/").content.decode()
    rows = re.findall(r"<tr data-refusal-group>.*?</tr>", page, re.S)
    assert len(rows) == 2  # not one row per refusal
    first, second = rows
    assert '<td class="num" data-field="count">30</td>' in first
    assert 'href="/pods/ml/p1/">ml/p1</a> ×25' in first and "ml/p2</a> ×5" in first
    assert "(attempt 0)" in first  # the latest message
    assert '<td class="num" data-field="count">2</td>' in second and "non-preemptible" in second
    assert "32 refusals in 2 groups" in page


@pytest.mark.django_db
def test_a_refused_pods_page_says_what_was_refused(client):
    refusals(3, "p1")
    page = operator_client(client, "viewer").get("/pods/ml/p1/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Refused by the admission webhook" in text and '<td class="num">3</td>' in text


# --- item 5: a pod's events and why it is Pending ------------------------------------------


@pytest.mark.kube
@pytest.mark.django_db
def test_a_pending_pods_page_says_why_from_the_api_server_and_the_extender(client, kube, settings):
    from kubernetes import client as k8s

    from agent.scheduling.models import PodVerdict

    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig}
    ns = kube.namespace
    core = k8s.CoreV1Api(kube.api_client)
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "wants-3"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    message = "0/3 nodes are available: 3 3 unique akri-onvif devices requested, node sees 2."
    core.patch_namespaced_pod_status(
        "wants-3",
        ns,
        {
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                    }
                ],
            }
        },
    )
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "wants-3.1"},
            "involvedObject": {"kind": "Pod", "name": "wants-3", "namespace": ns},
            "reason": "FailedScheduling",
            "message": message,
            "type": "Warning",
            "count": 4,
            "source": {"component": "default-scheduler"},
            "lastTimestamp": timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )
    Pod.objects.create(namespace=ns, name="wants-3", uid="u-3", phase="Pending")
    PodVerdict.objects.create(
        namespace=ns, name="wants-3", at=timezone.now(), reasons={"node sees 2 Instances": 3}
    )

    text = operator_client(client, "viewer").get(f"/pods/{ns}/wants-3/").content.decode()

    why = text[text.index("Why it is Pending") : text.index('id="pod-events"')]
    assert "PodScheduled False</strong>: Unschedulable" in why and message in why
    assert "Scheduler extender:</strong> no node fits" in why and "node sees 2 Instances" in why
    assert "FailedScheduling</strong> (default-scheduler)" in why
    events = text[text.index("data-pod-events") :]
    assert "FailedScheduling" in events and '<td class="num">4</td>' in events


# --- item 5: a list page per kind ------------------------------------------------------------

LISTS = ("/configurations/", "/instances/", "/nodes/", "/pods/", "/brokers/")


@pytest.fixture
def listed():
    from agent.brokers.models import Broker

    make_cluster(instances=150, capacity=4, nodes=("node-a", "node-b", "node-c"))
    Configuration.objects.create(
        namespace="default", name="akri-udev", capacity=2, error="no discovery handler udev"
    )
    for i in range(3):
        inst = Instance.objects.create(
            namespace="default",
            name=f"akri-udev-{i:06x}",
            configuration_name="akri-udev",
            capacity=2,
            nodes=["node-c"],
        )
        for n in range(2):
            Slot.objects.create(instance=inst, key=f"{inst.name}-{n}", index=n)
    for i in range(3):
        Broker.objects.create(
            namespace="default",
            kind="Pod",
            name=f"node-a-akri-onvif-{i:06x}-pod",
            configuration="akri-onvif",
            instance=f"akri-onvif-{i:06x}",
            node="node-a",
            phase="Running" if i else "Pending",
        )


@pytest.mark.django_db
@pytest.mark.parametrize("path", LISTS)
def test_each_kind_has_a_list_page_linked_from_the_navigation(client, listed, path):
    page = operator_client(client, "viewer").get(path)
    assert page.status_code == 200, path
    text = page.content.decode()
    nav = text[text.index('<nav aria-label="Main">') : text.index("</nav>")]
    for other in LISTS:
        assert f'href="{other}"' in nav
    assert f'href="{path}" aria-current="page"' in nav
    assert "data-list=" in text


def rows_of(text: str) -> list[str]:
    body = text[text.index("<tbody>") : text.index("</tbody>")]
    return re.findall(r'<th scope="row"><a href="[^"]*">([^<]*)</a>', body)


@pytest.mark.django_db
def test_the_instance_list_pages_sorts_and_filters_in_the_url(client, listed):
    viewer = operator_client(client, "viewer")
    first = viewer.get("/instances/").content.decode()
    assert "153 Instances" in first and "1–100 shown" in first
    assert rows_of(first)[0] == "default/akri-onvif-000000" and len(rows_of(first)) == 100
    second = viewer.get("/instances/?page=2").content.decode()
    assert rows_of(second)[0] == "default/akri-onvif-000064"
    udev = viewer.get("/instances/?configuration=akri-udev&sort=-instance").content.decode()
    assert rows_of(udev) == [f"default/akri-udev-{i:06x}" for i in (2, 1, 0)]
    assert 'aria-sort="descending"' in udev
    node_c = viewer.get("/instances/?node=node-c&q=udev").content.decode()
    assert len(rows_of(node_c)) == 3
    bad = viewer.get("/instances/?configuration=nope")
    assert (
        bad.status_code == 400 and "No Configuration named “nope” is known." in bad.content.decode()
    )
    assert viewer.get("/instances/?sort=colour").status_code == 400
    assert viewer.get("/instances/?page=9").status_code == 400


@pytest.mark.django_db
def test_the_other_lists_filter_and_sort(client, listed):
    viewer = operator_client(client, "viewer")
    broken = viewer.get("/configurations/?status=error").content.decode()
    assert rows_of(broken) == ["default/akri-udev"] and "cannot be used" in broken
    by_instances = viewer.get("/configurations/?sort=-instances").content.decode()
    assert rows_of(by_instances) == ["default/akri-onvif", "default/akri-udev"]
    nodes = viewer.get("/nodes/?sort=-held").content.decode()
    assert rows_of(nodes)[0] in ("node-a", "node-b", "node-c") and len(rows_of(nodes)) == 3
    assert rows_of(viewer.get("/nodes/?q=-c").content.decode()) == ["node-c"]
    pods = viewer.get("/pods/?node=node-a&phase=Running").content.decode()
    assert len(rows_of(pods)) == 50  # every third of the 150 held slots' pods
    assert viewer.get("/pods/?node=nowhere").status_code == 400
    waiting = viewer.get("/brokers/?phase=not-running").content.decode()
    assert rows_of(waiting) == ["default/node-a-akri-onvif-000000-pod"]


# --- item 6: broker pods that do not run say why ---------------------------------------------


def pending_pod(kube, name: str, message: str) -> None:
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(kube.api_client)
    ns = kube.namespace
    core.create_namespaced_pod(
        ns, {"metadata": {"name": name}, "spec": {"containers": [{"name": "b", "image": "x"}]}}
    )
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
    }
    core.patch_namespaced_pod_status(
        name, ns, {"status": {"phase": "Pending", "conditions": [condition]}}
    )
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": f"{name}.1"},
            "involvedObject": {"kind": "Pod", "name": name, "namespace": ns},
            "reason": "FailedScheduling",
            "message": message,
            "type": "Warning",
            "source": {"component": "default-scheduler"},
            "lastTimestamp": timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )


@pytest.mark.kube
@pytest.mark.django_db
def test_a_pending_broker_says_why_on_its_instances_broker_list(client, kube, settings):
    from agent.brokers.models import Broker

    settings.AKRI = {**settings.AKRI, "KUBECONFIG": kube.kubeconfig}
    ns = kube.namespace
    inst = Instance.objects.create(
        namespace=ns, name="cam-1", configuration_name="cams", capacity=1, nodes=["node-a"]
    )
    message = "0/1 nodes are available: 1 Insufficient akri.sh/cam-1."
    pending_pod(kube, "node-a-cam-1-pod", message)
    for name, phase in (("node-a-cam-1-pod", "Pending"), ("node-b-cam-1-pod", "Running")):
        Broker.objects.create(
            namespace=ns, kind="Pod", name=name, configuration="cams", instance="cam-1",
            node=name[:6], phase=phase,
        )  # fmt: skip

    viewer = operator_client(client, "viewer")
    for url in (f"/instances/{ns}/cam-1/", f"/brokers/instances/{ns}/cam-1/"):
        text = viewer.get(url).content.decode()
        why = re.findall(r'<tr class="broker-why" data-broker-why="([^"]+)">(.*?)</tr>', text, re.S)
        assert [name for name, _ in why] == ["node-a-cam-1-pod"], url  # the Running one: no
        words = why[0][1]
        assert "PodScheduled False: Unschedulable" in words and message in words
        assert "event FailedScheduling (default-scheduler)" in words
    assert inst.pk


# --- item 7: the small ones ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_viewers_403_page_does_not_contradict_itself(client):
    make_cluster(instances=1, capacity=2)
    slot = Slot.objects.get(key=f"{INSTANCE}-0")
    page = operator_client(client, "viewer").get(f"/slots/{slot.pk}/release/")
    assert page.status_code == 403
    text = page.content.decode()
    assert "Releasing a slot needs the operator role." in text
    assert "with the role <em>viewer</em>" in text
    assert "needs one of the roles" not in text


@pytest.mark.django_db
def test_a_user_without_a_role_is_told_which_roles_exist(client):
    client.force_login(User.objects.create_user("nobody"))
    text = client.get("/slots/").content.decode()
    assert "without a dashboard role" in text and "needs one of the roles" in text


@pytest.mark.django_db
def test_the_404_page_of_an_address_that_never_existed_names_no_internal_class(client):
    page = operator_client(client, "viewer").get("/no-such-page/")
    assert page.status_code == 404
    text = page.content.decode()
    assert "Resolver404" not in text and "deleted since" not in text
    assert "There is no page at <code>/no-such-page/</code>." in text


@pytest.mark.django_db
def test_the_404_page_of_an_object_says_what_is_missing_and_why_it_may_be(client):
    text = operator_client(client, "viewer").get("/nodes/nowhere/").content.decode()
    assert "No node named nowhere is known." in text and "deleted since" in text


@pytest.mark.django_db
def test_the_leaders_card_says_election_is_off_when_it_is(client, settings):
    settings.LEADER_ELECTION = {**settings.LEADER_ELECTION, "ENABLED": False}
    text = operator_client(client, "viewer").get("/").content.decode()
    leaders = text[text.index('id="leaders-h"') :]
    assert "Leader election is off" in leaders and "unknown" not in leaders


# --- item 8: the console says what happens --------------------------------------------------


def test_static_files_are_streamed_without_the_synchronous_iterator_warning():
    import warnings

    from asgiref.sync import async_to_sync
    from asgiref.testing import ApplicationCommunicator

    from akri_site.asgi import application

    async def fetch() -> tuple[int, bytes]:
        scope = {
            "type": "http",
            "http_version": "1.1",
            "method": "GET",
            "path": "/static/dashboard/mark.js",
            "query_string": b"",
            "headers": [(b"host", b"testserver")],
        }
        asking = ApplicationCommunicator(application, scope)
        await asking.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await asking.receive_output(10)
        body = b""
        while True:  # a streamed response comes in several messages
            part = await asking.receive_output(10)
            body += part.get("body", b"")
            if not part.get("more_body"):
                break
        await asking.wait(10)
        return start["status"], body

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status, body = async_to_sync(fetch)()
    assert status == 200 and b"akriMark" in body
    said = [str(w.message) for w in caught]
    assert not [w for w in said if "synchronous iterators" in w], said


def test_scripts_demo_help_names_itself():
    from agent.management.commands.demo import Command

    parser = Command().create_parser("manage.py", "demo")
    assert parser.format_usage().startswith("usage: scripts/demo ")
    assert "in one process" not in parser.format_help()


def test_the_quiet_demo_console_counts_expected_allocate_races_and_skips_visitor_4xx(
    monkeypatch, settings
):
    import logging

    from agent import demo_support

    monkeypatch.delenv("LOG_LEVEL", raising=False)
    settings.LOGGING = {"version": 1, "root": {"level": "INFO"}}
    plugin, request = logging.getLogger("agent.node.plugin"), logging.getLogger("django.request")
    saved = (logging.getLogger().level, request.level, logging.getLogger("uvicorn.error").level)
    try:
        assert demo_support.quiet_console(verbose=False)
        demo_support.EXPECTED_RACES.take()
        seen: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
        plugin.addHandler(handler)
        try:
            refused = "%s: Allocate %s refused: %s"
            plugin.warning(
                refused, "akri.sh/cam", "[cam-0]", "Unable to claim slot: held by node-b"
            )
            plugin.warning(refused, "akri.sh/cam", "[cam-1]", "Instance cam is gone")
        finally:
            plugin.removeHandler(handler)
        assert seen == ["akri.sh/cam: Allocate [cam-1] refused: Instance cam is gone"]
        races = demo_support.EXPECTED_RACES.take()
        assert races == 1
        line = demo_support.activity_line("12:00:00", 3, 8, {}, races)
        assert line.endswith("1 Allocate refused because another node took the slot first"
                             " (the demo's pods race for the last slots; expected)")  # fmt: skip
        assert not request.isEnabledFor(logging.WARNING) and request.isEnabledFor(logging.ERROR)
        assert not logging.getLogger("uvicorn.error").isEnabledFor(logging.INFO)
    finally:
        plugin.removeFilter(demo_support.EXPECTED_RACES)
        logging.getLogger().setLevel(saved[0])
        request.setLevel(saved[1])
        logging.getLogger("uvicorn.error").setLevel(saved[2])
