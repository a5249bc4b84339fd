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
