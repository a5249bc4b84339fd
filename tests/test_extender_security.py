"""The extender refuses what kube-scheduler would never send (issue 29): a caller without the
scheduler's client certificate, bodies too large or too deep, names no object can have, and
binds of a pod that is not waiting, not the one meant, asks for other devices than the filter
was shown, or to a node that does not exist or that the pod's own rules keep it off. Each time
the answer is a clear error and nothing changes: no annotation, no Binding, no slot booked, no
verdict row.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import ssl
import urllib.error
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from kubernetes import client

from agent.extender.server import MAX_BODY
from agent.extender.service import ExtenderService
from agent.extender.tls import Reloader
from agent.scheduling.models import PodVerdict
from agent.sharing.akri_slots import ASSIGNMENT
from agent.simulator.scheduler import STAND_IN, SchedulerTls, register_nodes, unregister_nodes
from tests.extender_http import (
    Certs,
    filter_args,
    make_certs,
    post,
    put_configuration,
    put_instance,
)
from tests.sharing_world import pod

pytestmark = [pytest.mark.django_db(transaction=True)]

SCHEDULER = "system:kube-scheduler"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("extender") / "certs")


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory):
    """A second CA and its certificates: not the one the extender trusts."""
    return make_certs(tmp_path_factory.mktemp("other") / "certs")


class World:
    """One node pair with cameras, and the extender serving over TLS as deploy/ runs it."""

    def __init__(self, kube, certs, client_name: str = SCHEDULER) -> None:
        self.kube = kube
        self.core = client.CoreV1Api(kube.api_client)
        tag = kube.namespace[2:]
        # Names of this test's own: slot keys carry no namespace, and a real API server keeps
        # other runs' pods and nodes.
        self.n1, self.n2, self.gone = f"{tag}-n1", f"{tag}-n2", f"{tag}-gone"
        self.cam = f"cam-{tag}0"
        put_configuration(kube.namespace, "cam", capacity=1, unique=True)
        put_instance(kube.namespace, self.cam, [self.n1, self.n2])
        self.registered = register_nodes(self.core, [self.n1])
        self.registered += register_nodes(self.core, [self.n2], labels={"disk": "hdd"})
        self.service = ExtenderService(
            kube.new_client(),
            namespace=kube.namespace,
            feed_interval=0.05,
            kube_interval=3600,
            tls=certs.server(client_name),
        ).start()
        self.context = certs.scheduler().context()

    def stop(self) -> None:
        self.service.stop()
        unregister_nodes(self.core, self.registered)

    def post(self, verb: str, body=None, raw: bytes | None = None):
        return post(f"{self.service.url}/{verb}", body, raw=raw, context=self.context)

    def create(self, name: str, requests: dict, **spec) -> dict:
        body = pod(requests, name=name)
        del body["metadata"]["uid"], body["status"]
        body["metadata"]["namespace"] = self.kube.namespace
        body["spec"]["schedulerName"] = STAND_IN  # no real kube-scheduler binds it meanwhile
        body["spec"].update(spec)
        self.core.create_namespaced_pod(self.kube.namespace, body)
        return self.read(name)

    def read(self, name: str) -> dict:
        answer = self.core.read_namespaced_pod(name, self.kube.namespace, _preload_content=False)
        return json.loads(answer.data)

    def bind(self, asking: dict, node: str, **changes) -> dict:
        meta = asking["metadata"]
        body = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
            **changes,
        }
        status, result = self.post("bind", body)
        assert status == 200
        return result

    def untouched(self, name: str) -> bool:
        """The pod is as the extender found it: unbound, no assignment."""
        stored = self.read(name)
        return not stored["spec"].get("nodeName") and ASSIGNMENT not in (
            stored["metadata"].get("annotations") or {}
        )

    def camera_free(self) -> bool:
        """The books still give the one camera slot to the next pod (nothing was booked)."""
        probe = pod({"akri.sh/cam": 1})
        return self.service.state.filter(probe, [self.n1]).fits == [self.n1]


@pytest.fixture
def world(kube, certs):
    found = World(kube, certs)
    yield found
    found.stop()


# --- who may call -----------------------------------------------------------------------------


def host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//")[1].split("/")[0].split(":")
    return host, int(port)


@pytest.mark.kube
def test_the_scheduler_with_its_client_certificate_is_served(world):
    asking = world.create("cams-1", {"akri.sh/cam": 1})

    status, result = world.post("filter", filter_args(asking, [world.n1]))

    assert world.service.url.startswith("https://")
    assert (status, result["NodeNames"], result["Error"]) == (200, [world.n1], "")


@pytest.mark.kube
def test_a_caller_without_a_client_certificate_never_gets_a_request_in(world, certs):
    """The forged bind of issue 29, from a client that trusts the server but has no
    certificate of its own: the handshake fails, the pod stays as it was."""
    victim = world.create("victim", {})
    context = SchedulerTls(ca_file=str(certs.dir / "ca.crt")).context()
    bind = {"PodName": "victim", "PodNamespace": world.kube.namespace, "Node": world.n1}

    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        post(f"{world.service.url}/bind", {**bind, "PodUID": victim["metadata"]["uid"]},
             context=context)  # fmt: skip

    assert world.untouched("victim")


@pytest.mark.kube
def test_a_client_certificate_of_another_ca_is_refused(world, other_certs):
    victim = world.create("victim", {})
    context = other_certs.scheduler().context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # even not checking the server: the server checks it

    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        post(f"{world.service.url}/filter", filter_args(victim, [world.n1]), context=context)

    assert not PodVerdict.objects.exists()


@pytest.mark.kube
def test_plain_http_to_the_protocol_port_gets_nothing(world):
    host, port = host_port(world.service.url)
    with socket.create_connection((host, port), timeout=5) as raw:
        raw.sendall(b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        answer = raw.recv(4096)

    assert b"HTTP/1.1 200" not in answer


@pytest.mark.kube
def test_a_certificate_of_the_ca_with_another_name_gets_403(kube, certs):
    """The client CA may sign more than the scheduler's certificate (a cluster CA): only the
    names given to --client-name may call."""
    world = World(kube, certs, client_name="some-other-scheduler")
    try:
        asking = world.create("cams-1", {"akri.sh/cam": 1})

        status, result = world.post("filter", filter_args(asking, [world.n1]))

        assert status == 403
        assert "'system:kube-scheduler' may not call the extender" in result
        assert not PodVerdict.objects.exists()
    finally:
        world.stop()


@pytest.mark.kube
def test_renewed_certificates_are_served_without_a_restart(world, certs, tmp_path):
    """cert-manager renews the Secret in place; the extender reads the files again."""
    live = tmp_path / "live"
    shutil.copytree(certs.dir, live)
    tls = Certs(live).server(SCHEDULER)
    world.service.stop()
    world.service = ExtenderService(
        world.kube.new_client(), namespace=world.kube.namespace, kube_interval=3600, tls=tls
    ).start()
    reloader = Reloader(tls, world.service.ssl_context)
    renewed = make_certs(tmp_path / "renewed")
    asking = world.create("cams-1", {"akri.sh/cam": 1})
    new_context = renewed.scheduler().context()
    with pytest.raises((ssl.SSLError, urllib.error.URLError)):  # the new CA is not trusted yet
        post(f"{world.service.url}/filter", filter_args(asking, [world.n1]), context=new_context)

    for name in ("tls.crt", "tls.key", "ca.crt"):
        shutil.copy(renewed.dir / name, live / name)
    assert reloader.check() is True

    status, result = post(
        f"{world.service.url}/filter", filter_args(asking, [world.n1]), context=new_context
    )
    assert (status, result["Error"]) == (200, "")
    assert reloader.check() is False  # nothing changed since


def test_runextender_refuses_plain_http_beyond_the_loopback_address():
    with pytest.raises(CommandError, match="refusing to serve the extender in plain HTTP"):
        call_command("runextender", host="0.0.0.0", without_api=True)


def test_runextender_needs_all_three_tls_files_and_readable_ones(tmp_path):
    with pytest.raises(CommandError, match="all three"):
        call_command("runextender", tls_cert_file="x.crt", without_api=True)
    missing = str(tmp_path / "nothing.pem")
    with pytest.raises(CommandError, match="cannot read the extender's TLS files"):
        call_command(
            "runextender",
            tls_cert_file=missing,
            tls_key_file=missing,
            client_ca_file=missing,
            without_api=True,
        )


# --- what a body may be -----------------------------------------------------------------------


@pytest.mark.kube
def test_a_body_over_the_limit_is_refused_unread_and_the_connection_closed(world):
    """The 18 MB request of issue 29 grew the process past its memory limit."""
    status, result = world.post("filter", raw=b" " * (MAX_BODY + 1))

    assert status == 200
    assert result["Error"] == "the body is over 4 MiB"
    assert not result["NodeNames"]


@pytest.mark.kube
def test_a_body_of_unstated_length_stops_at_the_limit(world):
    host, port = host_port(world.service.url)
    connection = http.client.HTTPSConnection(host, port, context=world.context, timeout=30)
    chunk = b" " * (1024 * 1024)
    try:
        connection.request("POST", "/bind", body=iter([chunk] * 6), encode_chunked=True)
        answer = connection.getresponse()
        result = json.loads(answer.read())
    finally:
        connection.close()

    assert answer.status == 200
    assert result == {"Error": "the body is over 4 MiB"}


@pytest.mark.kube
def test_a_5000_node_filter_of_the_longest_names_fits_the_limit(world):
    asking = world.create("cams-1", {"akri.sh/cam": 1})
    names = [f"{i:05d}-" + "n" * 247 for i in range(5000)]
    assert len(json.dumps(filter_args(asking, names))) > 1_250_000

    status, result = world.post("filter", filter_args(asking, names))

    assert (status, result["Error"]) == (200, "")
    assert len(result["FailedAndUnresolvableNodes"]) == 5000


@pytest.mark.kube
@pytest.mark.parametrize("depth", [200_000, 65])
def test_json_nested_too_deep_gets_error_set_not_a_500(world, depth):
    raw = b"[" * depth + b"]" * depth

    for verb in ("filter", "bind"):
        status, result = world.post(verb, raw=raw)
        assert status == 200, result
        assert result["Error"] == "the body is not JSON nested at most 64 deep"
    assert world.post("prioritize", raw=raw) == (200, [])


@pytest.mark.kube
@pytest.mark.parametrize(
    "change, error",
    [
        ({"name": "p" * 254}, "Pod.metadata.name is 254 characters long; at most 253"),
        ({"name": "a/b"}, "Pod.metadata.name 'a/b' is not a valid name"),
        ({"namespace": "n" * 64}, "Pod.metadata.namespace is 64 characters long; at most 63"),
        ({"uid": "u" * 65}, "Pod.metadata.uid is 65 characters long; at most 64"),
    ],
)
def test_names_no_pod_can_have_are_refused_and_never_recorded(world, change, error):
    asking = world.create("cams-1", {"akri.sh/cam": 1})
    forged = json.loads(json.dumps(asking))
    forged["metadata"].update(change)

    status, result = world.post("filter", filter_args(forged, [world.n1]))
    # The next, real pod's verdict is recorded: nothing is held up.
    world.post("filter", filter_args(asking, [world.n2, world.gone]))
    world.service.recorder.flush()

    assert status == 200 and error in result["Error"]
    assert list(PodVerdict.objects.values_list("name", flat=True)) == ["cams-1"]


@pytest.mark.kube
def test_node_names_longer_than_a_name_or_too_many_are_refused(world):
    asking = world.create("cams-1", {"akri.sh/cam": 1})

    long_name = world.post("filter", filter_args(asking, ["n" * 254]))[1]
    too_many = world.post("filter", filter_args(asking, [f"n{i}" for i in range(15_001)]))[1]
    bind = world.bind(asking, "n" * 254)

    assert "longer than 253 characters" in long_name["Error"]
    assert "at most 15000 are allowed" in too_many["Error"]
    assert "Node is 254 characters long" in bind["Error"]
    assert world.untouched("cams-1") and world.camera_free()


# --- binds the scheduler would not make -------------------------------------------------------


@pytest.mark.kube
def test_a_bind_to_a_node_that_does_not_exist_is_refused(world):
    asking = world.create("cams-1", {"akri.sh/cam": 1})

    result = world.bind(asking, world.gone)

    assert result["Error"] == f"node {world.gone} does not exist"
    assert world.untouched("cams-1") and world.camera_free()


@pytest.mark.kube
def test_a_bind_against_the_pods_node_selector_or_affinity_is_refused(world):
    ssd = world.create("on-ssd", {"akri.sh/cam": 1}, nodeSelector={"disk": "ssd"})
    term = {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}  # fmt: skip
    picky = world.create("picky", {"akri.sh/cam": 1}, affinity=affinity)

    by_selector = world.bind(ssd, world.n2)
    by_affinity = world.bind(picky, world.n2)

    assert by_selector["Error"] == (
        f"node {world.n2} does not match the pod's nodeSelector (disk=ssd)"
    )
    assert (
        by_affinity["Error"] == f"node {world.n2} does not match the pod's required node affinity"
    )
    assert world.untouched("on-ssd") and world.untouched("picky") and world.camera_free()


@pytest.mark.kube
def test_a_bind_to_a_node_with_a_taint_the_pod_does_not_tolerate_is_refused(world):
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    world.core.patch_node(world.n1, {"spec": {"taints": [taint]}})
    asking = world.create("cams-1", {"akri.sh/cam": 1})

    result = world.bind(asking, world.n1)

    assert "has the taint dedicated=gpu:NoSchedule" in result["Error"]
    assert world.untouched("cams-1") and world.camera_free()


@pytest.mark.kube
def test_a_forged_filter_then_bind_of_a_pod_that_asks_for_nothing_books_nothing(world):
    """Issue 29: /filter remembered the body it was sent and /bind used it, so a filter
    claiming a camera for a pod that asked for none wrote an assignment and booked the slot."""
    plain = world.create("plain", {})
    forged = json.loads(json.dumps(plain))
    forged["spec"]["containers"][0]["resources"] = {"limits": {"akri.sh/cam": "1"}}
    status, result = world.post("filter", filter_args(forged, [world.n1]))
    assert result["NodeNames"] == [world.n1]

    result = world.bind(plain, world.n1)

    assert result["Error"] == (
        f"pod {world.kube.namespace}/plain asks for no extended resource, but the filter was "
        "shown a pod asking for 1 akri.sh/cam"
    )
    assert world.untouched("plain") and world.camera_free()


@pytest.mark.kube
def test_a_bind_of_a_pod_that_is_not_pending_or_not_the_one_meant_is_refused(world):
    running = world.create("running", {"akri.sh/cam": 1})
    world.core.patch_namespaced_pod_status(
        "running", world.kube.namespace, {"status": {"phase": "Running"}}
    )
    other = world.create("other", {"akri.sh/cam": 1})

    not_pending = world.bind(running, world.n1)
    wrong_uid = world.bind(other, world.n1, PodUID="0b5c8d4e-0000-4000-8000-000000000000")

    ns = world.kube.namespace
    assert not_pending["Error"] == f"pod {ns}/running is Running, not Pending"
    assert wrong_uid["Error"].startswith(f"pod {ns}/other has uid ")
    assert world.untouched("running") and world.untouched("other") and world.camera_free()


@pytest.mark.kube
def test_a_bind_of_a_pod_being_deleted_is_refused(world):
    world.create("leaving", {"akri.sh/cam": 1}, terminationGracePeriodSeconds=30)
    body = world.read("leaving")
    world.core.patch_namespaced_pod(
        "leaving", world.kube.namespace, {"metadata": {"finalizers": ["akri-site.test/hold"]}}
    )
    world.core.delete_namespaced_pod("leaving", world.kube.namespace)
    try:
        result = world.bind(body, world.n1)

        assert result["Error"] == f"pod {world.kube.namespace}/leaving is being deleted"
        assert world.untouched("leaving") and world.camera_free()
    finally:
        world.core.patch_namespaced_pod(
            "leaving", world.kube.namespace, {"metadata": {"finalizers": None}}
        )


@pytest.mark.kube
def test_a_legitimate_bind_still_goes_through(world):
    asking = world.create("cams-1", {"akri.sh/cam": 1})
    world.post("filter", filter_args(asking, [world.n1, world.n2]))

    result = world.bind(asking, world.n1)

    stored = world.read("cams-1")
    assert result == {"Error": ""}
    assert stored["spec"]["nodeName"] == world.n1
    assert ASSIGNMENT in stored["metadata"]["annotations"]
    assert not world.camera_free()


def test_the_shipped_certificates_verify_against_their_ca(certs):
    import subprocess

    done = subprocess.run(
        ["openssl", "verify", "-CAfile", str(certs.dir / "ca.crt"),
         str(certs.dir / "tls.crt"), str(certs.dir / "scheduler.crt")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert Path(certs.dir / "ca.key").stat().st_mode & 0o077 == 0  # the CA key is private
