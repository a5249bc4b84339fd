"""The Grafana dashboard under deploy/grafana/ queries only series akri-site exports.

Here, against the definitions (every series the code can export, whatever the process). That
each series is exported by the process that records it, scraped over HTTP from processes
running on their own as deploy/ runs them, is tests/test_metrics_processes.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

import agent.metrics  # noqa: F401  (every per-process series registered)
from akri_site.dashboard.prom import CACHE_REGISTRY
from akri_site.dashboard.sample import make_cluster

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "akri-site.json"
METRIC = re.compile(r"\bakri_[a-z0-9_]+\b")


def exported_series(text: str) -> set[str]:
    """Every series name /metrics can carry: its families, and a histogram's three parts."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names.update(f"{name}_{part}" for part in ("bucket", "sum", "count"))
            if kind == "counter" and not name.endswith("_total"):
                names.add(f"{name}_total")
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def queried_series(dashboard: dict) -> set[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    return {name for expr in exprs for name in METRIC.findall(expr)}


@pytest.mark.django_db
def test_the_grafana_dashboard_queries_only_series_akri_site_defines():
    make_cluster(instances=4, capacity=4)
    dashboard = json.loads(DASHBOARD.read_text())
    # Per-process series (agent.metrics) and the web's, computed from the cache at scrape time.
    defined = exported_series(generate_latest(REGISTRY).decode())
    defined |= exported_series(generate_latest(CACHE_REGISTRY).decode())

    queried = queried_series(dashboard)

    assert "akri_release_latency_seconds_bucket" in queried and "akri_slots" in queried
    missing = queried - defined
    assert not missing, f"the dashboard queries series nothing exports: {missing}"


def test_the_grafana_dashboard_is_importable_with_a_prometheus_input():
    dashboard = json.loads(DASHBOARD.read_text())

    assert dashboard["uid"] == "akri-site"
    assert [i["pluginId"] for i in dashboard["__inputs"]] == ["prometheus"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(p["targets"] for p in dashboard["panels"])
