"""The kubelet's API-server side of pod deletion, for the kubelet simulator.

Deleting a pod that is bound to a node does not remove it from a real API server: the pod gets
a `deletionTimestamp` and stays (Terminating) until the node's kubelet has stopped its
containers and released their devices, and then deletes it once more with grace period 0.
`PodFinisher` plays that part for one `KubeletSimulator`: it lists and watches the pods bound
to the kubelet's node (in one namespace, or all) and, for each pod marked for deletion, removes
it from the kubelet (`remove_pod`, which frees its device ids) and deletes it with grace 0 and
its uid as precondition. A pod removed outright (a force deletion) is removed from the kubelet
too, as a kubelet tears down pods the API server no longer has.

It works the same against the API-server simulator and a real server. Run `start()` once the
API server is up; `stop()` ends the watch promptly.

Pods are removed one at a time, as the kubelet's status manager removes them: its sync loop
takes the pods whose status changed one after another, and for each sends a GET, a status
PATCH and, once the pod is terminated, the DELETE (``syncBatch``, ``syncPod``); this stand-in
sends only the DELETE. It once sent four at a time per node: at 50 nodes the simulator then
held some 200 deletions at once, and each agent's Instance PATCH queued behind them (0.41 s at
p50 of the 0.52 s ``release-storm`` measured from a pod's disappearance to its slot free; one
at a time, 0.14 of 0.17 s), so the bench measured the simulator's queue, not the agents.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from agent.kube.client import Requests
from agent.kube.watch import ResourceWatcher
from agent.simulator.kubelet import KubeletSimulator

log = logging.getLogger(__name__)

# Streams end this often so a stopped or restarted API server is noticed soon.
WATCH_SECONDS = 30
# Pods removed at once by one node's kubelet: one, as its status manager does (module doc).
POD_WORKERS = 1


class PodFinisher:
    """Finishes the deletion of the pods bound to one kubelet's node; see the module doc."""

    def __init__(
        self,
        kubelet: KubeletSimulator,
        api_client: client.ApiClient,
        namespace: str | None = None,
    ) -> None:
        self.kubelet = kubelet
        self.node = kubelet.node_name
        self.namespace = namespace
        self.core = client.CoreV1Api(api_client)
        self._deletes = _PodDeletes(api_client)
        self.finished = 0
        self._count_lock = threading.Lock()
        # Pods (by uid) being finished or finished and not yet seen gone: the final delete's
        # own MODIFIED event (grace 0) is not a reason to delete again, and a kubelet does not.
        self._finishing: set[str] = set()
        selector = {"field_selector": f"spec.nodeName={self.node}"}
        if namespace is None:
            list_func, args = self.core.list_pod_for_all_namespaces, ()
        else:
            list_func, args = self.core.list_namespaced_pod, (namespace,)
        self._watcher = ResourceWatcher(
            owner=f"kubelet-{self.node}",
            kind="pods",
            list_func=list_func,
            list_args=args,
            list_kwargs=selector,
            on_event=self._on_event,
            on_relist=self._on_relist,
            api_client=api_client,
            to_dict=True,
            timeout_seconds=WATCH_SECONDS,
            persist=False,
        )
        self._thread: threading.Thread | None = None
        self._workers = ThreadPoolExecutor(POD_WORKERS, thread_name_prefix=f"pods-{self.node}")

    def start(self) -> PodFinisher:
        self._thread = threading.Thread(
            target=self._watcher.run, name=f"pod-finisher-{self.node}", daemon=True
        )
        self._thread.start()
        return self

    def wait_synced(self, timeout: float = 10.0) -> bool:
        return self._watcher.synced.wait(timeout)

    def stop(self) -> None:
        self._watcher.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._workers.shutdown(wait=True, cancel_futures=True)

    # --- events ---------------------------------------------------------------------------
    def _on_relist(self, pods: list[dict[str, Any]]) -> None:
        listed = {(pod.get("metadata") or {}).get("uid") for pod in pods}
        with self._count_lock:
            self._finishing &= listed
        for pod in pods:
            self._on_event("ADDED", pod)

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        uid = meta.get("uid") or ""
        if kind == "DELETED":
            self.kubelet.remove_pod(namespace, name)
            with self._count_lock:
                self._finishing.discard(uid)
        elif meta.get("deletionTimestamp"):
            with self._count_lock:
                if uid in self._finishing:
                    return
                self._finishing.add(uid)
            future = self._workers.submit(self._finish, namespace, name, uid)
            future.add_done_callback(self._report)

    def _report(self, future: Any) -> None:
        exc = None if future.cancelled() else future.exception()
        if exc is not None:  # as when it failed in the watch's own thread: list again
            log.warning("kubelet %s could not finish a pod: %s; relisting", self.node, exc)
            self._watcher.relist_soon()

    def _finish(self, namespace: str, name: str, uid: str) -> None:
        """What the kubelet does last: stop the pod here, then remove it with grace 0."""
        self.kubelet.remove_pod(namespace, name)
        options: dict[str, Any] = {"gracePeriodSeconds": 0}
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            self._deletes.delete_pod(namespace, name, options)
        except client.ApiException as exc:
            with self._count_lock:
                self._finishing.discard(uid)
            # 404: already gone; 409: a new pod took the name (its own deletion comes later).
            if exc.status not in (404, 409):
                raise
            return
        except BaseException:
            with self._count_lock:
                self._finishing.discard(uid)  # the relist that follows tries again
            raise
        with self._count_lock:
            self.finished += 1
        log.debug("kubelet %s finished pod %s/%s", self.node, namespace, name)


class _PodDeletes(Requests):
    """A pod's deletion as plain JSON: the typed call validated its arguments and built a
    V1Pod of every answer, most of this stand-in's CPU in a storm of 5,000 pods, which a
    bench of the agents on one machine shares with them."""

    def delete_pod(self, namespace: str, name: str, options: dict[str, Any]) -> None:
        self._call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=options)
