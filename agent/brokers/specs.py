"""Broker specs for the demo, the benchmark and the tests: what Akri's Helm chart gives a
debugEcho Configuration (an nginx broker per device, port 80 on both Services)."""

from __future__ import annotations

import copy
from typing import Any

DEBUG_ECHO_POD_SPEC: dict[str, Any] = {
    "containers": [
        {
            "name": "akri-debug-echo-foo-broker",
            "image": "nginx:stable-alpine",
            "resources": {
                "limits": {"{{PLACEHOLDER}}": "1", "cpu": "29m", "memory": "11Mi"},
                "requests": {"{{PLACEHOLDER}}": "1", "cpu": "10m", "memory": "11Mi"},
            },
        }
    ]
}
SERVICE_SPEC: dict[str, Any] = {
    "type": "ClusterIP",
    "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}],
}


def with_brokers(
    configuration: dict[str, Any],
    pod_spec: dict[str, Any] | None = None,
    *,
    services: bool = True,
) -> dict[str, Any]:
    """A copy of ``configuration`` with a brokerPodSpec and (by default) both Services."""
    body = copy.deepcopy(configuration)
    spec = body.setdefault("spec", {})
    spec["brokerSpec"] = {"brokerPodSpec": copy.deepcopy(pod_spec or DEBUG_ECHO_POD_SPEC)}
    if services:
        spec["instanceServiceSpec"] = copy.deepcopy(SERVICE_SPEC)
        spec["configurationServiceSpec"] = copy.deepcopy(SERVICE_SPEC)
    return body
