"""The extender with real agents and kubelet simulators, and a tiny stand-in for kube-scheduler
(filter -> prioritize -> best node -> bind), then the kubelet admitting the bound pod as it
does once it sees the binding. Shared by the end-to-end test and the ``schedule-storm`` bench.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tests.extender_http import filter_args, post


@dataclass
class Outcome:
    node: str  # "" when no node fits
    admitted: bool = False
    error: str = ""
    filter_result: dict[str, Any] | None = None


def pod_body(name: str, requests: dict[str, int]) -> dict[str, Any]:
    limits = {k: str(v) for k, v in requests.items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": limits, "limits": limits},
                }
            ],
        },
    }


class MiniScheduler:
    """Schedules one pod the way kube-scheduler runs an extender with nodeCacheCapable."""

    def __init__(self, core: client.CoreV1Api, namespace: str, url: str, kubelets: dict) -> None:
        self.core = core
        self.namespace = namespace
        self.url = url
        self.kubelets = kubelets  # node name -> KubeletSimulator

    def create(self, name: str, requests: dict[str, int]) -> dict[str, Any]:
        self.core.create_namespaced_pod(self.namespace, pod_body(name, requests))
        response = self.core.read_namespaced_pod(name, self.namespace, _preload_content=False)
        return json.loads(response.data)

    def schedule(self, pod: dict[str, Any], admit: bool = True) -> Outcome:
        nodes = sorted(self.kubelets)
        status, result = post(self.url + "/filter", filter_args(pod, nodes))
        assert status == 200 and result["Error"] == "", result
        fits = result["NodeNames"] or []
        if not fits:
            return Outcome("", filter_result=result)
        _, scores = post(self.url + "/prioritize", filter_args(pod, fits))
        best = max(scores, key=lambda s: (s["Score"], -fits.index(s["Host"])))["Host"]
        meta = pod["metadata"]
        bind = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": best,
        }
        status, bound = post(self.url + "/bind", bind)
        assert status == 200
        if bound["Error"]:
            return Outcome("", error=bound["Error"], filter_result=result)
        outcome = Outcome(best, filter_result=result)
        if admit:
            outcome.admitted, outcome.error = self.admit(pod, best)
        return outcome

    def admit(self, pod: dict[str, Any], node: str) -> tuple[bool, str]:
        meta = pod["metadata"]
        containers = [
            {
                "name": c["name"],
                "requests": {k: int(v) for k, v in c["resources"]["limits"].items()},
            }
            for c in pod["spec"]["containers"]
        ]
        result = self.kubelets[node].admit_pod(
            meta["namespace"], meta["name"], containers, uid=meta["uid"]
        )
        return result.admitted, result.error
