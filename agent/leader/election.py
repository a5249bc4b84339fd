"""One candidate in a Lease-based leader election (``coordination.k8s.io/v1``).

The rules live in ``agent.domain.lease``; this module is the loop that applies them against the
API server through the official client's ``CoordinationV1Api``:

- every ``retry_period`` (with a little jitter while following) read the Lease and, when the
  rules allow, write ourselves as holder with the ``resourceVersion`` we read: a 409 means a
  rival wrote first, and we stay a follower;
- a leader renews the same way; when no renew has succeeded for ``renew_deadline`` it stops
  leading (``on_stopped``) on its own, before any rival may take the Lease;
- ``is_leading()`` is the fence for work done while leading: it is time-based, so a leader
  whose process was frozen (or whose renew thread starves) refuses to act the moment it wakes,
  before its elector thread has even run again;
- ``stop()`` releases the Lease (empty holder), so a clean shutdown hands over at the rival's
  next retry instead of after a whole lease;
- ``on_started`` / ``on_stopped`` run in order on a thread of their own: starting the work
  (the controller's first lists take seconds) must never hold up the renewals.

Why not ``kubernetes.leaderelection``: its Config calls ``sys.exit`` on bad values, it has no
release on shutdown and never counts transitions (shared/reference §5.2).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from agent.domain.lease import (
    JITTER,
    LeaseRecord,
    Timing,
    acquired_spec,
    may_acquire,
    released_spec,
)

log = logging.getLogger(__name__)

PART_OF_LABEL = {"app.kubernetes.io/part-of": "akri-site"}


def default_identity() -> str:
    """The pod's name (its hostname) and a random suffix: a restarted container is a new
    candidate, never mistaken for the holder it replaced."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaderElector:
    """Runs the election for one Lease in a thread of its own; see the module docstring."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        *,
        identity: str | None = None,
        timing: Timing | None = None,
        on_started: Callable[[], None] | None = None,
        on_stopped: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.timing = timing or Timing()
        self._on_started = on_started or (lambda: None)
        self._on_stopped = on_stopped or (lambda: None)
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._callbacks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._callback_thread: threading.Thread | None = None
        self._leading = False
        self._renewed_at = 0.0
        # The version of the Lease last seen and when it was first seen (local clock).
        self._seen: tuple[str, LeaseRecord] | None = None
        self._seen_at = 0.0
        # resign(): asked from any thread, carried out by the election's own (step), which alone
        # changes who leads; then no attempt to lead again until the hold-off has passed.
        self._resign_asked: tuple[str, float] | None = None
        self._hold_off_until = 0.0

    # --- the public face --------------------------------------------------------------------
    def is_leading(self) -> bool:
        """True while we hold the Lease and our last renew started within the renew deadline."""
        return self._leading and self._clock() - self._renewed_at < self.timing.renew_deadline

    def resign(self, why: str, hold_off: float | None = None) -> None:
        """Stop leading at the next step (releasing the Lease, ``on_stopped`` run) and stay a
        follower for ``hold_off`` seconds (a lease duration by default), so that a rival can
        take over: for a leader that cannot do its work. Safe from any thread."""
        hold = self.timing.lease_duration if hold_off is None else hold_off
        self._resign_asked = (why, hold)

    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self.run, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop campaigning; a leader releases the Lease, then ``on_stopped`` runs to its end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._resign()  # driven by step() from outside: resign here
        if self._callback_thread is not None:
            self._callbacks.put(None)
            self._callback_thread.join(timeout)
            self._callback_thread = None

    def run(self) -> None:
        """Campaign until ``stop()``; blocks."""
        log.info("leader election %s/%s: candidate %s", self.namespace, self.name, self.identity)
        try:
            while not self._stop.is_set():
                self.step()
                self._stop.wait(self._pause())
        finally:
            self._resign()

    def step(self) -> bool:
        """One attempt to take or renew the Lease; True when we lead after it."""
        started = self._clock()
        asked, self._resign_asked = self._resign_asked, None
        if asked is not None:
            why, hold = asked
            self._hold_off_until = started + hold
            if self._leading:
                self._release()
                self._lose(f"resigned: {why}")
            return False
        if not self._leading and started < self._hold_off_until:
            return False
        if self._try_write(started):
            if not self._leading:
                self._renewed_at = started
                self._leading = True
                log.info("leader election %s: %s is the leader", self.name, self.identity)
                self._call(self._on_started)
            self._renewed_at = started
        elif self._leading and not self.is_leading():
            self._lose(f"no renew for {self.timing.renew_deadline:g} s")
        return self._leading

    def _resign(self) -> None:
        if self._leading:
            self._release()
            self._lose("shutting down")

    # --- the steps --------------------------------------------------------------------------
    def _pause(self) -> float:
        retry = self.timing.retry_period
        return retry if self._leading else retry * random.uniform(1.0, JITTER)

    def _try_write(self, started: float) -> bool:
        try:
            current = self._read()
            if current is None:
                return self._create()
            rv = current["metadata"]["resourceVersion"]
            record = LeaseRecord.from_spec(current.get("spec"))
            self._observe(rv, record)
            if not may_acquire(record, self.identity, self._clock() - self._seen_at):
                if self._leading:
                    self._lose(f"{record.holder or 'nobody'} holds the Lease now")
                return False
            return self._replace(rv, record)
        except ApiException as exc:
            if exc.status == 409:
                return False  # a rival wrote first: read again at the next retry
            log.warning("leader election %s: API error %s %s", self.name, exc.status, exc.reason)
            return False
        except Exception as exc:  # the API server may be down; keep campaigning
            log.warning("leader election %s: %s", self.name, exc)
            return False

    def _observe(self, rv: str, record: LeaseRecord) -> None:
        if self._seen is None or self._seen[0] != rv:
            self._seen = (rv, record)
            self._seen_at = self._clock()

    def _read(self) -> dict[str, Any] | None:
        # Raw JSON: the generated models' datetime parsing is a known source of bugs (§5.2).
        try:
            response = self.api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout()
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(response.data)

    def _create(self) -> bool:
        body = self._body(acquired_spec(None, self.identity, self.timing, _now()))
        answer = self.api.create_namespaced_lease(
            self.namespace, body, _preload_content=False, _request_timeout=self._timeout()
        )
        self._remember(json.loads(answer.data))
        return True

    def _replace(self, rv: str, record: LeaseRecord) -> bool:
        body = self._body(acquired_spec(record, self.identity, self.timing, _now()), rv)
        answer = self.api.replace_namespaced_lease(
            self.name,
            self.namespace,
            body,
            _preload_content=False,
            _request_timeout=self._timeout(),
        )
        self._remember(json.loads(answer.data))
        return True

    def _release(self) -> None:
        """Hand the Lease back, conditionally: if a rival holds it already, leave it be."""
        if self._seen is None or not self.is_leading():
            return
        rv, record = self._seen
        body = self._body(released_spec(record, _now()), rv)
        try:
            self.api.replace_namespaced_lease(
                self.name, self.namespace, body, _preload_content=False, _request_timeout=2.0
            )
            log.info("leader election %s: %s released the Lease", self.name, self.identity)
        except Exception as exc:  # the rival takes over once the lease runs out
            log.warning("leader election %s: release failed: %s", self.name, exc)

    def _remember(self, lease: dict[str, Any]) -> None:
        self._seen = (lease["metadata"]["resourceVersion"], LeaseRecord.from_spec(lease["spec"]))
        self._seen_at = self._clock()

    def _body(self, spec: dict[str, Any], rv: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        meta["labels"] = dict(PART_OF_LABEL)
        if rv is not None:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def _timeout(self) -> float:
        # A request that hangs must not hold the loop past the point where a renew could help.
        return max(1.0, self.timing.retry_period)

    def _lose(self, why: str) -> None:
        self._leading = False
        log.warning("leader election %s: %s stops leading (%s)", self.name, self.identity, why)
        self._call(self._on_stopped)

    def _call(self, callback: Callable[[], None]) -> None:
        if self._callback_thread is None:
            self._callback_thread = threading.Thread(
                target=self._run_callbacks, name=f"lease-{self.name}-work", daemon=True
            )
            self._callback_thread.start()
        self._callbacks.put(callback)

    def _run_callbacks(self) -> None:
        while (callback := self._callbacks.get()) is not None:
            try:
                callback()
            except Exception:
                log.exception("leader election %s: callback failed", self.name)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
