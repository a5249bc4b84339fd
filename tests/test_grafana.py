"""The Grafana dashboard under deploy/grafana/ queries only series /metrics exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from akri_site.dashboard.sample import make_cluster

pytestmark = pytest.mark.django_db

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


def test_the_grafana_dashboard_queries_only_series_that_metrics_exports(client):
    make_cluster(instances=4, capacity=4)
    dashboard = json.loads(DASHBOARD.read_text())

    response = client.get("/metrics")

    assert response.status_code == 200
    queried = queried_series(dashboard)
    assert "akri_release_latency_seconds_bucket" in queried and "akri_slots" in queried
    missing = queried - exported_series(response.content.decode())
    assert not missing, f"the dashboard queries series /metrics does not export: {missing}"


def test_the_grafana_dashboard_is_importable_with_a_prometheus_input():
    dashboard = json.loads(DASHBOARD.read_text())

    assert dashboard["uid"] == "akri-site"
    assert [i["pluginId"] for i in dashboard["__inputs"]] == ["prometheus"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(p["targets"] for p in dashboard["panels"])
