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
