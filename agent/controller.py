"""The controller: the cluster watched into the ORM cache, and the live fan-out to browsers.

It watches Configurations and Instances (through ``CacheSync``), Pods that request
``akri.sh/*`` resources and Nodes; after each applied change it hands the Instance to the
live ``Coalescer``, which publishes one delta per window to the channel layer. Node
transitions to NotReady (or deletion) enqueue the cluster-wide reconciliation, which frees
that node's slots once its grace has passed. Which pod holds which slot comes from the pods
themselves (their agents' ``akri-site.io/holds``), through ``agent.kube.holders``.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from kubernetes import client

from agent import dbcopy
from agent.dbthreads import closing_connections, start_thread
from agent.domain.holdings import HOLDS, parse_holds
from agent.kube.client import CoreApi
from agent.kube.holders import Holders
from agent.kube.watch import CacheSync, ResourceWatcher
from agent.models import Node, Pod
from agent.sharing.pods import requests_of
from agent.sharing.policy import PolicyError
from agent.usage import UsageSampler

log = logging.getLogger(__name__)

AKRI_PREFIX = "akri.sh/"
# Queued cache changes above which the in-process charge recompute waits (no broker).
CHARGES_YIELD_BACKLOG = 20


def pod_resources(pod: dict[str, Any]) -> dict[str, int]:
    """``akri.sh/*`` resources a pod asks for, as kube-scheduler counts them (quantities in any
    form the API server writes; init containers at their peak). A pod we cannot read asks for
    nothing here: the API server would not have stored it."""
    try:
        return requests_of(pod, AKRI_PREFIX)
    except PolicyError:
        return {}


def pod_fields(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The cache row's columns (but namespace and name) of a pod that uses Akri resources;
    None for any other pod."""
    meta = obj.get("metadata") or {}
    resources = pod_resources(obj)
    if not resources:
        return None
    return {
        "uid": meta.get("uid", ""),
        "node_name": (obj.get("spec") or {}).get("nodeName") or "",
        "phase": (obj.get("status") or {}).get("phase") or "",
        "resources": resources,
        "deleting": bool(meta.get("deletionTimestamp")),
        "holds": parse_holds((meta.get("annotations") or {}).get(HOLDS)),
    }


def apply_pod(obj: dict[str, Any], fields: dict[str, Any] | None = None) -> bool:
    """Mirror a pod that uses Akri resources; True when the cache changed. ``fields``: its
    ``pod_fields``, when the caller has them already."""
    fields = fields if fields is not None else pod_fields(obj)
    if fields is None:
        return False
    meta = obj["metadata"]
    Pod.objects.update_or_create(
        namespace=meta.get("namespace", ""), name=meta["name"], defaults=fields
    )
    return True


# Rows per bulk statement: within every backend's parameter limit.
BATCH = 500


def replace_all_pods(items: list[dict[str, Any]]) -> None:
    """After a relist held in one list, the pod cache is the list (see ``replace_pods``)."""
    wanted: dict[tuple[str, str], dict[str, Any]] = {}
    collect_pods(wanted, items)
    replace_pods(wanted)


def collect_pods(
    wanted: dict[tuple[str, str], dict[str, Any]], items: list[dict[str, Any]]
) -> None:
    """Add the cache columns of the pods in ``items`` that use Akri resources to ``wanted``:
    a relist keeps these few columns, not the pods (10,000 pods are 50 MB of JSON)."""
    for obj in items:
        fields = pod_fields(obj)
        if fields is not None:
            meta = obj["metadata"]
            wanted[(meta.get("namespace", ""), meta["name"])] = fields


def replace_pods(wanted: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The pod cache becomes ``wanted``: rows written in bulk, and only those that differ (a
    thousand-node cluster relists tens of thousands of pods at every start)."""
    wanted = dict(wanted)
    columns = ["uid", "node_name", "phase", "resources", "deleting", "holds"]
    gone, changed = [], []
    now = timezone.now()  # bulk_update does not fill auto_now
    # Plain tuples, not a model per row: on a warm database every row is read to be compared.
    rows = Pod.objects.values_list("pk", "namespace", "name", *columns)
    for pk, namespace, name, *values in rows.iterator(BATCH):
        fields = wanted.pop((namespace, name), None)
        if fields is None:
            gone.append(pk)
        elif any(fields[k] != v for k, v in zip(columns, values, strict=True)):
            changed.append(Pod(pk=pk, namespace=namespace, name=name, updated_at=now, **fields))
    for i in range(0, len(gone), BATCH):
        Pod.objects.filter(pk__in=gone[i : i + BATCH]).delete()
    Pod.objects.bulk_update(changed, [*columns, "updated_at"], batch_size=BATCH)
    new = [{"namespace": ns, "name": name, **f} for (ns, name), f in wanted.items()]
    dbcopy.insert_rows(Pod, new)


def node_ready(obj: dict[str, Any]) -> bool:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def apply_node(obj: dict[str, Any]) -> bool:
    """Mirror a Node; True when it just stopped being Ready."""
    row = Node.objects.filter(name=obj["metadata"]["name"]).first()
    was_ready = row.ready if row else None
    if row is None:
        row = Node(name=obj["metadata"]["name"])
    _mirror_node(row, obj, timezone.now())
    row.save()
    return was_ready is not False and not row.ready


NODE_COLUMNS = ["labels", "deleted", "ready", "ready_since", "not_ready_since"]


def _mirror_node(row: Node, obj: dict[str, Any], now: datetime) -> None:
    """Set the row's columns from the Node object (``row.ready``: as last seen)."""
    ready, was_ready = node_ready(obj), row.ready if row.pk is not None else None
    row.labels = (obj.get("metadata") or {}).get("labels") or {}
    row.deleted = False
    row.ready = ready
    if ready and not was_ready:
        row.ready_since, row.not_ready_since = now, None
    elif not ready and row.not_ready_since is None:
        row.not_ready_since = _transition_time(obj) or now


def replace_nodes(items: list[dict[str, Any]]) -> None:
    """After a node relist, the Node rows are the list: new and changed rows written in bulk,
    the rest marked deleted. (A read and a save per node took 12-15 s for 1,000 nodes.)"""
    now = timezone.now()
    rows = {row.name: row for row in Node.objects.all()}
    new, changed = [], []
    for obj in items:
        row = rows.pop(obj["metadata"]["name"], None)
        if row is None:
            row = Node(name=obj["metadata"]["name"])
            new.append(row)
        before = [getattr(row, k) for k in NODE_COLUMNS]
        _mirror_node(row, obj, now)
        if row.pk is not None and [getattr(row, k) for k in NODE_COLUMNS] != before:
            row.updated_at = now  # bulk_update does not fill auto_now
            changed.append(row)
    with transaction.atomic():
        Node.objects.bulk_create(new, batch_size=BATCH)
        Node.objects.bulk_update(changed, [*NODE_COLUMNS, "updated_at"], batch_size=BATCH)
        gone = [row.pk for row in rows.values() if not row.deleted or row.ready]
        for i in range(0, len(gone), BATCH):
            Node.objects.filter(pk__in=gone[i : i + BATCH]).update(deleted=True, ready=False)


def _transition_time(obj: dict[str, Any]):
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("lastTransitionTime"):
            return parse_datetime(condition["lastTransitionTime"])
    return None


class Controller:
    """Runs the watchers and the live fan-out until ``stop()``."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        *,
        sync: CacheSync | None = None,
        timeout_seconds: int | None = None,
        queues: bool = True,
    ) -> None:
        from akri_site.dashboard.live import Coalescer

        self.api_client = api_client
        self.namespace = namespace
        self.owns_sync = sync is None
        self.sync = sync or CacheSync(
            api_client, namespace, owner="controller", timeout_seconds=timeout_seconds
        )
        self.live = Coalescer()
        # Slot.pod_* from the pods' own word (their agents keep the map on the node).
        self.holders = Holders(on_changed=self._holders_changed)
        # Slot usage history for the dashboard's charts (agent.usage), sampled while leading.
        self.usage = UsageSampler()
        core = CoreApi(api_client)  # raw lists and watches: no typed models imported
        self.pods = ResourceWatcher(
            owner="controller",
            kind="pods",
            list_func=core.list_pod_for_all_namespaces,
            on_event=self._pod_event,
            on_relist=self._pod_relist,
            on_page=self._pod_page,
            on_relist_end=self._pod_relist_end,
            api_client=api_client,
            to_dict=True,
            timeout_seconds=timeout_seconds,
        )
        self.nodes = ResourceWatcher(
            owner="controller",
            kind="nodes",
            list_func=core.list_node,
            on_event=self._node_event,
            on_relist=self._node_relist,
            api_client=api_client,
            to_dict=True,
            timeout_seconds=timeout_seconds,
        )
        self._listed_pods: dict[tuple[str, str], dict[str, Any]] = {}  # a relist so far
        self._threads: list[threading.Thread] = []
        # Embedded cluster passes waiting out a lost node's grace; a stopped controller's must
        # not run later, on whatever cluster the process's settings then name.
        self._timers: list[threading.Timer] = []
        # Queue charges (agent/queues): DRA and queue-system watches, fed our pods and Instances.
        self.queues = None
        if queues:
            from agent.queues.watch import QueueWatch

            self.queues = QueueWatch(
                api_client, fire=self._recompute_charges, timeout_seconds=timeout_seconds
            )
        # Broker deployment (agent.brokers): its own watches, work enqueued for Celery.
        from agent.brokers.controller import BrokerController

        self.brokers = BrokerController(
            api_client, namespace, self.sync, timeout_seconds=timeout_seconds
        )

    def start(self) -> Controller:
        self.live.start()
        self.holders.start()
        self.sync.subscribe(self._on_sync)
        self.brokers.start()
        if self.owns_sync:
            self.sync.start()
        for watcher in (self.pods, self.nodes):
            self._threads.append(start_thread(watcher.run, f"controller-{watcher.kind}"))
        if self.queues is not None:
            self.sync.subscribe(self._queues_sync)
            self.queues.start()
        self.usage.start()
        return self

    def listed(self, timeout: float) -> bool:
        """Whether every watcher of the cache has listed and what they listed is in it,
        waiting up to ``timeout`` seconds (``agent.heap`` settles the heap then)."""
        deadline = time.monotonic() + timeout
        for event in (self.pods.synced, self.nodes.synced):
            if not event.wait(max(0.0, deadline - time.monotonic())):
                return False
        return self.sync.wait_synced(max(0.01, deadline - time.monotonic()))

    def stopped_watchers(self) -> list[str]:
        """The watcher threads of a started controller that have ended (none while it works)."""
        return [thread.name for thread in self._threads if not thread.is_alive()]

    def stop(self) -> None:
        self.usage.stop()
        self.sync.unsubscribe(self._on_sync)
        if self.queues is not None:
            self.sync.unsubscribe(self._queues_sync)
            self.queues.stop()
        self.brokers.stop()
        if self.owns_sync:
            self.sync.stop()
        for watcher in (self.pods, self.nodes):
            watcher.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self.holders.stop()
        for timer in self._timers:
            timer.cancel()
        for timer in self._timers:
            timer.join(timeout=5)  # a cancelled timer ends at once; one already running finishes
        self.live.stop()

    # --- handlers -----------------------------------------------------------------------
    def _on_sync(self, kind: str, name: str, obj: dict[str, Any] | None) -> None:
        if kind != "instance":
            return
        # The cache clears a slot's pod when its value changes: the holders fill it again.
        self.holders.instance(self.namespace, name)
        if not name:
            return
        key = f"{self.namespace}/{name}"
        if obj is None:
            self.live.add_removed([key])
        else:
            self.live.add([key])

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace", "")
        fields = pod_fields(obj)
        if kind == "DELETED":
            Pod.objects.filter(namespace=namespace, name=meta["name"]).delete()
        elif fields is not None:
            apply_pod(obj, fields)
        if fields is not None:  # a pod that uses no Akri resource holds no slot
            self.holders.pod(namespace, meta["name"], None if kind == "DELETED" else fields)
        if self.queues is not None:
            self.queues.pod_event(kind, obj)

    def _pod_relist(self, items: list[dict[str, Any]]) -> None:
        wanted: dict[tuple[str, str], dict[str, Any]] = {}
        collect_pods(wanted, items)
        replace_pods(wanted)
        self.holders.relist(wanted)
        if self.queues is not None:
            self.queues.pod_relist(items)
        close_old_connections()

    def _pod_page(self, items: list[dict[str, Any]]) -> None:
        """A page of a pod relist: only what the caches keep of it is held until the end."""
        collect_pods(self._listed_pods, items)
        if self.queues is not None:
            self.queues.pod_page(items)

    def _pod_relist_end(self, names: set[str], listed_rv: str = "") -> None:
        # Pods reach the cache only through this watch, which resumes after the list: unlike
        # Instances, nothing newer than the list's snapshot can be in it yet.
        wanted, self._listed_pods = self._listed_pods, {}
        replace_pods(wanted)
        self.holders.relist(wanted)
        if self.queues is not None:
            self.queues.pod_relist_end()
        close_old_connections()

    def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            Node.objects.filter(name=name).update(
                deleted=True, ready=False, not_ready_since=timezone.now()
            )
            self._enqueue_cluster_reconcile(f"node {name} deleted")
            self.brokers.node_gone(name)
        elif apply_node(obj):
            self._enqueue_cluster_reconcile(f"node {name} NotReady")

    def _node_relist(self, items: list[dict[str, Any]]) -> None:
        replace_nodes(items)

    def _holders_changed(self, instances: set[tuple[str, str]]) -> None:
        """Slots of these Instances now name other pods: their charges and live cells."""
        self.live.add([f"{ns}/{name}" for ns, name in sorted(instances)])
        if self.queues is not None:
            from agent.charges.facts import AKRI, claim_key

            self.queues.debouncer.mark({claim_key(AKRI, ns, name) for ns, name in instances})

    def _queues_sync(self, kind: str, name: str, obj: dict[str, Any] | None) -> None:
        if kind == "instance" and self.queues is not None:
            self.queues.instance_changed(self.namespace, name, obj)

    def _recompute_charges(self, keys: list[str] | None) -> None:
        """Debounced charge recompute: in-process with this client when there is no broker."""
        from agent.queues import history, recompute, tasks

        if settings.CELERY_TASK_ALWAYS_EAGER:
            from agent.queues.live import publish

            if self.sync.backlog() > CHARGES_YIELD_BACKLOG and self.queues is not None:
                # In-process accounting yields to the cache it reads: try again next window.
                self.queues.debouncer.mark(None if keys is None else set(keys))
                return

            outcome = recompute.recompute(keys, api_client=self.api_client)
            if keys is None:
                history.sample()
            if outcome.written:
                publish()
            if outcome.api_away:
                # As the task would retry: the debouncer keeps the keys and tries them again.
                from agent.retrying import ApiAway

                raise ApiAway(outcome.api_away)
        else:
            tasks.recompute_charges.delay(keys=keys, trigger="event")

    def _enqueue_cluster_reconcile(self, why: str) -> None:
        """After the grace, the cluster-wide pass frees what the lost node held."""
        try:
            from agent import tasks
        except ImportError:  # pragma: no cover - tasks land with reconciliation
            return
        grace = float(settings.AKRI["NODE_GONE_GRACE_SECONDS"])
        log.info("controller: %s; cluster reconciliation in %.0f s", why, grace)
        try:
            if settings.CELERY_TASK_ALWAYS_EAGER:
                # No broker to hold a delayed task: wait in-process instead.
                timer = threading.Timer(
                    grace + 1,
                    closing_connections(tasks.reconcile_cluster.apply),
                    kwargs={"kwargs": {"trigger": "event"}},
                )
                timer.daemon = True
                self._timers = [t for t in self._timers if t.is_alive()] + [timer]
                timer.start()
            else:
                tasks.reconcile_cluster.apply_async(
                    kwargs={"trigger": "event"}, countdown=grace + 1
                )
        except Exception:
            log.exception("controller: could not enqueue cluster reconciliation")
