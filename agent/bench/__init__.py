"""Benchmarks: ``python manage.py bench NAME`` runs one and prints its summary line last.

Each benchmark is a function returning an ordered mapping of figures; the command prints
``NAME key=value ...``. Ratios compare against a baseline measured in the same run.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# name -> (module, function, what it measures)
REGISTRY: dict[str, tuple[str, str, str]] = {
    "live": (
        "agent.bench.live",
        "bench_live",
        "deviceUsage change in the API server to a websocket delta, 1 and 200 clients",
    ),
    "claims": (
        "agent.bench.claims",
        "bench_claims",
        "claim+release through the claim store vs a bare conditional write",
    ),
    "contention": (
        "agent.bench.claims",
        "bench_contention",
        "20 claimers race for an Instance of capacity 3, 200 rounds",
    ),
    "allocate": (
        "agent.bench.agent",
        "bench_allocate",
        "the Allocate RPC over gRPC (claim included) vs a bare conditional write",
    ),
    "cl-allocate": (
        "agent.bench.cl",
        "bench_cl_allocate",
        "one Allocate for 4 unique CL devices vs single-device IL Allocates",
    ),
    "health-propagation": (
        "agent.bench.agent",
        "bench_health_propagation",
        "deviceUsage change in the API server -> new list at another node's kubelet",
    ),
    "agent-memory": (
        "agent.bench.agent",
        "bench_agent_memory",
        "RSS of manage.py runagent serving 100 Instances",
    ),
    "release": (
        "agent.bench.reconcile",
        "bench_release",
        "pod deleted in the API server -> its slot free there, 200 pods through an agent",
    ),
    "scale": (
        "agent.bench.scale",
        "bench_scale",
        "controller sync, memory, change lag and slot map at 40,000 Instances on 1,000 nodes",
    ),
    "release-storm": (
        "agent.bench.storm",
        "bench_release_storm",
        "5,000 pods on shared Instances across 50 nodes deleted at once, 500 live pods kept: "
        "writes per freed slot and free time, folded vs one write per slot",
    ),
    "sweep": (
        "agent.bench.reconcile",
        "bench_sweep",
        "one node-local sweep over 500 Instances x 4 held slots in use",
    ),
    "brokers": (
        "agent.bench.brokers",
        "bench_brokers",
        "1,000 Instances appear at once on 50 nodes -> every broker pod and Service created",
    ),
    "web": (
        "agent.bench.web",
        "bench_web",
        "200 clients on the demo's slot map and /api/slots/ for 20 s, 50 websockets open",
    ),
    "failover": (
        "agent.bench.failover",
        "bench_failover",
        "Lease leader killed -> the other candidate leading and its first write accepted",
    ),
    # --- scheduler extender (issue 14) ---
    "extender-filter": (
        "agent.bench.extender",
        "bench_extender_filter",
        "one pod filtered over 5,000 nodes seeing 20,000 Instances, over HTTP",
    ),
    "schedule-storm": (
        "agent.bench.extender",
        "bench_schedule_storm",
        "500 pods asking unique CL devices, room for 300: admission errors, overbooking",
    ),
    "history": (
        "akri_site.dashboard.bench",
        "bench_history",
        "the usage chart's data: 7 days of a 500-node cluster, one sample a minute",
    ),
    "lists": (
        "akri_site.dashboard.bench",
        "bench_lists",
        "each list page's first page (Configurations, Instances, nodes, pods, brokers) at "
        "40,000 Instances",
    ),
    # Queue charges (agent/queues).
    "charges": (
        "agent.queues.bench",
        "bench_charges",
        "full charge recompute (5,000 claims, 200 queues, 20,000 pods) and one-pod updates",
    ),
    "webhook": (
        "agent.queues.bench",
        "bench_webhook",
        "AdmissionReview round trip over HTTP, 50 concurrent clients",
    ),
}


def register(name: str, module: str, function: str, description: str) -> None:
    REGISTRY[name] = (module, function, description)


def load(name: str) -> Callable[..., dict[str, object]]:
    module, function, _ = REGISTRY[name]
    return getattr(importlib.import_module(module), function)


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) by nearest rank; values need not be sorted."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary(name: str, figures: dict[str, object]) -> str:
    parts = []
    for key, value in figures.items():
        if isinstance(value, float):
            value = f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
        parts.append(f"{key}={value}")
    return f"{name} " + " ".join(parts)


def ensure_migrated() -> None:
    """Benchmarks write cache rows: make sure the database they use has its tables."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def start_daphne(port: int, env: dict[str, str]) -> subprocess.Popen:
    """The web app under Daphne in a process of its own on 127.0.0.1:``port`` (its output shown
    only with AKRI_BENCH_VERBOSE); the caller waits for the port and terminates it."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "akri_site.asgi:application",
        ],  # fmt: skip
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("AKRI_BENCH_VERBOSE") else subprocess.DEVNULL,
    )
