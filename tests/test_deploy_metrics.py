"""deploy/ tells Prometheus where every process's /metrics is: a container port named for it and
the prometheus.io annotations on each pod, the PodMonitors of deploy/extras/prometheus selecting
exactly those pods and ports under the job names the alert rules use, and the web taking its
own pod IP as a Host (Prometheus scrapes it at that address)."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.deploykit import DEPLOY, NAMESPACE, OVERLAYS, find, kubelet_env, pod_spec, render

# Workload -> (its /metrics port's name, number); the web serves /metrics on its pages' port.
SCRAPED = {
    "akri-site-agent": ("metrics", 8080),
    "akri-site-controller": ("metrics", 8080),
    "akri-site-worker": ("metrics", 8080),
    "akri-site-web": ("http", 8000),
}
KIND = {"akri-site-agent": "DaemonSet"}


def workload(objects, name: str) -> dict:
    return find(objects, KIND.get(name, "Deployment"), name)


def monitors() -> list[dict]:
    return [o for o in render("extras/prometheus") if o["kind"] == "PodMonitor"]


def selects(selector: dict, labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for term in selector.get("matchExpressions", []):
        assert term["operator"] == "In", term  # the only operator these monitors use
        if labels.get(term["key"]) not in term["values"]:
            return False
    return True


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("name", sorted(SCRAPED))
def test_each_process_declares_its_metrics_port_and_its_annotations_name_it(overlay, name):
    port_name, number = SCRAPED[name]
    obj = workload(render(overlay), name)
    main = pod_spec(obj)["containers"][0]

    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports[port_name] == number
    annotations = obj["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(number)
    assert annotations["prometheus.io/path"] == "/metrics"
    if port_name == "metrics":  # served by agent.exporter, on METRICS_PORT
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["METRICS_PORT"] == str(number)


def test_the_pod_monitors_scrape_every_process_once_on_its_port_as_the_rules_job():
    objects = render("overlays/external")
    jobs = set()
    for name, (port_name, _) in SCRAPED.items():
        labels = workload(objects, name)["spec"]["template"]["metadata"]["labels"]
        chosen = [m for m in monitors() if selects(m["spec"]["selector"], labels)]
        assert len(chosen) == 1, (name, [m["metadata"]["name"] for m in chosen])
        (monitor,) = chosen
        assert monitor["metadata"]["namespace"] == NAMESPACE
        assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [port_name]
        assert all(e["path"] == "/metrics" for e in monitor["spec"]["podMetricsEndpoints"])
        # The job label comes from this pod label: the rules and dashboard name these jobs.
        jobs.add(labels[monitor["spec"]["jobLabel"]])
    rules = (DEPLOY / "extras" / "prometheus" / "rules.yml").read_text()
    wanted = set(
        re.findall(r"akri-site-[a-z]+", " ".join(re.findall(r"job=~?\"([^\"]+)\"", rules)))
    )
    assert wanted and wanted <= jobs == set(SCRAPED)


def test_the_prometheus_extras_render_with_kustomize_into_the_namespace():
    objects = render("extras/prometheus")

    assert sorted(o["kind"] for o in objects) == ["PodMonitor", "PodMonitor", "PrometheusRule"]
    assert {o["metadata"]["namespace"] for o in objects} == {NAMESPACE}
    kustomization = yaml.safe_load((DEPLOY / "extras/prometheus/kustomization.yaml").read_text())
    assert "rules.yml" not in kustomization["resources"]  # plain Prometheus's, not an object


def test_the_agent_requires_the_scrape_token_from_the_secret():
    """/metrics ships protected (issue 29 §9): no token, no agent (one line naming it)."""
    agent = workload(render("overlays/external"), "akri-site-agent")
    env = {e["name"]: e for e in pod_spec(agent)["containers"][0]["env"]}

    ref = env["METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "akri-site", "key": "METRICS_TOKEN"}
    assert "METRICS_TOKEN" in env["AKRI_REQUIRED_SETTINGS"]["value"].split(",")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_server_process_requires_the_scrape_token(overlay):
    config = find(render(overlay), "ConfigMap", "akri-site")["data"]

    assert "METRICS_TOKEN" in config["AKRI_REQUIRED_SETTINGS"].split(",")


def test_the_pod_monitors_send_the_scrape_token():
    for monitor in monitors():
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            credentials = endpoint["authorization"]["credentials"]
            assert credentials == {"name": "akri-site", "key": "METRICS_TOKEN"}


@pytest.mark.parametrize(("pod_ip", "host"), [("10.1.2.3", "10.1.2.3"), ("fd00::7", "[fd00::7]")])
def test_the_web_takes_its_own_pod_ip_as_host(pod_ip, host):
    objects = render("overlays/external")
    config = find(objects, "ConfigMap", "akri-site")["data"]
    web = pod_spec(workload(objects, "akri-site-web"))["containers"][0]

    env = kubelet_env(web, config, {"status.podIP": pod_ip, "metadata.namespace": NAMESPACE})

    allowed = env["ALLOWED_HOSTS"].split(",")
    assert host in allowed
    assert set(config["ALLOWED_HOSTS"].split(",")) <= set(allowed)
