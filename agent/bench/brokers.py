"""The ``brokers`` benchmark: 1,000 Instances appear at once on 50 nodes; how long until every
broker pod and Service exists, with how many writes per object, and no duplicates.

The controller's broker part (its watches and dispatcher) starts after the Instances exist, as
after a controller restart, so all of them arrive at once (the relist). The work runs on a real
Celery worker on Redis (``AKRI_TEST_REDIS_URL`` / ``REDIS_URL``, four threads) when Redis
answers, else on the embedded runner. A ``PodRunner`` without kubelets reports each broker
pod Running, so the Services follow. Writes are counted at the API-server simulator: creates,
deletes and patches of Pods, Jobs and Services (pod status reports excluded).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from kubernetes import client

from agent.bench import ensure_migrated
from agent.bench.claims import instance_body
from agent.brokers.models import BrokerAction
from agent.brokers.specs import with_brokers
from agent.domain import brokers as rules
from agent.kube.client import AkriApi, new_api_client
from agent.simulator.apiserver import ApiServerSimulator

WRITE = re.compile(r"^/apis?/(v1|batch/v1)/namespaces/[^/]+/(pods|services|jobs)(/[^/]+)?$")
TIMEOUT = 600.0
QUICK_TIMEOUT = 120.0  # the smoke run fails fast rather than outlast its test


def bench_brokers(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    ensure_migrated()
    instances, nodes = (100, 10) if quick else (1000, 50)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    with ApiServerSimulator() as sim:
        path = tempfile.mkstemp(prefix="akri-kubeconfig-", suffix=".yaml")[1]
        sim.write_kubeconfig(path)
        settings.AKRI["KUBECONFIG"], settings.AKRI["NAMESPACE"] = path, namespace
        api_client = new_api_client(path)
        _world(api_client, namespace, instances, nodes)
        sim.request_log.clear()
        with _worker() as mode:
            seconds = _converge(
                api_client, path, namespace, instances, QUICK_TIMEOUT if quick else TIMEOUT
            )
        writes = sum(1 for r in sim.request_log if r.method != "GET" and WRITE.match(r.path))
        figures = _count(api_client, namespace)
        os.unlink(path)
    objects = 2 * instances + 1
    return {
        "converge_s": round(seconds, 2),
        "duplicates": figures["duplicates"],
        "api_writes_per_object": round(writes / objects, 3),
        "objects": objects,
        "creates_answered_409": BrokerAction.objects.filter(
            namespace=namespace, action=BrokerAction.Action.ADOPTED
        ).count(),
        "missing": max(0, objects - figures["objects"]),
        "mode": mode,
    }


def _world(api_client: client.ApiClient, namespace: str, instances: int, nodes: int) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": namespace}})
    names = [f"node-{i:02d}" for i in range(nodes)]
    for name in names:
        core.create_node({"metadata": {"name": name}})
    akri = AkriApi(api_client, namespace)
    config = {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": "bench"},
        "spec": {"discoveryHandler": {"name": "debugEcho", "discoveryDetails": ""}, "capacity": 1},
    }
    akri.create_configuration(with_brokers(config))
    bodies = [
        instance_body(f"bench-{i:06x}", 1, "bench", (names[i % nodes],)) for i in range(instances)
    ]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(akri.create_instance, bodies))


class _worker:
    """A Celery worker on Redis for the run when Redis answers; else the embedded runner."""

    def __enter__(self) -> str:
        from akri_site.celery import app, on_broker

        self.app = app
        self.saved = app.conf["task_always_eager"]
        self.contexts: list[Any] = []
        url = os.environ.get("AKRI_TEST_REDIS_URL") or settings.REDIS_URL or ""
        if not url or not _redis_answers(url):
            app.conf.update(task_always_eager=True)
            return "embedded"
        from celery.contrib.testing.worker import start_worker

        queue = f"bench-brokers-{uuid.uuid4().hex[:6]}"
        settings.CELERY_BROKER_URL = url
        self.contexts = [
            on_broker(url, queue),
            start_worker(
                app, pool="threads", concurrency=4, perform_ping_check=False, queues=[queue]
            ),
        ]
        for context in self.contexts:
            context.__enter__()
        return "celery"

    def __exit__(self, *exc: object) -> None:
        for context in reversed(self.contexts):
            context.__exit__(None, None, None)
        self.app.conf.update(task_always_eager=self.saved)


def _redis_answers(url: str) -> bool:
    import redis

    try:
        conn = redis.Redis.from_url(url, socket_connect_timeout=1)
        return bool(conn.ping())
    except redis.RedisError:
        return False


def _converge(
    api_client: client.ApiClient, path: str, namespace: str, instances: int, timeout: float
) -> float:
    from agent.brokers.controller import BrokerController
    from agent.kube.watch import CacheSync
    from agent.simulator.pod_runner import PodRunner

    core = client.CoreV1Api(api_client)
    t0 = time.perf_counter()
    sync = CacheSync(new_api_client(path), namespace, owner="bench-brokers").start()
    brokers = BrokerController(new_api_client(path), namespace, sync).start()
    runner = PodRunner(new_api_client(path), namespace).start()
    try:
        deadline = t0 + timeout
        while True:
            pods = core.list_namespaced_pod(namespace, label_selector=rules.CONFIGURATION_LABEL)
            running = sum(1 for p in pods.items if p.status.phase == "Running")
            services = len(core.list_namespaced_service(namespace).items)
            if running >= instances and services >= instances + 1:
                return time.perf_counter() - t0
            if time.perf_counter() >= deadline:
                break
            time.sleep(0.25)
        raise RuntimeError(
            f"brokers: not converged after {timeout:.0f} s: {len(pods.items)} broker pods, "
            f"{running} of {instances} running, {services} of {instances + 1} Services; "
            + _unserved(core, namespace, pods.items)
        )
    finally:
        runner.stop()
        brokers.stop()
        sync.stop()


def _unserved(core: client.CoreV1Api, namespace: str, pods: list[Any]) -> str:
    """What a run that did not converge left undone: Instances with a Running broker pod
    and no Service, and what the runs recorded for each (so that a failure tells its story)."""
    served = {
        (s.metadata.labels or {}).get(rules.INSTANCE_LABEL)
        for s in core.list_namespaced_service(namespace).items
    }
    lacking = sorted(
        {
            p.metadata.labels.get(rules.INSTANCE_LABEL)
            for p in pods
            if p.status.phase == "Running"
            and p.metadata.labels.get(rules.INSTANCE_LABEL) not in served
        }
    )
    told = []
    for name in lacking[:3]:
        actions = BrokerAction.objects.filter(namespace=namespace, instance=name).order_by("at")
        told.append(f"{name}: " + ", ".join(f"{a.action} {a.kind} {a.name}" for a in actions))
    return f"Running without a Service: {len(lacking)} ({'; '.join(told) or 'none'})"


def _count(api_client: client.ApiClient, namespace: str) -> dict[str, int]:
    core = client.CoreV1Api(api_client)
    pods = core.list_namespaced_pod(namespace).items
    services = core.list_namespaced_service(namespace).items
    targets = Counter(
        (
            p.metadata.labels.get(rules.INSTANCE_LABEL),
            p.metadata.labels.get(rules.TARGET_NODE_LABEL),
        )
        for p in pods
    )
    extra_pods = sum(n - 1 for n in targets.values())
    return {"duplicates": extra_pods, "objects": len(targets) + len(services)}
