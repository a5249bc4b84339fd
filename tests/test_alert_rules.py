"""The alert rules in deploy/extras/prometheus: one set of rules in two wrappings, each rule
querying only series akri-site exports, every alert with texts for the operator and a unit test,
and Prometheus's own promtool judging them (checked and unit-tested) when it is installed
(scripts/setup takes it from Debian's prometheus package)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY, generate_latest

import agent.metrics  # noqa: F401  (every per-process series registered)
from akri_site.dashboard.prom import CACHE_REGISTRY

from .test_grafana import exported_series

RULES_DIR = Path(__file__).resolve().parents[1] / "deploy" / "extras" / "prometheus"
RULES = RULES_DIR / "rules.yml"
RULES_TEST = RULES_DIR / "rules.test.yml"
PROMETHEUS_RULE = RULES_DIR / "prometheusrule.yaml"
# Prometheus's own series about each target.
PROMETHEUS_SERIES = {"up"}
SERIES = re.compile(r"\b(akri_[a-z0-9_]+|up)\b")


def groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def alerts() -> list[dict]:
    return [rule for group in groups() for rule in group["rules"]]


def promtool() -> str | None:
    beside_python = Path(sys.executable).parent / "promtool"
    return shutil.which("promtool") or (str(beside_python) if beside_python.exists() else None)


def test_the_prometheus_rule_carries_exactly_the_plain_rules():
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())

    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == "akri-site"
    assert rule["spec"]["groups"] == groups()


@pytest.mark.django_db
def test_every_rule_queries_only_series_akri_site_exports():
    defined = exported_series(generate_latest(REGISTRY).decode())
    defined |= exported_series(generate_latest(CACHE_REGISTRY).decode())

    for rule in alerts():
        named = set(SERIES.findall(rule["expr"]))
        assert named, rule["alert"]
        unknown = named - defined - PROMETHEUS_SERIES
        assert not unknown, f"{rule['alert']} queries series nothing exports: {unknown}"


def test_the_rules_cover_what_an_operator_must_hear_about():
    queried = {name for rule in alerts() for name in SERIES.findall(rule["expr"])}

    assert "akri_slots_stuck" in queried  # slots held too long
    assert {"up", "akri_agent_heartbeat_timestamp_seconds"} <= queried  # an agent gone
    assert {"akri_reconcile_runs_total", "akri_reconcile_slots_total"} <= queried  # failing
    assert "akri_leader" in queried  # nobody leading


def test_every_alert_has_a_severity_a_summary_a_description_and_a_delay():
    names = [rule["alert"] for rule in alerts()]

    assert len(names) == len(set(names))
    for rule in alerts():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert re.fullmatch(r"\d+m", rule["for"]), rule["alert"]


def test_every_alert_is_seen_firing_and_quiet_in_the_unit_tests():
    tests = yaml.safe_load(RULES_TEST.read_text())
    checks = [check for test in tests["tests"] for check in test["alert_rule_test"]]
    firing = {check["alertname"] for check in checks if check["exp_alerts"]}
    quiet = {check["alertname"] for check in checks if not check["exp_alerts"]}

    assert tests["rule_files"] == ["rules.yml"]
    names = {rule["alert"] for rule in alerts()}
    assert names <= firing, names - firing
    assert names <= quiet, names - quiet


def test_promtool_finds_the_rules_valid_and_their_unit_tests_pass():
    tool = promtool()
    if tool is None:
        reason = (
            "promtool is not installed (scripts/setup installs it from Debian's prometheus "
            "package when run as root): the rules were checked by parsing only"
        )
        print(reason)
        pytest.skip(reason)

    checked = subprocess.run(
        [tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in checked.stdout

    tested = subprocess.run(
        [tool, "test", "rules", RULES_TEST.name],
        cwd=RULES_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
