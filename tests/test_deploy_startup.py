"""A pod missing a setting its manifest declares required stops at start with one clear line
(not a traceback, not a development default). The requirements come from the rendered
manifests; the processes are the real entry points, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploykit import find, pod_spec, render

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
STRONG_KEY = "k3Vq9xN2mR7tY4pL8sD1fG6hJ0wZcAqEuIoPaSdFgHjKlZxCvBnM5b"
CLEARED = ("DATABASE_URL", "REDIS_URL", "NODE_NAME", "SECRET_KEY", "AKRI_REQUIRED_SETTINGS")


def config_env() -> dict[str, str]:
    """The ConfigMap every server-side process loads, as its environment."""
    return dict(find(render("overlays/external"), "ConfigMap", "akri-site")["data"])


def agent_env() -> dict[str, str]:
    agent = find(render("overlays/external"), "DaemonSet", "akri-site-agent")
    (main,) = pod_spec(agent)["containers"]
    return {e["name"]: e["value"] for e in main["env"] if "value" in e}


def start(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return subprocess.run(
        command,
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_naming(done: subprocess.CompletedProcess[str], setting: str) -> None:
    assert done.returncode != 0, done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert setting in lines[0], lines[0]


@pytest.mark.parametrize(
    "command",
    [
        [str(BIN / "daphne"), "-p", "0", "akri_site.asgi:application"],
        [sys.executable, "manage.py", "runcontroller"],
        [str(BIN / "celery"), "-A", "akri_site", "worker"],
        [str(BIN / "celery"), "-A", "akri_site", "beat"],
    ],
    ids=["web", "controller", "worker", "beat"],
)
def test_a_server_process_without_database_url_stops_with_one_line(command):
    env = config_env()
    assert "DATABASE_URL" in env["AKRI_REQUIRED_SETTINGS"].split(",")
    env.update(SECRET_KEY=STRONG_KEY, REDIS_URL="redis://127.0.0.1:1/0")

    done = start(command, env)

    assert_one_line_naming(done, "DATABASE_URL")


def test_the_agent_without_node_name_stops_with_one_line(tmp_path):
    env = agent_env()
    assert "NODE_NAME" in env["AKRI_REQUIRED_SETTINGS"].split(",")
    env.update(SECRET_KEY=STRONG_KEY, AKRI_SQLITE_PATH=str(tmp_path / "agent.sqlite3"))

    done = start([sys.executable, "manage.py", "runagent"], env)

    assert_one_line_naming(done, "NODE_NAME")


def test_runagent_alone_without_a_node_name_says_so_in_one_line(tmp_path):
    # Outside deploy/ (no AKRI_REQUIRED_SETTINGS): the command's own check.
    done = start(
        [sys.executable, "manage.py", "runagent"],
        {"AKRI_AGENT_ONLY": "true", "AKRI_SQLITE_PATH": str(tmp_path / "agent.sqlite3")},
    )

    assert_one_line_naming(done, "NODE_NAME")
