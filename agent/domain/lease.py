"""Lease-based leader election: the rules, without the API server.

The rules follow client-go's ``tools/leaderelection`` (what kube-controller-manager uses):

- A candidate may take the Lease when nobody holds it, when it holds it already, or when the
  record has not *changed* for longer than its ``leaseDurationSeconds`` as measured on the
  candidate's own monotonic clock from when it first saw that version. Local observation, not
  the holder's ``renewTime``, so that clock skew between nodes cannot shorten a lease.
- The holder counts itself leader only while its last successful renew *started* less than
  ``renew_deadline`` ago. Since ``renew_deadline < lease_duration`` and a rival starts counting
  only once it has seen that renew (which lands after it started), a leader that cannot renew
  stops acting at least ``lease_duration - renew_deadline`` seconds before anyone may take over.
- Every write is conditional (``resourceVersion``), so two candidates racing for an expired
  Lease cannot both win: the loser gets 409 and reads again.

Times on the wire are MicroTime: exactly six fractional digits, or the API server answers 400.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

# A follower waits up to this many retry periods between attempts (client-go's jitter), so that
# candidates started together do not knock in step.
JITTER = 1.2


@dataclass(frozen=True)
class Timing:
    """Lease duration, renew deadline and retry period, in seconds.

    The defaults keep a failover within 15 s (``worst_failover``: 11.6 s) and give a leader
    that cannot renew 3 s between stopping and the earliest takeover."""

    lease_duration: float = 8.0
    renew_deadline: float = 5.0
    retry_period: float = 1.5

    def __post_init__(self) -> None:
        # client-go's own checks: a renew deadline at or past the lease would let a rival take
        # over while the old leader still acts; too few retries per deadline make a leader
        # give up on one slow request.
        if self.retry_period <= 0:
            raise ValueError("retry period must be positive")
        if self.renew_deadline <= 1.2 * self.retry_period:
            raise ValueError("renew deadline must be longer than 1.2 x the retry period")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("lease duration must be longer than the renew deadline")

    @property
    def worst_failover(self) -> float:
        """Longest time from a leader's death to a rival's takeover, requests aside: the rival
        may see the last renew up to one (jittered) retry late, waits the lease out, then polls."""
        return self.lease_duration + 2 * JITTER * self.retry_period


@dataclass(frozen=True)
class LeaseRecord:
    """The parts of a Lease's spec that election reads."""

    holder: str = ""
    duration: float = 0.0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> LeaseRecord:
        spec = spec or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration=float(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )


def may_acquire(record: LeaseRecord | None, me: str, seen_for: float) -> bool:
    """Whether ``me`` may write itself as holder of a Lease last seen changing ``seen_for``
    seconds ago (local monotonic time); ``None`` means the Lease does not exist."""
    if record is None or not record.holder or record.holder == me:
        return True
    return seen_for > record.duration


def acquired_spec(
    record: LeaseRecord | None, me: str, timing: Timing, now: dt.datetime
) -> dict[str, Any]:
    """The spec that makes ``me`` the holder: a renew keeps acquireTime and the transition
    count; a takeover sets acquireTime and counts one more transition."""
    stamp = microtime(now)
    renewing = record is not None and record.holder == me
    transitions = record.transitions if record else 0
    return {
        "holderIdentity": me,
        "leaseDurationSeconds": int(timing.lease_duration),
        "acquireTime": record.acquire_time if renewing and record.acquire_time else stamp,
        "renewTime": stamp,
        "leaseTransitions": transitions if renewing or record is None else transitions + 1,
    }


def released_spec(record: LeaseRecord, now: dt.datetime) -> dict[str, Any]:
    """The spec a holder writes on a clean shutdown: nobody holds it, so a rival takes over at
    its next retry instead of waiting the lease out (client-go's ReleaseOnCancel)."""
    stamp = microtime(now)
    return {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": record.transitions,
    }


def microtime(moment: dt.datetime) -> str:
    """Kubernetes MicroTime: UTC, always six fractional digits (``isoformat`` drops them
    when the microseconds are zero, which the API server rejects)."""
    if moment.tzinfo is None:
        raise ValueError("MicroTime needs an aware datetime")
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
