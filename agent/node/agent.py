"""The node agent: from discovered devices to Instances to kubelet device plugins, for one node.

Flow (DESIGN.md "one allocation, end to end"): a discovery session per Configuration reports
the whole device list whenever it changes -> the agent makes each device an Instance
(``<config>-<digest>``) that lists this node, and takes this node out of Instances whose device
it no longer sees (shared devices after ``offline_grace``) -> one Instance-level plugin per
Instance that lists this node, one Configuration-level plugin per Configuration with at least
one of them -> the kubelet's Allocate claims slots through the claim store -> the answer
updates the view, and every plugin of every agent sharing the cache sync re-sends its list.

Threads, and why:
- the cache sync's watch threads call ``_on_sync``: it only updates the in-memory view, wakes
  the affected plugins and marks Configurations dirty; no API call happens there;
- one worker thread does all Instance writes and plugin starts/stops, so decisions about one
  Instance never race each other; it wakes on dirty marks and on deadlines (offline grace,
  retries), never on a polling tick;
- one asyncio loop thread serves every plugin (``grpc.aio``) and watches for kubelet restarts
  (``kubelet.sock``'s inode and each plugin's own socket, every ``restart_poll`` seconds);
  Allocate's claims run in the loop's small thread pool, and a CL request's claims in
  ``claim_pool`` concurrently;
- discovery sessions run in their handlers' threads.

Several agents may share one ``CacheSync`` (the one-process demo and the tests run three):
exactly one sync writes the cache per database and namespace. Our own writes reach the other
agents through ``CacheSync.applied_directly``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import connections
from kubernetes import client

from agent import metrics
from agent.discovery.base import DiscoveredDevice, DiscoveryHandler, HandlerRegistry
from agent.discovery.debugecho import DEFAULT_AVAILABILITY_PATH, DebugEchoHandler
from agent.discovery.external import ReconnectPolicy, RegistrationServer
from agent.discovery.udev import UdevHandler
from agent.domain.cordon import ANNOTATION as CORDON_ANNOTATION
from agent.domain.naming import (
    cl_resource_name,
    il_resource_name,
    instance_digest,
    is_resource_name_valid,
)
from agent.kube.claims import ClaimStore
from agent.kube.client import AkriApi
from agent.kube.watch import CacheSync
from agent.models import Configuration, Instance, SlotEvent
from agent.node.assignments import assignments_for
from agent.node.cl import ConfigurationPlugin
from agent.node.discovery import (
    ConfigDiscovery,
    UnresolvedProperty,
    resolve_properties,
    session_key,
)
from agent.node.il import InstancePlugin
from agent.node.instances import DesiredInstance, InstanceWriteError, InstanceWriter
from agent.node.loop import LoopThread
from agent.node.plugin import KUBELET_SOCKET, DevicePlugin, socket_inode
from agent.node.view import (
    ClusterView,
    ConfigEntry,
    Update,
    config_of,
    is_deleting,
    is_older,
    nodes_of,
    rv_of,
)

log = logging.getLogger(__name__)

RETRY_SECONDS = 2.0
STOP_TIMEOUT = 10.0


class Reconciler(Protocol):
    """What the agent needs of a node-local slot reconciler (``agent.node.reconcile``)."""

    def on_allocated(
        self, node: str, instance: str, slot: str, value: str, device_id: str, resource_name: str
    ) -> None: ...

    def start(self) -> Any: ...

    def stop(self) -> Any: ...


@dataclass(frozen=True)
class SeenDevice:
    """A device this node discovered, under the Instance it became."""

    configuration: str
    device: DiscoveredDevice
    shared: bool


def default_handlers(debug_echo_availability: str = DEFAULT_AVAILABILITY_PATH) -> HandlerRegistry:
    """The built-in handlers: debugEcho (shared-ness from DEBUG_ECHO_INSTANCES_SHARED) and udev."""
    registry = HandlerRegistry()
    registry.register(DebugEchoHandler.from_env(availability_path=debug_echo_availability))
    registry.register(UdevHandler())
    return registry


class NodeAgent:
    """One node's agent. ``start()`` returns once everything runs; ``stop()`` undoes it all.

    - ``plugin_dir``: the kubelet's device-plugin directory (``kubelet.sock`` and our sockets);
      ``kubelet_socket`` overrides where Register goes (default ``<plugin_dir>/kubelet.sock``).
    - ``pod_resources_socket``: the kubelet's PodResources, for the slot reconciler.
    - ``registration_socket``: where Akri's external discovery handlers register (None: none).
    - ``handlers``: the discovery handlers (default: debugEcho and udev); external ones join
      the same registry.
    - ``sync``: a running CacheSync to share (exactly one per database and namespace); without
      one the agent runs its own.
    - ``offline_grace``: seconds a shared device may go undiscovered before this node leaves
      its Instance (unshared: at once).
    - ``discovery_reconnect``: seconds a failed external handler endpoint is re-dialled before
      it is dropped (0: at once, as Akri).
    - ``reconciler_factory(agent)``: builds the slot reconciler (``on_allocated``, ``start``,
      ``stop``, optionally ``serialized(*instances)``); by default ``agent.node.reconcile``'s
      when a PodResources socket is given. ``reconcile=False`` runs none.
    """

    def __init__(
        self,
        node_name: str,
        api_client: client.ApiClient,
        namespace: str,
        plugin_dir: str,
        pod_resources_socket: str = "",
        registration_socket: str | None = None,
        handlers: HandlerRegistry | None = None,
        sync: CacheSync | None = None,
        *,
        offline_grace: float = 300.0,
        discovery_reconnect: float = 0.0,
        reconciler_factory: Callable[[NodeAgent], Reconciler] | None = None,
        reconcile: bool = True,
        restart_poll: float = 0.5,
        blocking_workers: int = 8,
        claim_workers: int = 4,
        kubelet_socket: str | None = None,
    ) -> None:
        self.node_name = node_name
        self.api_client = api_client
        self.namespace = namespace
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.registration_socket = registration_socket
        self.kubelet_socket = kubelet_socket or f"{plugin_dir}/{KUBELET_SOCKET}"
        self.handlers = handlers if handlers is not None else default_handlers()
        self.offline_grace = offline_grace
        self.discovery_reconnect = discovery_reconnect
        self.restart_poll = restart_poll
        self.api = AkriApi(api_client, namespace)
        self._own_sync = sync is None
        self.sync = sync or CacheSync(api_client, namespace, owner=f"agent:{node_name}")
        self.view = ClusterView()
        # Cache writes of our claims go through the sync's ordered applier, off Allocate's path.
        self.claims = ClaimStore(
            self.api,
            f"agent:{node_name}",
            on_applied=self._claim_applied,
            sync=self.sync,
            parse=self.view.state_of,
        )
        self.assignments = assignments_for(api_client, node_name)  # the extender's, issue 14
        self.loop = LoopThread(f"agent-{node_name}", blocking_workers)
        self.claim_pool = ThreadPoolExecutor(claim_workers, thread_name_prefix=f"claim-{node_name}")
        self.register_slots = asyncio.Semaphore(8)  # concurrent Register calls per agent
        self.reconciler: Reconciler | None = None
        self._reconciler_factory = reconciler_factory
        self._reconcile = reconcile
        self._writer = InstanceWriter(self.api, node_name, self._written, self._deleted)
        self._registration: RegistrationServer | None = None
        self._lock = threading.Lock()  # guards the dicts below
        self._seen: dict[str, SeenDevice] = {}
        self._missing: dict[str, float] = {}  # instance -> monotonic time first missed
        self._il: dict[str, InstancePlugin] = {}
        self._cl: dict[str, ConfigurationPlugin] = {}
        self._dirty: set[str] = set()
        self._lifecycle: set[Future] = set()  # plugin starts and stops under way
        self._holds: set[object] = set()  # Allocates holding back device-list updates
        self.hold_notifications = True  # see defer_notifications
        self._held: set[DevicePlugin] = set()
        self._deadlines: dict[str, float] = {}  # configuration -> re-check at
        self._discovery: dict[str, ConfigDiscovery] = {}  # written by the worker only
        self._said: dict[str, str] = {}  # last log line per topic, so repeats stay quiet
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._worker = threading.Thread(target=self._run, name=f"agent-{node_name}", daemon=True)
        self._monitor: Future | None = None
        self.started = False

    # --- public -----------------------------------------------------------------------------
    def start(self) -> NodeAgent:
        self.loop.start()
        self.sync.subscribe(self._on_sync)
        self.handlers.add_listener(self._on_handler)
        self._load_from_cache()
        if self._own_sync:
            self.sync.start()
        # The reconciler runs before any plugin can take an Allocate, so it sees every claim.
        self._start_reconciler()
        if self.registration_socket:
            self._registration = RegistrationServer(
                self.handlers,
                self.registration_socket,
                policy=ReconnectPolicy(reconnect_window=self.discovery_reconnect),
            ).start()
        self._monitor = self.loop.submit(self._watch_kubelet())
        self._worker.start()
        self.started = True
        self._mark_all()
        log.info("agent for node %s started (namespace %s)", self.node_name, self.namespace)
        return self

    def _start_reconciler(self) -> None:
        factory = self._reconciler_factory
        if factory is None and self._reconcile and self.pod_resources_socket:
            # Slot reconciliation needs the kubelet's PodResources: on by default with it.
            from agent.node.reconcile import reconciler_for as factory
        if factory is not None and self._reconcile:
            self.reconciler = factory(self)
            self.reconciler.start()

    def stop(self) -> None:
        """Stop everything this agent started: plugin sockets removed, streams ended."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wakeup.set()
        if self.reconciler is not None:
            _quietly(self.reconciler.stop, "stopping the reconciler")
        self.sync.unsubscribe(self._on_sync)
        if self._own_sync:
            self.sync.stop()
        if self._registration is not None:
            self._registration.stop()
        if self._worker.is_alive():
            self._worker.join(timeout=STOP_TIMEOUT)
        for session in list(self._discovery.values()):
            session.stop()
        self._discovery.clear()
        self._stop_plugins()
        self.loop.stop()
        self.claim_pool.shutdown(wait=True)
        log.info("agent for node %s stopped", self.node_name)

    def plugins(self) -> dict[str, DevicePlugin]:
        """Running plugins by resource name (a copy)."""
        with self._lock:
            found: dict[str, DevicePlugin] = {p.resource_name: p for p in self._il.values()}
            found.update({p.resource_name: p for p in self._cl.values()})
        return found

    def seen_instances(self) -> set[str]:
        """Instances whose device this node currently discovers (or is in its offline grace)."""
        with self._lock:
            return set(self._seen)

    # --- used by the plugins ------------------------------------------------------------------
    def device_of(self, instance: str) -> DiscoveredDevice | None:
        with self._lock:
            seen = self._seen.get(instance)
        return seen.device if seen else None

    def allocated(
        self, instance: str, slot: str, value: str, device_id: str, resource_name: str
    ) -> None:
        """After a successful claim: tell the reconciler, which maps slots to pods."""
        if self.reconciler is None:
            return
        try:
            self.reconciler.on_allocated(
                self.node_name, instance, slot, value, device_id, resource_name
            )
        except Exception:
            log.exception("reconciler hook failed for %s", slot)

    def serialized(self, *instances: str) -> contextlib.AbstractContextManager:
        """The reconciler's per-Instance locks around claim + hook, when it offers them."""
        serialized = getattr(self.reconciler, "serialized", None)
        return serialized(*instances) if serialized is not None else contextlib.nullcontext()

    def release_quietly(self, instance: str, key: str, value: str, why: str) -> None:
        """Undo a claim made by a refused Allocate; failures are logged (reconciliation and
        the conditional write's own rules take it from there)."""
        try:
            self.claims.release(
                instance,
                key,
                value,
                cause=SlotEvent.Cause.RELEASE,
                node=self.node_name,
                detail=f"rolled back: {why}",
                current=self.view.instance(instance),
            )
        except Exception as exc:
            log.warning("rolling back %s=%s failed: %s", key, value, exc)

    def refresh_instance(self, name: str) -> None:
        """Read one Instance from the API server into the view (after losing a race)."""
        try:
            obj = self.api.get_instance(name)
        except Exception as exc:
            log.debug("refreshing %s failed: %s", name, exc)
            return
        update = self.view.put_instance(obj)
        if update is not None:
            self._instance_changed(update)

    # --- what the cluster says ----------------------------------------------------------------
    def _on_sync(self, kind: str, name: str, obj: dict[str, Any] | None) -> None:
        if self._stopping.is_set():
            return
        if kind == "configuration":
            self._configuration_event(name, obj)
        elif kind == "instance":
            self._instance_event(name, obj)

    def _configuration_event(self, name: str, obj: dict[str, Any] | None) -> None:
        if name == "":  # relisted: drop what the relist no longer has
            present = set(
                Configuration.objects.filter(namespace=self.namespace).values_list(
                    "name", flat=True
                )
            )
            for gone in self.view.configuration_names() - present:
                self.view.drop_configuration(gone)
            self._mark_all()
            return
        if obj is None:
            self.view.drop_configuration(name)
        else:
            self.view.put_configuration(obj)
        self._notify_configuration(name)
        self._mark(name)

    def _instance_event(self, name: str, obj: dict[str, Any] | None) -> None:
        if name == "":
            # Relisted. What the cache no longer has is gone, unless this view holds a version
            # newer than the list's: an Instance this node created or wrote after the list's
            # snapshot, which the view took from the API server's answer before the cache
            # did. Dropped, it would not come back: the watch's echo is the same version.
            listed_rv = rv_of(obj) if obj is not None else ""
            present = set(
                Instance.objects.filter(namespace=self.namespace).values_list("name", flat=True)
            )
            for gone in self.view.instance_names() - present:
                held = self.view.instance(gone)
                if held is None or not is_older(listed_rv, rv_of(held)):
                    self._instance_gone(gone)
            self._mark_all()
            return
        if obj is None:
            self._instance_gone(name)
        else:
            update = self.view.put_instance(obj)
            if update is not None:
                self._instance_changed(update)

    def _instance_changed(self, update: Update) -> None:
        obj = update.current
        name, configuration = obj["metadata"]["name"], config_of(obj)
        with self._lock:
            plugins = [self._il.get(name), self._cl.get(configuration)]
        self._notify_plugins(plugins)
        # A slot value alone changes health, which the plugins just took care of; the worker
        # is for joining, leaving and following the Configuration.
        if update.lifecycle_changed:
            self._mark(configuration)

    def _instance_gone(self, name: str, rv: str = "") -> None:
        obj = self.view.drop_instance(name, rv)
        with self._lock:
            plugins = [self._il.get(name), self._cl.get(config_of(obj)) if obj else None]
        self._notify_plugins(plugins)
        if obj is not None:
            self._mark(config_of(obj))

    def _notify_configuration(self, configuration: str) -> None:
        with self._lock:
            plugins = [p for p in self._il.values() if self._config_of_plugin(p) == configuration]
            if configuration in self._cl:
                plugins.append(self._cl[configuration])
        self._notify_plugins(plugins)

    def _notify_plugins(self, plugins: list[DevicePlugin | None]) -> None:
        with self._lock:
            if self._holds:
                self._held.update(p for p in plugins if p is not None)
                return
        for plugin in plugins:
            if plugin is not None:
                plugin.notify()

    def defer_notifications(self) -> Callable[..., None]:
        """Device-list updates wait from now until the returned release is called (any
        arguments are ignored, and calls after the first do nothing), then go out once,
        together. A plugin holds them from an Allocate's arrival until the kubelet has its
        answer: sent first, they reach the loop ahead of it (each claim changes health, so
        the Instance's plugin and the Configuration's recompute and send their lists) and
        the answer waits behind them. Measured toggled call by call in one run, everything
        settled between calls: IL 3.15 ms p50 held to the answer's sending, 3.55 ms not (11%
        less; ``allocate`` prints both, ``no_hold_*``); CL, earlier, 4.19 ms against 5.78 ms
        (28% less). Held only until the answer was handed to gRPC, the updates still ran on
        the loop ahead of its sending: ending the hold once it is sent took a further 2-8%
        off CL (``cl-allocate``, A/B in one run).
        ``hold_notifications = False`` turns it off."""
        if not self.hold_notifications:
            return _no_op
        token = object()
        with self._lock:
            self._holds.add(token)

        def release(*_: object) -> None:
            with self._lock:
                if token not in self._holds:
                    return
                self._holds.discard(token)
                held, self._held = (self._held, set()) if not self._holds else (set(), self._held)
            for plugin in held:
                plugin.notify()

        return release

    def _config_of_plugin(self, plugin: InstancePlugin) -> str:
        seen = self._seen.get(plugin.instance)
        return seen.configuration if seen else ""

    def _on_handler(self, handler_name: str) -> None:
        """A discovery handler (re)registered or went away: its Configurations restart."""
        if self._stopping.is_set():
            return
        for name in self.view.configuration_names():
            spec = self.view.spec(name)
            if spec is not None and spec.handler_name == handler_name:
                self._mark(name)

    def _load_from_cache(self) -> None:
        """What the cache holds now; the sync's events take over from here."""
        for row in Configuration.objects.filter(namespace=self.namespace):
            self.view.put_configuration(_configuration_object(row))
        for row in Instance.objects.filter(namespace=self.namespace):
            self.view.put_instance(_instance_object(row))

    # --- our own writes -----------------------------------------------------------------------
    def _claim_applied(self, obj: dict[str, Any]) -> None:
        """The claim store wrote ``obj``: our view takes it now. The cache and every other
        subscriber of the sync (other agents in this process) get it from the sync's applier,
        off the Allocate's path."""
        update = self.view.put_instance(obj)
        if update is not None:
            self._instance_changed(update)

    def _written(self, obj: dict[str, Any]) -> None:
        """An Instance write of ours: into the cache in order with the watch, and the view."""
        self.sync.submit_direct(obj, {})
        self._claim_applied(obj)

    def _deleted(self, name: str, rv: str) -> None:
        # The cache row goes with the watch's DELETED event, in order with the rest.
        self._instance_gone(name, rv)

    # --- the worker ---------------------------------------------------------------------------
    def _mark(self, configuration: str) -> None:
        if not configuration:
            return
        with self._lock:
            self._dirty.add(configuration)
        self._wakeup.set()

    def _synced(self) -> bool:
        return self.sync.configurations.synced.is_set() and self.sync.instances.synced.is_set()

    def _mark_all(self) -> None:
        ours = {config_of(o) for o in self.view.instances() if self.node_name in nodes_of(o)}
        with self._lock:
            self._dirty.update(ours)
            self._dirty.update(self.view.configuration_names())
            self._dirty.update(self._discovery)
            self._dirty.update(s.configuration for s in self._seen.values())
            self._dirty.add("")  # plugins only
        self._wakeup.set()

    def _later(self, configuration: str, at: float) -> None:
        with self._lock:
            current = self._deadlines.get(configuration)
            if current is None or at < current:
                self._deadlines[configuration] = at

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._wakeup.wait(self._until_next_deadline())
                self._wakeup.clear()
                if self._stopping.is_set():
                    break
                try:
                    self._step()
                except Exception:
                    log.exception("agent step failed; retrying")
                    self._stopping.wait(RETRY_SECONDS)
                    self._mark_all()
        finally:
            connections.close_all()

    def _until_next_deadline(self) -> float:
        with self._lock:
            if not self._deadlines:
                return 60.0
            return max(0.0, min(self._deadlines.values()) - time.monotonic())

    def _step(self) -> None:
        now = time.monotonic()
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            due = [c for c, at in self._deadlines.items() if at <= now]
            for configuration in due:
                del self._deadlines[configuration]
        dirty.update(due)
        dirty.discard("")
        for configuration in sorted(dirty):
            if self._stopping.is_set():
                return
            self._sync_configuration(configuration)
        self._sync_plugins()

    # --- Configuration -> discovery -> Instances ----------------------------------------------
    def _sync_configuration(self, name: str) -> None:
        entry = self.view.configuration(name)
        if entry is None or is_deleting(entry.obj):
            self._stop_discovery(name)
            if self._synced():
                self._leave_all(name, "its Configuration was deleted")
            else:  # not listed yet is not deleted: look again once the sync has listed
                self._later(name, time.monotonic() + RETRY_SECONDS)
            return
        if entry.spec is None:
            self._say(name, f"Configuration {name} skipped: {entry.error}", logging.ERROR)
            self._stop_discovery(name)
            return
        handler = self.handlers.get(entry.spec.handler_name)
        if handler is None:
            self._say(
                name,
                f"Configuration {name} waits for discovery handler {entry.spec.handler_name!r}",
            )
            self._stop_discovery(name)
            return
        session = self._ensure_discovery(name, entry, handler)
        if session is not None:
            self._sync_devices(name, entry, session)

    def _ensure_discovery(
        self, name: str, entry: ConfigEntry, handler: DiscoveryHandler
    ) -> ConfigDiscovery | None:
        spec = entry.spec
        assert spec is not None
        key = session_key(handler, spec)
        session = self._discovery.get(name)
        if session is not None and session.key == key:
            return session
        if session is not None:
            log.info("discovery for %s restarts: its handler or details changed", name)
            self._stop_discovery(name)
        session = ConfigDiscovery(name, handler, key, self._mark)
        try:
            properties = resolve_properties(self.api_client, spec.discovery_properties)
            session.start(spec.discovery_details, properties)
        except UnresolvedProperty as exc:
            self._say(name, f"Configuration {name} cannot start discovery: {exc}", logging.ERROR)
            self._later(name, time.monotonic() + RETRY_SECONDS * 5)
            return None
        except Exception as exc:  # DiscoveryError, or a handler's own failure
            self._say(
                name, f"Configuration {name}: {spec.handler_name} refused it: {exc}", logging.ERROR
            )
            self._later(name, time.monotonic() + RETRY_SECONDS * 15)
            return None
        self._said.pop(name, None)
        with self._lock:
            self._discovery[name] = session
        log.info("discovery for %s started with handler %s", name, spec.handler_name)
        return session

    def _stop_discovery(self, name: str) -> None:
        with self._lock:
            session = self._discovery.pop(name, None)
        if session is not None:
            session.stop()

    def _sync_devices(self, name: str, entry: ConfigEntry, session: ConfigDiscovery) -> None:
        devices = session.current()
        if devices is None:
            return  # no list yet: nothing is known to be missing either
        spec = entry.spec
        assert spec is not None
        uid = str((entry.obj.get("metadata") or {}).get("uid") or "")
        present: set[str] = set()
        for device in devices:
            desired = DesiredInstance(
                configuration=name,
                configuration_uid=uid,
                digest=instance_digest(device.id, session.shared, self.node_name),
                capacity=spec.capacity,
                shared=session.shared,
                device_properties=dict(device.properties),
                configuration_properties=dict(spec.broker_properties),
            )
            if desired.name in present:
                log.error(
                    "devices of %s collide on Instance %s; keeping the first", name, desired.name
                )
                continue
            present.add(desired.name)
            self._join(desired, SeenDevice(name, device, session.shared))
        for instance in self._candidates(name) - present:
            self._device_missing(name, instance, session.shared)

    def _join(self, desired: DesiredInstance, seen: SeenDevice) -> None:
        with self._lock:
            self._seen[desired.name] = seen
            back = self._missing.pop(desired.name, None)
        if back is not None:
            log.info("device of %s is back", desired.name)
        try:
            self._writer.ensure(self.view.instance(desired.name), desired)
        except InstanceWriteError as exc:
            log.warning("%s; retrying", exc)
            self._later(desired.configuration, time.monotonic() + RETRY_SECONDS)

    def _candidates(self, configuration: str) -> set[str]:
        """Instances of ``configuration`` this node is part of, by its books or the API's."""
        with self._lock:
            names = {n for n, s in self._seen.items() if s.configuration == configuration}
        names.update(
            o["metadata"]["name"]
            for o in self.view.instances(configuration)
            if self.node_name in nodes_of(o)
        )
        return names

    def _device_missing(self, configuration: str, instance: str, shared: bool) -> None:
        obj = self.view.instance(instance)
        if obj is not None:
            shared = bool((obj.get("spec") or {}).get("shared", shared))
        now = time.monotonic()
        if shared and self.offline_grace > 0:
            with self._lock:
                since = self._missing.setdefault(instance, now)
            if now - since < self.offline_grace:
                if since == now:
                    log.info(
                        "device of %s not discovered; leaving it in %.1fs unless it returns",
                        instance,
                        self.offline_grace,
                    )
                self._later(configuration, since + self.offline_grace)
                return
        self._leave(configuration, instance, "its device is no longer discovered")

    def _leave(self, configuration: str, instance: str, why: str) -> None:
        with self._lock:
            self._seen.pop(instance, None)
            self._missing.pop(instance, None)
        log.info("node %s leaves Instance %s: %s", self.node_name, instance, why)
        try:
            self._writer.leave(self.view.instance(instance), instance)
        except InstanceWriteError as exc:
            log.warning("%s; retrying", exc)
            self._later(configuration, time.monotonic() + RETRY_SECONDS)

    def _leave_all(self, configuration: str, why: str) -> None:
        for instance in sorted(self._candidates(configuration)):
            self._leave(configuration, instance, why)

    # --- plugins --------------------------------------------------------------------------------
    def _wanted_plugins(self) -> tuple[set[str], set[str]]:
        """(Instances, Configurations) that should have a plugin on this node now."""
        with self._lock:
            seen = set(self._seen)
        instances: set[str] = set()
        configurations: set[str] = set()
        for obj in self.view.instances():
            name = obj["metadata"]["name"]
            if name not in seen or self.node_name not in nodes_of(obj) or is_deleting(obj):
                continue
            if not is_resource_name_valid(il_resource_name(name)):
                self._say(
                    name,
                    f"Instance {name}: {il_resource_name(name)} is not a valid "
                    "extended resource name (too long?); no device plugin",
                    logging.ERROR,
                )
                continue
            instances.add(name)
            configuration = config_of(obj)
            if self.view.spec(configuration) is not None and is_resource_name_valid(
                cl_resource_name(configuration)
            ):
                configurations.add(configuration)
        return instances, configurations

    def _sync_plugins(self) -> None:
        instances, configurations = self._wanted_plugins()
        started: list[DevicePlugin] = []
        stopped: list[DevicePlugin] = []
        with self._lock:
            for name in instances - self._il.keys():
                self._il[name] = InstancePlugin(self, name)
                started.append(self._il[name])
            for name in configurations - self._cl.keys():
                self._cl[name] = ConfigurationPlugin(self, name)
                started.append(self._cl[name])
            stopped += [self._il.pop(n) for n in list(self._il.keys() - instances)]
            stopped += [self._cl.pop(n) for n in list(self._cl.keys() - configurations)]
        futures = [self.loop.submit(p.stop()) for p in stopped]
        futures += [self.loop.submit(p.start()) for p in started]
        with self._lock:
            self._lifecycle = {f for f in self._lifecycle if not f.done()} | set(futures)

    def _stop_plugins(self) -> None:
        with self._lock:
            plugins = list(self._il.values()) + list(self._cl.values())
            self._il.clear()
            self._cl.clear()

            pending = list(self._lifecycle)

        async def stop_all() -> None:
            if self._monitor is not None:
                self._monitor.cancel()
            await asyncio.gather(*(p.stop() for p in plugins), return_exceptions=True)

        try:
            # Starts and stops still under way finish first: the loop must not stop with a
            # server half closed (its socket would accept connections nobody answers).
            wait(pending, timeout=STOP_TIMEOUT)
            self.loop.run(stop_all(), timeout=STOP_TIMEOUT)
        except Exception:
            log.exception("stopping the device plugins of %s failed", self.node_name)

    async def _watch_kubelet(self) -> None:
        """Kubelet restarts: a new kubelet.sock inode, or our own socket gone. Both mean
        re-serve and re-register (kubelet-apis.md §1.6)."""
        last = socket_inode(self.kubelet_socket)
        # The loop serves every plugin: a stamp each round shows it turning (the alert
        # AkriAgentHeartbeatMissing watches for a stale stamp, deploy/extras/prometheus).
        heartbeat = metrics.AGENT_HEARTBEAT.labels(self.node_name)
        while True:
            heartbeat.set_to_current_time()
            await asyncio.sleep(self.restart_poll)
            try:
                last = await self._check_kubelet(last)
            except Exception:
                log.exception("checking the kubelet socket failed")

    async def _check_kubelet(self, last: int | None) -> int | None:
        current = socket_inode(self.kubelet_socket)
        with self._lock:
            plugins: list[DevicePlugin] = list(self._il.values()) + list(self._cl.values())
        if current is not None and current != last:
            log.info(
                "kubelet.sock is new (kubelet restarted): re-registering %d plugins", len(plugins)
            )
            await asyncio.gather(*(p.restart("the kubelet restarted") for p in plugins))
            return current
        lost = [p for p in plugins if p.serving and socket_inode(p.socket_path) != p.inode]
        if lost:
            await asyncio.gather(*(p.restart("its socket was removed") for p in lost))
        return last

    # --- small helpers --------------------------------------------------------------------------
    def _say(self, topic: str, message: str, level: int = logging.INFO) -> None:
        """Log ``message`` unless it is what was last said about ``topic``."""
        if self._said.get(topic) != message:
            self._said[topic] = message
            log.log(level, message)


def _no_op(*_: object) -> None:
    pass


def _quietly(fn: Callable[[], Any], what: str) -> None:
    try:
        fn()
    except Exception:
        log.exception("%s failed", what)


def _configuration_object(row: Configuration) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": row.name,
        "namespace": row.namespace,
        "uid": row.uid,
        "resourceVersion": row.resource_version,
        "generation": row.generation,
    }
    if row.deleting:
        metadata["deletionTimestamp"] = "unknown"
    return {"metadata": metadata, "spec": row.spec}


def _instance_object(row: Instance) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": row.name,
        "namespace": row.namespace,
        "uid": row.uid,
        "resourceVersion": row.resource_version,
    }
    if row.deleting:
        metadata["deletionTimestamp"] = "unknown"
    if row.cordon is not None:
        # The plugins' health and Allocate read the cordon from here (agent.domain.cordon).
        metadata["annotations"] = {CORDON_ANNOTATION: row.cordon}
    return {
        "metadata": metadata,
        "spec": {
            "configurationName": row.configuration_name,
            "cdiName": row.cdi_name,
            "capacity": row.capacity,
            "shared": row.shared,
            "nodes": list(row.nodes),
            "brokerProperties": dict(row.broker_properties),
            "deviceUsage": dict(row.device_usage),
        },
    }
