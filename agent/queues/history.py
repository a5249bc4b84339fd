"""The charge history and per-queue totals.

``sample()`` records one ``ChargeSample`` per queue and resource for the current interval
(queue "" holds what no queue pays for); ``prune_samples()`` drops samples and webhook
refusals past ``AKRI_QUEUE_HISTORY_HOURS`` (and refusals beyond ``AKRI_QUEUE_REFUSALS_MAX``
rows), in batches like ``agent.retention``.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agent.charges.owner import ClaimCharge, UserView, totals
from agent.queues.models import (
    Charge,
    ChargeSample,
    Refusal,
)


def interval_start(now: datetime, seconds: float) -> datetime:
    epoch = now.timestamp()
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=now.tzinfo)


def sample(now: datetime | None = None) -> int:
    """Record this interval's charges: one row per queue and resource (queue "" = uncharged)."""
    seconds = float(settings.AKRI_QUEUES["SAMPLE_SECONDS"])
    at = interval_start(now or timezone.now(), seconds)
    rows = {}
    for row in queue_totals().values():
        for resource, charged in row["charged"].items() or [("", 0)]:
            rows[(row["queue"], resource)] = {
                "charged": charged,
                "owned": row["owned"],
                "uses_of_others": row["uses_of_others"],
                "used_by_others": row["used_by_others"],
            }
    for resource, uncharged in uncharged_by_resource().items():
        rows[("", resource)] = {"charged": uncharged}
    with transaction.atomic():
        ChargeSample.objects.filter(at=at).delete()
        ChargeSample.objects.bulk_create(
            ChargeSample(at=at, queue=q, resource=r, **values) for (q, r), values in rows.items()
        )
    return len(rows)


def current_charges() -> list[ClaimCharge]:
    """The stored decisions, as much of the domain's objects as totals read: no pod lists,
    problems or reasons (a large cluster's rows are read whole on every live update)."""
    fields = ("kind", "namespace", "name", "resource", "amount", "accounted", "owner")
    rows = Charge.objects.values_list(*fields, "source", "charged", "uncharged", "queues")
    return [
        ClaimCharge(
            key=f"{kind}:{namespace}/{name}",
            kind=kind,
            namespace=namespace,
            name=name,
            resource=resource,
            amount=amount,
            accounted=accounted,
            owner=owner or None,
            source=source,
            charged=charged,
            uncharged=uncharged,
            users=tuple(UserView("", "", queue, "") for queue in queues),
        )
        for kind, namespace, name, resource, amount, accounted, owner, source, charged, uncharged, queues in rows  # noqa: E501
    ]


def queue_totals() -> dict[str, dict[str, Any]]:
    """Per queue: charged devices per resource, claims owned, used of others, lent, orphans."""
    out = {}
    for queue, row in sorted(totals(current_charges()).items()):
        out[queue] = {
            "queue": queue,
            "charged": dict(sorted(row.charged.items())),
            "total": row.total,
            "owned": row.owned,
            "uses_of_others": row.uses_of_others,
            "used_by_others": row.used_by_others,
            "orphans": row.orphans,
        }
    return out


def uncharged_by_resource() -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for resource, uncharged in Charge.objects.filter(uncharged__gt=0).values_list(
        "resource", "uncharged"
    ):
        out[resource] += uncharged
    return dict(out)


def prune_samples(now: datetime | None = None) -> int:
    """Drop samples past ``AKRI_QUEUE_HISTORY_HOURS``, in batches (as ``agent.retention``)."""
    hours = float(settings.AKRI_QUEUES["HISTORY_HOURS"])
    cutoff = (now or timezone.now()) - timedelta(hours=hours)
    deleted = 0
    for model in (ChargeSample, Refusal):
        while True:
            batch = list(model.objects.filter(at__lt=cutoff).values_list("pk", flat=True)[:500])
            if not batch:
                break
            deleted += model.objects.filter(pk__in=batch).delete()[0]
    return deleted + prune_refusals_over(int(settings.AKRI_QUEUES["REFUSALS_MAX"]))


def prune_refusals_over(limit: int) -> int:
    """Keep the newest ``limit`` refusal rows, whatever their age; the oldest go first."""
    deleted = 0
    while True:
        # The (limit + 1)-th newest row and all older ones are over the bound.
        edge = Refusal.objects.order_by("-at", "-id").values_list("at", "id")[limit : limit + 1]
        if not edge:
            return deleted
        at, pk = edge[0]
        over = Refusal.objects.filter(Q(at__lt=at) | Q(at=at, id__lte=pk))
        batch = list(over.order_by("at", "id").values_list("pk", flat=True)[:500])
        if not batch:
            return deleted
        deleted += Refusal.objects.filter(pk__in=batch).delete()[0]
