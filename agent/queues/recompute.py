"""Recompute queue charges from the cache and store them.

``recompute(keys)`` decides the named claims (all of them when ``keys`` is None) with the
rules of ``agent.charges`` over the facts ``agent.queues.facts`` gathers, writes the owner
label of a first bind (``agent.queues.labels``) when given an API client, and writes the
changed ``Charge`` rows. The history is ``agent.queues.history``.

When the API server fails in passing, the labels not written yet wait (each would wait out the
same timeout) and the rows are stored anyway; ``Outcome.api_away`` says so, and the caller
tries again later (the Celery task retries, the controller's debouncer keeps the keys).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone
from kubernetes import client

from agent.charges.owner import ClaimCharge, decide
from agent.queues.facts import by_pairs, gather, rules, world
from agent.queues.labels import write_label
from agent.queues.models import (
    Charge,
)
from agent.retrying import ApiAway

log = logging.getLogger(__name__)


CHARGE_FIELDS = (
    "resource",
    "amount",
    "accounted",
    "owner",
    "source",
    "charged",
    "uncharged",
    "users",
    "queues",
    "problems",
    "why",
)


def _row_values(charge: ClaimCharge) -> dict[str, Any]:
    return {
        "resource": charge.resource,
        "amount": charge.amount,
        "accounted": charge.accounted,
        "owner": charge.owner or "",
        "source": charge.source,
        "charged": charge.charged,
        "uncharged": charge.uncharged,
        "users": [
            {"pod": u.pod, "uid": u.uid, "queue": u.queue or "", "why": u.why} for u in charge.users
        ],
        "queues": sorted(charge.queues),
        "problems": list(charge.problems),
        "why": charge.why,
    }


def store(charges: dict[str, ClaimCharge], *, full: bool, gone: Iterable[str] = ()) -> int:
    """Write changed Charge rows, drop the rows of ``gone`` claims (and, on a full pass, of
    every claim not decided); how many rows changed. Reads first, then one short write
    transaction: on SQLite a transaction holds the only write lock, which the cache's own
    writers wait for."""
    wanted = {(c.kind, c.namespace, c.name): _row_values(c) for c in charges.values()}
    existing = Charge.objects.all()
    if not full:
        existing = existing.filter(pk__in=_pks(wanted))
    rows = {
        (kind, namespace, name): (pk, digest)
        for pk, kind, namespace, name, digest in existing.values_list(
            "pk", "kind", "namespace", "name", "digest"
        )
    }
    create, update = [], []
    now = timezone.now()
    for key, values in wanted.items():
        found = rows.pop(key, None)
        values["digest"] = _digest(values)
        if found is None:
            create.append(Charge(kind=key[0], namespace=key[1], name=key[2], **values))
        elif found[1] != values["digest"]:
            update.append(Charge(pk=found[0], updated_at=now, **values))
    drop = [pk for pk, _ in rows.values()] if full else _pks(_parse_keys(gone))
    if not (create or update or drop):
        return 0
    with transaction.atomic():
        Charge.objects.bulk_create(create, batch_size=500)
        Charge.objects.bulk_update(update, [*CHARGE_FIELDS, "digest", "updated_at"], batch_size=500)
        for i in range(0, len(drop), 500):
            Charge.objects.filter(pk__in=drop[i : i + 500]).delete()
    return len(create) + len(update) + len(drop)


def _parse_keys(keys: Iterable[str]) -> dict[tuple[str, str, str], None]:
    out = {}
    for key in keys:
        kind, _, rest = key.partition(":")
        namespace, _, name = rest.partition("/")
        out[(kind, namespace, name)] = None
    return out


def _digest(values: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(values, sort_keys=True).encode(), digest_size=16).hexdigest()


def _pks(wanted: dict[tuple[str, str, str], Any]) -> list[int]:
    by_kind: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for kind, namespace, name in wanted:
        by_kind[kind].add((namespace, name))
    return [
        pk
        for kind, pairs in by_kind.items()
        for qs in by_pairs(Charge.objects.all(), pairs, kind=kind)
        for pk in qs.values_list("pk", flat=True)
    ]


@dataclass
class Outcome:
    decided: int = 0
    written: int = 0
    labels_written: int = 0
    labels_adopted: int = 0
    label_errors: list[str] = field(default_factory=list)
    # Why labels were left for a retry (the API server failing in passing); "" when none was.
    api_away: str = ""


def recompute(
    keys: Iterable[str] | None = None, *, api_client: client.ApiClient | None = None
) -> Outcome:
    """Decide the claims named by ``keys`` (all when None), write labels, store the rows."""
    keys = None if keys is None else list(keys)
    the_rules, the_world = rules(), world()
    claims = gather(keys, the_rules)
    decided = {c.key: decide(c, the_world, the_rules) for c in claims}
    outcome = Outcome(decided=len(decided))
    if api_client is not None:
        by_key = {c.key: c for c in claims}
        for key, charge in list(decided.items()):
            if charge.write_label and not outcome.api_away:
                try:
                    decided[key], what = write_label(
                        api_client, by_key[key], charge, the_world, the_rules
                    )
                except ApiAway as exc:
                    outcome.api_away = str(exc)
                    outcome.label_errors.append(str(exc))
                    continue
                if what == "written":
                    outcome.labels_written += 1
                elif what == "adopted":
                    outcome.labels_adopted += 1
                elif what != "present":
                    outcome.label_errors.append(what)
    # Named claims with nothing to charge or show any more (gone, or an Instance freed).
    gone = [key for key in keys if key not in decided] if keys is not None else []
    outcome.written = store(decided, full=keys is None, gone=gone)
    return outcome
