"""Pytest plugin: one `kube` fixture for Kubernetes-facing tests, simulator or real API server.

Register with `pytest_plugins = ["tests.kubeenv"]` (in tests/conftest.py).

- Default: one `ApiServerSimulator` per session with the CRDs from `deploy/crds/`. Each test gets
  a fresh namespace name (`t-<random>`, with a Namespace object created for code that checks),
  and afterwards the simulator is reset (objects gone, CRDs kept) and its knobs restored.
- `AKRI_TEST_KUBECONFIG=<path>`: the same tests run against that server. The CRDs are applied
  once per session (create or replace, then wait until Established); each test's namespace is
  created before the test and afterwards emptied and removed the way the namespace controller
  does it (every namespaced object deleted, pods with grace 0, leftover finalizers cleared,
  then the namespace deleted and finalized), because a bare API server has no controller
  that would. Cluster-scoped objects a test creates (Nodes, ...) are the test's to clean up.
  The kinds to delete come from the server's discovery, asked again whenever the set of CRDs
  changed (a test may install some), and kept in a cache file of this session's own: the
  client's default file (one per server URL in the temp dir, read by every later run) goes
  stale when a run installs CRDs, and the next run then listed kinds that were gone (404).

Fixtures: `kube` (function scope, a `KubeEnv`) and `apiserver` (session scope, the raw simulator
for simulator-only tests; always a simulator, also when a real server is configured). A test
that uses `kube` gets the `kube` marker too, so that `-m kube` selects it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import string
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.resource import ResourceList

from agent.simulator.apiserver import ApiServerSimulator

ENV_KUBECONFIG = "AKRI_TEST_KUBECONFIG"
CRD_DIR = Path(__file__).resolve().parents[1] / "deploy" / "crds"
# A test that forgets timeout_seconds on a watch gets its stream ended after this long.
SIM_WATCH_CAP = 60.0
SIM_HISTORY_LIMIT = 10000


class KubeEnv:
    """What a Kubernetes-facing test needs: a client, its namespace and how to reach the server."""

    def __init__(self, session: _KubeSession, namespace: str) -> None:
        self._session = session
        self._clients: list[Any] = []
        self.namespace = namespace
        self.namespaces = [namespace]  # every namespace removed after the test
        self.kubeconfig = session.kubeconfig
        self.simulator: ApiServerSimulator | None = session.simulator
        self.real = session.simulator is None
        self.api_client = self.new_client()

    def new_client(self) -> client.ApiClient:
        """An independent ApiClient (own connection pool); closed after the test."""
        api_client = self._session.new_client()
        self._clients.append(api_client)
        return api_client

    def create_namespace(self) -> str:
        """Another fresh namespace for this test (created now, removed after the test)."""
        name = _random_namespace()
        _create_namespace(client.CoreV1Api(self.api_client), name)
        self.namespaces.append(name)
        return name

    def wait_for(
        self,
        predicate: Callable[[], Any],
        timeout: float = 5.0,
        interval: float = 0.01,
        message: str | None = None,
    ) -> Any:
        """Poll `predicate` until it returns something truthy (returned) or raise AssertionError.
        An AssertionError raised by the predicate counts as "not yet"."""
        deadline = time.monotonic() + timeout
        last_error: AssertionError | None = None
        while True:
            try:
                result = predicate()
                if result:
                    return result
            except AssertionError as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                what = message or getattr(predicate, "__name__", repr(predicate))
                detail = f" (last failure: {last_error})" if last_error else ""
                raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
            time.sleep(interval)

    def close(self) -> None:
        for api_client in self._clients:
            # Closing a pool must never fail a test.
            with contextlib.suppress(Exception):
                api_client.close()
        self._clients.clear()


class _KubeSession:
    """Session-wide server access: the simulator, or a real server from a kubeconfig."""

    def __init__(self, simulator: ApiServerSimulator | None, kubeconfig: str) -> None:
        self.simulator = simulator
        self.kubeconfig = kubeconfig
        self._configuration: client.Configuration | None = None
        self._namespaced: list[Any] | None = None
        self._crds: tuple | None = None  # the CRDs (name, served versions) _namespaced knew
        self._discovery_dir = tempfile.mkdtemp(prefix="akri-kubeenv-discovery-")
        if simulator is None:
            configuration = client.Configuration()
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            configuration.connection_pool_maxsize = 64
            self._configuration = configuration

    def new_client(self) -> client.ApiClient:
        if self.simulator is not None:
            return self.simulator.api_client()
        return client.ApiClient(self._configuration)

    def close(self) -> None:
        shutil.rmtree(self._discovery_dir, ignore_errors=True)

    def namespaced_kinds(self, api_client: client.ApiClient) -> list[Any]:
        """The namespaced kinds the server serves, discovered again when its CRDs changed."""
        crds = _crd_versions(api_client)
        if self._namespaced is None or crds != self._crds:
            cache_file = os.path.join(self._discovery_dir, "discovery.json")
            with contextlib.suppress(FileNotFoundError):
                os.remove(cache_file)  # no file: the client asks the server
            dynamic = DynamicClient(api_client, cache_file=cache_file)
            self._namespaced = [
                r
                for r in dynamic.resources.search(preferred=True)
                if not isinstance(r, ResourceList)
                and r.namespaced
                and "/" not in r.name
                and {"list", "delete"} <= set(r.verbs or ())
            ]
            self._crds = crds
        return self._namespaced

    def remove_namespace(self, api_client: client.ApiClient, namespace: str) -> None:
        """What the namespace controller does, for a real server that runs none: delete every
        object in the namespace, clear finalizers nobody will clear, then the namespace."""
        for resource in self.namespaced_kinds(api_client):
            _empty(resource, namespace)
        core = client.CoreV1Api(api_client)
        try:
            core.delete_namespace(namespace)
            core.replace_namespace_finalize(
                namespace, {"metadata": {"name": namespace}, "spec": {"finalizers": []}}
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def _crd_versions(api_client: client.ApiClient) -> tuple:
    crds = client.ApiextensionsV1Api(api_client).list_custom_resource_definition().items
    return tuple(
        sorted((c.metadata.name, tuple(v.name for v in c.spec.versions if v.served)) for c in crds)
    )


def _empty(resource: Any, namespace: str) -> None:
    """Delete every object of one type in `namespace` (pods at once, as their kubelet would).
    A kind that is gone meanwhile (404: its CRD removed) has nothing left to delete."""
    options = {"gracePeriodSeconds": 0, "propagationPolicy": "Background"}
    if "deletecollection" in (resource.verbs or ()):
        # A DELETE on the collection without a selector: the dynamic client's delete() insists
        # on one, and not every type takes a field selector on metadata.namespace (1.37's
        # podcertificaterequests refuse it). What it leaves, the loop below deletes.
        with contextlib.suppress(client.ApiException):
            resource.client.request("delete", resource.path(namespace=namespace), body=options)
    try:
        items = resource.get(namespace=namespace).items
    except client.ApiException as exc:
        if exc.status == 404:
            return
        raise
    for obj in items:
        meta = obj.metadata
        if meta.finalizers:
            patch = {"metadata": {"finalizers": None}}
            with contextlib.suppress(client.ApiException):
                resource.patch(
                    name=meta.name,
                    namespace=namespace,
                    body=patch,
                    content_type="application/merge-patch+json",
                )
        with contextlib.suppress(client.ApiException):
            resource.delete(name=meta.name, namespace=namespace, body=options)


def _create_namespace(core: client.CoreV1Api, name: str) -> None:
    core.create_namespace({"metadata": {"name": name, "labels": {"akri-site/test": "true"}}})


def _random_namespace() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "t-" + "".join(secrets.choice(alphabet) for _ in range(8))


def _crd_documents() -> list[dict]:
    docs = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        with path.open() as fh:
            docs.extend(
                d
                for d in yaml.safe_load_all(fh)
                if d and d.get("kind") == "CustomResourceDefinition"
            )
    return docs


def apply_crds(api_client: client.ApiClient, timeout: float = 60.0) -> None:
    """Create or replace every CRD in deploy/crds, then wait until each is Established."""
    ext = client.ApiextensionsV1Api(api_client)
    names = []
    for crd in _crd_documents():
        name = crd["metadata"]["name"]
        names.append(name)
        try:
            ext.create_custom_resource_definition(crd)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            current = ext.read_custom_resource_definition(name)
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(name, crd)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() >= deadline:
                raise AssertionError(f"CRD {name} not Established after {timeout}s")
            time.sleep(0.2)


def restore_simulator(sim: ApiServerSimulator) -> None:
    sim.clear_faults()
    sim.set_history_limit(SIM_HISTORY_LIMIT)
    sim.set_watch_cap(SIM_WATCH_CAP)
    sim.reset()
    sim.request_log.clear()
    sim.admission.calls.clear()  # the webhooks an earlier test's requests called


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the `kube` fixture is a `kube` test, marked or not, so that
    `-m kube` runs all of them against AKRI_TEST_KUBECONFIG's server."""
    for item in items:
        if "kube" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("kube"):
            item.add_marker(pytest.mark.kube)


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerSimulator]:
    """The session's API-server simulator (always a simulator, for simulator-only tests)."""
    sim = ApiServerSimulator(history_limit=SIM_HISTORY_LIMIT, watch_cap_seconds=SIM_WATCH_CAP)
    sim.start()
    sim.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture(scope="session")
def _kube_session(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_KubeSession]:
    path = os.environ.get(ENV_KUBECONFIG)
    if path:
        session = _KubeSession(None, path)
        api_client = session.new_client()
        try:
            apply_crds(api_client)
        finally:
            api_client.close()
    else:
        sim = request.getfixturevalue("apiserver")
        kubeconfig = sim.write_kubeconfig(tmp_path_factory.mktemp("kube-sim") / "kubeconfig")
        session = _KubeSession(sim, str(kubeconfig))
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def kube(_kube_session: _KubeSession) -> Iterator[KubeEnv]:
    """A client and a fresh namespace on the simulator or on AKRI_TEST_KUBECONFIG's server."""
    if _kube_session.simulator is not None:
        restore_simulator(_kube_session.simulator)
    env = KubeEnv(_kube_session, _random_namespace())
    _create_namespace(client.CoreV1Api(env.api_client), env.namespace)
    try:
        yield env
    finally:
        if env.real:
            for namespace in env.namespaces:
                _kube_session.remove_namespace(env.api_client, namespace)
        env.close()
        if _kube_session.simulator is not None:
            restore_simulator(_kube_session.simulator)
