"""The kubelet's side of a timed Allocate, in a process of its own.

On a node the kubelet is a separate program: the gRPC client work of an Allocate (building
the request, C-core's completion queue, decoding the answer) never runs in the agent's
interpreter. A bench that calls Allocate from the agent's own process makes the agent's
threads share one interpreter lock with that client work as well, and measures a contention
no node has. So the timed calls come from this small program (no Django, only gRPC and the
generated protocol code), driven over its stdin and stdout by ``KubeletCaller``: one JSON
line per call, the elapsed milliseconds measured here, around the call alone.

    {"endpoint": "/path/to/plugin.sock", "ids": [["dev-0"], ["dev-1"]]}
    -> {"ms": 1.234} or {"error": "StatusCode.UNKNOWN: ..."}
"""

from __future__ import annotations

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


class CallFailed(Exception):
    """The Allocate was refused or failed; the message is gRPC's status and details."""


class KubeletCaller:
    """A child process that makes Allocate calls on request and times them."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "agent.bench.caller"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def allocate(self, endpoint: str, ids: list[list[str]]) -> float:
        """One Allocate with one container request per list of device ids; its milliseconds."""
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"endpoint": endpoint, "ids": ids}) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the caller process ended (exit code {proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise CallFailed(answer["error"])
        self.last = answer
        return float(answer["ms"])

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()

    def __enter__(self) -> KubeletCaller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call(stubs: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    endpoint = request["endpoint"]
    if endpoint not in stubs:
        channel = grpc.insecure_channel("unix://" + endpoint, options=_OPTIONS)
        stubs[endpoint] = dp_grpc.DevicePluginStub(channel)
    message = dp.AllocateRequest(
        container_requests=[dp.ContainerAllocateRequest(devices_ids=ids) for ids in request["ids"]]
    )
    started = time.perf_counter()
    try:
        stubs[endpoint].Allocate(message, timeout=10)
    except grpc.RpcError as exc:
        return {"error": f"{exc.code()}: {exc.details()}"}
    end = time.perf_counter()
    return {"ms": (end - started) * 1000, "t0": started, "t1": end}


def main() -> None:
    stubs: dict[str, Any] = {}
    for line in sys.stdin:
        print(json.dumps(_call(stubs, json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
