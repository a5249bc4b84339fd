"""Python's full collections in the controller, a process that holds a large cache.

CPython runs a full (generation 2) collection whenever the objects that survived the younger
generations grow by a quarter since the last one, and a full collection traverses every
tracked object while no other thread runs. Measured in ``bench scale`` (40,000 Instances, 1,000
nodes): the first sync ran about 25 of them, 4.3 s of its 8.5 s of CPU, each longer than the one
before as the cache grew; after it, one every few seconds of watch events, each 140-280 ms, and
every change that arrived meanwhile waited: they were the change lag's p95.

Almost everything the sync loads lives as long as the cache. So, in a process of its own
(``runcontroller``; never in a test process or the embedded ``runserver``, whose other objects
would be frozen too): automatic collection is off while the first lists load (reference counting
still frees everything that is not in a cycle), and once every watcher has listed, or after
``SETTLE_AFTER_SECONDS`` at the latest, one collection runs, what survives it is moved out of
the collector's sight (``gc.freeze``) and automatic collection is on again: later full
collections traverse only what came after. A frozen object that is dropped later is still
freed by its reference count; only a cycle among frozen objects would stay.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Automatic collection stays off for no longer than this, listed or not: a sync stuck on an
# unreachable API server must not keep cycles from being collected for good.
SETTLE_AFTER_SECONDS = 300.0


class SyncCollection:
    """Collection off during the first sync, then one collection and ``gc.freeze``.

    ``listed(timeout)`` answers whether every watcher has listed (waiting up to ``timeout``);
    ``stop()`` (the term ends before that) turns collection back on without freezing."""

    def __init__(
        self,
        listed: Callable[[float], bool],
        settle_after: float = SETTLE_AFTER_SECONDS,
    ) -> None:
        self.listed = listed
        self.settle_after = settle_after
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.frozen = 0  # objects moved out of the collector's sight, once settled

    def start(self) -> SyncCollection:
        gc.disable()
        self._thread = threading.Thread(target=self._settle, name="heap-settle", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        gc.enable()

    def _settle(self) -> None:
        deadline = time.monotonic() + self.settle_after
        try:
            while not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or self.listed(min(left, 1.0)):
                    break
            if self._stopping.is_set():
                return
            started = time.monotonic()
            gc.collect()
            gc.freeze()
            self.frozen = gc.get_freeze_count()
            log.info(
                "controller: first sync done; %d objects kept out of full collections "
                "(collected and frozen in %.2f s)",
                self.frozen,
                time.monotonic() - started,
            )
        finally:
            gc.enable()
