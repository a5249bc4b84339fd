"""Every benchmark runs (``--quick``) and prints its summary line with the keys its issue names.

Figures are not judged here (performance is measured by the benchmarks, not by timed tests);
what is checked is that each one still runs end to end and reports what it promises, with
sane values where a value is a correctness check (no double holders).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import bench

ROOT = Path(__file__).resolve().parent.parent

# The keys each issue asks for (more may follow them), and the floor figures the Allocate
# benchmarks print beside their ratios.
KEYS = {
    "claims": {"p50_ms", "p99_ms", "bare_p50_ms", "ratio_p50"},
    "contention": {"claims_per_s", "double_holders"},
    "allocate": {"p50_ms", "p99_ms", "bare_p50_ms", "ratio_p50", "floor_p50_ms", "floor_ratio_p50"}
    | {"over_floor_p50", "sustained_p50_ms", "sustained_p99_ms", "sustained_over_floor_p50"},
    "health-propagation": {"p50_ms", "p95_ms"},
    "agent-memory": {"rss_mb", "plain_rss_mb", "flags_saved_mb"},
    "cl-allocate": {"p50_ms", "p99_ms", "single_p50_ms", "ratio_p50", "floor_ratio_p50"}
    | {"over_floor_p50", "sustained_p50_ms", "sustained_p99_ms", "sustained_over_floor_p50"},
    "release": {"p50_ms", "p95_ms"},
    "release-storm": {"writes_per_slot", "free_p95_s", "live_touched"}
    | {"unfolded_writes_per_slot", "unfolded_free_p95_s", "writes_ratio"},
    "sweep": {"duration_ms", "first_ms"},
    "live": {"p50_ms_1", "p95_ms_1", "p50_ms_200", "p95_ms_200"},
    "slotmap": {"server_ms"},
    "history": {"server_ms", "rows", "points"},
    "lists": {"configurations_ms", "instances_ms", "nodes_ms", "pods_ms", "brokers_ms", "max_ms"},
    "brokers": {"converge_s", "duplicates", "api_writes_per_object"},
    "web": {"rps", "p95_ms", "cores_busy", "errors"},
    "scale": {"sync_s", "rss_mb", "lag_p95_ms", "changes_per_s", "backlog_end", "late", "lost"}
    | {"slotmap_ms"},
    "failover": {"p95_s", "dual_leader_writes"},
    "extender-filter": {"p95_ms"},
    "schedule-storm": {"admission_errors", "overbooked", "rescheduled_s"},
    "charges": {"full_ms", "incremental_p95_ms"},
    "webhook": {"p99_ms"},
}


def test_every_registered_benchmark_is_covered_here():
    assert set(bench.REGISTRY) == set(KEYS)


@pytest.mark.parametrize("name", sorted(KEYS))
def test_benchmark_prints_its_summary_line(name, tmp_path):
    env = dict(os.environ)
    # Its own embedded database and in-process layers, whatever the suite runs on.
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env["AKRI_SQLITE_PATH"] = str(tmp_path / "bench.sqlite3")
    done = subprocess.run(
        [sys.executable, "manage.py", "bench", name, "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    head, *pairs = last.split()
    assert head == name, last
    figures = dict(pair.split("=", 1) for pair in pairs)
    assert KEYS[name] <= set(figures), last
    for key in KEYS[name]:
        value = float(figures[key])
        assert math.isfinite(value) and value >= 0, last
    if name == "contention":
        assert figures["double_holders"] == "0", last
    if name == "brokers":
        assert (figures["duplicates"], figures["missing"]) == ("0", "0"), last
    if name == "web":
        assert figures["errors"] == "0", last  # every request answered 200
    if name == "scale":
        failed = (figures["lost"], figures["write_errors"], figures["batch_fallbacks"])
        assert failed == ("0", "0", "0"), last
    if name == "failover":
        assert figures["dual_leader_writes"] == "0", last
    if name == "schedule-storm":
        assert figures["admission_errors"] == "0" and figures["overbooked"] == "0", last
    if name == "release-storm":
        assert (figures["live_touched"], figures["unfolded_live_touched"]) == ("0", "0"), last
        assert float(figures["unfolded_writes_per_slot"]) >= 1, last  # one write a slot at least
        assert float(figures["writes_per_slot"]) <= 1, last  # folding never writes more


@pytest.mark.parametrize(
    "args", [["--nodes", "0"], ["--pods", "-5"], ["--live", "-1"], ["--nodes", "2", "--pods", "-1"]]
)
def test_storm_sizes_out_of_range_are_a_clear_error_and_run_nothing(args):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="must be at least"):
        call_command("bench", "release-storm", *args)


@pytest.mark.parametrize("rate", ["0", "-3"])
def test_a_change_rate_out_of_range_is_a_clear_error_and_runs_nothing(rate):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="must be at least"):
        call_command("bench", "scale", "--rate", rate)


def test_a_rate_given_to_a_benchmark_that_takes_none_is_a_clear_error():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="rate"):
        call_command("bench", "release-storm", "--rate", "100")
