"""``manage.py bench slotmap``: server time of the slot map at 2,000 Instances x 4 slots.

Builds the Instances inside a transaction that is rolled back at the end, so the database it
runs on is left as it was.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.contrib.auth.models import Group, User
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from akri_site.dashboard.sample import make_cluster


class _Rollback(Exception):
    pass


def bench_slotmap(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    from agent.bench import ensure_migrated, percentile

    ensure_migrated()
    rounds = 3 if quick else 15
    figures: dict[str, object] = {}
    try:
        with transaction.atomic():
            name = f"bench-slotmap-{uuid.uuid4().hex[:6]}"
            make_cluster(
                instances=2000,
                capacity=4,
                configuration=name,
                namespace=name,
                nodes=tuple(f"bench-node-{i}" for i in range(20)),
            )
            user = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}", is_staff=True)
            user.groups.add(Group.objects.get_or_create(name="operator")[0])
            client = Client()
            client.force_login(user)
            url = f"/slots/?configuration={name}"
            client.get(url)  # warm up
            times, size, queries = [], 0, 0
            for _ in range(rounds):
                with CaptureQueriesContext(connection) as captured:
                    started = time.perf_counter()
                    response = client.get(url)
                    times.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, response.status_code
                size, queries = len(response.content), len(captured)
            figures = {
                "server_ms": percentile(times, 50),
                "instances": 2000,
                "slots": 8000,
                "max_ms": max(times),
                "target_ms": 500,
                "bytes": size,
                "queries": queries,
            }
            raise _Rollback
    except _Rollback:
        pass
    return figures


def _insert_samples(rows: list[tuple]) -> None:
    """Bulk insert ``UsageSample`` rows the fastest way the database offers (COPY on
    PostgreSQL), inside the caller's transaction."""
    from agent.models import UsageSample

    table = UsageSample._meta.db_table
    columns = ("minute", "namespace", "configuration", "node", "held", "free", "foreign")
    quoted = ", ".join(connection.ops.quote_name(c) for c in columns)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ", ".join(["%s"] * len(columns))
            cursor.executemany(f"INSERT INTO {table} ({quoted}) VALUES ({marks})", rows)


def bench_history(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    """``manage.py bench history``: the usage chart's data for 7 days of a 500-node cluster,
    one sample a minute (a row per Configuration x node per minute, and the cluster-wide row).

    The samples are bulk inserted inside a transaction that is rolled back at the end (setup is
    not timed); then the chart's JSON request goes through Django's test client, whole range
    for the cluster (``server_ms``) and for one node (``node_ms``), p50 over the rounds.
    """
    from django.utils import timezone

    from agent.bench import ensure_migrated, percentile
    from agent.usage import minute_of

    ensure_migrated()
    days, nodes, rounds = (1, 50, 3) if quick else (7, 500, 7)
    name = f"bench-history-{uuid.uuid4().hex[:6]}"
    last = minute_of(timezone.now())
    minutes = days * 24 * 60
    figures: dict[str, object] = {}
    try:
        with transaction.atomic():
            started = time.perf_counter()
            names = [f"{name}-node-{i}" for i in range(nodes)]
            for first in range(last - minutes + 1, last + 1, 240):
                batch = []
                for minute in range(first, min(first + 240, last + 1)):
                    batch.append((minute, "default", name, "", nodes * 2, nodes * 2, 1))
                    for i, node in enumerate(names):
                        batch.append((minute, "default", name, node, 2, 4, int(i % 50 == 0)))
                _insert_samples(batch)
            setup_s = time.perf_counter() - started
            user = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}")
            user.groups.add(Group.objects.get_or_create(name="viewer")[0])
            client = Client()
            client.force_login(user)
            range_ = f"{days * 24}h" if days == 1 else "7d"
            cluster_url = f"/api/charts/usage/?range={range_}"
            node_url = f"{cluster_url}&node={names[nodes // 2]}"
            timings: dict[str, list[float]] = {cluster_url: [], node_url: []}
            points = rows = 0
            for url in (cluster_url, node_url):
                client.get(url)  # warm up
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    response = client.get(url)
                    timings[url].append((time.perf_counter() - t0) * 1000)
                    assert response.status_code == 200, response.content[:300]
                    data = response.json()
                    held = [v for v in data["held"] if v is not None]
                    # The chart really read the samples: every point holds the mean held count.
                    assert len(held) >= len(data["t"]) - 2, (len(held), len(data["t"]))
                    points = max(points, len(data["t"]))
            rows = (nodes + 1) * minutes
            figures = {
                "server_ms": percentile(timings[cluster_url], 50),
                "node_ms": percentile(timings[node_url], 50),
                "rows": rows,
                "points": points,
                "nodes": nodes,
                "days": days,
                "target_ms": 300,
                "setup_s": setup_s,
                "database": connection.vendor,
            }
            raise _Rollback
    except _Rollback:
        pass
    return figures


LIST_PAGES = ("configurations", "instances", "nodes", "pods", "brokers")


def _fill_scale(instances: int, nodes: int, prefix: str) -> None:
    """The ``scale`` benchmark's cluster, written straight into the cache: ``instances``
    Instances of 4 slots over ``nodes`` nodes (each seen by one node), one slot in four held
    by a Running pod, four Configurations, and a broker pod for every twentieth Instance
    (one in ten of those Pending)."""
    from django.utils import timezone

    from agent.brokers.models import Broker
    from agent.models import Configuration, Instance, Node, Pod, Slot

    now = timezone.now()
    configurations = [f"{prefix}-{c}" for c in ("onvif", "udev", "opcua", "debug")]
    Configuration.objects.bulk_create(
        Configuration(namespace=prefix, name=name, capacity=4, discovery_handler="onvif")
        for name in configurations
    )
    names = [f"{prefix}-node-{i:04d}" for i in range(nodes)]
    Node.objects.bulk_create(Node(name=n, ready=True, ready_since=now) for n in names)
    for first in range(0, instances, 2000):
        batch = range(first, min(first + 2000, instances))
        rows = Instance.objects.bulk_create(
            Instance(
                namespace=prefix,
                name=f"{prefix}-{i:06x}",
                configuration_name=configurations[i % len(configurations)],
                capacity=4,
                shared=True,
                nodes=[names[i % nodes]],
                created_at=now,
            )
            for i in batch
        )
        slots, pods, brokers = [], [], []
        for i, inst in zip(batch, rows, strict=True):
            node = names[i % nodes]
            for k in range(4):
                slot = Slot(instance=inst, key=f"{inst.name}-{k}", index=k)
                if k == 0:
                    slot.value, slot.level, slot.holder_node = node, Slot.Level.IL, node
                    slot.since, slot.pod_namespace, slot.pod_name = now, prefix, f"work-{i}"
                    pods.append(
                        Pod(
                            namespace=prefix,
                            name=f"work-{i}",
                            uid=f"{prefix}-{i}",
                            node_name=node,
                            phase="Running",
                            resources={f"akri.sh/{inst.name}": "1"},
                        )
                    )
                slots.append(slot)
            if i % 20 == 0:
                brokers.append(
                    Broker(
                        namespace=prefix,
                        kind=Broker.Kind.POD,
                        name=f"{node}-{inst.name}-pod",
                        configuration=inst.configuration_name,
                        instance=inst.name,
                        node=node,
                        phase="Pending" if i % 200 == 0 else "Running",
                        created_at=now,
                    )
                )
        Slot.objects.bulk_create(slots, batch_size=2000)
        Pod.objects.bulk_create(pods, batch_size=2000)
        Broker.objects.bulk_create(brokers, batch_size=2000)


def bench_lists(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    """``manage.py bench lists``: server time of each list page's first page (default sort, no
    filter) at the ``scale`` benchmark's size, 40,000 Instances on 1,000 nodes (10,000 held
    slots and their pods, 2,000 broker pods), p50 over the rounds after one request that warms
    the counts the pages reuse (``cold_ms``: the slowest of those first requests). The rows are
    written inside a transaction rolled back at the end (setup not timed)."""
    from agent.bench import ensure_migrated, percentile

    ensure_migrated()
    instances, nodes, rounds = (2000, 50, 3) if quick else (40000, 1000, 9)
    figures: dict[str, object] = {}
    try:
        with transaction.atomic():
            prefix = f"bench-lists-{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            _fill_scale(instances, nodes, prefix)
            setup_s = time.perf_counter() - started
            user = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}")
            user.groups.add(Group.objects.get_or_create(name="viewer")[0])
            client = Client()
            client.force_login(user)
            timings: dict[str, list[float]] = {}
            cold: dict[str, float] = {}
            queries: dict[str, int] = {}
            for name in LIST_PAGES:
                url = f"/{name}/"
                t0 = time.perf_counter()
                response = client.get(url)
                cold[name] = (time.perf_counter() - t0) * 1000
                assert response.status_code == 200, (url, response.status_code)
                timings[name] = []
                for _ in range(rounds):
                    with CaptureQueriesContext(connection) as captured:
                        t0 = time.perf_counter()
                        response = client.get(url)
                        timings[name].append((time.perf_counter() - t0) * 1000)
                    assert response.status_code == 200, (url, response.status_code)
                    # The page really listed the cluster: a full first page of rows.
                    assert response.content.count(b"<tr>") >= 4, url
                    queries[name] = len(captured)
            for name in LIST_PAGES:
                figures[f"{name}_ms"] = percentile(timings[name], 50)
            figures["max_ms"] = max(percentile(t, 50) for t in timings.values())
            figures["cold_ms"] = max(cold.values())
            figures["instances"] = instances
            figures["nodes"] = nodes
            figures["queries_max"] = max(queries.values())
            figures["target_ms"] = 300
            figures["setup_s"] = setup_s
            figures["database"] = connection.vendor
            raise _Rollback
    except _Rollback:
        pass
    return figures
