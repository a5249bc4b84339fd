"""The suite's own Kubernetes teardown (tests/kubeenv.py), run on the simulator: on a real API
server it empties and removes each test's namespace from the kinds the server's discovery
names (issue 30 §6). A run that installed CRDs left the client's discovery cache on disk
stale, and the next run's teardown listed kinds that were gone: 404, every test in error."""

from __future__ import annotations

import hashlib
import os
import tempfile

import pytest
from kubernetes import client

from tests.kubeenv import _crd_versions, _KubeSession

pytestmark = pytest.mark.kube

# Named by group and plural: other tests leave CRDs of their own with the plural "widgets" in
# the session's simulator (CRDs outlive its reset), as on a shared real server.
GROUP, PLURAL = "widgets.example.test", "widgets"


def widget_crd() -> dict:
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": "v1", "served": True, "storage": True,
                 "schema": {"openAPIV3Schema": schema}}
            ],
        },
    }  # fmt: skip


def make_widget(api_client: client.ApiClient, namespace: str, name: str) -> None:
    body = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": name}}
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, "v1", namespace, PLURAL, body
    )


def widgets(api_client: client.ApiClient, namespace: str) -> list[str]:
    found = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        GROUP, "v1", namespace, PLURAL
    )
    return [w["metadata"]["name"] for w in found["items"]]


def config_maps(api_client: client.ApiClient, namespace: str) -> list[str]:
    items = client.CoreV1Api(api_client).list_namespaced_config_map(namespace).items
    return [c.metadata.name for c in items]


def make_config_map(api_client: client.ApiClient, namespace: str, name: str) -> None:
    client.CoreV1Api(api_client).create_namespaced_config_map(
        namespace, {"metadata": {"name": name}}
    )


@pytest.fixture
def session(apiserver, kube):
    if kube.real:
        pytest.skip("the teardown is tested on the simulator (it serves discovery and CRDs)")
    made = _KubeSession(apiserver, kube.kubeconfig)
    yield made
    made.close()
    assert not os.path.exists(made._discovery_dir)


@pytest.fixture
def widget_kind(kube):
    ext = client.ApiextensionsV1Api(kube.api_client)
    ext.create_custom_resource_definition(widget_crd())
    try:
        yield
    finally:
        try:
            ext.delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def test_the_teardown_finds_a_kind_installed_after_its_first_discovery(kube, session):
    api = kube.api_client
    first = kube.create_namespace()
    make_config_map(api, first, "before")
    session.remove_namespace(api, first)  # discovers the kinds served now
    assert config_maps(api, first) == []
    ext = client.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition(widget_crd())
    try:
        second = kube.create_namespace()
        make_widget(api, second, "w")
        session.remove_namespace(api, second)
        assert widgets(api, second) == []
    finally:
        ext.delete_custom_resource_definition(f"{PLURAL}.{GROUP}")


def test_the_teardown_skips_a_kind_that_is_gone(kube, session, widget_kind):
    api = kube.api_client
    first = kube.create_namespace()
    make_widget(api, first, "w")
    session.remove_namespace(api, first)
    assert any((r.group, r.name) == (GROUP, PLURAL) for r in session._namespaced)
    client.ApiextensionsV1Api(api).delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
    # Discovered again: the widgets are no longer among the kinds to empty.
    second = kube.create_namespace()
    make_config_map(api, second, "after")
    session.remove_namespace(api, second)
    assert config_maps(api, second) == []
    assert not any((r.group, r.name) == (GROUP, PLURAL) for r in session._namespaced)
    # And a list of kinds that still names them (a CRD removed between the check and the
    # deletes) is no error: a 404 on a gone kind means nothing is left of it.
    session.namespaced_kinds(api)
    stale = [*session._namespaced, *_gone_widgets(kube, session)]
    session._namespaced = stale
    third = kube.create_namespace()
    make_config_map(api, third, "stale")
    session.remove_namespace(api, third)
    assert config_maps(api, third) == []


def _gone_widgets(kube, session) -> list:
    """The widget kind as discovery showed it while its CRD existed."""
    ext = client.ApiextensionsV1Api(kube.api_client)
    ext.create_custom_resource_definition(widget_crd())
    try:
        kinds = session.namespaced_kinds(kube.api_client)
        found = [r for r in kinds if (r.group, r.name) == (GROUP, PLURAL)]
    finally:
        ext.delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
    assert found
    session._crds = _crd_versions(kube.api_client)  # as if nothing changed since
    return found


def test_discovery_reads_no_cache_another_run_left_on_disk(kube, session):
    """The client's default cache file for this server (one per URL in the temp dir) is
    neither read nor written: a stale one naming a kind that is gone changes nothing."""
    host = kube.api_client.configuration.host
    name = f"osrcp-{hashlib.md5(host.encode(), usedforsecurity=False).hexdigest()}.json"
    default = os.path.join(tempfile.gettempdir(), name)
    with open(default, "w") as fh:
        fh.write('{"library_version": "stale", "resources": {}}')  # garbage: never read
    try:
        namespace = kube.create_namespace()
        make_config_map(api := kube.api_client, namespace, "c")
        session.remove_namespace(api, namespace)
        assert config_maps(api, namespace) == []
        with open(default) as fh:
            assert fh.read() == '{"library_version": "stale", "resources": {}}'
        assert os.listdir(session._discovery_dir) == ["discovery.json"]
    finally:
        os.remove(default)
