"""Rendering deploy/ for the tests: kustomize as kubectl embeds it.

Debian's kubernetes-client (kubectl 1.20, kustomize v2.0.3) is what scripts/setup installs
when no kubectl is present; a newer kubectl renders the same files (they use only what
v2.0.3 knows: bases, resources, namespace, commonLabels, images, patchesStrategicMerge).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
OVERLAYS = ("overlays/embedded-redis", "overlays/external")
NAMESPACE = "akri-site"


def kubectl() -> str:
    found = os.environ.get("AKRI_KUBECTL") or shutil.which("kubectl")
    if not found:
        raise AssertionError(
            "kubectl is needed to render deploy/ (kubectl kustomize): scripts/setup installs "
            "Debian's kubernetes-client when run as root, or set AKRI_KUBECTL"
        )
    return found


@functools.cache
def render(path: str) -> tuple[dict[str, Any], ...]:
    """Every object ``kubectl kustomize deploy/<path>`` renders (cached per path)."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"kubectl kustomize {path}: {done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def load(path: str) -> list[dict[str, Any]]:
    """The objects of one plain YAML file under deploy/."""
    return [d for d in yaml.safe_load_all((DEPLOY / path).read_text()) if d]


def find(objects, kind: str, name: str) -> dict[str, Any]:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise AssertionError(f"no {kind} {name} rendered")


def workloads(objects) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return list(spec.get("initContainers") or []) + list(spec["containers"])


_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def kubelet_env(
    container: dict[str, Any], config: dict[str, str], fields: dict[str, str]
) -> dict[str, str]:
    """A container's environment as the kubelet builds it: ``envFrom`` ConfigMaps first (every
    one is given ``config``; Secrets are left out), then ``env`` in order, each ``$(NAME)``
    expanded from what is defined so far and ``fieldRef`` values taken from ``fields``."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        if "configMapRef" in source:
            env.update(config)
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = _REFERENCE.sub(
                lambda m: env.get(m.group(1), m.group(0)), var["value"]
            )
        elif "fieldRef" in var.get("valueFrom", {}):
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env
