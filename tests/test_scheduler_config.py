"""The KubeSchedulerConfiguration example obeys kube-scheduler's validation rules for extenders
(config/v1 types and validation), and points at what runextender serves."""

from __future__ import annotations

from pathlib import Path

import yaml

from agent.domain.naming import is_resource_name_valid

EXAMPLE = (
    Path(__file__).resolve().parents[1] / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
)
KEYS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}


def test_the_example_is_a_valid_scheduler_configuration():
    config = yaml.safe_load(EXAMPLE.read_text())

    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    extenders = config["extenders"]
    assert sum(1 for e in extenders if e.get("bindVerb")) <= 1
    for extender in extenders:
        assert set(extender) <= KEYS
        assert extender["urlPrefix"].startswith("http")
        if extender.get("prioritizeVerb"):
            assert extender["weight"] > 0
        names = [r["name"] for r in extender.get("managedResources") or []]
        assert len(names) == len(set(names))
        assert all(is_resource_name_valid(n) for n in names), names


def test_the_example_calls_the_verbs_runextender_serves():
    extender = yaml.safe_load(EXAMPLE.read_text())["extenders"][0]

    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["urlPrefix"].endswith(":8888")  # runextender's default port


def test_the_example_calls_the_extender_service_deploy_renders():
    from urllib.parse import urlsplit

    from .deploykit import render

    extender = yaml.safe_load(EXAMPLE.read_text())["extenders"][0]
    url = urlsplit(extender["urlPrefix"])
    services = [
        doc
        for doc in render("base")
        if doc["kind"] == "Service" and doc["metadata"]["name"].endswith("extender")
    ]

    assert len(services) == 1
    service = services[0]
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert url.hostname == f"{name}.{namespace}.svc"
    assert url.port in {port["port"] for port in service["spec"]["ports"]}


def test_configuration_level_resources_are_left_to_the_extender_so_its_reason_reaches_the_pod():
    extender = yaml.safe_load(EXAMPLE.read_text())["extenders"][0]

    assert extender["managedResources"]
    assert all(r["ignoredByScheduler"] is True for r in extender["managedResources"])
