"""Benchmark of the Configuration-level plugin's Allocate.

``cl-allocate``: one Allocate for 4 unique devices (one container request naming 4 vdevs of
``akri.sh/<configuration>``, 4 Instances) against single-device Allocates of the per-Instance
plugins, in the same run, over gRPC as the kubelet calls them, with the API server in its own
process (``agent.bench.agent``'s setup). The CL plugin writes the 4 claims concurrently, so
the 4-device call should cost little more than a 1-device one: ``ratio_p50`` is the p50 of the
former over the p50 of the latter. Every claim is released between calls, untimed, through
the agent's claim store as the reconciler would.

What bounds the ratio: a claim's time in the agent is mostly CPU in the HTTP client stack
(kubernetes client, urllib3, http.client), and the agent's threads share one interpreter lock,
so four concurrent claims overlap only the API server's share and the network waits.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from agent.bench import ensure_migrated, percentile
from agent.bench.agent import CONFIG, _healthy, _settle, agents, configuration
from agent.domain.naming import cl_device_id, cl_resource_name, il_resource_name, slot_key
from agent.node.agent import NodeAgent
from agent.protos import deviceplugin_pb2 as dp
from agent.protos import deviceplugin_pb2_grpc as dp_grpc

DEVICES = 4
WARM_UP = 10


def _instances(agent: NodeAgent, count: int) -> list[str]:
    """Names of ``count`` Instances once this node's view has them all."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        names = sorted(o["metadata"]["name"] for o in agent.view.instances(CONFIG))
        if len(names) >= count:
            return names[:count]
        time.sleep(0.02)
    raise TimeoutError(f"{count} Instances of {CONFIG} did not appear")


def _request(ids: list[str]) -> dp.AllocateRequest:
    return dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])


def _release_all(agent: NodeAgent, instances: list[str]) -> None:
    """Free every slot this node holds, as the reconciler would once the pod is gone."""
    for name in instances:
        state = agent.view.state(name)
        assert state is not None
        for key in state.held_by(agent.node_name):
            value = state.device_usage[key]
            agent.claims.release(name, key, value, current=agent.view.instance(name))


def _quiet(agent: NodeAgent) -> None:
    """The previous call's background work done (cache writes, and the reconciler's
    write-behind, which four claims make four times as much of) before the next timed call."""
    _settle(agent)
    flush = getattr(agent.reconciler, "flush", None)
    if flush is not None:
        flush()


def _timed(stub: dp_grpc.DevicePluginStub, request: dp.AllocateRequest) -> float:
    started = time.perf_counter()
    stub.Allocate(request, timeout=10)
    return (time.perf_counter() - started) * 1000


def bench_cl_allocate(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    """Slot reconciler on, as runagent runs; each round: one 4-device CL Allocate, then one
    single-slot IL Allocate on each of the 4 Instances, each after the previous call's
    background work settled."""
    ensure_migrated()
    rounds = 50 if quick else 400
    descriptions = [f"cam{i}" for i in range(DEVICES)]
    with agents(["node-a"], reconcile=True) as (api, [node], _):
        api.create_configuration(configuration(descriptions))  # uniqueDevices defaults to true
        agent = node.agent
        instances = _instances(agent, DEVICES)
        resource = cl_resource_name(CONFIG)
        _healthy(node.kubelet, resource, DEVICES)
        for name in instances:
            _healthy(node.kubelet, il_resource_name(name), 2)
        channels: list[grpc.Channel] = []

        def stub_for(resource_name: str) -> dp_grpc.DevicePluginStub:
            endpoint = node.kubelet.resources()[resource_name].endpoint
            channel = grpc.insecure_channel(
                "unix://" + endpoint, options=[("grpc.default_authority", "localhost")]
            )
            channels.append(channel)
            return dp_grpc.DevicePluginStub(channel)

        cl_stub = stub_for(resource)
        cl_request = _request([cl_device_id(CONFIG, n) for n in range(DEVICES)])
        singles = [
            (stub_for(il_resource_name(name)), _request([slot_key(name, 0)])) for name in instances
        ]
        cl_ms: list[float] = []
        single_ms: list[float] = []
        four_ms: list[float] = []  # the 4 single calls of a round, added up
        for i in range(rounds + WARM_UP):
            _quiet(agent)
            elapsed = _timed(cl_stub, cl_request)
            _check_unique(agent, instances)
            _release_all(agent, instances)
            singles_ms = []
            for stub, request in singles:
                _quiet(agent)
                singles_ms.append(_timed(stub, request))
                _release_all(agent, instances)
            if i >= WARM_UP:
                cl_ms.append(elapsed)
                single_ms.extend(singles_ms)
                four_ms.append(sum(singles_ms))
        for channel in channels:
            channel.close()
    p50, single_p50 = percentile(cl_ms, 50), percentile(single_ms, 50)
    return {
        "p50_ms": p50,
        "p99_ms": percentile(cl_ms, 99),
        "single_p50_ms": single_p50,
        "single_p99_ms": percentile(single_ms, 99),
        "ratio_p50": p50 / single_p50,
        "four_singles_p50_ms": percentile(four_ms, 50),
        "rounds": rounds,
    }


def _check_unique(agent: NodeAgent, instances: list[str]) -> None:
    """The answer stood for 4 distinct Instances, one slot each: a bench that measured
    something else would lie."""
    held = {}
    for name in instances:
        state = agent.view.state(name)
        held[name] = len(state.held_by(agent.node_name)) if state is not None else 0
    if set(held.values()) != {1}:
        raise RuntimeError(f"one slot on each of {DEVICES} Instances expected, held: {held}")
