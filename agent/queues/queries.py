"""What the Queues pages, the JSON API and ``/metrics`` show, read from the charge cache."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Max, Min, Sum
from django.utils import timezone

from agent.charges.facts import AKRI, DRA, PodFacts
from agent.charges.owner import FIRST_BIND, LABEL, NO_QUEUE, ORPHAN_ATTRIBUTED, ORPHAN_DEDUCTED
from agent.charges.preempt import preemptibility
from agent.models import Slot
from agent.queues import facts as queue_facts
from agent.queues import history as charge_history
from agent.queues.models import Charge, ChargeSample, QueuePod, QueueSystem, Refusal

SOURCES = {
    LABEL: "owner label",
    FIRST_BIND: "first bind (label being written)",
    ORPHAN_ATTRIBUTED: "orphan, attributed",
    ORPHAN_DEDUCTED: "orphan, deducted",
    NO_QUEUE: "no known queue",
    "unused": "holds nothing",
}
REFUSALS_SHOWN = 20
# The Queues page groups refusals (one pod re-created by its controller is refused every few
# seconds: one row each buried the page): at most this many groups, and pods named per group.
REFUSAL_GROUPS_SHOWN = 50
REFUSAL_PODS_SHOWN = 5
_REFUSAL_KEY = ("rule", "claim", "queue", "owner", "resource")
CHART_QUEUES = 8  # lines in a chart: the largest queues; the rest are in the table


def overview() -> dict[str, Any]:
    totals = charge_history.queue_totals()
    opted = queue_facts.world().opted_out
    for name, row in totals.items():
        row["opted_out"] = name in opted
    charges = list(Charge.objects.values("source", "charged", "uncharged", "accounted"))
    by_source: dict[str, int] = defaultdict(int)
    for row in charges:
        by_source[row["source"]] += 1
    return {
        "queues": list(totals.values()),
        "charged": sum(r["charged"] for r in charges),
        "uncharged": charge_history.uncharged_by_resource(),
        "uncharged_total": sum(r["uncharged"] for r in charges),
        "claims": len(charges),
        "not_accounted": sum(1 for r in charges if not r["accounted"]),
        "by_source": {SOURCES.get(k, k): v for k, v in sorted(by_source.items())},
        "orphans": by_source[ORPHAN_ATTRIBUTED] + by_source[ORPHAN_DEDUCTED],
        "problems": Charge.objects.exclude(problems=[]).count(),
        "systems": dict(QueueSystem.objects.values_list("kind", "present")),
        "refusals": list(Refusal.objects.all()[:REFUSALS_SHOWN]),
        "policy": settings.AKRI_QUEUES["ORPHANS"],
        "label_key": settings.AKRI_QUEUES["LABEL_KEY"],
    }


def charge_dict(row: Charge) -> dict[str, Any]:
    return {
        "kind": row.kind,
        "namespace": row.namespace,
        "name": row.name,
        "resource": row.resource,
        "amount": row.amount,
        "accounted": row.accounted,
        "owner": row.owner,
        "source": row.source,
        "source_text": SOURCES.get(row.source, row.source),
        "charged": row.charged,
        "uncharged": row.uncharged,
        "users": row.users,
        "queues": row.queues,
        "foreign": sorted(set(row.queues) - {row.owner}) if row.owner else [],
        "problems": row.problems,
        "why": row.why,
    }


def charges(*, queue: str = "", source: str = "", problems: bool = False) -> list[dict[str, Any]]:
    rows = Charge.objects.all()
    if source:
        rows = rows.filter(source=source)
    if problems:
        rows = rows.exclude(problems=[])
    out = [charge_dict(r) for r in rows]
    if queue:
        out = [c for c in out if c["owner"] == queue or queue in c["queues"]]
    return out


def queue_detail(queue: str) -> dict[str, Any] | None:
    rows = charges(queue=queue)
    total = charge_history.queue_totals().get(queue)
    if total is None and not rows:
        return None
    return {
        "queue": queue,
        "totals": total,
        "opted_out": queue in queue_facts.world().opted_out,
        "owned": [c for c in rows if c["owner"] == queue and not c["source"].startswith("orphan")],
        "of_others": [c for c in rows if c["owner"] and c["owner"] != queue],
        "orphans": [c for c in rows if c["source"].startswith("orphan")],
        "unowned": [c for c in rows if not c["owner"] and not c["source"].startswith("orphan")],
    }


def claim_detail(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    row = Charge.objects.filter(kind=kind, namespace=namespace, name=name).first()
    if row is None:
        return None
    claim = charge_dict(row)
    pods = {
        (p.namespace, p.name): p
        for p in QueuePod.objects.filter(
            namespace__in={u["pod"].split("/", 1)[0] for u in row.users}
        )
    }
    users = []
    the_world = queue_facts.world() if pods else None
    for user in row.users:
        ns, _, pod_name = user["pod"].partition("/")
        pod = pods.get((ns, pod_name))
        verdict = preemptibility(_facts(pod), the_world) if pod is not None else None
        users.append(
            {
                **user,
                "namespace": ns,
                "name": pod_name,
                "foreign": bool(row.owner) and user.get("queue") != row.owner,
                "preemptible": verdict.preemptible if verdict else None,
                "preemptible_why": verdict.why if verdict else "pod not in the cache",
                "node": pod.node_name if pod else "",
                "phase": pod.phase if pod else "",
            }
        )
    claim["users"] = users
    claim["slots"] = (
        list(
            Slot.objects.filter(instance__namespace=namespace, instance__name=name)
            .order_by("index")
            .values("key", "value", "holder_node", "pod_namespace", "pod_name", "since")
        )
        if kind == AKRI
        else []
    )
    claim["is_dra"] = kind == DRA
    return claim


def _facts(pod: QueuePod) -> PodFacts:
    return PodFacts(
        pod.namespace,
        pod.name,
        pod.uid,
        pod.labels,
        pod.annotations,
        pod.priority,
        pod.created,
        owner_uids=tuple(pod.owners or ()),
    )


def history(start: datetime, end: datetime | None, queue: str = "") -> dict[str, Any]:
    """Charged devices per queue per interval, as columns for uPlot: {"t": [...], "series"}."""
    rows = ChargeSample.objects.filter(at__gte=start)
    if end is not None:
        rows = rows.filter(at__lte=end)
    if queue:
        rows = rows.filter(queue=queue)
    sums: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    times: set[float] = set()
    for at, name, charged in rows.values_list("at", "queue", "charged"):
        stamp = at.timestamp()
        times.add(stamp)
        sums[name or "(uncharged)"][stamp] += charged
    order = sorted(sums, key=lambda q: (-sum(sums[q].values()), q))[:CHART_QUEUES]
    t = sorted(times)
    return {
        "t": t,
        "series": [{"queue": q, "values": [sums[q].get(x, 0) for x in t]} for q in order],
        "interval_seconds": float(settings.AKRI_QUEUES["SAMPLE_SECONDS"]),
        # The chart spans the chosen range, not just the samples in it.
        "from": start.timestamp(),
        "to": (end or timezone.now()).timestamp(),
    }


def refusal_groups(start: datetime, end: datetime | None = None) -> dict[str, Any]:
    """The webhook's refusals in [start, end), one group per rule, claim, queue (and owner and
    kind of object): how many, first and last time, the latest message and the pods named,
    newest group first."""
    qs = Refusal.objects.filter(at__gte=start)
    if end is not None:
        qs = qs.filter(at__lt=end)
    rows = list(
        qs.values(*_REFUSAL_KEY)
        .annotate(count=Sum("repeats"), first=Min("at"), last=Max("at"))
        .order_by("-last")[: REFUSAL_GROUPS_SHOWN + 1]
    )
    groups = []
    for row in rows[:REFUSAL_GROUPS_SHOWN]:
        members = qs.filter(**{k: row[k] for k in _REFUSAL_KEY})
        latest = members.order_by("-at", "-id").values("message").first()
        pods = members.values("namespace", "name").annotate(n=Sum("repeats"), last=Max("at"))
        named = list(pods.order_by("-last")[: REFUSAL_PODS_SHOWN + 1])
        groups.append(
            {
                **row,
                "message": latest["message"] if latest else "",
                "pods": named[:REFUSAL_PODS_SHOWN],
                "more_pods": pods.count() - REFUSAL_PODS_SHOWN
                if len(named) > REFUSAL_PODS_SHOWN
                else 0,
            }
        )
    return {
        "groups": groups,
        "more_groups": len(rows) > REFUSAL_GROUPS_SHOWN,
        "total": qs.aggregate(n=Sum("repeats"))["n"] or 0,
    }
