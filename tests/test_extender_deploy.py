"""deploy/ ships the extender as only kube-scheduler may call it (issue 29): HTTPS with the
Secret's certificate, client certificates of its CA named system:kube-scheduler, probes on a
port of their own, a NetworkPolicy that admits only the scheduler, and a scheduler
configuration (and certificates, from deploy/extender-certs or cert-manager) that match."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from agent.management.commands.runextender import Command
from tests.deploykit import DEPLOY, NAMESPACE, find, kubectl, pod_spec, render
from tests.extender_http import make_certs

SCHEDULER_CONFIG = DEPLOY / "scheduler" / "kube-scheduler-config.yaml"
SECRET = "akri-site-extender-tls"


def extender_objects():
    objects = render("overlays/external")
    return (
        find(objects, "Deployment", "akri-site-extender"),
        find(objects, "Service", "akri-site-extender"),
        find(objects, "NetworkPolicy", "akri-site-extender"),
    )


def runextender_options() -> dict:
    deployment, _, _ = extender_objects()
    (container,) = pod_spec(deployment)["containers"]
    assert container["command"][:3] == ["python", "manage.py", "runextender"]
    parser = Command().create_parser("manage.py", "runextender")
    return vars(parser.parse_args(container["command"][3:]))


def scheduler_extender() -> dict:
    (extender,) = yaml.safe_load(SCHEDULER_CONFIG.read_text())["extenders"]
    return extender


def test_the_extender_serves_tls_from_the_mounted_secret_to_the_scheduler_only():
    deployment, _, _ = extender_objects()
    spec = pod_spec(deployment)
    (container,) = spec["containers"]
    options = runextender_options()
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    mounted = {path: v["secret"]["secretName"] for path, v in mounts.items() if "secret" in v}

    for option, key in (
        ("tls_cert_file", "tls.crt"),
        ("tls_key_file", "tls.key"),
        ("client_ca_file", "ca.crt"),
    ):
        directory, _, name = options[option].rpartition("/")
        assert (mounted.get(directory), name) == (SECRET, key), option
    assert options["client_name"] == ["system:kube-scheduler"]
    assert not options["insecure_http"] and not options["without_api"]


def test_the_probes_use_the_plain_health_port_not_the_client_certificate_port():
    deployment, service, _ = extender_objects()
    (container,) = pod_spec(deployment)["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    options = runextender_options()

    assert ports == {"https": options["port"], "health": options["health_port"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["livenessProbe"]["tcpSocket"]["port"] == "health"
    (exposed,) = service["spec"]["ports"]
    assert (exposed["name"], exposed["targetPort"]) == ("https", "https")


def test_the_network_policy_admits_only_kube_scheduler_and_only_to_the_protocol_port():
    deployment, service, policy = extender_objects()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]

    assert spec["podSelector"]["matchLabels"].items() <= labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "https"}]
    (source,) = rule["from"]
    assert source["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
    }
    # Nothing kustomize adds (the product's own labels) may narrow it to no pod at all.
    assert source["podSelector"] == {
        "matchExpressions": [{"key": "component", "operator": "In", "values": ["kube-scheduler"]}]
    }


def test_the_scheduler_configuration_calls_the_service_over_https_with_its_certificate():
    _, service, _ = extender_objects()
    extender = scheduler_extender()
    url = urlsplit(extender["urlPrefix"])

    assert url.scheme == "https" and extender["enableHTTPS"] is True
    assert url.hostname == f"{service['metadata']['name']}.{NAMESPACE}.svc"
    tls = extender["tlsConfig"]
    # Without caFile kube-scheduler would not check the extender's certificate at all.
    assert set(tls) == {"certFile", "keyFile", "caFile"}
    assert len({Path(v).parent for v in tls.values()}) == 1
    assert not tls.get("insecure")


def test_extender_certs_makes_what_the_scheduler_and_the_extender_expect(tmp_path):
    certs = make_certs(tmp_path / "certs")
    service_name = urlsplit(scheduler_extender()["urlPrefix"]).hostname

    def text(name: str) -> str:
        done = subprocess.run(
            ["openssl", "x509", "-noout", "-subject", "-ext", "subjectAltName,extendedKeyUsage",
             "-in", str(certs.dir / name)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout

    server, client = text("tls.crt"), text("scheduler.crt")
    assert f"DNS:{service_name}" in server and "TLS Web Server Authentication" in server
    assert "CN = system:kube-scheduler" in client and "TLS Web Client Authentication" in client
    assert runextender_options()["client_name"] == ["system:kube-scheduler"]
    names = ("ca.crt", "scheduler.crt", "scheduler.key")
    assert {Path(v).name for v in scheduler_extender()["tlsConfig"].values()} == set(names)
    again = subprocess.run(
        [str(DEPLOY / "extender-certs"), str(certs.dir)], capture_output=True, text=True
    )
    assert again.returncode != 0 and "not overwriting" in again.stderr


def test_the_cert_manager_component_issues_the_extenders_and_the_schedulers_certificates(
    tmp_path,
):
    relative = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n  - {relative}/overlays/external\n"
        f"components:\n  - {relative}/extras/cert-manager\n"
    )
    done = subprocess.run(
        [kubectl(), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}
    server = docs[("Certificate", "akri-site-extender")]["spec"]
    scheduler = docs[("Certificate", "akri-site-extender-scheduler")]["spec"]
    ca = docs[("Issuer", server["issuerRef"]["name"])]["spec"]["ca"]
    service_name = urlsplit(scheduler_extender()["urlPrefix"]).hostname

    assert server["secretName"] == SECRET
    assert service_name in server["dnsNames"] and "server auth" in server["usages"]
    # One CA signs both: the extender's Secret's ca.crt is then the CA of the client's.
    assert scheduler["issuerRef"] == server["issuerRef"]
    assert docs[("Certificate", "akri-site-extender-ca")]["spec"]["secretName"] == ca["secretName"]
    assert [scheduler["commonName"]] == runextender_options()["client_name"]
    assert "client auth" in scheduler["usages"]


def test_the_admission_policy_lets_the_extender_write_what_its_policies_write_at_bind():
    from agent.extender.retry import ANNOTATION as RETRY
    from agent.sharing.akri_slots import ASSIGNMENT
    from agent.sharing.gpu_cards import GPU_INDEX, PREDICATE_TIME

    objects = render("overlays/external")
    policy = find(objects, "ValidatingAdmissionPolicy", "akri-site-extender-pending-pods")
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "akri-site-extender-pending-pods")
    deployment, _, _ = extender_objects()
    account = pod_spec(deployment)["serviceAccountName"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}

    assert binding["spec"] == {
        "policyName": "akri-site-extender-pending-pods",
        "validationActions": ["Deny"],
    }
    assert (
        f"system:serviceaccount:{NAMESPACE}:{account}"
        in (policy["spec"]["matchConditions"][0]["expression"])
    )
    # The bind's annotations, and the one that asks kube-scheduler to retry a refused pod.
    assert set(yaml.safe_load(variables["ours"])) == {
        ASSIGNMENT,
        RETRY,
        GPU_INDEX,
        PREDICATE_TIME,
    }
