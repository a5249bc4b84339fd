"""Benchmark of the Configuration-level plugin's Allocate.

``cl-allocate``: one Allocate for 4 unique devices (one container request naming 4 vdevs of
``akri.sh/<configuration>``, 4 Instances) against single-device Allocates of the per-Instance
plugins, in the same run, over gRPC as the kubelet calls them, with the API server in its own
process (``agent.bench.agent``'s setup). The CL plugin writes the 4 claims concurrently, so
the 4-device call should cost little more than a 1-device one: ``ratio_p50`` is the p50 of the
former over the p50 of the latter. Every claim is released between calls, untimed, through
the agent's claim store as the reconciler would. The kubelet, and so the calls, run in a
process of their own, as on a node (``agent.bench.kubelet``).

Next to it the same run times ``agent.bench.floor``'s plugin, whose Allocate is nothing but
its conditional writes (4 concurrent, or 1): ``floor_ratio_p50`` is the ratio an agent that
added nothing to its writes would print, the bound the machine and the client stack set.

``over_floor_p50`` is the 4-device Allocate's p50 over the floor's 4-write Allocate's. The
``sustained_*`` figures time the same two calls back to back, nothing settled between them,
while ``agent.bench.agent.Churn`` keeps the watch, the device lists and the reconciler busy.

What bounds the ratio: a claim's time in the agent is mostly CPU in the HTTP client stack
(kubernetes client, urllib3, http.client), and the agent's threads share one interpreter lock,
so four concurrent claims overlap only the API server's share and the network waits.
"""

from __future__ import annotations

import time
from typing import Any

from agent.bench import ensure_migrated, percentile
from agent.bench.agent import (
    CONFIG,
    Churn,
    _healthy,
    _settle,
    _version,
    agents,
    configuration,
)
from agent.bench.floor import FloorPlugin
from agent.bench.kubelet import KubeletProcess
from agent.domain.naming import cl_device_id, cl_resource_name, il_resource_name, slot_key
from agent.node.agent import NodeAgent

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


def _release_all(agent: NodeAgent, instances: list[str]) -> list[tuple[str, str]]:
    """Free every slot this node holds, as the reconciler would once the pod is gone; the
    (Instance, resourceVersion) of each write, for ``_settle``."""
    written = []
    for name in instances:
        state = agent.view.state(name)
        assert state is not None
        for key in state.held_by(agent.node_name):
            value = state.device_usage[key]
            result = agent.claims.release(name, key, value, current=agent.view.instance(name))
            if result != "released":
                raise RuntimeError(f"{key} held by {value!r} could not be released: {result!r}")
            written.append((name, _version(agent.claims.last_seen.get(name))))
    if not written:
        raise RuntimeError("the timed Allocate left nothing to release: it claimed nothing")
    return written


def bench_cl_allocate(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    """Slot reconciler on, as runagent runs; each round: one 4-device CL Allocate, then one
    single-slot IL Allocate on each of the 4 Instances, each after the previous call's
    background work settled."""
    ensure_migrated()
    rounds = 50 if quick else 400
    descriptions = [f"cam{i}" for i in range(DEVICES)]
    with agents(["node-a"], reconcile=True, kubelet_process=True) as (api, [node], kubeconfig):
        api.create_configuration(configuration(descriptions))  # uniqueDevices defaults to true
        agent = node.agent
        kubelet = node.kubelet
        assert isinstance(kubelet, KubeletProcess)
        instances = _instances(agent, DEVICES)
        resource = cl_resource_name(CONFIG)
        _healthy(kubelet, resource, DEVICES)
        for name in instances:
            _healthy(kubelet, il_resource_name(name), 2)
        cl_call = (resource, [[cl_device_id(CONFIG, n) for n in range(DEVICES)]])
        singles = [(il_resource_name(name), [[slot_key(name, 0)]]) for name in instances]
        # The floor plugin writes slot 1 of each Instance (the agent's claims take slot 0).
        floor_slots = {slot_key(name, 1): name for name in instances}
        floor = FloorPlugin.beside(agent, kubeconfig, floor_slots).start()
        cl_ms: list[float] = []
        single_ms: list[float] = []
        four_ms: list[float] = []  # the 4 single calls of a round, added up
        floor_ms: list[float] = []
        floor_single_ms: list[float] = []
        try:
            for i in range(rounds + WARM_UP):
                elapsed = kubelet.allocate(*cl_call)
                _check_unique(agent, instances)
                _settle(agent, *_release_all(agent, instances))
                singles_ms = []
                for call in singles:
                    singles_ms.append(kubelet.allocate(*call))
                    _settle(agent, *_release_all(agent, instances))
                floor_four = kubelet.allocate(resource, [list(floor_slots)], floor.socket_path)
                _settle(agent, *floor.versions.items())
                floor_singles = []
                for key in floor_slots:
                    floor_singles.append(kubelet.allocate(resource, [[key]], floor.socket_path))
                    _settle(agent, *floor.versions.items())
                if i >= WARM_UP:
                    cl_ms.append(elapsed)
                    single_ms.extend(singles_ms)
                    four_ms.append(sum(singles_ms))
                    floor_ms.append(floor_four)
                    floor_single_ms.extend(floor_singles)
        finally:
            floor.stop()
    busy_ms, busy_floor_ms, churn = _sustained(rounds)
    p50, single_p50 = percentile(cl_ms, 50), percentile(single_ms, 50)
    floor_p50, floor_single_p50 = percentile(floor_ms, 50), percentile(floor_single_ms, 50)
    busy_p50, busy_floor_p50 = percentile(busy_ms, 50), percentile(busy_floor_ms, 50)
    return {
        "p50_ms": p50,
        "p99_ms": percentile(cl_ms, 99),
        "over_floor_p50": p50 / floor_p50,
        "single_p50_ms": single_p50,
        "single_p99_ms": percentile(single_ms, 99),
        "ratio_p50": p50 / single_p50,
        "four_singles_p50_ms": percentile(four_ms, 50),
        "floor_p50_ms": floor_p50,
        "floor_single_p50_ms": floor_single_p50,
        "floor_ratio_p50": floor_p50 / floor_single_p50,
        "sustained_p50_ms": busy_p50,
        "sustained_p99_ms": percentile(busy_ms, 99),
        "sustained_floor_p50_ms": busy_floor_p50,
        "sustained_over_floor_p50": busy_p50 / busy_floor_p50,
        "sustained_churn_writes": churn.writes,
        "rounds": rounds,
    }


def _sustained(rounds: int) -> tuple[list[float], list[float], Churn]:
    """4-device CL Allocates and the floor's 4-write Allocates, alternating which goes first,
    back to back under ``Churn``; each CL answer checked, its claims released untimed."""
    descriptions = [f"cam{i}" for i in range(DEVICES)]
    with agents(["node-a"], reconcile=True, kubelet_process=True) as (api, [node], kubeconfig):
        api.create_configuration(configuration(descriptions))
        agent, kubelet = node.agent, node.kubelet
        assert isinstance(kubelet, KubeletProcess)
        instances = _instances(agent, DEVICES)
        resource = cl_resource_name(CONFIG)
        _healthy(kubelet, resource, DEVICES)
        cl_call = (resource, [[cl_device_id(CONFIG, n) for n in range(DEVICES)]])
        floor_slots = {slot_key(name, 1): name for name in instances}
        floor = FloorPlugin.beside(agent, kubeconfig, floor_slots).start()
        churn = Churn(kubeconfig, api.namespace, "node-a").start()
        cl_ms: list[float] = []
        floor_ms: list[float] = []
        try:
            churn.wait_running()
            for i in range(rounds + WARM_UP):
                floor_first = i % 2 == 1
                if floor_first:
                    floor_four = kubelet.allocate(resource, [list(floor_slots)], floor.socket_path)
                elapsed = kubelet.allocate(*cl_call)
                _check_unique(agent, instances)
                _release_all(agent, instances)
                if not floor_first:
                    floor_four = kubelet.allocate(resource, [list(floor_slots)], floor.socket_path)
                if i >= WARM_UP:
                    cl_ms.append(elapsed)
                    floor_ms.append(floor_four)
        finally:
            churn.stop()
            floor.stop()
    return cl_ms, floor_ms, churn


def _check_unique(agent: NodeAgent, instances: list[str]) -> None:
    """The answer stood for 4 distinct Instances, one slot each: a bench that measured
    something else would lie."""
    held = {}
    for name in instances:
        state = agent.view.state(name)
        held[name] = len(state.held_by(agent.node_name)) if state is not None else 0
    if set(held.values()) != {1}:
        raise RuntimeError(f"one slot on each of {DEVICES} Instances expected, held: {held}")
