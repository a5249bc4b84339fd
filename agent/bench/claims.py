"""Benchmarks of the claim store against the API-server simulator."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from agent.bench import ensure_migrated, percentile
from agent.domain.naming import slot_key
from agent.domain.slots import initial_usage
from agent.kube import cache
from agent.kube.claims import ClaimStore, SlotTaken
from agent.kube.client import JSON_PATCH, AkriApi, new_api_client
from agent.kube.watch import CacheSync
from agent.simulator.apiserver import ApiServerSimulator


def instance_body(
    name: str, capacity: int, configuration: str = "bench", nodes: Sequence[str] = ("node-a",)
) -> dict[str, Any]:
    """A shared Instance as our agents create it, every slot free (benches and tests)."""
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": name},
        "spec": {
            "configurationName": configuration,
            "cdiName": f"akri.sh/{configuration}={name[-6:]}",
            "capacity": capacity,
            "shared": True,
            "nodes": list(nodes),
            "brokerProperties": {},
            "deviceUsage": initial_usage(name, capacity),
        },
    }


def bench_claims(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    ensure_migrated()
    rounds = 100 if quick else 1000
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    with ApiServerSimulator() as sim:
        sim.ensure_namespace(namespace)
        path = _kubeconfig(sim)
        api = AkriApi(new_api_client(path), namespace)
        # As in the agent: the cache write runs behind the claim, in order with the watch.
        sync = CacheSync(new_api_client(path), namespace, owner="bench").start()
        sync.wait_synced()
        store = ClaimStore(api, "node-a", sync=sync)
        name = "bench-claims-000001"
        api.create_instance(instance_body(name, 4))
        key = slot_key(name, 0)
        # Warm up the connection pool and the code paths before measuring.
        for _ in range(20):
            store.claim(name, key, "node-a")
            store.release(name, key, "node-a")
        # Store calls and bare writes interleave, so both meet the same background work
        # (the store's queued cache writes run behind its calls, in the applier thread).
        store_ms: list[float] = []
        bare_ms: list[float] = []
        bare_key = slot_key(name, 1)
        value = ""
        for _ in range(rounds):
            store_ms.append(_timed(store.claim, name, key, "node-a", expect="claimed"))
            store_ms.append(_timed(store.release, name, key, "node-a", expect="released"))
            for _ in range(2):
                new = "" if value else "node-a"
                ops = [
                    {"op": "test", "path": f"/spec/deviceUsage/{bare_key}", "value": value},
                    {"op": "replace", "path": f"/spec/deviceUsage/{bare_key}", "value": new},
                ]
                started = time.perf_counter()
                api.custom.patch_namespaced_custom_object(
                    "akri.sh", "v0", namespace, "instances", name, ops, _content_type=JSON_PATCH
                )
                bare_ms.append((time.perf_counter() - started) * 1000)
                value = new
        final = api.get_instance(name)["spec"]["deviceUsage"]
        if final[key] != "" or final[bare_key] != value:
            raise RuntimeError(f"the timed writes did not land as made: {final}")
        sync.drain(30)
        sync.stop()
    p50, bare_p50 = percentile(store_ms, 50), percentile(bare_ms, 50)
    return {
        "p50_ms": p50,
        "p99_ms": percentile(store_ms, 99),
        "bare_p50_ms": bare_p50,
        "ratio_p50": p50 / bare_p50,
        "ops": len(store_ms),
    }


def _timed(call: Any, *args: Any, expect: str) -> float:
    """Milliseconds of one claim store call, which must have written (``expect``): a call
    that answered "already ours" or "already free" measured nothing."""
    started = time.perf_counter()
    result = call(*args)
    elapsed = (time.perf_counter() - started) * 1000
    if result != expect:
        raise RuntimeError(f"{call.__name__}{args} answered {result!r}, not {expect!r}")
    return elapsed


def run_contention(
    api_clients: list[Any], namespace: str, rounds: int, capacity: int = 3
) -> dict[str, object]:
    """The race: every claimer wants one slot of one Instance each round. Also used by tests."""
    admin = AkriApi(api_clients[0], namespace)
    name = f"contended-{uuid.uuid4().hex[:6]}"
    cache.apply_instance(admin.create_instance(instance_body(name, capacity)))
    keys = [slot_key(name, i) for i in range(capacity)]
    stores = [ClaimStore(AkriApi(c, namespace), f"node-{i}") for i, c in enumerate(api_clients)]
    double_holders = 0
    wrong_winner_counts = 0
    losers_told_taken = 0
    losers_other = 0
    claims = 0
    elapsed = 0.0
    # Persistent claimer threads (each keeps its database connection), in lock-step rounds.
    results: dict[int, str | None] = {}
    start_round = threading.Barrier(len(stores) + 1)
    end_round = threading.Barrier(len(stores) + 1)

    def claimer(i: int, store: ClaimStore) -> None:
        node = f"node-{i}"
        for _ in range(rounds):
            start_round.wait()
            try:
                for key in keys:
                    try:
                        store.claim(name, key, node, current=store.last_seen.get(name))
                        results[i] = key
                        break
                    except SlotTaken:
                        continue
                else:
                    results[i] = None
            finally:
                end_round.wait()

    threads = [
        threading.Thread(target=claimer, args=(i, s), daemon=True) for i, s in enumerate(stores)
    ]
    for thread in threads:
        thread.start()
    for _ in range(rounds):
        results.clear()
        started = time.perf_counter()
        start_round.wait()
        end_round.wait()
        elapsed += time.perf_counter() - started
        winners = {i: key for i, key in results.items() if key}
        claims += len(winners)
        losers = [i for i in range(len(stores)) if i not in winners]
        losers_told_taken += sum(1 for i in losers if i in results and results[i] is None)
        losers_other += sum(1 for i in losers if i not in results)
        if len(winners) != capacity:
            wrong_winner_counts += 1
        usage = admin.get_instance(name)["spec"]["deviceUsage"]
        held = [usage[k] for k in keys if usage.get(k)]
        if len(held) != len(set(held)) or len(set(winners.values())) != len(winners):
            double_holders += 1
        owners = {key: f"node-{i}" for i, key in winners.items()}
        double_holders += sum(1 for key in keys if usage.get(key) and usage[key] != owners.get(key))
        for i, key in winners.items():
            stores[i].release(name, key, f"node-{i}")
    for thread in threads:
        thread.join(timeout=10)
    return {
        "claims_per_s": claims / elapsed if elapsed else 0.0,
        "double_holders": double_holders,
        "wrong_winner_counts": wrong_winner_counts,
        "losers_told_taken": losers_told_taken,
        "losers_other": losers_other,
        "rounds": rounds,
    }


def bench_contention(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    ensure_migrated()
    rounds = 20 if quick else 200
    with ApiServerSimulator() as sim:
        path = _kubeconfig(sim)
        clients = [new_api_client(path) for _ in range(20)]
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        sim.ensure_namespace(namespace)
        return run_contention(clients, namespace, rounds)


def _kubeconfig(sim: ApiServerSimulator) -> str:
    import tempfile

    path = tempfile.mkstemp(prefix="akri-kubeconfig-", suffix=".yaml")[1]
    sim.write_kubeconfig(path)
    return path
