"""Asking kube-scheduler again for a pod this extender refused, once the pod would fit.

kube-scheduler retries a pod an extender refused only on a cluster event (an assigned pod
deleted, a node's status changed, an update of the pod itself), or after 5 minutes in its
unschedulable pool. The events that free room reach it before they reach the extender's
books: a pod's deletion is also what makes the agent release its slot, and that release then
travels through the API server, the controller's cache and this process's cache feed; a new
Configuration comes through the cache as well. Retried at the event itself, the pod is refused
on books a moment old, and then nothing asks again: on the real node a gpushare pod waited
minutes for a card that had come free.

So the extender remembers the pods it refused (busy devices, a device name its books do not
know yet, a Configuration whose Instances have not reached them), and whenever its books
change it filters each of them again over the nodes it refused it on. A pod that now fits
gets the annotation ``akri.sh/retry`` (the time), written with a merge patch: an update of the
pending pod, which moves a pod an extender refused back to kube-scheduler's active queue
(every supported version, 1.30 on). Once per refusal, and only for pods that fit now one after
another (``SchedulerState.would_fit``, oldest refusal first), so the writes follow the room
that came free, not the number of waiting pods. A pod is
forgotten when it fits, when it is bound, and 5 minutes after its refusal (kube-scheduler
retries it by then anyway).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from agent.extender.state import SchedulerState

log = logging.getLogger(__name__)

ANNOTATION = "akri.sh/retry"
KEEP_SECONDS = 300.0  # kube-scheduler's podMaxInUnschedulablePodsDuration
MAX_REFUSED = 4096
# Nodes kept per refused pod: looking again is a filter over them at every change of the books,
# and the retry is a shortcut beside kube-scheduler's own (a pod refused on thousands of nodes
# is looked at again on the first ones only).
MAX_NODES = 100
# A pod asked about again still holds its room in the next looks for this long (its retry is
# on its way: kube-scheduler's longest backoff), so that one free slot is not offered to every
# waiting pod in turn before the first has been retried.
ASKED_SECONDS = 10.0
TIMEOUT = 5.0


@dataclass
class Refused:
    pod: dict[str, Any]
    nodes: list[str]
    at: float


def _slim(pod: dict[str, Any]) -> dict[str, Any]:
    """What the policies read of a pod being scheduled (its names and requests): a pod body
    may be 1.5 MiB, and thousands are kept."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}

    def containers(key: str) -> list[dict[str, Any]]:
        return [
            {k: c[k] for k in ("name", "resources", "restartPolicy") if k in c}
            for c in spec.get(key) or ()
            if isinstance(c, dict)
        ]

    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta},
        "spec": {
            "containers": containers("containers"),
            "initContainers": containers("initContainers"),
        },
    }


class Retrier:
    def __init__(
        self,
        state: SchedulerState,
        api_client: client.ApiClient | None,
        *,
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.core = client.CoreV1Api(api_client) if api_client is not None else None
        self.interval = interval
        self.clock = clock
        self.lock = threading.Lock()
        self.refused: OrderedDict[str, Refused] = OrderedDict()
        self.asked_for: OrderedDict[str, Refused] = OrderedDict()  # at: when it was asked
        self.asked = 0  # pods annotated so far
        self._version = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="extender-retry", daemon=True)

    # --- what the filter and bind say ---------------------------------------------------------
    def refused_pod(self, pod: dict[str, Any], nodes: list[str]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        if not isinstance(uid, str) or not uid or not nodes:
            return
        with self.lock:
            self.asked_for.pop(uid, None)  # retried and refused again: waiting once more
            self.refused[uid] = Refused(_slim(pod), list(nodes)[:MAX_NODES], self.clock())
            self.refused.move_to_end(uid)
            while len(self.refused) > MAX_REFUSED:
                self.refused.popitem(last=False)

    def placed(self, uid: str) -> None:
        with self.lock:
            self.refused.pop(uid, None)
            self.asked_for.pop(uid, None)

    # --- the loop -------------------------------------------------------------------------------
    def start(self) -> Retrier:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception:
                log.exception("extender: looking again at refused pods failed")

    def step(self) -> list[str]:
        """Filter the refused pods again if the books changed; the uids of those annotated."""
        self.state.expire()
        version = self.state.version
        if version == self._version:
            return []
        self._version = version
        now = self.clock()
        with self.lock:
            for uid in [u for u, r in self.refused.items() if now - r.at > KEEP_SECONDS]:
                del self.refused[uid]
            for uid in [u for u, r in self.asked_for.items() if now - r.at > ASKED_SECONDS]:
                del self.asked_for[uid]
            pending = list(self.asked_for.items())
            waiting = list(self.refused.items())
        # Pods asked about already go first: the room they were asked for is theirs.
        fitting = self.state.would_fit((u, r.pod, r.nodes) for u, r in [*pending, *waiting])
        by_uid = dict(waiting)
        asked = []
        for uid in fitting:
            refused = by_uid.get(uid)
            if refused is None:
                continue  # asked already
            with self.lock:
                if self.refused.get(uid) is not refused:
                    continue  # filtered or bound again meanwhile
                del self.refused[uid]
            if self._ask(refused.pod):
                asked.append(uid)
                with self.lock:
                    self.asked_for[uid] = Refused(refused.pod, refused.nodes, now)
        return asked

    def _ask(self, pod: dict[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        if self.core is None or not name:
            return False
        body = {"metadata": {"annotations": {ANNOTATION: str(time.time_ns())}}}
        try:
            self.core.patch_namespaced_pod(
                name, namespace, body, _preload_content=False, _request_timeout=TIMEOUT
            )
        except client.ApiException as exc:
            if exc.status not in (403, 404, 422):  # gone, or bound meanwhile (the policy)
                log.warning("extender: cannot ask again for pod %s/%s: %s", namespace, name, exc)
            return False
        except Exception as exc:
            log.warning("extender: cannot ask again for pod %s/%s: %s", namespace, name, exc)
            return False
        self.asked += 1
        log.info("extender: pod %s/%s fits now; kube-scheduler asked to retry it", namespace, name)
        return True
