"""Benchmarks of queue charges: ``charges`` (full and incremental recompute over a large
cache) and ``webhook`` (AdmissionReview round trips over HTTP under 50 concurrent clients, to
``runweb`` as deploy/ serves the webhook).

``charges`` fills the cache with 200 KAI queues, 20,000 pods and 5,000 claims (2,500 DRA
ResourceClaims reserved for 4 pods each, 2,500 Akri Instances with 4 slots held by pods), a
tenth of them shared across queues and half already labelled, then times a full recompute
(steady state: rows exist; ``first_ms`` is the first one, which creates them) and the
recompute of one claim after one pod is bound or gone. No API server: labels are not written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.db import transaction

from agent.bench import ensure_migrated, percentile

QUEUES = 200
CLAIMS = 2500  # of each kind
USERS = 4  # pods per claim


class _Rollback(Exception):
    pass


def fill(tag: str, claims: int = CLAIMS) -> list[str]:
    """The bench cache; returns the claim keys."""
    from agent.models import Instance, Slot
    from agent.queues.models import QueueObject, QueuePod, QueueSystem, ResourceClaim

    QueueSystem.objects.update_or_create(kind="kai-queue", defaults={"present": True})
    QueueObject.objects.bulk_create(
        QueueObject(kind="kai-queue", name=f"q{i}") for i in range(QUEUES)
    )
    pods = []
    for i in range(claims * 2 * USERS):
        # Claim c uses pods c*4..c*4+3; one claim in ten mixes queues.
        claim = i // USERS
        queue = (claim + (i % USERS if claim % 10 == 0 else 0)) % QUEUES
        pods.append(
            QueuePod(
                namespace=tag,
                name=f"p{i}",
                uid=f"{tag}-u{i}",
                labels={"kai.scheduler/queue": f"q{queue}", "app": "train"},
                annotations={},
                priority=50,
                created=f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z",
            )
        )
    QueuePod.objects.bulk_create(pods, batch_size=2000)
    label = "akri-site.io/queue"
    ResourceClaim.objects.bulk_create(
        (
            ResourceClaim(
                namespace=tag,
                name=f"rc{c}",
                labels={label: pods[c * USERS].labels["kai.scheduler/queue"]} if c % 2 else {},
                device_classes=["gpu.example.com"],
                allocated=1,
                reserved_for=[
                    {"resource": "pods", "name": f"p{i}", "uid": f"{tag}-u{i}"}
                    for i in range(c * USERS, c * USERS + USERS)
                ],
            )
            for c in range(claims)
        ),
        batch_size=1000,
    )
    instances = Instance.objects.bulk_create(
        (
            Instance(namespace=tag, name=f"cam-{c:06d}", configuration_name="cam", capacity=USERS)
            for c in range(claims)
        ),
        batch_size=1000,
    )
    slots = []
    for n, row in enumerate(instances):
        c = claims + n
        for s in range(USERS):
            i = c * USERS + s
            slots.append(
                Slot(
                    instance=row,
                    key=f"{row.name}-{s}",
                    index=s,
                    value="node-a",
                    level="IL",
                    holder_node="node-a",
                    pod_namespace=tag,
                    pod_name=f"p{i}",
                    pod_uid=f"{tag}-u{i}",
                )
            )
    Slot.objects.bulk_create(slots, batch_size=2000)
    return [f"resourceclaim:{tag}/rc{c}" for c in range(claims)] + [
        f"instance:{tag}/{row.name}" for row in instances
    ]


def _check_charges(tag: str, claims: int) -> None:
    """What the timed recompute must have stored, from the bench's own data: a charge per claim
    and per Instance, and each labelled claim owned by its label's queue (the claim's first
    pod's: q<c mod QUEUES>). Fails loudly otherwise: a recompute that decided nothing would be
    timed as fast."""
    from agent.queues.models import Charge

    rows = {(r.kind, r.name): r for r in Charge.objects.filter(namespace=tag)}
    if len(rows) != claims * 2:
        raise RuntimeError(f"charges: the recompute stored {len(rows)} of {claims * 2} charges")
    for c in range(1, claims, 2):
        owner = rows[("resourceclaim", f"rc{c}")].owner
        if owner != f"q{c % QUEUES}":
            raise RuntimeError(f"charges: rc{c} owned by {owner!r}, not q{c % QUEUES}")


def bench_charges(quick: bool = False, stdout: Any = None) -> dict[str, object]:

    from agent.queues import recompute
    from agent.queues.models import ResourceClaim

    ensure_migrated()
    claims = 250 if quick else CLAIMS
    figures: dict[str, object] = {}
    try:
        with transaction.atomic():
            tag = f"bench-{uuid.uuid4().hex[:6]}"
            keys = fill(tag, claims)
            started = time.perf_counter()
            recompute.recompute(None)
            first = (time.perf_counter() - started) * 1000
            _check_charges(tag, claims)
            full = []
            for _ in range(2 if quick else 5):
                started = time.perf_counter()
                recompute.recompute(None)
                full.append((time.perf_counter() - started) * 1000)
            steps = []
            rounds = 40 if quick else 200
            for n in range(rounds):
                c = (n * 37) % claims
                claim = ResourceClaim.objects.get(namespace=tag, name=f"rc{c}")
                # One pod gone, then bound again: the claim's reservedFor changes.
                if n % 2 == 0:
                    claim.reserved_for = claim.reserved_for[:-1]
                else:
                    i = c * USERS + USERS - 1
                    claim.reserved_for = claim.reserved_for[:-1] + [
                        {"resource": "pods", "name": f"p{i}", "uid": f"{tag}-u{i}"}
                    ]
                claim.save(update_fields=["reserved_for"])
                started = time.perf_counter()
                recompute.recompute([keys[c]])
                steps.append((time.perf_counter() - started) * 1000)
            figures = {
                "full_ms": percentile(full, 50),
                "first_ms": first,
                "incremental_p50_ms": percentile(steps, 50),
                "incremental_p95_ms": percentile(steps, 95),
                "claims": claims * 2,
                "pods": claims * 2 * USERS,
                "queues": QUEUES,
                "target_full_ms": 1000,
                "target_incremental_p95_ms": 50,
            }
            raise _Rollback
    except _Rollback:
        pass
    return figures


# --- webhook -----------------------------------------------------------------------------------
def review(uid: str, priority: int, queue: str) -> bytes:
    return json.dumps(
        {
            "kind": "AdmissionReview",
            "apiVersion": "admission.k8s.io/v1",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "bench",
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": uid, "labels": {"kai.scheduler/queue": queue}},
                    "spec": {
                        "priority": priority,
                        "containers": [{"name": "main", "image": "busybox"}],
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": "rc1"}],
                    },
                },
            },
        }
    ).encode()


def bench_webhook(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    from django.conf import settings

    from agent.queues import recompute

    ensure_migrated()
    if not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        raise SystemExit("webhook: run on the embedded SQLite database (unset DATABASE_URL)")
    tag = "bench"
    _clear(tag)
    fill(tag, 50)
    recompute.recompute(None)
    try:
        with serving(settings.DATABASES["default"]["NAME"]) as (port, workers):
            total = 500 if quick else 5000
            # One client first: the cost of a review alone, against which queueing shows.
            single, _ = asyncio.run(_hammer(port, 100 if quick else 500, 1))
            latencies, denied = asyncio.run(_hammer(port, total, 50))
    finally:
        _clear(tag)
    # Every odd review asks for a claim of another queue's at priority 125 (not preemptible):
    # refused; the even ones (priority 50, preemptible) are let in.
    if denied != total // 2:
        raise RuntimeError(f"webhook: {denied} of {total} reviews refused, {total // 2} expected")
    return {
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "p50_ms_1": percentile(single, 50),
        "p99_ms_1": percentile(single, 99),
        "requests": len(latencies),
        "concurrency": 50,
        "workers": workers,
        "denied": denied,
        "target_p99_ms": 20,
    }


@contextlib.contextmanager
def serving(sqlite_path: str) -> Iterator[tuple[int, int]]:
    """``manage.py runweb`` on a free port over the bench's SQLite file, as deploy/ runs the
    webhook container: one uvicorn worker per core (sharing a private Redis for the channel
    layer, as the demo's; one worker without redis-server). Yields (port, workers)."""
    from agent.bench.live import _free_port, _wait_port
    from akri_site.webserve import default_workers, private_redis

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    # Refusals are logged at INFO; the console is not what is measured.
    env.update(AKRI_SQLITE_PATH=sqlite_path, LOG_LEVEL="WARNING")
    with private_redis() as redis_url:
        workers = default_workers() if redis_url else 1
        if redis_url:
            env["AKRI_CHANNEL_REDIS_URL"] = redis_url
        command = [sys.executable, "manage.py", "runweb", "--port", str(port)]
        server = subprocess.Popen(
            [*command, "--workers", str(workers)],
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=None if os.environ.get("AKRI_BENCH_VERBOSE") else subprocess.DEVNULL,
        )
        try:
            _wait_port(port)
            yield port, workers
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _clear(tag: str) -> None:
    from agent.models import Instance
    from agent.queues.models import Charge, QueueObject, QueuePod, ResourceClaim

    Instance.objects.filter(namespace=tag).delete()
    QueuePod.objects.filter(namespace=tag).delete()
    ResourceClaim.objects.filter(namespace=tag).delete()
    Charge.objects.filter(namespace=tag).delete()
    QueueObject.objects.filter(kind="kai-queue").delete()


async def _hammer(port: int, total: int, concurrency: int) -> tuple[list[float], int]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/webhooks/pods/validate"
    latencies: list[float] = []
    denied = 0
    counter = iter(range(total))

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal denied
        for n in counter:
            # Half of the pods are non-preemptible and foreign to rc1's owner: refused.
            body = review(f"r{n}", 125 if n % 2 else 50, "q7")
            started = time.perf_counter()
            async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                answer = await r.json()
            latencies.append((time.perf_counter() - started) * 1000)
            if r.status != 200:
                raise RuntimeError(f"webhook answered {r.status}: {answer}")
            denied += not answer["response"]["allowed"]

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        await worker_warmup(http, url)
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return latencies, denied


async def worker_warmup(http, url: str) -> None:
    for n in range(20):
        async with http.post(url, data=review(f"w{n}", 0, "q1")) as r:
            await r.read()
