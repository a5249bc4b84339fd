"""A stand-in for kube-scheduler's use of an HTTP extender, for tests and benchmarks.

It schedules one pod as the scheduler does with ``nodeCacheCapable: true`` and the extender as
binder: POST ``filter`` with the pod and the node names, ``prioritize`` the survivors, take the
best score (ties: the first), POST ``bind``. The JSON is the scheduler's (``ExtenderArgs``
with the unused field null). ``admit`` then plays the kubelet that sees the binding.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from kubernetes import client


def post(url: str, body: Any, raw: bytes | None = None, timeout: float = 10) -> tuple[int, Any]:
    """(status, decoded body) of a JSON POST; a non-200 answer's body comes back as text."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def filter_args(
    pod: dict[str, Any], nodes: list[str], node_objects: list[dict] | None = None
) -> dict[str, Any]:
    """ExtenderArgs as the scheduler marshals them: both keys present, the unused one null."""
    if node_objects is None:
        return {"Pod": pod, "Nodes": None, "NodeNames": nodes}
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": node_objects}, "NodeNames": None}


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


@dataclass
class Outcome:
    node: str  # "" when no node fits (the pod stays Pending)
    admitted: bool = False
    error: str = ""
    filter_result: dict[str, Any] | None = None


class MiniScheduler:
    def __init__(self, core: client.CoreV1Api, namespace: str, url: str, kubelets: dict) -> None:
        self.core = core
        self.namespace = namespace
        self.url = url
        self.kubelets = kubelets  # node name -> KubeletSimulator

    def create(self, name: str, requests: dict[str, int]) -> dict[str, Any]:
        """Create the pod and read it back: the full v1.Pod JSON the scheduler would send."""
        self.core.create_namespaced_pod(self.namespace, pod_body(name, requests))
        response = self.core.read_namespaced_pod(name, self.namespace, _preload_content=False)
        return json.loads(response.data)

    def bind_best(self, pod: dict[str, Any]) -> Outcome:
        """Filter, prioritize and bind; the node bound to, or "" with the reasons."""
        nodes = sorted(self.kubelets)
        status, result = post(self.url + "/filter", filter_args(pod, nodes))
        if status != 200 or result["Error"]:
            return Outcome("", error=f"filter failed: {status} {result}")
        fits = result["NodeNames"] or []
        if not fits:
            return Outcome("", filter_result=result)
        _, scores = post(self.url + "/prioritize", filter_args(pod, fits))
        order = {name: i for i, name in enumerate(fits)}
        best = max(
            scores or [{"Host": fits[0], "Score": 0}], key=lambda s: (s["Score"], -order[s["Host"]])
        )
        meta = pod["metadata"]
        bind = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": best["Host"],
        }
        status, bound = post(self.url + "/bind", bind)
        if status != 200 or bound["Error"]:
            return Outcome("", error=f"bind failed: {status} {bound}", filter_result=result)
        return Outcome(best["Host"], filter_result=result)

    def schedule(self, pod: dict[str, Any], admit: bool = True) -> Outcome:
        outcome = self.bind_best(pod)
        if outcome.node and admit:
            outcome.admitted, outcome.error = self.admit(pod, outcome.node)
        return outcome

    def admit(self, pod: dict[str, Any], node: str) -> tuple[bool, str]:
        """The kubelet of ``node`` admits the bound pod (the agent's Allocate runs)."""
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
