"""How background work rides out a database or an API server that is away for a while.

Two shapes of background work, one policy each:

* Celery tasks take ``RETRY`` (Celery's own autoretry): a task that meets the database away
  (PostgreSQL restarting, failing over, out of connections) or the API server failing in
  passing (``ApiAway``) is sent again with a countdown, doubling from 1 s to 30 s and
  jittered, at most ``max_retries`` times or until its expiry passes (beat's runs expire
  after one interval, and the next run does the same work). The worker is never blocked
  sleeping, and the retry is logged by Celery ("Retry in Ns").
* Threads (the controller's queue probe, the charge debouncer, the webhook's refusal writer)
  keep what they failed to do and try again after ``Backoff``: doubling from a first delay to
  a cap, jittered, and back to the first delay after a success. A thread never dies of an
  outage: work it stopped doing would not resume until a restart.

What counts as passing: ``DATABASE_AWAY`` for the database (an ``IntegrityError`` or a
``DataError`` would fail again, so they are not retried), and for the API server a failure
to connect or answer, 429 and 5xx (``api_away``). A 4xx answer is the API server's final
word on that request.
"""

from __future__ import annotations

import random

from django.db import InterfaceError, OperationalError
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

DATABASE_AWAY = (OperationalError, InterfaceError)


class ApiAway(Exception):
    """The API server could not do what was asked now (no answer, 429 or 5xx): try later."""


def api_away(exc: BaseException) -> bool:
    """Is ``exc`` a passing failure of the API server (worth trying again later)?"""
    if isinstance(exc, ApiAway | HTTPError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, ApiException):
        return not exc.status or exc.status == 429 or exc.status >= 500
    return False


# Options for ``@shared_task``: the database away or the API server failing retries the task.
RETRY = {
    "autoretry_for": (*DATABASE_AWAY, ApiAway),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": 30,
}


class Backoff:
    """Delays between tries of a step that keeps failing, for threads: ``first`` doubling up
    to ``cap``, each between half and all of that (replicas that failed together do not all
    come back in the same instant). ``succeeded()`` starts again from ``first``."""

    def __init__(self, first: float = 0.5, cap: float = 30.0) -> None:
        self.first, self.cap = first, max(cap, first)
        self.failures = 0

    def failed(self) -> float:
        """Count one more failure; the seconds to wait before the next try."""
        delay = min(self.cap, self.first * 2 ** min(self.failures, 32))
        self.failures += 1
        return delay * random.uniform(0.5, 1.0)

    def succeeded(self) -> None:
        self.failures = 0
