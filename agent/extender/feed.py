"""Filling the extender's books, off the scheduler's path.

``CacheFeed`` reads Instances and Configurations from the controller's ORM cache. A cheap
signature query (count and newest ``updated_at`` of each table) says whether anything moved;
only then are versions compared and the changed rows read, and unchanged Instances keep
their ``InstanceState`` objects so that the nodes they concern keep their books.

``KubeFeed`` relists Nodes (capacity and annotations, for the GPU policies when the scheduler
sends names only) from the API server, as raw JSON: the client's model classes would cost
seconds on thousands of nodes. ``PodFeed`` lists, then watches, the bound, unfinished pods that
carry a device annotation (Volcano's ``volcano.sh/gpu-index`` or our ``akri.sh/assignment``).
A watch, not a relist every few seconds: kube-scheduler retries the pods an extender refused
on an assigned pod's deletion at once, and a feed seconds behind refused them again (the card
of the deleted pod still counted), after which nothing asked again for minutes.

``FeedThread`` runs both in one background thread and never lets an error stop it: a failed
step is logged and retried on the next tick, the books keep their last good inputs.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from django.db import close_old_connections
from django.db.models import Count, Max
from kubernetes import client

from agent.dbthreads import closing_connections
from agent.domain.cordon import ANNOTATION as CORDON_ANNOTATION
from agent.domain.cordon import parse_cordon
from agent.domain.slots import InstanceState
from agent.extender.state import SchedulerState
from agent.kube.watch import ResourceWatcher
from agent.models import Configuration, Instance
from agent.sharing.akri_slots import ASSIGNMENT
from agent.sharing.gpu_cards import GPU_INDEX
from agent.sharing.policy import ConfigurationInfo

log = logging.getLogger(__name__)

CHUNK = 500
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"
DEVICE_ANNOTATIONS = (ASSIGNMENT, GPU_INDEX)


class CacheFeed:
    def __init__(self, state: SchedulerState, namespace: str) -> None:
        self.state = state
        self.namespace = namespace
        self._signature: tuple | None = None
        self._states: dict[str, tuple[str, InstanceState]] = {}  # name -> (rv, state)

    def refresh(self) -> bool:
        """Bring the books up to the cache; True when something changed."""
        signature = self._read_signature()
        if signature == self._signature:
            return False
        instances = Instance.objects.filter(namespace=self.namespace, deleting=False)
        versions = dict(instances.values_list("name", "resource_version"))
        changed = [n for n, rv in versions.items() if self._states.get(n, ("",))[0] != rv or not rv]
        for start in range(0, len(changed), CHUNK):
            for row in instances.filter(name__in=changed[start : start + CHUNK]):
                self._states[row.name] = (row.resource_version, _state_of(row))
        for gone in set(self._states) - set(versions):
            del self._states[gone]
        self.state.set_inventory([s for _, s in self._states.values()], self._configurations())
        self._signature = signature
        return True

    def _read_signature(self) -> tuple:
        def of(model: Any) -> tuple:
            found = model.objects.filter(namespace=self.namespace).aggregate(
                n=Count("id"), at=Max("updated_at")
            )
            return found["n"], found["at"]

        return of(Instance), of(Configuration)

    def _configurations(self) -> dict[str, ConfigurationInfo]:
        rows = Configuration.objects.filter(namespace=self.namespace, error="", deleting=False)
        return {
            name: ConfigurationInfo(name, capacity, unique)
            for name, capacity, unique in rows.values_list("name", "capacity", "unique_devices")
        }


def _state_of(row: Instance) -> InstanceState:
    return InstanceState(
        name=row.name,
        configuration=row.configuration_name,
        capacity=row.capacity,
        device_usage=row.device_usage or {},
        nodes=tuple(row.nodes or ()),
        shared=row.shared,
        cordon=parse_cordon({CORDON_ANNOTATION: row.cordon} if row.cordon is not None else None),
    )


class KubeFeed:
    def __init__(self, state: SchedulerState, api_client: client.ApiClient) -> None:
        self.state = state
        self.core = client.CoreV1Api(api_client)

    def refresh(self, pods: bool = True) -> None:
        """Nodes; and the device-holding pods, unless a ``PodFeed`` watches them."""
        nodes = self._list(self.core.list_node)
        for node in nodes:
            self.state.set_node(node["metadata"]["name"], node)
        if pods:
            found = self._list(self.core.list_pod_for_all_namespaces, field_selector=UNFINISHED)
            self.state.set_pods(p for p in found if holds_devices(p))

    @staticmethod
    def _list(func: Any, **kwargs: Any) -> list[dict[str, Any]]:
        response = func(_preload_content=False, **kwargs)
        return json.loads(response.data).get("items") or []


def holds_devices(pod: dict[str, Any]) -> bool:
    """Bound to a node, and carrying a device annotation some policy reads."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    return bool(node) and any(key in annotations for key in DEVICE_ANNOTATIONS)


class PodFeed:
    """The device-holding pods, listed then watched (every pod: a pod that finishes or loses
    its node leaves the books as it changes, which a field selector would not show)."""

    def __init__(self, state: SchedulerState, api_client: client.ApiClient) -> None:
        self.state = state
        self.watcher = ResourceWatcher(
            owner="extender",
            kind="pods",
            list_func=client.CoreV1Api(api_client).list_pod_for_all_namespaces,
            on_event=self._on_event,
            on_relist=self._on_relist,
            api_client=api_client,
            to_dict=True,
            persist=False,
        )
        self._thread = threading.Thread(target=self.watcher.run, name="extender-pods", daemon=True)

    def start(self, timeout: float = 30.0) -> PodFeed:
        self._thread.start()
        if not self.watcher.synced.wait(timeout):
            log.warning("extender: the pod watch has not listed yet; counting without it")
        return self

    def stop(self) -> None:
        self.watcher.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _on_relist(self, pods: list[dict[str, Any]]) -> None:
        self.state.set_pods(p for p in pods if holds_devices(p) and not _finished(p))

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid") or ""
        if not uid:
            return
        gone = kind == "DELETED" or _finished(pod)
        held = not gone and holds_devices(pod)
        self.state.pod_changed(uid, pod if held else None, gone=gone)


def _finished(pod: dict[str, Any]) -> bool:
    return ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed")


class FeedThread:
    """Runs the feeds every ``interval`` (cache) and ``kube_interval`` (API) seconds."""

    def __init__(
        self,
        cache: CacheFeed,
        kube: KubeFeed | None,
        *,
        interval: float = 0.5,
        kube_interval: float = 5.0,
    ) -> None:
        self.cache = cache
        self.kube = kube
        self.interval = interval
        self.kube_interval = kube_interval
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=closing_connections(self._run), name="extender-feed", daemon=True
        )
        self.pods_watched = False  # a PodFeed keeps the pods: the node relist leaves them
        self.errors = 0

    def start(self) -> FeedThread:
        self.step(kube=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        ticks_per_kube = max(1, round(self.kube_interval / self.interval))
        tick = 0
        while not self._stop.wait(self.interval):
            tick += 1
            self.step(kube=tick % ticks_per_kube == 0)

    def step(self, kube: bool = False) -> None:
        try:
            close_old_connections()
            self.cache.refresh()
        except Exception:
            self.errors += 1
            log.exception("extender: reading the cache failed; keeping the last books")
        if kube and self.kube is not None:
            try:
                self.kube.refresh(pods=not self.pods_watched)
            except Exception:
                self.errors += 1
                log.exception("extender: listing nodes and pods failed; keeping the last ones")
