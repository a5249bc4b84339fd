"""deploy/: every overlay renders, every object passes Kubernetes' own schemas, and the
manifests keep the promises README makes (mounts, privileges, probes, webhook, budgets).
With AKRI_TEST_KUBECONFIG, every object is also sent to that server with a dry run."""

from __future__ import annotations

import copy
import os
from collections import defaultdict

import kubernetes_validate
import pytest
from kubernetes import client, dynamic

from tests.deploykit import (
    DEPLOY,
    NAMESPACE,
    OVERLAYS,
    containers,
    find,
    kubelet_env,
    load,
    pod_spec,
    render,
    workloads,
)

# The oldest Kubernetes these manifests are written for (policy/v1 budgets, seccompProfile,
# the kubernetes.io/metadata.name label), and the newest schemas kubernetes-validate ships.
# The oldest Kubernetes the README supports (ValidatingAdmissionPolicy is GA from 1.30) and the
# newest the validator knows.
SCHEMA_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
DISCOVERY_NAMESPACE = "akri-site-discovery"  # deploy/discovery: discoveryProperties' Secrets
AGENT_RSS_MB = 84  # the agent-memory benchmark, 100 Instances, started without the flags
HOST_DIRS = {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/var/lib/akri"}


def everything():
    for overlay in OVERLAYS:
        for obj in render(overlay):
            yield overlay, obj
    for obj in load("extras/ingress.yaml"):
        yield "extras", obj


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_rendered_object_passes_the_kubernetes_schemas(version):
    checked = 0
    for where, obj in everything():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(
                f"{where}: {obj['kind']} {obj['metadata']['name']}: {exc.message} at {list(exc.path)}"
            ) from None
        checked += 1
    assert checked > 40


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_every_component_in_one_namespace(overlay):
    objects = render(overlay)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for kind, name in [
        ("CustomResourceDefinition", "configurations.akri.sh"),
        ("CustomResourceDefinition", "instances.akri.sh"),
        ("DaemonSet", "akri-site-agent"),
        ("Deployment", "akri-site-controller"),
        ("Deployment", "akri-site-web"),
        ("Deployment", "akri-site-worker"),
        ("Deployment", "akri-site-beat"),
        ("Deployment", "akri-site-extender"),
        ("Service", "akri-site-web"),
        ("Service", "akri-site-webhook"),
        ("Service", "akri-site-extender"),
        ("ValidatingWebhookConfiguration", "akri-site-pods"),
    ]:
        assert (kind, name) in names, f"{overlay}: no {kind} {name}"
    for obj in objects:
        if "namespace" in obj["metadata"]:
            # The one exception: the agent may read discoveryProperties' Secrets there only.
            assert obj["metadata"]["namespace"] in (NAMESPACE, DISCOVERY_NAMESPACE), obj["metadata"]
        for subject in obj.get("subjects") or []:
            assert subject["namespace"] == NAMESPACE, obj["metadata"]["name"]
    assert ("Deployment", "akri-site-redis") in names if "embedded" in overlay else True


def test_only_the_embedded_overlay_runs_redis_and_points_the_processes_at_it():
    embedded = find(render("overlays/embedded-redis"), "ConfigMap", "akri-site")
    external = find(render("overlays/external"), "ConfigMap", "akri-site")
    assert embedded["data"]["REDIS_URL"] == "redis://akri-site-redis:6379/0"
    assert "REDIS_URL" not in external["data"]  # from the Secret akri-site
    assert not [
        o for o in render("overlays/external") if o["metadata"]["name"] == "akri-site-redis"
    ]


def test_the_agent_mounts_what_akris_agent_mounts_with_no_privilege():
    agent = find(render("overlays/external"), "DaemonSet", "akri-site-agent")
    spec = pod_spec(agent)
    volumes = {v["name"]: v for v in spec["volumes"]}
    (main,) = spec["containers"]
    mounted = {m["mountPath"]: volumes[m["name"]] for m in main["volumeMounts"]}
    for path in HOST_DIRS:
        assert mounted[path]["hostPath"]["path"] == path
    env = {e["name"]: e for e in main["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["AKRI_AGENT_ONLY"]["value"] == "true"
    assert "DATABASE_URL" not in env and not main.get("envFrom")  # no shared database
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    for c in containers(agent):
        security = c["securityContext"]
        assert not security.get("privileged")
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["readOnlyRootFilesystem"] is True
    memory = main["resources"]["requests"]["memory"]
    assert memory.endswith("Mi") and int(memory[:-2]) >= AGENT_RSS_MB


def test_only_the_agent_runs_optimized_from_bytecode_compiled_so_with_two_malloc_arenas():
    # -OO -X no_debug_ranges: some 3 MB of every agent's memory, from the bytecode the image
    # compiles with the same flags. The other processes keep docstrings and asserts (the
    # controller's queue watch, for one, reads typed events, typed from docstrings).
    assert "python -OO -X no_debug_ranges -m compileall" in (DEPLOY / "Containerfile").read_text()
    names = ("PYTHONOPTIMIZE", "PYTHONNODEBUGRANGES", "MALLOC_ARENA_MAX")
    for overlay in OVERLAYS:
        objects = render(overlay)
        config = find(objects, "ConfigMap", "akri-site")["data"]
        flags = {}
        for workload in workloads(objects):
            for c in containers(workload):
                env = kubelet_env(c, config, defaultdict(str))
                flags[workload["metadata"]["name"], c["name"]] = {n: env.get(n) for n in names}
        agent = flags.pop(("akri-site-agent", "agent"))
        assert agent == {
            "PYTHONOPTIMIZE": "2",
            "PYTHONNODEBUGRANGES": "1",
            "MALLOC_ARENA_MAX": "2",  # rather than mallopt() through ctypes, loaded for it alone
        }, overlay
        assert ("akri-site-agent", "migrate") in flags and len(flags) > 5, overlay
        assert [c for c, env in flags.items() if any(env.values())] == [], overlay


def test_every_other_process_runs_as_non_root_with_a_read_only_root():
    for workload in workloads(render("overlays/embedded-redis")):
        if workload["kind"] == "DaemonSet":
            continue
        assert pod_spec(workload)["securityContext"]["runAsNonRoot"] is True, workload["metadata"]
        for c in containers(workload):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert "memory" in c["resources"]["limits"], c["name"]


def test_each_component_has_a_service_account_of_its_own():
    objects = render("overlays/external")
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    used = [pod_spec(w).get("serviceAccountName") for w in workloads(objects)]
    assert len(used) == len(set(used)), used
    assert set(used) <= accounts


def test_one_image_runs_every_process():
    images = {c["image"] for w in workloads(render("overlays/external")) for c in containers(w)}
    assert images == {"akri-site:0.1.0"}


def test_two_controller_replicas_and_budgets_for_every_replicated_deployment():
    objects = render("overlays/external")
    assert find(objects, "Deployment", "akri-site-controller")["spec"]["replicas"] == 2
    budgets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PodDisruptionBudget"}
    for workload in workloads(objects):
        if workload["kind"] != "Deployment" or workload["spec"]["replicas"] < 2:
            continue
        name = workload["metadata"]["name"]
        selector = budgets[name]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
        assert budgets[name]["spec"]["maxUnavailable"] == 1


def test_web_is_ready_only_when_healthz_answers():
    web = find(render("overlays/external"), "Deployment", "akri-site-web")
    main, hook = pod_spec(web)["containers"]
    assert main["command"][:3] == ["python", "manage.py", "runweb"]
    # The webhook's TLS endpoint has a container of its own: admission never queues behind pages.
    assert hook["command"][:3] == ["python", "manage.py", "runweb"]
    assert "--ssl-certfile" in hook["command"] and hook["ports"][0]["containerPort"] == 8443
    probe = main["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    # The kubelet would send the pod's IP as Host, which ALLOWED_HOSTS refuses with a 400.
    (host,) = [h["value"] for h in probe["httpHeaders"] if h["name"] == "Host"]
    config = find(render("overlays/external"), "ConfigMap", "akri-site")["data"]
    assert host in config["ALLOWED_HOSTS"].split(",")
    assert "akri-site-webhook.akri-site.svc" in config["ALLOWED_HOSTS"].split(",")
    assert "livenessProbe" in main


def test_the_webhook_points_at_the_web_processs_tls_port_and_path():
    objects = render("overlays/external")
    hook, labels = find(objects, "ValidatingWebhookConfiguration", "akri-site-pods")["webhooks"]
    # The queue owner label's guard: only labelled claims and Instances are sent.
    assert labels["clientConfig"] == hook["clientConfig"]
    assert labels["objectSelector"]["matchExpressions"][0]["key"] == "akri-site.io/queue"
    assert {r["resources"][0] for r in labels["rules"]} == {"resourceclaims", "instances"}
    service_ref = hook["clientConfig"]["service"]
    assert service_ref["path"] == "/webhooks/pods/validate"
    assert service_ref["namespace"] == NAMESPACE
    service = find(objects, "Service", service_ref["name"])
    (port,) = service["spec"]["ports"]
    assert port["port"] == service_ref["port"] == 443
    web = find(objects, "Deployment", "akri-site-web")
    assert (
        service["spec"]["selector"].items() <= web["spec"]["template"]["metadata"]["labels"].items()
    )
    ports = {p["name"] for c in pod_spec(web)["containers"] for p in c["ports"]}
    assert port["targetPort"] in ports
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert NAMESPACE in excluded and "kube-system" in excluded
    secret = {v["name"]: v for v in pod_spec(web)["volumes"]}["webhook-tls"]["secret"]
    assert secret["secretName"] == "akri-site-webhook-tls"


# --- server-side dry run ----------------------------------------------------------------------


@pytest.mark.kube
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rendered_objects_pass_a_server_side_dry_run(kube, overlay):
    if not kube.real:
        pytest.skip("a server-side dry run needs a real API server: set AKRI_TEST_KUBECONFIG")
    dyn = dynamic.DynamicClient(kube.api_client)
    unserved = []
    for obj in render(overlay):
        body = _into(copy.deepcopy(obj), kube.namespace)
        try:
            resource = dyn.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        except dynamic.exceptions.ResourceNotFoundError:
            unserved.append(f"{body['apiVersion']} {body['kind']}")
            continue
        namespace = kube.namespace if resource.namespaced else None
        try:
            resource.create(body=body, namespace=namespace, query_params=[("dryRun", "All")])
        except client.ApiException as exc:
            # Objects the server has already (the CRDs, applied by the test session) are fine.
            if exc.status != 409:
                raise AssertionError(
                    f"{body['kind']} {body['metadata']['name']}: {exc.body}"
                ) from None
    # A server older than the manifests' minimum (1.25) lacks only policy/v1.
    assert set(unserved) <= {"policy/v1 PodDisruptionBudget"}, unserved


def _into(obj: dict, namespace: str) -> dict:
    """The object as it would be installed in ``namespace`` (the test's own)."""
    meta = obj["metadata"]
    if obj["kind"] == "Namespace":
        meta["name"] = namespace + "-dry"
    if "namespace" in meta:
        meta["namespace"] = namespace
    if obj["kind"].startswith("ClusterRole") or obj["kind"] == "ValidatingWebhookConfiguration":
        meta["name"] = f"{meta['name']}-{namespace}"
    for subject in obj.get("subjects") or []:
        subject["namespace"] = namespace
    return obj


@pytest.mark.parametrize("path", ["base", "overlays/embedded-redis", "overlays/external"])
def test_kustomize_renders_every_tree_without_a_deprecation_warning(path):
    import subprocess

    from tests.deploykit import DEPLOY, kubectl

    done = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / path)], capture_output=True, text=True, timeout=120
    )

    assert done.returncode == 0, done.stderr
    assert "deprecated" not in done.stderr.lower(), done.stderr


def test_the_cert_manager_component_issues_the_secret_the_web_mounts_and_injects_every_ca(
    tmp_path,
):
    """deploy/extras/cert-manager from an overlay of the user's: its Certificate is the Secret
    the web pods mount, for the name the API server dials, and the CA injector is asked to fill
    every webhook of akri-site-pods."""
    import os
    import subprocess

    import yaml

    from tests.deploykit import DEPLOY, kubectl

    relative = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n  - {relative}/overlays/embedded-redis\n"
        f"components:\n  - {relative}/extras/cert-manager\n"
    )
    done = subprocess.run(
        [kubectl(), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}

    certificate = by_kind[("Certificate", "akri-site-webhook")]
    webhooks = by_kind[("ValidatingWebhookConfiguration", "akri-site-pods")]
    web = by_kind[("Deployment", "akri-site-web")]
    mounted = {
        v["secret"]["secretName"]
        for v in web["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    services = {w["clientConfig"]["service"]["name"] for w in webhooks["webhooks"]}
    namespace = certificate["metadata"]["namespace"]

    assert certificate["spec"]["secretName"] in mounted
    assert {f"{name}.{namespace}.svc" for name in services} <= set(certificate["spec"]["dnsNames"])
    assert webhooks["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{namespace}/{certificate['metadata']['name']}"
    )
    assert ("Issuer", certificate["spec"]["issuerRef"]["name"]) in by_kind


@pytest.mark.kube
def test_set_webhook_ca_gives_every_webhook_the_ca(kube, tmp_path):
    """deploy/set-webhook-ca, as the README tells an operator to run it (kubectl), on the
    simulator and on a real server."""
    import base64
    import subprocess

    from tests.deploykit import DEPLOY

    (config,) = [d for d in render("base") if d["kind"] == "ValidatingWebhookConfiguration"]
    body = copy.deepcopy(config)
    # Nothing serves it here: fail open and never match a namespace, so no other test waits.
    for webhook in body["webhooks"]:
        webhook["namespaceSelector"] = {"matchLabels": {"akri-site-test": "never"}}
    api = client.AdmissionregistrationV1Api(kube.api_client)
    api.create_validating_webhook_configuration(body)
    try:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.crt"),
             "-subj", "/CN=akri-site-webhook.akri-site.svc"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        done = subprocess.run(
            [str(DEPLOY / "set-webhook-ca"), str(tmp_path / "tls.crt")],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "KUBECONFIG": kube.kubeconfig},
        )
        assert done.returncode == 0, done.stderr

        stored = api.read_validating_webhook_configuration(body["metadata"]["name"])
        wanted = (tmp_path / "tls.crt").read_bytes()
        assert len(stored.webhooks) == len(body["webhooks"]) == 2
        assert all(base64.b64decode(w.client_config.ca_bundle) == wanted for w in stored.webhooks)
    finally:
        api.delete_validating_webhook_configuration(body["metadata"]["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_agent_reads_secrets_only_in_the_discovery_namespace(overlay):
    """The site's own Secret (database URL, SECRET_KEY) and the webhook's TLS key are in
    akri-site; the agent, root on every node, can read Secrets only in akri-site-discovery."""
    objects = render(overlay)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    readable = set()
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["name"] == "akri-site-agent" for s in binding["subjects"]):
            continue
        namespace = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role["rules"]:
            if "secrets" in rule["resources"] and set(rule["verbs"]) & {"get", "list", "watch"}:
                readable.add(namespace or "every namespace")

    assert readable == {DISCOVERY_NAMESPACE}
