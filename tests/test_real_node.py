"""End to end on the real node (issue 26 section 4, issue 27 sections 1 and 6). Opt-in.

    AKRI_TEST_REAL_NODE=1 python -m pytest -q -s tests/test_real_node.py     # as root

``scripts/real-node`` (kubelet, kube-scheduler, kube-controller-manager, kube-proxy, CoreDNS and
containerd of the release ``scripts/real-apiserver`` builds) is reused when it runs, else started
here and stopped at the end (and so is the API server). Without AKRI_TEST_REAL_NODE every test
is skipped at once, with the reason printed.

Two paths. The fast one runs the agent as ``deploy/base/agent.yaml`` runs it (``manage.py
migrate`` then ``manage.py runagent``, the same environment, its own SQLite file) as a host
process with the admin kubeconfig, so that a test can restart the kubelet or kube-scheduler
under it. Two differences, both for this shared machine: METRICS_PORT is a free port rather
than 8080 (the agent's pod has a network namespace of its own), and debugEcho's availability
file is the suite's own rather than the shared /tmp's. For the extender tests, the node's
kube-scheduler is restarted with ``deploy/scheduler/kube-scheduler-config.yaml`` unchanged,
``manage.py runextender`` runs with TLS as ``deploy/base/extender.yaml`` runs it, and
``manage.py runcontroller`` fills the SQLite cache the extender reads.

The deployed one (the ``test_deployed_*`` tests, last: the host agent stops first) applies
``deploy/`` as README's "Running it for real" tells a user: the image built by
``deploy/build-image`` and imported into the node's containerd (``scripts/real-node
akri-image``), PostgreSQL and Redis of the user's own (Debian's, started here on the node's
address), the Secrets, ``kubectl apply -k`` of ``tests/real-node-deploy`` (the external overlay;
what differs is said there) and ``deploy/set-webhook-ca``. Every process then runs as a pod
with its ServiceAccount token, RBAC and admission policies, reaching the API server through
the kubernetes Service (kube-proxy). Figures (seconds) are printed as ``[real-node] figure ...``
lines and again at the end.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import time
import uuid
from pathlib import Path

import pytest

from tests import realnode as rn

ENABLED = os.environ.get("AKRI_TEST_REAL_NODE", "") not in ("", "0")
REASON = (
    "end-to-end on the real node: set AKRI_TEST_REAL_NODE=1 and run as root "
    "(scripts/real-node builds and starts kubelet, kube-scheduler and containerd)"
)
if not ENABLED:
    print(f"\ntests/test_real_node.py skipped: {REASON}")
elif os.geteuid() != 0:
    REASON = "AKRI_TEST_REAL_NODE=1 needs root (containerd, the kubelet's directories)"
    ENABLED = False

pytestmark = [pytest.mark.skipif(not ENABLED, reason=REASON), pytest.mark.timeout(900)]

EXTENDER_CONFIG = rn.ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
EXTENDER_TLS_DIR = Path("/etc/kubernetes/akri-site-extender")
# A Configuration-level resource the shipped scheduler configuration hands to the extender.
MANAGED_CONFIGURATION = "akri-debug-echo-foo"

FIGURES: list[tuple[str, float]] = []


def figure(name: str, seconds: float) -> None:
    FIGURES.append((name, seconds))
    rn.log(f"figure {name}: {seconds:.3f} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """The API as the tests use it: the official client with the admin kubeconfig."""

    def __init__(self, kubeconfig: str, node: str) -> None:
        from kubernetes import client, config

        self.kubeconfig = kubeconfig
        self.node = node
        self.api_client = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.kubectl = str(rn.kube_bin() / "kubectl")

    def kctl(self, *args: str, timeout: float = 120):
        return rn.run(
            [self.kubectl, f"--kubeconfig={self.kubeconfig}", *args], timeout=timeout
        ).stdout

    # Akri objects
    def create_configuration(self, body: dict) -> None:
        self.custom.create_namespaced_custom_object(
            rn.GROUP, rn.VERSION, rn.AKRI_NAMESPACE, "configurations", body
        )

    def delete_configuration(self, name: str, timeout: float = 60) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                rn.GROUP, rn.VERSION, rn.AKRI_NAMESPACE, "configurations", name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        rn.wait_for(
            f"the Instances of {name} to go",
            lambda: not self.instances(name) and not self._config_exists(name),
            timeout,
            0.2,
        )

    def _config_exists(self, name: str) -> bool:
        items = self.custom.list_namespaced_custom_object(
            rn.GROUP, rn.VERSION, rn.AKRI_NAMESPACE, "configurations"
        )["items"]
        return any(c["metadata"]["name"] == name for c in items)

    def instances(self, configuration: str) -> list[dict]:
        items = self.custom.list_namespaced_custom_object(
            rn.GROUP, rn.VERSION, rn.AKRI_NAMESPACE, "instances"
        )["items"]
        return sorted(
            (i for i in items if i.get("spec", {}).get("configurationName") == configuration),
            key=lambda i: i["metadata"]["name"],
        )

    def usage(self, configuration: str) -> dict[str, str]:
        usage: dict[str, str] = {}
        for inst in self.instances(configuration):
            usage.update(inst["spec"].get("deviceUsage") or {})
        return usage

    def allocatable(self, resource: str) -> int:
        node = self.core.read_node(self.node)
        value = (node.status.allocatable or {}).get(resource)
        return int(value) if value is not None else -1

    def ensure_namespace(self, name: str) -> bool:
        """The namespace, waiting out one still being deleted (a previous run's); True if
        created here."""
        from kubernetes.client.rest import ApiException

        deadline = time.monotonic() + 120
        while True:
            try:
                ns = self.core.read_namespace(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                self.core.create_namespace({"metadata": {"name": name}})
                return True
            if ns.metadata.deletion_timestamp is None:
                return False
            assert time.monotonic() < deadline, f"namespace {name} still being deleted"
            time.sleep(0.5)

    # pods
    def create_namespace(self) -> str:
        name = f"e2e-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace({"metadata": {"name": name}})
        return name

    def delete_namespace(self, name: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            self.core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def pods(self, namespace: str) -> list:
        return self.core.list_namespaced_pod(namespace).items

    def phase(self, namespace: str, name: str) -> str:
        return self.core.read_namespaced_pod(name, namespace).status.phase

    def wait_running(self, namespace: str, name: str, timeout: float = 90) -> float:
        def probe():
            pod = self.core.read_namespaced_pod(name, namespace)
            if pod.status.phase == "Failed":
                raise AssertionError(
                    f"pod {name} Failed: {pod.status.reason}: {pod.status.message}"
                )
            return pod.status.phase == "Running"

        return rn.wait_for(f"pod {name} Running", probe, timeout, 0.05)[1]

    def events(self, namespace: str, pod: str | None = None) -> list:
        items = self.core.list_namespaced_event(namespace).items
        return [e for e in items if pod is None or e.involved_object.name == pod]

    def admission_errors(self, namespace: str) -> list[str]:
        bad = [
            f"{p.metadata.name}: {p.status.message}"
            for p in self.pods(namespace)
            if p.status.reason == "UnexpectedAdmissionError"
        ]
        bad += [
            f"{e.involved_object.name}: {e.message}"
            for e in self.events(namespace)
            if e.reason == "UnexpectedAdmissionError"
        ]
        return bad

    def diagnose(self, namespace: str, configuration: str, resource: str) -> str:
        """What a failed wait leaves to read: phases, the last event of each pod, slots."""
        lines = [f"allocatable {resource}: {self.allocatable(resource)}"]
        lines.append(f"usage: {self.usage(configuration)}")
        events = {}
        for e in sorted(self.events(namespace), key=lambda e: str(e.last_timestamp)):
            events[e.involved_object.name] = f"{e.reason}: {(e.message or '')[:160]}"
        for p in self.pods(namespace):
            lines.append(
                f"{p.metadata.name} {p.status.phase} node={p.spec.node_name} "
                f"{events.get(p.metadata.name, '')}"
            )
        return "\n".join(lines)

    def logs(self, namespace: str, name: str) -> str:
        return self.core.read_namespaced_pod_log(name, namespace)


def held(usage: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in usage.items() if v}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The real node, the CRDs, and the agent as deploy/base/agent.yaml runs it."""
    node_control = rn.NodeControl()
    workdir = tmp_path_factory.mktemp("real-node")
    agent = None
    created_ns = False
    cluster = None
    try:
        env = node_control.ensure()
        kubeconfig = env["AKRI_TEST_KUBECONFIG"]
        node = env["AKRI_REAL_NODE"]
        cluster = Cluster(kubeconfig, node)
        from kubernetes import client

        version = client.VersionApi(cluster.api_client).get_code().git_version
        kubelet = cluster.core.read_node(node).status.node_info.kubelet_version
        rn.log(f"API server {version}, kubelet {kubelet}, node {node}")
        cluster.kctl("apply", "--server-side", "--force-conflicts", "-k", "deploy/crds")
        created_ns = cluster.ensure_namespace(rn.AKRI_NAMESPACE)
        leftovers = cluster.custom.list_namespaced_custom_object(
            rn.GROUP, rn.VERSION, rn.AKRI_NAMESPACE, "configurations"
        )["items"]
        assert not leftovers, (
            "Configurations left in akri-site from another run: "
            f"{[c['metadata']['name'] for c in leftovers]}"
        )
        aenv = rn.agent_env(
            kubeconfig, node, str(workdir / "agent.sqlite3"), metrics_port=free_port()
        )
        rn.run([rn.PYTHON, "manage.py", "migrate", "--noinput", "-v0"], env=aenv, timeout=300)
        t0 = time.monotonic()
        agent = rn.HostProcess(
            "agent",
            ["runagent", "--debug-echo-availability", str(workdir / "debug-echo-availability")],
            aenv,
            workdir,
        )
        rn.wait_for(
            "the agent to start",
            lambda: "running; SIGTERM stops it" in agent.tail(200) or not agent.alive(),
            60,
            0.05,
        )
        assert agent.alive(), f"the agent exited:\n{agent.tail()}"
        figure("agent started (process to 'running')", time.monotonic() - t0)
        cluster.agent = agent

        def stop_host_agent() -> None:
            # The deployed agent takes over the node: the host one's Configurations go first
            # (while it runs to see its Instances deleted), then it stops.
            for c in cluster.custom.list_namespaced_custom_object(
                rn.GROUP, rn.VERSION, rn.AKRI_NAMESPACE, "configurations"
            )["items"]:
                cluster.delete_configuration(c["metadata"]["name"])
            agent.stop()
            cluster.host_agent_stopped = True

        cluster.stop_host_agent = stop_host_agent
        cluster.host_agent_stopped = False
        cluster.node_control = node_control
        cluster.workdir = workdir
        yield cluster
    finally:
        if cluster is not None and agent is not None and agent.alive():
            for c in cluster.custom.list_namespaced_custom_object(
                rn.GROUP, rn.VERSION, rn.AKRI_NAMESPACE, "configurations"
            )["items"]:
                try:
                    cluster.delete_configuration(c["metadata"]["name"])
                except Exception as exc:  # noqa: BLE001 - cleanup goes on
                    rn.log(f"cleanup: {exc}")
        if agent is not None:
            if not agent.alive() and not getattr(cluster, "host_agent_stopped", False):
                rn.log(f"the agent had exited:\n{agent.tail()}")
            agent.stop()
        if created_ns and cluster is not None:
            cluster.core.delete_namespace(rn.AKRI_NAMESPACE)
        node_control.stop()
        if FIGURES:
            rn.log("figures (s): " + ", ".join(f"{n}={v:.3f}" for n, v in FIGURES))


@pytest.fixture
def ns(real):
    name = real.create_namespace()
    yield name
    real.delete_namespace(name)


def make_configuration(real: Cluster, name: str, descriptions: list[str], capacity: int):
    """Create a debugEcho Configuration; wait for its Instances and for the node to advertise
    them (the agent's plugins registered with the kubelet)."""
    resource = f"akri.sh/{name}"
    t0, wall0 = time.monotonic(), time.time()
    real.create_configuration(rn.configuration(name, descriptions, capacity=capacity))
    instances, _ = rn.wait_for(
        f"{len(descriptions)} Instances of {name}",
        lambda: (lambda i: i if len(i) == len(descriptions) else None)(real.instances(name)),
        60,
        0.05,
    )
    figure(f"{name}: Instances created", time.monotonic() - t0)
    names = [i["metadata"]["name"] for i in instances]
    resources = [resource] + [f"akri.sh/{n}" for n in names]
    rn.wait_for(
        f"node allocatable for {resources}",
        lambda: all(real.allocatable(r) > 0 for r in resources),
        90,
        0.1,
    )
    figure(f"{name}: plugins registered and advertised by the node", time.monotonic() - t0)
    registered = rn.kubelet_registrations(resources, since=wall0)
    if len(registered) == len(resources):
        figure(f"{name}: plugins registered with the kubelet (its log)", max(registered) - wall0)
    return names


def assert_device_env(logs: str, descriptions: list[str]) -> list[str]:
    lines = [ln for ln in logs.splitlines() if ln.startswith("DEBUG_ECHO_DESCRIPTION")]
    assert lines, f"no DEBUG_ECHO_DESCRIPTION in the container's env:\n{logs}"
    plain = [ln for ln in lines if ln.startswith("DEBUG_ECHO_DESCRIPTION=")]
    suffixed = [ln for ln in lines if ln.startswith("DEBUG_ECHO_DESCRIPTION_")]
    assert plain and suffixed, lines
    assert all(ln.split("=", 1)[1] in descriptions for ln in lines), lines
    return lines


def wait_slots_free(real: Cluster, configuration: str, t0: float, timeout: float = 60) -> float:
    rn.wait_for(
        f"every slot of {configuration} free",
        lambda: not held(real.usage(configuration)),
        timeout,
        0.005,
    )
    return time.monotonic() - t0


def delete_pod_measured(real: Cluster, ns: str, name: str, configuration: str, slot: str):
    """Delete a pod as a user does (its 1 s grace): seconds to gone from the API, and from
    gone to its slot free."""
    from kubernetes.client.rest import ApiException

    t0 = time.monotonic()
    real.core.delete_namespaced_pod(name, ns)

    def gone():
        try:
            real.core.read_namespaced_pod(name, ns)
        except ApiException as exc:
            return exc.status == 404
        return False

    rn.wait_for(f"pod {name} gone", gone, 90, 0.005)
    t_gone = time.monotonic()
    rn.wait_for(f"slot {slot} free", lambda: real.usage(configuration).get(slot) == "", 60, 0.005)
    return t_gone - t0, time.monotonic() - t_gone


def test_debug_echo_il_and_cl_pods_run_with_env_and_slots_follow(real, ns):
    """An IL pod (akri.sh/<instance>: 1) and a CL pod (akri.sh/<configuration>: 1) run on the
    real kubelet, placed by the real kube-scheduler, with the device env; the slots they hold
    survive a kubelet restart and come free once the pods are gone."""
    config = "akri-e2e-echo"
    descriptions = ["foo0", "foo1"]
    instances = make_configuration(real, config, descriptions, capacity=2)
    try:
        real.core.create_namespaced_pod(ns, rn.device_pod("il", f"akri.sh/{instances[0]}"))
        figure("IL pod Running (create to Running)", real.wait_running(ns, "il"))
        real.core.create_namespaced_pod(ns, rn.device_pod("cl", f"akri.sh/{config}"))
        figure("CL pod Running (create to Running)", real.wait_running(ns, "cl"))
        for pod in ("il", "cl"):
            assert real.core.read_namespaced_pod(pod, ns).spec.node_name == real.node
            logs, _ = rn.wait_for(
                f"{pod}'s env in its log",
                lambda pod=pod: (lambda t: t if "DEBUG_ECHO" in t else None)(real.logs(ns, pod)),
                30,
                0.2,
            )
            rn.log(f"{pod} env: {assert_device_env(logs, descriptions)}")
        # The IL pod's env names its Instance's description.
        il_logs = real.logs(ns, "il")
        inst0 = real.instances(config)[0]
        assert (
            f"DEBUG_ECHO_DESCRIPTION={inst0['spec']['brokerProperties']['DEBUG_ECHO_DESCRIPTION']}"
            in il_logs.splitlines()
        )

        usage = held(real.usage(config))
        il_slots = {k: v for k, v in usage.items() if v == real.node}
        cl_slots = {k: v for k, v in usage.items() if v.startswith("C:")}
        assert len(il_slots) == 1 and next(iter(il_slots)).startswith(instances[0]), usage
        assert len(cl_slots) == 1 and next(iter(cl_slots.values())).endswith(f":{real.node}")
        assert len(usage) == 2, usage

        # A kubelet restart frees nothing.
        before = real.usage(config)
        figure(
            "kubelet restart (scripts/real-node restart-kubelet)",
            real.node_control.restart_kubelet(),
        )
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20:
            assert real.usage(config) == before, "a slot changed across the kubelet restart"
            time.sleep(0.5)
        assert real.phase(ns, "il") == "Running" and real.phase(ns, "cl") == "Running"
        assert real.agent.alive()

        # Deleted pods' slots come free.
        (il_slot,) = il_slots
        (cl_slot,) = cl_slots
        gone, freed = delete_pod_measured(real, ns, "il", config, il_slot)
        figure("IL pod delete to gone from the API", gone)
        figure("IL slot release after the pod was gone", freed)
        gone, freed = delete_pod_measured(real, ns, "cl", config, cl_slot)
        figure("CL pod delete to gone from the API", gone)
        figure("CL slot release after the pod was gone", freed)
        assert not held(real.usage(config))
        assert not real.admission_errors(ns)
    finally:
        real.delete_namespace(ns)
        real.delete_configuration(config)


def test_cl_pods_one_after_another_until_full_then_pending(real, ns):
    """Issue 27 section 1: two Instances of capacity 2; CL pods asking 1 each, created one
    after another, each Running while slots are free; the fifth waits Pending with the
    scheduler's reason; no UnexpectedAdmissionError."""
    config = "akri-e2e-cl"
    resource = f"akri.sh/{config}"
    instances = make_configuration(real, config, ["bar0", "bar1"], capacity=2)
    try:
        rn.log(f"allocatable {resource}: {real.allocatable(resource)}")
        for i in range(1, 5):
            real.core.create_namespaced_pod(ns, rn.device_pod(f"cl-{i}", resource))
            figure(f"CL pod {i} of 4 Running", real.wait_running(ns, f"cl-{i}", timeout=60))
            assert len(held(real.usage(config))) == i

            # Issue 27 section 1: allocatable = held + claimable, so that allocatable minus
            # the node's CL requests (what kube-scheduler computes) is what the node can still
            # claim: in unique mode, the Instances with a free slot.
            def consistent(i=i):
                usage = real.usage(config)
                claimable = sum(
                    any(v == "" for k, v in usage.items() if k.startswith(f"{name}-"))
                    for name in instances
                )
                return real.allocatable(resource) - i == claimable

            _, waited = rn.wait_for(f"allocatable - {i} == claimable", consistent, 30, 0.2)
            rn.log(
                f"after pod {i}: allocatable {resource} = {real.allocatable(resource)}"
                f" (consistent after {waited:.1f} s)"
            )
        real.core.create_namespaced_pod(ns, rn.device_pod("cl-5", resource))

        def refused():
            evs = [e for e in real.events(ns, "cl-5") if e.reason == "FailedScheduling"]
            return evs[-1].message if evs else None

        message, _ = rn.wait_for("cl-5's FailedScheduling event", refused, 60, 0.2)
        rn.log(f"cl-5: {message}")
        assert "Insufficient" in message and resource in message, message
        time.sleep(5)
        assert real.phase(ns, "cl-5") == "Pending"
        usage = held(real.usage(config))
        assert len(usage) == 4 and all(v.startswith("C:") for v in usage.values()), usage
        assert not real.admission_errors(ns), real.admission_errors(ns)
        # One slot comes free: the Pending pod gets it.
        t0 = time.monotonic()
        real.core.delete_namespaced_pod("cl-1", ns)
        real.wait_running(ns, "cl-5", timeout=60)
        figure("pending CL pod Running after one Running pod deleted", time.monotonic() - t0)
        assert not real.admission_errors(ns), real.admission_errors(ns)
    finally:
        t0 = time.monotonic()
        real.delete_namespace(ns)
        wait_slots_free(real, config, t0, timeout=90)
        real.delete_configuration(config)


@pytest.fixture(scope="module")
def extender(real, tmp_path_factory):
    """kube-scheduler calling runextender through deploy/scheduler/kube-scheduler-config.yaml,
    unchanged: the extender with TLS (certificates by deploy/extender-certs) at the Service's
    name (a temporary /etc/hosts line), the controller filling the SQLite cache it reads."""
    workdir = tmp_path_factory.mktemp("extender")
    certs = workdir / "certs"
    rn.run(["deploy/extender-certs", str(certs)], timeout=120)
    tls_existed = EXTENDER_TLS_DIR.exists()
    etc_existed = EXTENDER_TLS_DIR.parent.exists()
    assert not tls_existed, f"{EXTENDER_TLS_DIR} exists already; refusing to overwrite it"
    EXTENDER_TLS_DIR.mkdir(parents=True)
    for name in ("ca.crt", "scheduler.crt", "scheduler.key"):
        shutil.copy(certs / name, EXTENDER_TLS_DIR / name)
    db = workdir / "site.sqlite3"
    env = rn.base_env(
        real.kubeconfig,
        DATABASE_URL=f"sqlite:///{db}",
        SECRET_KEY=secrets.token_urlsafe(50),
        AKRI_NAMESPACE=rn.AKRI_NAMESPACE,
        AKRI_LEADER_ELECTION="false",
        LOG_LEVEL="INFO",
        # The shipped policies and the GPU ones (README: enabled by AKRI_SHARING_POLICIES).
        AKRI_SHARING_POLICIES="akri-instance,akri-configuration,gpushare,gpu-number",
    )
    procs: list[rn.HostProcess] = []
    hosts = rn.hosts_line("127.0.0.1", rn.EXTENDER_HOST)
    hosts.__enter__()
    scheduler_restarted = False
    done = False

    def teardown() -> None:
        # Once: at the module's end, or earlier when the deployed extender takes over the
        # Service's name and the scheduler's certificate directory (real.stop_host_extender).
        nonlocal done
        if done:
            return
        done = True
        if scheduler_restarted:
            real.node_control.restart_scheduler(None)
            note = rn.ROOT / "var" / "real-node" / "run" / "scheduler-kubeconfig-copy"
            if note.exists():
                Path(note.read_text().strip()).unlink(missing_ok=True)
                note.unlink()
        for p in reversed(procs):
            if not p.alive():
                rn.log(f"{p.name} had exited:\n{p.tail()}")
            p.stop()
        hosts.__exit__(None, None, None)
        shutil.rmtree(EXTENDER_TLS_DIR, ignore_errors=True)
        if not etc_existed:
            with_contents = list(EXTENDER_TLS_DIR.parent.iterdir())
            if not with_contents:
                EXTENDER_TLS_DIR.parent.rmdir()
            else:
                rn.log(f"left {EXTENDER_TLS_DIR.parent}: {with_contents}")

    real.stop_host_extender = teardown
    try:
        rn.run([rn.PYTHON, "manage.py", "migrate", "--noinput", "-v0"], env=env, timeout=300)
        procs.append(rn.HostProcess("controller", ["runcontroller"], env, workdir))
        # deploy/base/extender.yaml's command; the certificate paths are where the Secret
        # would be mounted, here the directory extender-certs wrote.
        procs.append(
            rn.HostProcess(
                "extender",
                [
                    "runextender",
                    "--port",
                    "8888",
                    "--tls-cert-file",
                    str(certs / "tls.crt"),
                    "--tls-key-file",
                    str(certs / "tls.key"),
                    "--client-ca-file",
                    str(certs / "ca.crt"),
                    "--client-name",
                    "system:kube-scheduler",
                    "--health-port",
                    str(free_port()),
                ],
                env,
                workdir,
            )
        )

        def listening():
            for p in procs:
                assert p.alive(), f"{p.name} exited:\n{p.tail()}"
            with socket.socket() as s:
                return s.connect_ex((rn.EXTENDER_HOST, 8888)) == 0

        rn.wait_for("the extender on :8888", listening, 60, 0.2)
        scheduler_restarted = True  # restored below even if the restart fails half-way
        real.node_control.restart_scheduler(str(EXTENDER_CONFIG))
        rn.log("kube-scheduler restarted with deploy/scheduler/kube-scheduler-config.yaml")
        real.extender_procs = procs
        yield procs
    finally:
        teardown()


def cache_rows(real: Cluster, configuration: str) -> dict:
    """The controller's cache (the extender's books, a SQLite file here) for one
    Configuration: its rows (uid, resourceVersion, deleting, error) and its Instances'."""
    import sqlite3

    db = Path(real.extender_procs[0].log_path.parent) / "site.sqlite3"
    with sqlite3.connect(db) as conn:
        configs = conn.execute(
            "select uid, resource_version, deleting, error from agent_configuration"
            " where namespace = ? and name = ?",
            (rn.AKRI_NAMESPACE, configuration),
        ).fetchall()
        instances = conn.execute(
            "select name, resource_version, deleting from agent_instance"
            " where namespace = ? and configuration_name = ?",
            (rn.AKRI_NAMESPACE, configuration),
        ).fetchall()
    return {"configurations": configs, "instances": instances}


def wait_cache(real: Cluster, configuration: str, count: int) -> None:
    """The controller's cache holds the Configuration (live, as the API has it: same uid) and
    its Instances, as the extender reads them."""
    uid = real.custom.get_namespaced_custom_object(
        rn.GROUP, rn.VERSION, rn.AKRI_NAMESPACE, "configurations", configuration
    )["metadata"]["uid"]

    def probe():
        rows = cache_rows(real, configuration)
        live = [i for i in rows["instances"] if not i[2]]
        return [(uid, False, "")] == [
            (c[0], bool(c[2]), c[3]) for c in rows["configurations"]
        ] and (len(live) == count)

    try:
        rn.wait_for(f"the controller's cache to hold {configuration}", probe, 30, 0.2)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: API uid {uid}, cache {cache_rows(real, configuration)}"
        ) from None


def test_extender_unique_request_beyond_the_node_stays_pending_with_reason(real, extender, ns):
    """3 unique devices asked on a node that sees 2 Instances: Pending, and the
    FailedScheduling event says why in words (the extender's reason)."""
    config = MANAGED_CONFIGURATION
    make_configuration(real, config, ["foo0", "foo1"], capacity=5)
    try:
        wait_cache(real, config, 2)
        real.core.create_namespaced_pod(ns, rn.device_pod("three", f"akri.sh/{config}", 3))

        def refused():
            evs = [e for e in real.events(ns, "three") if e.reason == "FailedScheduling"]
            return evs[-1].message if evs else None

        message, waited = rn.wait_for("FailedScheduling of the 3-device pod", refused, 60, 0.2)
        figure("3-of-2 pod: FailedScheduling event", waited)
        rn.log(f"3-of-2 pod: {message}")
        assert "3 unique" in message and "2" in message, message
        assert "Insufficient" not in message, message
        time.sleep(3)
        assert real.phase(ns, "three") == "Pending"
        assert not held(real.usage(config))
    finally:
        real.delete_namespace(ns)
        real.delete_configuration(config)


def scheduler_config_counting(workdir: Path) -> Path:
    """deploy's scheduler configuration with ``ignoredByScheduler: false`` for its Akri
    resources (kube-scheduler counts them too, before the extender); nothing else changed."""
    text = EXTENDER_CONFIG.read_text()
    for name in ("akri.sh/akri-onvif", f"akri.sh/{MANAGED_CONFIGURATION}"):
        old = f"      - name: {name}\n        ignoredByScheduler: true\n"
        assert old in text, text
        text = text.replace(old, old.replace("true", "false"))
    path = workdir / "kube-scheduler-config-counting.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("ignored_by_scheduler", [True, False], ids=["ignored", "counted"])
def test_extender_burst_of_20_for_room_10(real, extender, ns, ignored_by_scheduler):
    """20 CL pods at once for 10 slots (2 Instances x capacity 5), bound by the extender:
    exactly 10 Running, no UnexpectedAdmissionError, no slot overbooked; 5 Running deleted,
    5 Pending Running within 30 s. Both managedResources settings: the shipped
    ``ignoredByScheduler: true``, and ``false`` (kube-scheduler's own count first)."""
    config = MANAGED_CONFIGURATION
    resource = f"akri.sh/{config}"
    tag = "ignoredByScheduler=" + str(ignored_by_scheduler).lower()
    if not ignored_by_scheduler:
        workdir = Path(real.extender_procs[0].log_path.parent)
        real.node_control.restart_scheduler(str(scheduler_config_counting(workdir)))
    make_configuration(real, config, ["foo0", "foo1"], capacity=5)
    try:
        wait_cache(real, config, 2)
        t0 = time.monotonic()
        for i in range(20):
            real.core.create_namespaced_pod(ns, rn.device_pod(f"burst-{i:02d}", resource))

        def running():
            return [p for p in real.pods(ns) if p.status.phase == "Running"]

        try:
            rn.wait_for("10 Running", lambda: len(running()) >= 10, 120, 0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{real.diagnose(ns, config, resource)}") from None
        figure(f"burst ({tag}): 10 of 20 Running", time.monotonic() - t0)
        time.sleep(10)  # settle: nothing more may run
        pods = real.pods(ns)
        phases = {p.metadata.name: p.status.phase for p in pods}
        run_pods = sorted(n for n, ph in phases.items() if ph == "Running")
        assert len(run_pods) == 10, phases
        assert sum(ph == "Pending" for ph in phases.values()) == 10, phases
        assert not real.admission_errors(ns), real.admission_errors(ns)
        usage = held(real.usage(config))
        assert len(usage) == 10, usage  # one slot per Running pod
        assert len(set(usage.values())) == 10, usage  # no virtual device on two slots
        assert all(v.startswith("C:") and v.endswith(f":{real.node}") for v in usage.values())
        bound_pending = [
            p.metadata.name for p in pods if p.status.phase == "Pending" and p.spec.node_name
        ]
        assert not bound_pending, f"bound but not admitted: {bound_pending}"
        assigned = [
            p.metadata.name
            for p in pods
            if (p.metadata.annotations or {}).get("akri.sh/assignment")
        ]
        rn.log(f"burst ({tag}): pods with akri.sh/assignment: {len(assigned)}")

        t0 = time.monotonic()
        for name in run_pods[:5]:
            real.core.delete_namespaced_pod(name, ns)
        deleted = set(run_pods[:5])

        def running_again():
            running = [
                p
                for p in real.pods(ns)
                if p.status.phase == "Running" and p.metadata.name not in deleted
            ]
            return len(running) == 10

        # Waits up to 90 s so that the figure is known; issue 27's target is 30 s.
        rn.wait_for("10 Running again (5 of them formerly Pending)", running_again, 90, 0.1)
        rescheduled = time.monotonic() - t0
        figure(f"burst ({tag}): 5 Pending Running after 5 Running deleted", rescheduled)
        late = rescheduled > 30
        if late and ignored_by_scheduler:
            raise AssertionError(f"5 Pending pods took {rescheduled:.1f} s (target 30 s)")
        time.sleep(5)
        live = [p for p in real.pods(ns) if p.metadata.deletion_timestamp is None]
        assert sum(p.status.phase == "Running" for p in live) == 10
        assert len(held(real.usage(config))) == 10
        assert not real.admission_errors(ns), real.admission_errors(ns)
        if late:
            # Product finding (reported): with ignoredByScheduler: false, kube-scheduler counts
            # allocatable, which in unique mode is held + Instances with a free slot (2 here,
            # however many slots are free), so after the kubelet's next status update it lets
            # about 2 pods through per status cycle (~10 s).
            pytest.xfail(f"counted: 5 Pending pods took {rescheduled:.1f} s (target 30 s)")
    finally:
        t0 = time.monotonic()
        real.delete_namespace(ns)
        wait_slots_free(real, config, t0, timeout=120)
        real.delete_configuration(config)
        if not ignored_by_scheduler:
            real.node_control.restart_scheduler(str(EXTENDER_CONFIG))


def gpu_scheduler_config(workdir: Path) -> Path:
    """deploy's scheduler configuration with its GPU managedResources uncommented, as its
    comment tells a user enabling gpushare and gpu-number; nothing else changed."""
    text = EXTENDER_CONFIG.read_text()
    for line in (
        "- name: volcano.sh/gpu-memory",
        "  ignoredByScheduler: true",
        "- name: volcano.sh/gpu-number",
    ):
        text = text.replace(f"      # {line}\n", f"      {line}\n")
    for name in ("volcano.sh/gpu-memory", "volcano.sh/gpu-number"):
        assert f"      - name: {name}\n        ignoredByScheduler: true\n" in text, text
    path = workdir / "kube-scheduler-config-gpu.yaml"
    path.write_text(text)
    return path


def test_gpushare_with_capacities_as_the_api_server_stores_them(real, extender, ns):
    """gpushare through the real kube-scheduler: two cards from the Node's capacity written
    as 2 and 2000 (stored as "2k"); pods asking 1000 (stored as "1k") each get a card of their
    own, a third waits Pending with the reason in words, one asking more than a card holds
    is unresolvable."""
    patch = [
        {"op": "add", "path": "/status/capacity/volcano.sh~1gpu-number", "value": "2"},
        {"op": "add", "path": "/status/capacity/volcano.sh~1gpu-memory", "value": "2000"},
    ]
    real.core.patch_node_status(real.node, patch)  # a list: sent as a JSON patch
    workdir = Path(real.extender_procs[0].log_path.parent)
    try:
        capacity = real.core.read_node(real.node).status.capacity
        assert capacity["volcano.sh/gpu-memory"] == "2k", capacity
        rn.wait_for(
            "the kubelet to make the GPU capacity allocatable",
            lambda: real.allocatable("volcano.sh/gpu-number") == 2,
            60,
            0.5,
        )
        real.node_control.restart_scheduler(str(gpu_scheduler_config(workdir)))
        time.sleep(3)  # the extender's node feed sees the new capacity

        def gpu_pod(name: str, memory: str) -> dict:
            return rn.device_pod(name, "volcano.sh/gpu-memory", memory)

        for name in ("gpu-a", "gpu-b"):
            real.core.create_namespaced_pod(ns, gpu_pod(name, "1000"))
            figure(f"gpushare pod {name} Running", real.wait_running(ns, name))
        pods = {p.metadata.name: p for p in real.pods(ns)}
        assert pods["gpu-a"].spec.containers[0].resources.limits["volcano.sh/gpu-memory"] == "1k"
        cards = {n: (pods[n].metadata.annotations or {}).get("volcano.sh/gpu-index") for n in pods}
        rn.log(f"gpushare cards: {cards}")
        assert sorted(cards.values()) == ["0", "1"], cards

        def refused(pod: str):
            evs = [e for e in real.events(ns, pod) if e.reason == "FailedScheduling"]
            return evs[-1].message if evs else None

        real.core.create_namespaced_pod(ns, gpu_pod("gpu-c", "600"))
        message, _ = rn.wait_for("gpu-c refused", lambda: refused("gpu-c"), 60, 0.2)
        rn.log(f"gpu-c: {message}")
        assert "no card" in message and "free" in message, message
        real.core.create_namespaced_pod(ns, gpu_pod("gpu-big", "1500"))
        message, _ = rn.wait_for("gpu-big refused", lambda: refused("gpu-big"), 60, 0.2)
        rn.log(f"gpu-big: {message}")
        assert "1500" in message and "1k" not in message, message
        assert real.phase(ns, "gpu-c") == "Pending" and real.phase(ns, "gpu-big") == "Pending"
        # A card comes free: the waiting pod gets it. The extender watches pods and asks
        # kube-scheduler again (akri.sh/retry) once its books show the card free.
        t0 = time.monotonic()
        real.core.delete_namespaced_pod("gpu-a", ns)
        try:
            real.wait_running(ns, "gpu-c", timeout=30)
        finally:
            for e in real.events(ns, "gpu-c"):
                rn.log(
                    f"gpu-c event {e.reason} x{e.count or 1} first {e.first_timestamp} "
                    f"last {e.last_timestamp} {e.event_time}: {(e.message or '')[:100]}"
                )
        figure("gpushare: waiting pod Running after a card came free", time.monotonic() - t0)
        card = (real.core.read_namespaced_pod("gpu-c", ns).metadata.annotations or {}).get(
            "volcano.sh/gpu-index"
        )
        assert card == cards["gpu-a"], (card, cards)
        assert not real.admission_errors(ns)
    finally:
        real.delete_namespace(ns)
        node = real.core.read_node(real.node)
        remove = [
            {"op": "remove", "path": f"/status/{part}/{key.replace('/', '~1')}"}
            for part, values in (
                ("capacity", node.status.capacity),
                ("allocatable", node.status.allocatable),
            )
            for key in values
            if key.startswith("volcano.sh/")
        ]
        if remove:
            real.core.patch_node_status(real.node, remove)
        real.node_control.restart_scheduler(str(EXTENDER_CONFIG))


# The deployed topology: deploy/ applied as README's "Running it for real" tells a user, the
# agent as its DaemonSet runs it (the image from deploy/build-image, its ServiceAccount token
# and RBAC, reaching the API server through the kubernetes Service and kube-proxy). These run
# last: the host agent above stops first (one agent per node).

AGENT_LABEL = "app.kubernetes.io/name=akri-site-agent"
# Cluster-scoped objects of deploy/ (the CRDs stay: the suite applied them first).
DEPLOYED_CLUSTER_KINDS = (
    "clusterrole,clusterrolebinding,validatingwebhookconfiguration,"
    "validatingadmissionpolicy,validatingadmissionpolicybinding"
)


def make_secrets(real: Cluster, workdir: Path, services: rn.ExternalServices) -> Path:
    """Step 2 of README's "Running it for real": the Secret akri-site, the webhook's TLS Secret
    (openssl, as the README writes it) and the extender's (deploy/extender-certs). Returns
    the webhook certificate (for deploy/set-webhook-ca)."""
    k = real.kctl
    k(
        "-n",
        rn.AKRI_NAMESPACE,
        "delete",
        "secret",
        "akri-site",
        "akri-site-webhook-tls",
        "akri-site-extender-tls",
        "--ignore-not-found",
    )
    k(
        "-n",
        rn.AKRI_NAMESPACE,
        "create",
        "secret",
        "generic",
        "akri-site",
        f"--from-literal=SECRET_KEY={secrets.token_urlsafe(50)}",
        f"--from-literal=DATABASE_URL={services.database_url}",
        f"--from-literal=REDIS_URL={services.redis_url}",
        f"--from-literal=METRICS_TOKEN={secrets.token_urlsafe(32)}",
    )
    crt, key = workdir / "tls.crt", workdir / "tls.key"
    rn.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "825",
            "-keyout",
            str(key),
            "-out",
            str(crt),
            "-subj",
            "/CN=akri-site-webhook.akri-site.svc",
            "-addext",
            "subjectAltName=DNS:akri-site-webhook.akri-site.svc",
        ]
    )
    k(
        "-n",
        rn.AKRI_NAMESPACE,
        "create",
        "secret",
        "tls",
        "akri-site-webhook-tls",
        f"--cert={crt}",
        f"--key={key}",
    )
    certs = workdir / "extender-certs"
    rn.run(["deploy/extender-certs", str(certs)])
    real.extender_certs = certs  # the scheduler's half, for the control plane
    k(
        "-n",
        rn.AKRI_NAMESPACE,
        "create",
        "secret",
        "generic",
        "akri-site-extender-tls",
        *(f"--from-file={certs / n}" for n in ("tls.crt", "tls.key", "ca.crt")),
    )
    return crt


@pytest.fixture(scope="module")
def deployed(real, tmp_path_factory):
    """deploy/ on the real node: PostgreSQL and Redis on the node's address (the external
    overlay's "yours"), the Secrets as README's step 2 makes them, tests/real-node-deploy
    (deploy/overlays/external, differences said there) applied with kubectl -k,
    deploy/set-webhook-ca run; the agent DaemonSet's pod running and every Deployment
    available."""
    workdir = tmp_path_factory.mktemp("deployed")
    real.stop_host_agent()
    applied = False
    services = None
    try:
        addresses = real.core.read_node(real.node).status.addresses
        address = next(a.address for a in addresses if a.type == "InternalIP")
        services = rn.ExternalServices(rn.ROOT / "var" / "real-node" / "run" / "external", address)
        image, took = real.node_control.akri_image()
        figure("image: deploy/build-image (if the code changed) and ctr import", took)
        rn.log(f"image in the node's containerd: {image}")
        t0 = time.monotonic()
        crt = make_secrets(real, workdir, services)
        applied = True
        real.kctl("apply", "-k", str(rn.DEPLOY_OVERLAY))
        env = dict(
            os.environ, KUBECONFIG=real.kubeconfig, PATH=f"{rn.kube_bin()}:{os.environ['PATH']}"
        )
        rn.run(["deploy/set-webhook-ca", str(crt)], env=env)

        def agent_running():
            pods = real.core.list_namespaced_pod(rn.AKRI_NAMESPACE, label_selector=AGENT_LABEL)
            for p in pods.items:
                if p.status.phase == "Running" and p.metadata.deletion_timestamp is None:
                    return p.metadata.name
            return None

        try:
            pod, _ = rn.wait_for("the agent DaemonSet's pod Running", agent_running, 180, 0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{deployed_diagnosis(real)}") from None
        figure("deployed agent: apply to pod Running", time.monotonic() - t0)
        rn.wait_for(
            "the deployed agent to start",
            lambda: "running; SIGTERM stops it" in real.logs(rn.AKRI_NAMESPACE, pod),
            90,
            0.2,
        )
        figure("deployed agent: apply to 'running' in its log", time.monotonic() - t0)
        real.agent_pod = pod
        for name in ("web", "controller", "worker", "beat", "extender"):
            try:
                real.kctl("-n", rn.AKRI_NAMESPACE, "rollout", "status", f"deployment/akri-site-{name}",
                          "--timeout=240s", timeout=260)  # fmt: skip
            except RuntimeError as exc:
                raise AssertionError(f"{exc}\n{deployed_diagnosis(real)}") from None
        figure("deployed: apply to every Deployment available", time.monotonic() - t0)
        yield real
    finally:
        if applied:
            for c in real.custom.list_namespaced_custom_object(
                rn.GROUP, rn.VERSION, rn.AKRI_NAMESPACE, "configurations"
            )["items"]:
                try:
                    real.delete_configuration(c["metadata"]["name"])
                except Exception as exc:  # noqa: BLE001 - cleanup goes on
                    rn.log(f"cleanup: {exc}")
            with_log = getattr(real, "agent_pod", None)
            if with_log:
                (workdir / "agent.log").write_text(real.logs(rn.AKRI_NAMESPACE, with_log))
                rn.log(f"deployed agent's log in {workdir / 'agent.log'}")
            real.kctl(
                "-n",
                rn.AKRI_NAMESPACE,
                "delete",
                "daemonset,deployment,service,"
                "configmap,secret,serviceaccount,role,rolebinding,networkpolicy,"
                "poddisruptionbudget",
                "-l",
                "app.kubernetes.io/part-of=akri-site",
                "--wait=false",
                timeout=180,
            )
            real.kctl(
                "delete",
                DEPLOYED_CLUSTER_KINDS,
                "-l",
                "app.kubernetes.io/part-of=akri-site",
                "--wait=false",
                timeout=180,
            )
            real.kctl(
                "delete", "namespace", "akri-site-discovery", "--ignore-not-found", "--wait=false"
            )
        if services is not None:
            services.stop()


def deployed_diagnosis(real: Cluster) -> str:
    lines = []
    for p in real.pods(rn.AKRI_NAMESPACE):
        states = [
            (c.name, c.state.waiting.reason if c.state.waiting else "")
            for c in (p.status.container_statuses or []) + (p.status.init_container_statuses or [])
        ]
        lines.append(f"{p.metadata.name} {p.status.phase} {states}")
    for e in real.events(rn.AKRI_NAMESPACE)[-15:]:
        lines.append(f"event {e.involved_object.name}: {e.reason}: {(e.message or '')[:200]}")
    for p in real.pods(rn.AKRI_NAMESPACE):
        if p.metadata.name.startswith(("akri-site-controller", "akri-site-worker")):
            try:
                tail = real.core.read_namespaced_pod_log(
                    p.metadata.name, rn.AKRI_NAMESPACE, tail_lines=25
                )
            except Exception as exc:  # noqa: BLE001 - a diagnosis goes on
                tail = str(exc)
            lines.append(f"--- {p.metadata.name} log:\n{tail}")
    return "\n".join(lines)


def test_deployed_agent_pod_serves_il_and_cl_pods(deployed, ns):
    """Issue 26 section 4, case 1: the agent as deploy/'s DaemonSet runs it (its own SQLite on
    an emptyDir, its ServiceAccount token, RBAC and admission policy; the API server reached
    through the kubernetes Service) serves a debugEcho Configuration: an IL and a CL pod
    Running with their device env, the holds annotation written on each (the agent policy
    admits the write: the token names the pod's node), slots free once the pods are gone."""
    real = deployed
    config = "akri-e2e-deployed"
    descriptions = ["dep0", "dep1"]
    instances = make_configuration(real, config, descriptions, capacity=2)
    try:
        for inst in real.instances(config):
            # Written by the agent's ServiceAccount, not the suite's admin.
            managers = {m["manager"] for m in inst["metadata"].get("managedFields") or []}
            rn.log(f"{inst['metadata']['name']} written by {sorted(managers)}")
        real.core.create_namespaced_pod(ns, rn.device_pod("il", f"akri.sh/{instances[0]}"))
        figure("deployed: IL pod Running", real.wait_running(ns, "il"))
        real.core.create_namespaced_pod(ns, rn.device_pod("cl", f"akri.sh/{config}"))
        figure("deployed: CL pod Running", real.wait_running(ns, "cl"))
        for pod in ("il", "cl"):
            logs, _ = rn.wait_for(
                f"{pod}'s env in its log",
                lambda pod=pod: (lambda t: t if "DEBUG_ECHO" in t else None)(real.logs(ns, pod)),
                30,
                0.2,
            )
            rn.log(f"deployed {pod} env: {assert_device_env(logs, descriptions)}")
            holds, _ = rn.wait_for(
                f"{pod}'s akri-site.io/holds annotation",
                lambda pod=pod: (
                    real.core.read_namespaced_pod(pod, ns).metadata.annotations or {}
                ).get("akri-site.io/holds"),
                30,
                0.2,
            )
            rn.log(f"deployed {pod} akri-site.io/holds: {holds}")
        usage = held(real.usage(config))
        il_slots = [k for k, v in usage.items() if v == real.node]
        cl_slots = [k for k, v in usage.items() if v.startswith("C:")]
        assert len(il_slots) == 1 and il_slots[0].startswith(instances[0]), usage
        assert len(cl_slots) == 1 and len(usage) == 2, usage
        gone, freed = delete_pod_measured(real, ns, "il", config, il_slots[0])
        figure("deployed: IL slot release after the pod was gone", freed)
        gone, freed = delete_pod_measured(real, ns, "cl", config, cl_slots[0])
        figure("deployed: CL slot release after the pod was gone", freed)
        assert not held(real.usage(config))
        assert not real.admission_errors(ns)
        restarts = [
            c.restart_count
            for c in real.core.read_namespaced_pod(
                real.agent_pod, rn.AKRI_NAMESPACE
            ).status.container_statuses
        ]
        assert restarts == [0], f"the agent's container restarted: {restarts}"
    finally:
        real.delete_namespace(ns)
        real.delete_configuration(config)


def test_deployed_broker_pod_per_instance_and_gone_with_it(deployed):
    """Issue 26 section 4, case 2: a Configuration with brokerSpec.brokerPodSpec (the node's
    busybox image): the deployed controller and worker create one broker pod per Instance,
    the real kube-scheduler and kubelet run it with its device's env through the deployed
    agent, and it goes once its Instance goes (the Configuration deleted)."""
    real = deployed
    config = "akri-e2e-broker"
    body = rn.configuration(config, ["brk0", "brk1"], capacity=2)
    body["spec"]["brokerSpec"] = {
        "brokerPodSpec": {
            "containers": [
                {
                    "name": "broker",
                    "image": rn.BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "env | sort; exec sleep 3600"],
                    # As Akri's charts write it: the controller puts the Instance's resource
                    # here, and the agent's Allocate gives the broker its device's env.
                    "resources": {
                        "limits": {"{{PLACEHOLDER}}": "1"},
                        "requests": {"{{PLACEHOLDER}}": "1"},
                    },
                }
            ],
            "terminationGracePeriodSeconds": 1,
        }
    }
    t0 = time.monotonic()
    real.create_configuration(body)
    try:
        instances, _ = rn.wait_for(
            "2 Instances of the broker Configuration",
            lambda: (lambda i: i if len(i) == 2 else None)(real.instances(config)),
            60,
            0.1,
        )
        names = [i["metadata"]["name"] for i in instances]

        def brokers():
            pods = real.core.list_namespaced_pod(
                rn.AKRI_NAMESPACE, label_selector=f"akri.sh/configuration={config}"
            ).items
            return [p for p in pods if p.metadata.deletion_timestamp is None]

        def running():
            pods = brokers()
            ok = len(pods) == 2 and all(p.status.phase == "Running" for p in pods)
            return pods if ok else None

        try:
            pods, _ = rn.wait_for("a Running broker pod per Instance", running, 120, 0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{deployed_diagnosis(real)}") from None
        figure("deployed: broker pods Running (Configuration created to both Running)",
               time.monotonic() - t0)  # fmt: skip
        by_instance = {p.metadata.labels.get("akri.sh/instance"): p for p in pods}
        assert sorted(by_instance) == sorted(names), sorted(by_instance)
        for inst in instances:
            pod = by_instance[inst["metadata"]["name"]]
            rn.log(f"broker {pod.metadata.name} on {pod.spec.node_name}")
            assert pod.spec.node_name == real.node
            description = inst["spec"]["brokerProperties"]["DEBUG_ECHO_DESCRIPTION"]
            logs, _ = rn.wait_for(
                f"{pod.metadata.name}'s env",
                lambda p=pod.metadata.name: (lambda t: t if "DEBUG_ECHO" in t else None)(
                    real.logs(rn.AKRI_NAMESPACE, p)
                ),
                30,
                0.2,
            )
            assert f"DEBUG_ECHO_DESCRIPTION={description}" in logs.splitlines(), logs
        usage = held(real.usage(config))
        rn.log(f"broker slots: {usage}")
        assert len(usage) == 2 and set(usage.values()) == {real.node}, usage
        # Brokers are reconciled to the Instances: one deleted by hand comes back.
        victim = pods[0].metadata.name
        real.core.delete_namespaced_pod(victim, rn.AKRI_NAMESPACE)
        t1 = time.monotonic()
        rn.wait_for("the deleted broker back and Running", running, 120, 0.2)
        figure("deployed: a deleted broker pod Running again", time.monotonic() - t1)

        t1 = time.monotonic()
        real.delete_configuration(config)
        rn.wait_for("the broker pods gone", lambda: not real.core.list_namespaced_pod(
            rn.AKRI_NAMESPACE, label_selector=f"akri.sh/configuration={config}").items,
            120, 0.2)  # fmt: skip
        figure("deployed: Configuration deleted to every broker pod gone", time.monotonic() - t1)
    finally:
        real.delete_configuration(config)


DRA_DRIVER = "gpu.e2e.akri-site.test"
DRA_CLASS = "e2e-gpu.akri-site.test"
QUEUE_LABEL = "akri-site.io/queue"


def dra_pod(name: str, queue: str, claim: str) -> dict:
    """A busybox pod of ``queue`` (KAI's pod label) using the ResourceClaim ``claim``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"kai.scheduler/queue": queue}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "main",
                    "image": rn.BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def test_deployed_dra_claim_shared_by_two_queues_owner_label_and_webhook(deployed, ns):
    """Issue 26 section 4, case 3: a resource.k8s.io/v1 ResourceClaim allocated by the real
    kube-scheduler (from a ResourceSlice the suite publishes as a DRA driver's controller
    would; no kubelet plugin, so the pods stay ContainerCreating) and reserved for a team-a
    pod: the deployed worker writes the owner label team-a; a team-b pod then shares it
    (reservedFor both); the real API server calls deploy/'s queue-labels webhook, which
    refuses a changed owner label."""
    from kubernetes.client.rest import ApiException

    real = deployed
    custom = real.custom
    group, version = "resource.k8s.io", "v1"
    slice_name = f"{real.node}-e2e-gpu"
    custom.create_cluster_custom_object(
        group,
        version,
        "deviceclasses",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "DeviceClass",
            "metadata": {"name": DRA_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]},
        },
    )
    custom.create_cluster_custom_object(
        group,
        version,
        "resourceslices",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name},
            "spec": {
                "driver": DRA_DRIVER,
                "nodeName": real.node,
                "pool": {"name": real.node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}],
            },
        },
    )
    claim = "shared-gpu"
    try:
        custom.create_namespaced_custom_object(
            group,
            version,
            ns,
            "resourceclaims",
            {
                "apiVersion": f"{group}/{version}",
                "kind": "ResourceClaim",
                "metadata": {"name": claim},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRA_CLASS}}]
                    }
                },
            },
        )

        def read_claim():
            return custom.get_namespaced_custom_object(group, version, ns, "resourceclaims", claim)

        def reserved():
            return {r["name"] for r in read_claim().get("status", {}).get("reservedFor") or []}

        t0 = time.monotonic()
        real.core.create_namespaced_pod(ns, dra_pod("team-a-pod", "team-a", claim))
        rn.wait_for("the claim allocated and reserved for team-a-pod", lambda: reserved() == {
            "team-a-pod"}, 60, 0.2)  # fmt: skip
        figure("DRA: claim allocated and reserved by kube-scheduler", time.monotonic() - t0)
        assert real.core.read_namespaced_pod("team-a-pod", ns).spec.node_name == real.node
        try:
            label, waited = rn.wait_for(
                "the owner label on the claim",
                lambda: (read_claim()["metadata"].get("labels") or {}).get(QUEUE_LABEL),
                90,
                0.2,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{deployed_diagnosis(real)}") from None
        figure("DRA: owner label written after the reservation", time.monotonic() - t0)
        assert label == "team-a", label
        managers = {m["manager"] for m in read_claim()["metadata"].get("managedFields") or []}
        rn.log(f"claim written by {sorted(managers)}")

        real.core.create_namespaced_pod(ns, dra_pod("team-b-pod", "team-b", claim))
        rn.wait_for("the claim shared by both pods", lambda: reserved() == {
            "team-a-pod", "team-b-pod"}, 60, 0.2)  # fmt: skip
        assert (read_claim()["metadata"]["labels"] or {})[QUEUE_LABEL] == "team-a"

        # The API server sends the label change to the webhook (objectSelector: the label
        # exists), which refuses it: the owner never changes.
        patch = {"metadata": {"labels": {QUEUE_LABEL: "team-b"}}}
        with pytest.raises(ApiException) as refused:
            custom.patch_namespaced_custom_object(
                group, version, ns, "resourceclaims", claim, patch
            )
        rn.log(f"label change refused: {refused.value.status} {refused.value.body[:300]}")
        assert refused.value.status in (400, 403), refused.value.body
        assert "queue-labels.akri-site.akri.sh" in refused.value.body, refused.value.body
        assert (read_claim()["metadata"]["labels"] or {})[QUEUE_LABEL] == "team-a"
    finally:
        real.delete_namespace(ns)
        for kind, name in (("resourceslices", slice_name), ("deviceclasses", DRA_CLASS)):
            try:
                custom.delete_cluster_custom_object(group, version, kind, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def test_deployed_scheduler_calls_the_extender_service(deployed, ns):
    """kube-scheduler with deploy/scheduler/kube-scheduler-config.yaml unchanged calls the
    deployed extender at its Service's name (resolved by the cluster DNS, as README's
    ClusterFirstWithHostNet set-up has it; routed by kube-proxy to the extender pod; TLS both
    ways with deploy/extender-certs' certificates, the scheduler's under
    /etc/kubernetes/akri-site-extender): 3 unique devices on a node seeing 2 stay Pending with
    the extender's reason in words; 2 run."""
    real = deployed
    stop_host_extender = getattr(real, "stop_host_extender", None)
    if stop_host_extender is not None:
        stop_host_extender()  # its /etc/hosts line and certificate directory go
    assert not EXTENDER_TLS_DIR.exists(), f"{EXTENDER_TLS_DIR} exists already"
    etc_existed = EXTENDER_TLS_DIR.parent.exists()
    EXTENDER_TLS_DIR.mkdir(parents=True)
    for name in ("ca.crt", "scheduler.crt", "scheduler.key"):
        shutil.copy(real.extender_certs / name, EXTENDER_TLS_DIR / name)
    config = MANAGED_CONFIGURATION
    try:
        real.node_control.restart_scheduler(str(EXTENDER_CONFIG))
        make_configuration(real, config, ["foo0", "foo1"], capacity=5)
        t0 = time.monotonic()
        real.core.create_namespaced_pod(ns, rn.device_pod("three", f"akri.sh/{config}", 3))

        def refused():
            evs = [e for e in real.events(ns, "three") if e.reason == "FailedScheduling"]
            return evs[-1].message if evs and "3 unique" in (evs[-1].message or "") else None

        try:
            message, _ = rn.wait_for("the extender's reason for the 3-device pod", refused, 90, 0.2)
        except AssertionError as exc:
            evs = [f"{e.reason}: {e.message}" for e in real.events(ns, "three")]
            raise AssertionError(f"{exc}: {evs}\n{deployed_diagnosis(real)}") from None
        figure("deployed extender: 3-of-2 pod refused with its reason", time.monotonic() - t0)
        rn.log(f"deployed extender, 3-of-2 pod: {message}")
        assert "Insufficient" not in message, message
        real.core.create_namespaced_pod(ns, rn.device_pod("two", f"akri.sh/{config}", 2))
        figure("deployed extender: 2-device pod Running", real.wait_running(ns, "two"))
        usage = held(real.usage(config))
        assert len(usage) == 2 and all(v.startswith("C:") for v in usage.values()), usage
        assert real.phase(ns, "three") == "Pending"
    finally:
        real.delete_namespace(ns)
        real.delete_configuration(config)
        real.node_control.restart_scheduler(None)
        note = rn.ROOT / "var" / "real-node" / "run" / "scheduler-kubeconfig-copy"
        if note.exists():
            Path(note.read_text().strip()).unlink(missing_ok=True)
            note.unlink()
        shutil.rmtree(EXTENDER_TLS_DIR, ignore_errors=True)
        if not etc_existed and not any(EXTENDER_TLS_DIR.parent.iterdir()):
            EXTENDER_TLS_DIR.parent.rmdir()
