"""The kubelet of the Allocate benchmarks, in a process of its own, as on a node.

On a node the kubelet is a separate program: neither its gRPC client work for an Allocate
(building the request, C-core's completion queue, decoding the answer) nor its PodResources
server (which the agent's reconciler asks after every Allocate) runs in the agent's
interpreter. A bench that runs the kubelet simulator in the agent's process makes the agent's
threads share one interpreter lock with all of that too, and measures a contention no node
has. So the allocate benches start the kubelet simulator in a child (no Django: gRPC, the
generated protocol code and ``agent.simulator.kubelet`` only) and drive it over its stdin and
stdout, one JSON line a request; the milliseconds of an Allocate are measured in the child,
around the call alone:

    {"op": "allocate", "resource": "akri.sh/x", "ids": [["x-0"]]}  ->  {"ms": 1.234}
    the same with "endpoint": "/path/to.sock" dials that socket instead
    {"op": "healthy", "resource": "akri.sh/x", "count": 2}          ->  {"ok": true}
    anything refused or failed                                      ->  {"error": "..."}
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

import grpc

from agent.protos import deviceplugin_pb2 as dp
from agent.protos import deviceplugin_pb2_grpc as dp_grpc

# As the kubelet dials plugins (see agent.node.plugin.CHANNEL_OPTIONS).
_OPTIONS = [("grpc.default_authority", "localhost")]


class KubeletFailed(Exception):
    """The kubelet process refused or failed a request; the message says why."""


class KubeletProcess:
    """A kubelet simulator in a child process, serving ``plugin_dir``'s ``kubelet.sock`` and
    PodResources on ``pod_resources_socket``, as ``KubeletSimulator`` in this one would."""

    def __init__(self, plugin_dir: str, pod_resources_socket: str, node_name: str) -> None:
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.node_name = node_name
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent.bench.kubelet",
                f"--plugin-dir={plugin_dir}",
                f"--pod-resources={pod_resources_socket}",
                f"--node={node_name}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._ask({"op": "ready"})  # kubelet.sock is there: the agent can register

    def allocate(self, resource: str, ids: list[list[str]], endpoint: str = "") -> float:
        """One Allocate, one container request per list of device ids; its milliseconds.
        ``endpoint`` dials that plugin socket instead of the one registered for ``resource``
        (a plugin the kubelet was never told of, as ``agent.bench.floor``'s)."""
        request = {"op": "allocate", "resource": resource, "ids": ids, "endpoint": endpoint}
        return float(self._ask(request)["ms"])

    def wait_healthy(self, resource: str, count: int, timeout: float = 20.0) -> None:
        self._ask({"op": "healthy", "resource": resource, "count": count, "timeout": timeout})

    def stop(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()  # the child stops its kubelet and exits
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the kubelet process ended (exit code {proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise KubeletFailed(answer["error"])
        return answer


# --- the child ------------------------------------------------------------------------------
class _Child:
    def __init__(self, kubelet: Any) -> None:
        self.kubelet = kubelet
        self.stubs: dict[str, Any] = {}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ready":
            return {"ok": True}
        if op == "healthy":
            self.kubelet.wait_devices(
                request["resource"],
                lambda d: sum(h == "Healthy" for h in d.values()) == request["count"],
                timeout=request.get("timeout", 20.0),
            )
            return {"ok": True}
        if op == "allocate":
            return self.allocate(request["resource"], request["ids"], request.get("endpoint", ""))
        return {"error": f"unknown op {op!r}"}

    def allocate(self, resource: str, ids: list[list[str]], endpoint: str) -> dict[str, Any]:
        stub = self.stubs.get(endpoint or resource)
        if stub is None:
            path = endpoint or self.kubelet.resources()[resource].endpoint
            channel = grpc.insecure_channel("unix://" + path, options=_OPTIONS)
            stub = self.stubs[endpoint or resource] = dp_grpc.DevicePluginStub(channel)
        message = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=i) for i in ids]
        )
        started = time.perf_counter()
        try:
            stub.Allocate(message, timeout=10)
        except grpc.RpcError as exc:
            return {"error": f"{exc.code()}: {exc.details()}"}
        return {"ms": (time.perf_counter() - started) * 1000}


def main(argv: list[str] | None = None) -> None:
    from agent.simulator.kubelet import KubeletSimulator

    parser = argparse.ArgumentParser(description="kubelet simulator driven over stdin")
    parser.add_argument("--plugin-dir", required=True)
    parser.add_argument("--pod-resources", required=True)
    parser.add_argument("--node", required=True)
    args = parser.parse_args(argv)
    kubelet = KubeletSimulator(args.plugin_dir, args.pod_resources, args.node)
    kubelet.start()
    child = _Child(kubelet)
    try:
        for line in sys.stdin:
            try:
                answer = child.handle(json.loads(line))
            except Exception as exc:  # the parent gets the reason, the child keeps serving
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)
    finally:
        kubelet.stop()


if __name__ == "__main__":
    main()
