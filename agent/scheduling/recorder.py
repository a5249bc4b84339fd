"""Writing verdicts off the scheduler's path: ``record`` only queues; one thread writes the
latest verdict per pod (a pod filtered twice before the writer runs is written once)."""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from typing import Any

from django.db import close_old_connections
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


def _expanded(fields: dict[str, Any]) -> dict[str, Any]:
    if _DECISION not in fields:
        return fields
    rest = {k: v for k, v in fields.items() if k != _DECISION}
    return {**verdict_fields(*fields[_DECISION]), **rest}


class VerdictRecorder:
    def __init__(self) -> None:
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

    def flush(self) -> None:
        """Write what is queued; returns once it is written. A failed write is queued again
        (unless a newer verdict for the pod came meanwhile) for the next flush."""
        with self._writing:
            with self._lock:
                pending, self._pending = self._pending, {}
            if not pending:
                return
            try:
                close_old_connections()
                for (namespace, name), fields in list(pending.items()):
                    PodVerdict.objects.update_or_create(
                        namespace=namespace, name=name, defaults=_expanded(fields)
                    )
                    del pending[(namespace, name)]
            except Exception:
                self.errors += 1
                log.exception("extender: writing verdicts failed; %d kept for later", len(pending))
                with self._lock:
                    for key, fields in pending.items():
                        self._pending[key] = {**fields, **self._pending.get(key, {})}
