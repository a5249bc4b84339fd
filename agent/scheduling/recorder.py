"""Writing verdicts off the scheduler's path: ``record`` only queues; one thread writes the
latest verdict per pod (a pod filtered twice before the writer runs is written once).

A row that fails to be written because the database is away (any error but the two below) is
kept and written by a later flush, unless a newer verdict for that pod came meanwhile: the
Scheduling page must not lose a pod's reason to a database restart. A row the database refuses
for what it is (``DataError``, ``IntegrityError``), or one that cannot fit the columns, is
dropped and logged: it would be refused forever, and kept in the queue it would hold up every
verdict after it.

Rows are pruned by the same thread (``prune``): a pending pod is filtered again at least every
five minutes (kube-scheduler's ``podMaxInUnschedulablePodsDuration``), so a row untouched for
``RETENTION`` belongs to a pod that was bound, deleted or never existed; and never more than
``MAX_ROWS`` rows are kept, the oldest going first.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.db import DataError, IntegrityError, close_old_connections
from django.utils import timezone

from agent.dbthreads import closing_connections
from agent.scheduling.models import PodVerdict

log = logging.getLogger(__name__)

# Node names inside reasons make every node's reason different; counted without them.
_NODE_IN_REASON = re.compile(r"\bnode \S+")


def reason_kind(reason: str) -> str:
    return _NODE_IN_REASON.sub("the node", reason)


def verdict_fields(
    fits: list[str], failed: dict[str, str], unresolvable: dict[str, str], error: str
) -> dict[str, Any]:
    cap = PodVerdict.MAX_NODES
    reasons = Counter(reason_kind(r) for r in [*failed.values(), *unresolvable.values()])
    return {
        "fits": len(fits),
        "fit_nodes": sorted(fits)[:cap],
        "failed": dict(sorted(failed.items())[:cap]),
        "unresolvable": dict(sorted(unresolvable.items())[:cap]),
        "reasons": dict(reasons.most_common()),
        "error": error,
    }


_DECISION = "_decision"
COALESCE_SECONDS = 0.5
RETENTION = timedelta(minutes=15)
# 5,000 pods pending at once is a big cluster's bad day; each row holds at most
# PodVerdict.MAX_NODES reasons, some 10 kB.
MAX_ROWS = 5000
PRUNE_SECONDS = 60.0
PRUNE_BATCH = 500
# Column sizes of PodVerdict: a key that does not fit is refused by PostgreSQL (SQLite stores
# it), so it is never sent.
_LIMITS = {"namespace": 253, "name": 253, "uid": 64, "bound_to": 253}


def _expanded(fields: dict[str, Any]) -> dict[str, Any]:
    if _DECISION not in fields:
        return fields
    rest = {k: v for k, v in fields.items() if k != _DECISION}
    return {**verdict_fields(*fields[_DECISION]), **rest}


def _unfit(key: tuple[str, str], fields: dict[str, Any]) -> str:
    """Why this row cannot be stored ("" when it can)."""
    values = {"namespace": key[0], "name": key[1], **fields}
    for column, limit in _LIMITS.items():
        value = values.get(column, "")
        if not isinstance(value, str) or len(value) > limit:
            return f"{column} is not a string of at most {limit} characters"
    return ""


def prune(
    now: datetime | None = None, *, keep: int = MAX_ROWS, retention: timedelta = RETENTION
) -> int:
    """Delete rows untouched for ``retention``, then the oldest beyond ``keep``; how many."""
    cutoff = (now or timezone.now()) - retention
    deleted = 0
    old = PodVerdict.objects.filter(at__lt=cutoff)
    while batch := list(old.values_list("pk", flat=True)[:PRUNE_BATCH]):
        deleted += PodVerdict.objects.filter(pk__in=batch).delete()[0]
    while True:
        newest_first = PodVerdict.objects.order_by("-at", "-pk").values_list("pk", flat=True)
        extra = list(newest_first[keep : keep + PRUNE_BATCH])
        if not extra:
            return deleted
        deleted += PodVerdict.objects.filter(pk__in=extra).delete()[0]


class VerdictRecorder:
    def __init__(self, *, prune_seconds: float = PRUNE_SECONDS) -> None:
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        # Held for a whole flush, so that flush() returns only when what was queued is written.
        self._writing = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=closing_connections(self._run), name="verdicts", daemon=True
        )
        self.errors = 0
        self.dropped = 0
        self.prune_seconds = prune_seconds
        self._pruned_at = 0.0

    def start(self) -> VerdictRecorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.flush()

    def record_decision(
        self,
        namespace: str,
        name: str,
        uid: str,
        fits: list[str],
        failed: dict[str, str],
        unresolvable: dict[str, str],
        error: str,
    ) -> None:
        """A filter's outcome; summarised in the writer's thread, off the scheduler's path
        (thousands of reasons to count). The caller must not change the collections after."""
        fields = {_DECISION: (fits, failed, unresolvable, error), "bound_to": ""}
        with self._lock:
            # A new filter replaces what was queued: the pod is being scheduled again.
            self._pending[(namespace, name)] = {**fields, "uid": uid, "at": timezone.now()}
        self._wake.set()

    def record(self, namespace: str, name: str, uid: str, fields: dict[str, Any]) -> None:
        with self._lock:
            merged = {**self._pending.get((namespace, name), {}), **fields}
            self._pending[(namespace, name)] = {**merged, "uid": uid, "at": timezone.now()}
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            # A pod is filtered again and again while it waits: gather a moment's worth,
            # so each pod's latest verdict is written once.
            self._stop.wait(COALESCE_SECONDS)
            self._wake.clear()
            self.flush()
            self._prune_now_and_then()

    def _prune_now_and_then(self) -> None:
        if time.monotonic() - self._pruned_at < self.prune_seconds:
            return
        self._pruned_at = time.monotonic()
        try:
            gone = prune()
        except Exception:
            self.errors += 1
            log.exception("extender: pruning verdicts failed; trying again later")
            return
        if gone:
            log.info("extender: pruned %d old verdicts", gone)

    def flush(self) -> None:
        """Write what is queued; returns once it is written. A write that failed is queued
        again (unless a newer verdict for the pod came meanwhile) for the next flush; a row
        the database refuses for what it holds is dropped (see the module docstring)."""
        with self._writing:
            with self._lock:
                pending, self._pending = self._pending, {}
            if not pending:
                return
            try:
                close_old_connections()
                for key, fields in list(pending.items()):
                    self._write(key, fields)
                    del pending[key]
            except Exception:
                self.errors += 1
                log.exception("extender: writing verdicts failed; %d kept for later", len(pending))
                with self._lock:
                    for key, fields in pending.items():
                        self._pending[key] = {**fields, **self._pending.get(key, {})}

    def _write(self, key: tuple[str, str], fields: dict[str, Any]) -> None:
        why = _unfit(key, fields)
        if not why:
            try:
                PodVerdict.objects.update_or_create(
                    namespace=key[0], name=key[1], defaults=_expanded(fields)
                )
                return
            except (DataError, IntegrityError) as exc:
                why = str(exc)
        self.dropped += 1
        log.warning("extender: dropped the verdict of %.80s/%.80s: %s", *key, why)
