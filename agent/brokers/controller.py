"""The controller's broker part: events in, keys out, and the watched brokers mirrored.

Akri's controller acts on Instance events, on broker pod events and on Node events. Here the
same events enqueue work (``dispatch``) and never write to the API server themselves:

- an Instance whose Configuration, uid, nodes or deletion changed (slot changes do not
  matter to brokers) -> its Instance key; an Instance deleted -> its Instance key;
- a Configuration changed -> its Configuration key and the keys of its Instances (a change
  may roll their brokers); deleted -> its Configuration key; after a relist, the
  Configuration key of every Configuration known or with brokers (what went unseen);
- a broker pod (label ``akri.sh/configuration``) whose phase changed, that is being deleted
  or is gone -> its Instance key (or its Configuration key for Configuration-level replicas);
- one of our Services or Jobs gone -> the key it belongs to, so a hand-deleted one returns;
- a Node deleted -> the level pass.

The pod, Job and Service watches also keep ``Broker`` rows for the dashboard and
``akri_broker_pod_count``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.utils.dateparse import parse_datetime
from kubernetes import client

from agent.brokers.dispatch import Dispatcher
from agent.brokers.models import Broker
from agent.dbthreads import start_thread
from agent.domain import brokers as rules
from agent.kube.client import BatchApi, CoreApi
from agent.kube.watch import CacheSync, ResourceWatcher
from agent.models import Configuration, Instance

log = logging.getLogger(__name__)


class BrokerController:
    """Start with ``start()`` (after the CacheSync exists), end with ``stop()``."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        sync: CacheSync,
        *,
        dispatcher: Dispatcher | None = None,
        timeout_seconds: int | None = None,
    ) -> None:
        self.namespace = namespace
        self.sync = sync
        self.dispatch = dispatcher or Dispatcher(client=api_client)
        self._instances: dict[str, tuple[Any, ...]] = {}
        # Whether a Configuration has broker work at all (a brokerSpec, or brokers left over):
        # most Instances have none, and a relist of 40,000 must not enqueue 40,000 runs. The
        # sync's applier, the watch threads and ``start`` all read and forget it; the epoch
        # keeps a lookup that raced a change from storing what it read before (see
        # ``_has_brokers``).
        self._brokered: dict[str, bool] = {}
        self._brokered_epoch = 0
        self._brokered_lock = threading.Lock()
        self._phases: dict[tuple[str, str], tuple[str, bool]] = {}
        core, batch = CoreApi(api_client), BatchApi(api_client)  # raw: no typed models
        self.watchers = [
            self._watcher(api_client, rules.POD, core.list_namespaced_pod, rules.CONFIGURATION_LABEL, timeout_seconds),
            self._watcher(api_client, rules.SERVICE, core.list_namespaced_service, "controller=akri.sh", timeout_seconds),
            self._watcher(api_client, rules.JOB, batch.list_namespaced_job, "controller=akri.sh", timeout_seconds),
        ]  # fmt: skip
        self._threads: list[threading.Thread] = []

    def _watcher(self, api_client, kind, list_func, selector, timeout) -> ResourceWatcher:
        return ResourceWatcher(
            owner="controller",
            kind=f"{self.namespace}/broker-{kind.lower()}s",
            list_func=list_func,
            list_args=(self.namespace,),
            list_kwargs={"label_selector": selector},
            on_event=lambda event, obj: self._event(kind, event, obj),
            on_relist=lambda items: self._relist(kind, items),
            api_client=api_client,
            to_dict=True,
            timeout_seconds=timeout,
        )

    def start(self) -> BrokerController:
        self.sync.subscribe(self._on_sync)
        # The sync may have listed before we subscribed (it is shared, and started first):
        # what its cache holds now is enqueued once; from here on its events tell us.
        self._catch_up()
        for watcher in self.watchers:
            self._threads.append(start_thread(watcher.run, f"brokers-{watcher.kind}"))
        return self

    def stop(self) -> None:
        self.sync.unsubscribe(self._on_sync)
        for watcher in self.watchers:
            watcher.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self.dispatch.stop()

    def node_gone(self, name: str) -> None:
        log.info("brokers: node %s gone; level pass", name)
        self.dispatch.level(self.namespace)

    # --- Configurations and Instances ---------------------------------------------------
    def _on_sync(self, kind: str, name: str, obj: dict[str, Any] | None) -> None:
        if not name:
            self._forget_brokered()
            self._relisted()
        elif kind == "configuration":
            self._forget_brokered(name)
            self.dispatch.configuration(self.namespace, name)
            if obj is not None:  # a change may roll every broker of it
                for instance in _instances_of(self.namespace, name):
                    self.dispatch.instance(self.namespace, name, instance)
        elif kind == "instance":
            self._instance(name, obj)

    def _catch_up(self) -> None:
        rows = Instance.objects.filter(namespace=self.namespace)
        for configuration, name in rows.values_list("configuration_name", "name").iterator():
            if self._has_brokers(configuration):
                self.dispatch.instance(self.namespace, configuration, name)
        self._relisted()

    def _relisted(self) -> None:
        """After a relist each object was announced, but not what went during the gap: a
        Configuration-level run for every Configuration we know or have brokers of."""
        names = set(
            Configuration.objects.filter(namespace=self.namespace).values_list("name", flat=True)
        )
        names |= set(
            Broker.objects.filter(namespace=self.namespace).values_list("configuration", flat=True)
        )
        for name in sorted(n for n in names if n):
            self.dispatch.configuration(self.namespace, name)

    def _instance(self, name: str, obj: dict[str, Any] | None) -> None:
        if obj is None:
            before = self._instances.pop(name, None)
            if before is not None and self._has_brokers(before[0]):
                self.dispatch.instance(self.namespace, before[0], name)
            return
        facts = rules.InstanceFacts.from_object(obj)
        signature = (
            facts.configuration,
            facts.uid,
            tuple(sorted(facts.nodes)),
            facts.deleting,
            facts.shared,
        )
        if self._instances.get(name) != signature:
            self._instances[name] = signature
            if self._has_brokers(facts.configuration):
                self.dispatch.instance(self.namespace, facts.configuration, name)

    def _has_brokers(self, configuration: str) -> bool:
        """The Configuration asks for brokers, or some of its brokers are still around (a
        Configuration that dropped its brokerSpec: its runs remove them). Unknown yet: its
        arrival enqueues each of its Instances."""
        with self._brokered_lock:
            known = self._brokered.get(configuration)
            epoch = self._brokered_epoch
        if known is not None:
            return known
        spec = (
            Configuration.objects.filter(namespace=self.namespace, name=configuration)
            .values_list("spec", flat=True)
            .first()
        )
        known = bool((spec or {}).get("brokerSpec")) or (
            Broker.objects.filter(namespace=self.namespace, configuration=configuration).exists()
        )
        with self._brokered_lock:
            # A change written and announced while we read may be missing from what we read:
            # keeping it would skip every later Instance of a Configuration with brokers.
            if self._brokered_epoch == epoch:
                self._brokered[configuration] = known
        return known

    def _forget_brokered(self, configuration: str | None = None) -> None:
        """After the database holds a change: drop what was known (of one Configuration, or
        of all) and void lookups under way."""
        with self._brokered_lock:
            self._brokered_epoch += 1
            if configuration is None:
                self._brokered.clear()
            else:
                self._brokered.pop(configuration, None)

    # --- broker objects -----------------------------------------------------------------
    def _event(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name, labels = meta.get("name", ""), meta.get("labels") or {}
        if event == "DELETED":
            Broker.objects.filter(namespace=self.namespace, kind=kind, name=name).delete()
            self._forget_brokered(labels.get(rules.CONFIGURATION_LABEL, ""))
            self._phases.pop((kind, name), None)
            self._wake(labels)
            return
        _mirror(self.namespace, kind, obj)
        self._forget_brokered(labels.get(rules.CONFIGURATION_LABEL, ""))
        phase = (obj.get("status") or {}).get("phase") or ""
        state = (phase, bool(meta.get("deletionTimestamp")))
        before = self._phases.get((kind, name))
        self._phases[(kind, name)] = state
        if kind == rules.POD and _news(before, state):
            self._wake(labels)

    def _wake(self, labels: dict[str, str]) -> None:
        configuration = labels.get(rules.CONFIGURATION_LABEL)
        if not configuration:
            return
        instance = labels.get(rules.INSTANCE_LABEL)
        if instance:
            self.dispatch.instance(self.namespace, configuration, instance)
        else:
            self.dispatch.configuration(self.namespace, configuration)

    def _relist(self, kind: str, items: list[dict[str, Any]]) -> None:
        names, woken = set(), []
        for obj in items:
            _mirror(self.namespace, kind, obj)
            meta = obj["metadata"]
            names.add(meta["name"])
            phase = (obj.get("status") or {}).get("phase") or ""
            state = (phase, bool(meta.get("deletionTimestamp")))
            before = self._phases.get((kind, meta["name"]))
            self._phases[(kind, meta["name"])] = state
            if kind == rules.POD and _news(before, state):
                woken.append(meta.get("labels") or {})
        gone = Broker.objects.filter(namespace=self.namespace, kind=kind).exclude(name__in=names)
        for configuration, instance in gone.values_list("configuration", "instance"):
            # Gone during the gap the relist closes: as its DELETED event would have.
            woken.append({rules.CONFIGURATION_LABEL: configuration, rules.INSTANCE_LABEL: instance})
        gone.delete()
        self._forget_brokered()
        for labels in woken:
            self._wake(labels)


def _news(before: tuple[str, bool] | None, state: tuple[str, bool]) -> bool:
    """Whether a broker pod's (phase, deleting) is news its key must hear. A pod first seen
    Pending is what the run that made it expects; first seen Running, finished or deleting
    (listed after it changed, as when the watch starts behind the first runs) it is news: else
    its Services waited for the level pass."""
    if before is None:
        phase, deleting = state
        return deleting or phase not in ("", "Pending")
    return before != state


def _instances_of(namespace: str, configuration: str) -> list[str]:
    rows = Instance.objects.filter(namespace=namespace, configuration_name=configuration)
    return list(rows.values_list("name", flat=True))


def _mirror(namespace: str, kind: str, obj: dict[str, Any]) -> None:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    labels = meta.get("labels") or {}
    created = meta.get("creationTimestamp")
    Broker.objects.update_or_create(
        namespace=namespace,
        kind=kind,
        name=meta["name"],
        defaults={
            "uid": meta.get("uid", ""),
            "configuration": labels.get(rules.CONFIGURATION_LABEL, ""),
            "instance": labels.get(rules.INSTANCE_LABEL, ""),
            "node": labels.get(rules.TARGET_NODE_LABEL)
            or (obj.get("spec") or {}).get("nodeName")
            or "",
            "phase": status.get("phase") or "" if kind == rules.POD else "",
            "deleting": bool(meta.get("deletionTimestamp")),
            "created_at": parse_datetime(created) if isinstance(created, str) else created,
        },
    )
