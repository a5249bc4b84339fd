"""Every page at 40,000 Instances (issue 32 §4): server time cold, once the kept counts
expire, and warm, and the bytes each page sends, through Django's test client.

``time_pages(env, query)`` runs one fresh process per page on the database ``env`` names. In
it the probe does what ``runweb`` does before it serves (the middleware chain built, then
``warmup.warm_up``), and times the first request (``cold``: a new database connection, and
whatever the warm-up leaves to the first page); then it makes every kept count due
(``slotmap.CostlyReuse``) and asks again (``expired``: what a request pays once they are due,
the recounts it sets off running beside it); then ``rounds`` more times (``warm``, the
median). Each answer is checked against what the cache holds, read apart with plain SQL: a
fast page that shows the wrong thing fails.

``bench scale`` calls it on the controller's database after the change-rate run. ``fill()``
writes a cluster of the same size straight into a database (Instances with their slots, pods,
queue charges, slot events and reconciliation runs) for working on the pages without the
controller: ``python -m akri_site.dashboard.pagebench fill`` then ``... time``, with
``DATABASE_URL`` naming a database of your own.

This module imports no Django at the top: its ``__main__`` is the probe's process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parents[2]
USERNAME = "page-bench"
# The pages an operator opens at 2 a.m., and the list pages of issue 31.
LIST_PAGES = ("configurations", "instances", "nodes", "pods", "brokers")
TARGETS_MS = {"overview": 200, "slotmap": 200, "search": 150, **dict.fromkeys(LIST_PAGES, 300)}
MAX_BYTES = 200_000
# Each list page's table (the nodes list also names nodes known only as slot holders).
LIST_TABLES = (
    ("configurations", "agent_configuration"),
    ("instances", "agent_instance"),
    ("nodes", "agent_node"),
    ("pods", "agent_pod"),
    ("brokers", "brokers_broker"),
)


def page_urls(search_term: str) -> dict[str, str]:
    return {
        "overview": "/",
        "slotmap": "/slots/",
        "search": f"/search/?q={search_term}",
        **{name: f"/{name}/" for name in LIST_PAGES},
    }


# --- the probe, in a process of its own -----------------------------------------------------


def _probe(key: str, url: str, rounds: int) -> dict[str, Any]:
    from django.contrib.auth.models import Group, User
    from django.db import connection, connections
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from akri_site.dashboard.slotmap import CostlyReuse

    user, _ = User.objects.get_or_create(username=USERNAME)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    client = Client()
    client.force_login(user)
    connections.close_all()
    # What a server does before it serves: build the middleware chain (the ASGI handler does
    # when it is made; the test client on its first request), then runweb's warm-up.
    client.handler.load_middleware()
    warmup_s = _warm_up()
    connections.close_all()  # the first request opens its own, as after a restart

    def get() -> tuple[float, Any]:
        started = time.perf_counter()
        answer = client.get(url)
        elapsed = (time.perf_counter() - started) * 1000
        if answer.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {answer.status_code}: {answer.content[:300]!r}")
        return elapsed, answer

    cold, answer = get()
    # As time does: kept answers become due (the tree before kept-answer refresh forgot them).
    getattr(CostlyReuse, "expire_all", CostlyReuse.forget_all)()
    expired, _ = get()
    for reuse in CostlyReuse._all:  # the recounts that request set off
        getattr(reuse, "join", lambda: None)()
    warm = [get()[0] for _ in range(rounds)]
    with CaptureQueriesContext(connection) as captured:
        get()
    return {
        "cold_ms": cold,
        "expired_ms": expired,
        "warm_ms": statistics.median(warm),
        "bytes": len(answer.content),
        "queries": len(captured),
        "warmup_ms": warmup_s * 1000,
        "body": answer.content.decode(),
    }


def _warm_up() -> float:
    """runweb's warm-up; none with PAGEBENCH_WARM_UP=0, to measure the pages without it
    (and without the background recounts it turns on); PAGEBENCH_BACKGROUND=0 keeps the
    warm-up but has due counts made by the request."""
    if os.environ.get("PAGEBENCH_WARM_UP") == "0":
        return 0.0
    try:
        from akri_site.dashboard.warmup import warm_up
    except ImportError:  # a tree from before the warm-up, measured for comparison
        return 0.0
    took = warm_up()
    if os.environ.get("PAGEBENCH_BACKGROUND") == "0":  # warmed, but due counts made inline
        from akri_site.dashboard.slotmap import CostlyReuse

        CostlyReuse.refresh_in_background = False
    return took


def _probe_main(key: str, url: str, rounds: str) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "akri_site.settings")
    django.setup()
    result = _probe(key, url, int(rounds))
    sys.stdout.write("\n" + json.dumps(result) + "\n")


def probe_page(env: dict[str, str], key: str, url: str, rounds: int = 5) -> dict[str, Any]:
    """One page's figures (and its body, for checking) from a fresh process on ``env``."""
    out = subprocess.run(
        [sys.executable, "-m", "akri_site.dashboard.pagebench", "probe", key, url, str(rounds)],
        cwd=BASE_DIR,
        env={**env, "DJANGO_SETTINGS_MODULE": "akri_site.settings", "LOG_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"page probe {key} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- what the pages must show, read apart ------------------------------------------------------


def expectations(query: Any) -> dict[str, Any]:
    """Facts each page is checked against, read with plain SQL by ``query(sql)`` (rows)."""
    (slots,) = query("SELECT COUNT(*) FROM agent_slot")[0]
    (instances,) = query("SELECT COUNT(*) FROM agent_instance")[0]
    first = query(
        "SELECT name FROM agent_instance ORDER BY configuration_name, namespace, name LIMIT 1"
    )[0][0]
    # The last Instance by name; searched for by the end of its name, as an operator types.
    last = query("SELECT name FROM agent_instance ORDER BY name DESC LIMIT 1")[0][0]
    rows = {name: query(f"SELECT COUNT(*) FROM {table}")[0][0] for name, table in LIST_TABLES}
    return {"slots": slots, "instances": instances, "first": first, "last": last, "rows": rows}


def check(key: str, body: str, facts: dict[str, Any]) -> None:
    """Fail loudly when a page does not show what the cache holds."""

    def need(text: str) -> None:
        if text not in body:
            raise RuntimeError(f"page {key} does not show {text!r}")

    if key == "overview":
        need(f">{facts['slots']}</span> total")
        need(f"{facts['instances']} Instances")
    elif key == "slotmap":
        need(facts["first"])
    elif key == "search":
        need(facts["last"])
    else:  # a list: its first page holds rows as far as the table has them (and a header)
        want = min(facts["rows"][key], 4)
        if body.count("<tr") < want + bool(want):
            raise RuntimeError(f"page {key} lists fewer than {want} rows")


def time_pages(
    env: dict[str, str], query: Any, rounds: int = 5, stdout: Any = None
) -> dict[str, object]:
    """Each page's ``<page>_cold_ms``, ``_expired_ms``, ``_warm_ms``, ``_bytes`` and
    ``_queries``, every answer checked; ``pages_warmup_ms``: the longest start-up warm-up of
    the probes' processes; ``pages_over`` names the pages over their target in any figure."""
    facts = expectations(query)
    figures: dict[str, object] = {}
    over, warmups = [], []
    for key, url in page_urls(facts["last"][-8:]).items():
        result = probe_page(env, key, url, rounds)
        check(key, result.pop("body"), facts)
        warmups.append(result.pop("warmup_ms"))
        for name, value in result.items():
            figures[f"{key}_{name}"] = round(value, 1) if isinstance(value, float) else value
        worst = max(result["cold_ms"], result["expired_ms"], result["warm_ms"])
        if worst > TARGETS_MS[key] or result["bytes"] > MAX_BYTES:
            over.append(key)
        if stdout is not None:
            stdout.write(f"page {key} {url}: {json.dumps(result)}\n")
    figures["pages_warmup_ms"] = round(max(warmups), 1)
    figures["pages_over"] = ",".join(over) or "none"
    return figures


# --- a cluster written straight into the cache, for work on the pages ---------------------


def fill(instances: int = 40000, nodes: int = 1000, prefix: str = "pages") -> None:
    """The ``scale`` bench's cluster (``bench._fill_scale``: Instances of 4 slots, one in four
    held by a Running pod, Configurations, broker pods) and what a cluster of that size keeps
    beside it: a queue charge per held Instance, slot events of the last days and
    reconciliation runs, committed."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from agent.models import ReconcileRun, SlotEvent, SyncState
    from agent.queues.models import Charge
    from akri_site.dashboard.bench import _fill_scale

    now = timezone.now()
    with transaction.atomic():
        _fill_scale(instances, nodes, prefix)
        charges, events = [], []
        for i in range(instances):
            name = f"{prefix}-{i:06x}"
            node = f"{prefix}-node-{i % nodes:04d}"
            pod = f"{prefix}/work-{i}"
            charges.append(
                Charge(
                    kind="instance",
                    namespace=prefix,
                    name=name,
                    resource=f"akri.sh/{name}",
                    amount=1,
                    owner=f"queue-{i % 20}",
                    source="label",
                    charged=1,
                    users=[{"pod": pod, "uid": f"{prefix}-{i}", "queue": f"queue-{i % 20}"}],
                    queues=[f"queue-{i % 20}"],
                )
            )
            for k in range(2):  # claimed, then released and claimed again
                events.append(
                    SlotEvent(
                        at=now - timedelta(minutes=i % 4000, seconds=k),
                        namespace=prefix,
                        instance=name,
                        configuration=f"{prefix}-{('onvif', 'udev', 'opcua', 'debug')[i % 4]}",
                        slot=f"{name}-0",
                        before="" if k else node,
                        after=node if k else "",
                        cause=SlotEvent.Cause.ALLOCATE if k else SlotEvent.Cause.RELEASE,
                        actor=f"agent/{node}",
                        node=node,
                        pod=pod,
                    )
                )
            if len(events) >= 4000:
                Charge.objects.bulk_create(charges)
                SlotEvent.objects.bulk_create(events)
                charges, events = [], []
        Charge.objects.bulk_create(charges)
        SlotEvent.objects.bulk_create(events)
        ReconcileRun.objects.bulk_create(
            ReconcileRun(
                scope=ReconcileRun.Scope.NODE,
                node=f"{prefix}-node-{n % nodes:04d}",
                trigger=ReconcileRun.Trigger.SWEEP,
                started_at=now - timedelta(seconds=30 * n),
                checked=40,
            )
            for n in range(5000)
        )
        for kind in ("instances", "pods", "nodes", "configurations"):
            SyncState.objects.update_or_create(
                owner="controller", kind=kind, defaults={"synced_at": now}
            )


def _sql(query: str) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query)
        return cursor.fetchall()


def main(argv: list[str]) -> None:
    if argv[:1] == ["probe"]:
        _probe_main(*argv[1:])
        return
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "akri_site.settings")
    django.setup()
    if argv[:1] == ["fill"]:
        started = time.perf_counter()
        fill(*(int(a) for a in argv[1:3]))
        print(f"filled in {time.perf_counter() - started:.1f} s")
    elif argv[:1] == ["time"]:
        figures = time_pages(dict(os.environ), _sql, stdout=sys.stdout)
        print(" ".join(f"{k}={v}" for k, v in figures.items()))
    else:
        raise SystemExit("usage: python -m akri_site.dashboard.pagebench fill [N NODES] | time")


if __name__ == "__main__":
    main(sys.argv[1:])
