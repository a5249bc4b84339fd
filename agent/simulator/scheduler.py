"""A stand-in for kube-scheduler with an HTTP extender, for tests and benchmarks.

It schedules one pod as the scheduler does with ``nodeCacheCapable: true`` and the extender as
binder. First the scheduler's own resource fit (the ``NodeResourcesFit`` filter) for extended
resources: a node fits when its allocatable (what its kubelet reports: the Healthy devices,
held or not) minus the requests of the pods bound to it, counted as kube-scheduler counts
them (init containers at their peak, finished pods not at all), covers the pod's requests.
Resources the configuration marks ``ignoredByScheduler`` are left to the extender. Then POST
``filter`` with the pod and the fitting node names, ``prioritize`` the survivors, take the
best score (ties: the first), POST ``bind``. The JSON is the scheduler's (``ExtenderArgs``
with the unused field null). ``admit`` then plays the kubelet that sees the binding.

Skipping the fit, as this stand-in once did, hid that kube-scheduler subtracts a pod's
requests from allocatable: a plugin that also dropped held devices from allocatable (Akri
#849's Unhealthy held vdevs) got counted twice and its node stopped taking pods.

Like kube-scheduler, it schedules a pod as its own cache holds it, never reading it again:
``create`` fills that cache, ``refresh`` plays the informer catching up. After a failed attempt
it writes ``PodScheduled=False`` on the pod (a status patch, reason ``Unschedulable`` or
``SchedulerError``, only when the condition changed), so the server's pod moves on and the
cached one it sends next is stale, as kube-scheduler's often is. ``schedule`` retries a pod whose
bind failed (kube-scheduler puts it back in its queue, with backoff) up to ``attempts`` cycles.
Calling an extender over HTTPS it presents ``tls``, the fields of kube-scheduler's
``tlsConfig`` (with ``enableHTTPS: true``), and checks the extender's certificate against
``caFile``, or not at all without one, as kube-scheduler does.

Skipping the re-read and the status write, as this stand-in once did, hid two bind-path bugs: an
extender that binds the pod body it was sent, and a binder that retried a conflicting patch with
the resourceVersion it already had.

``QueueRunner`` runs it as kube-scheduler runs: an informer on the pods, kube-scheduler's
queue (``agent.simulator.scheduler_queue``: a refused pod is tried again only on a cluster
event, after a backoff, or after 5 minutes) and one scheduling thread. Retrying Pending pods
on a timer, as the schedule-storm benchmark once did, hid that an extender refusing a pod on
books a moment old left it Pending until some later event (on the real node, minutes).
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from agent.kube.watch import ResourceWatcher
from agent.sharing.pods import EXTENDED, is_extended, is_finished, quantity, requests_of
from agent.sharing.policy import PolicyError
from agent.simulator.scheduler_queue import (
    ASSIGNED_POD_DELETE,
    EXTENDER,
    FIT,
    NODE_ALLOCATABLE_CHANGE,
    UNSCHEDULED_POD_UPDATE,
    SchedulingQueue,
)

log = logging.getLogger(__name__)


def post(
    url: str,
    body: Any,
    raw: bytes | None = None,
    timeout: float = 10,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Any]:
    """(status, decoded body) of a JSON POST; a non-200 answer's body comes back as text.
    ``context``: the TLS client side for an ``https://`` URL (``SchedulerTls.context``)."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


@dataclass(frozen=True)
class SchedulerTls:
    """kube-scheduler's extender ``tlsConfig`` (file fields), with ``enableHTTPS: true``."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    insecure: bool = False

    def context(self) -> ssl.SSLContext:
        """What kube-scheduler's transport does (pkg/scheduler/extender.go, makeTransport):
        the client certificate when given; the server checked against ``ca_file``, and not
        checked at all when there is none (enableHTTPS without a CA means insecure)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        if self.ca_file and not self.insecure:
            context.load_verify_locations(cafile=self.ca_file)
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


# The stand-in's pods name a scheduler of their own: a real kube-scheduler running against the
# same API server (scripts/real-node's) then leaves them to the stand-in, as it leaves pods of
# a second scheduler's profile.
STAND_IN = "akri-site-stand-in"


def filter_args(
    pod: dict[str, Any], nodes: list[str], node_objects: list[dict] | None = None
) -> dict[str, Any]:
    """ExtenderArgs as the scheduler marshals them: both keys present, the unused one null."""
    if node_objects is None:
        return {"Pod": pod, "Nodes": None, "NodeNames": nodes}
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": node_objects}, "NodeNames": None}


def pod_body(name: str, requests: dict[str, int]) -> dict[str, Any]:
    limits = {k: str(v) for k, v in requests.items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": STAND_IN,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": limits, "limits": limits},
                }
            ],
        },
    }


def register_nodes(
    core: client.CoreV1Api, names: list[str] | tuple[str, ...], labels: dict | None = None
) -> list[str]:
    """Node objects for ``names``, Ready, as their kubelets register them and the node
    controller then finds them (kube-scheduler and the extender's bind know only nodes that
    exist); the names created, for ``unregister_nodes``. A node that exists already is left as
    it is. A real API server taints a new Node ``node.kubernetes.io/not-ready:NoSchedule``
    (admission plugin TaintNodesByCondition) until the node controller sees it Ready; no
    controller runs here, so the taint is lifted as it would."""
    created = []
    for name in names:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    **(labels or {}),
                },
            },
        }
        try:
            core.create_node(body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            continue
        created.append(name)
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        core.patch_node_status(name, {"status": {"conditions": [ready]}})
        core.patch_node(name, {"spec": {"taints": None}})
    return created


def unregister_nodes(core: client.CoreV1Api, names: list[str]) -> None:
    for name in names:
        try:
            core.delete_node(name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


@dataclass
class Outcome:
    node: str  # "" when no node fits (the pod stays Pending)
    admitted: bool = False
    error: str = ""
    filter_result: dict[str, Any] | None = None
    # The scheduler's own fit: node -> why it does not fit ("Insufficient akri.sh/x").
    unfit: dict[str, str] | None = None
    # Scheduling cycles ``schedule`` ran (a failed bind is retried), and each failure's error.
    attempts: int = 1
    failures: list[str] = field(default_factory=list)

    def plugins(self) -> frozenset[str]:
        """What refused the pod, as kube-scheduler records it for its queue: NodeResourcesFit
        for the nodes its fit left out, ``Extender`` when the extender refused some node;
        nothing for an error (the queue then retries it after a backoff)."""
        found = set()
        if self.error:
            return frozenset()
        if self.unfit:
            found.add(FIT)
        result = self.filter_result or {}
        if result.get("FailedNodes") or result.get("FailedAndUnresolvableNodes"):
            found.add(EXTENDER)
        return frozenset(found)

    def message(self, nodes: int) -> str:
        """The FailedScheduling event kube-scheduler writes: "0/N nodes are available: ..."."""
        reasons: dict[str, int] = {}
        for why in (self.unfit or {}).values():
            reasons[why] = reasons.get(why, 0) + 1
        result = self.filter_result or {}
        for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
            for why in (result.get(key) or {}).values():
                reasons[why] = reasons.get(why, 0) + 1
        listed = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
        return f"0/{nodes} nodes are available: {listed}."


class MiniScheduler:
    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        url: str | None,
        kubelets: dict,
        ignored_by_scheduler: frozenset[str] | set[str] = frozenset(),
        *,
        tls: SchedulerTls | None = None,
        attempts: int = 3,
        backoff: float = 0.05,
    ) -> None:
        self.core = core
        self.namespace = namespace
        self.url = url  # the extender's; None: no extender, the scheduler binds
        self.kubelets = kubelets  # node name -> KubeletSimulator (None: read the Node object)
        # managedResources[].ignoredByScheduler: the fit leaves these to the extender.
        self.ignored = frozenset(ignored_by_scheduler)
        self.context = tls.context() if tls is not None else None
        self._local = threading.local()  # each thread's connection to the extender
        # Scheduling cycles per schedule(), and the pause before a retry (kube-scheduler backs
        # off 1 s doubling to 10 s; tests need no such wait).
        self.attempts = max(1, attempts)
        self.backoff = backoff
        # The scheduler's pod cache, by uid: what it sends, whatever the server has now.
        self.cache: dict[str, dict[str, Any]] = {}
        # uid -> the PodScheduled condition last written (reason, message): kube-scheduler
        # writes it only when it changed.
        self._conditions: dict[str, tuple[str, str]] = {}

    def create(self, name: str, requests: dict[str, int]) -> dict[str, Any]:
        """Create the pod and read it back: the full v1.Pod JSON the scheduler would send, as
        its cache holds it from now on."""
        self.core.create_namespaced_pod(self.namespace, pod_body(name, requests))
        return self.refresh({"metadata": {"name": name, "namespace": self.namespace}})

    def refresh(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The informer catching up: the pod as the server has it now, into the cache."""
        meta = pod["metadata"]
        response = self.core.read_namespaced_pod(
            meta["name"], meta.get("namespace") or self.namespace, _preload_content=False
        )
        fresh = json.loads(response.data)
        self.cache[fresh["metadata"]["uid"]] = fresh
        return fresh

    def cached(self, pod: dict[str, Any]) -> dict[str, Any]:
        """``pod`` as the cache holds it (the caller's copy for a pod the cache never saw)."""
        return self.cache.get((pod.get("metadata") or {}).get("uid", ""), pod)

    def _post(self, verb: str, body: Any) -> tuple[int, Any]:
        """Over a connection kept open per thread, as kube-scheduler's HTTP transport keeps
        its connections to an extender (a new one per call costs a connect, and a TLS
        handshake over HTTPS, each time)."""
        connection = getattr(self._local, "connection", None)
        parts = urllib.parse.urlsplit(self.url or "")
        for attempt in (1, 2):
            if connection is None:
                if parts.scheme == "https":
                    connection = http.client.HTTPSConnection(
                        parts.netloc, timeout=10, context=self.context
                    )
                else:
                    connection = http.client.HTTPConnection(parts.netloc, timeout=10)
                self._local.connection = connection
            try:
                connection.request(
                    "POST",
                    f"{parts.path.rstrip('/')}/{verb}",
                    body=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                )
                response = connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = self._local.connection = None
                if attempt == 2:
                    raise
                continue
            if response.status != 200:
                return response.status, data.decode(errors="replace")
            return response.status, json.loads(data)
        raise AssertionError("unreachable")

    # --- NodeResourcesFit ----------------------------------------------------------------------

    def allocatable(self, node: str, resource: str) -> int:
        """The node's allocatable as its status reports it: the kubelet simulator's own count
        (its Healthy devices), or the Node object's ``status.allocatable``."""
        kubelet = self.kubelets.get(node)
        if kubelet is not None:
            return kubelet.allocatable(resource)
        obj = self.core.read_node(node, _preload_content=False)
        value = ((json.loads(obj.data).get("status") or {}).get("allocatable") or {}).get(resource)
        try:
            return quantity(value, resource) if value is not None else 0
        except PolicyError:
            return 0

    def requested(self, nodes: list[str], skip_uid: str = "") -> dict[str, dict[str, int]]:
        """node -> extended resource -> what the pods bound there ask for (finished pods and
        the pod being scheduled left out), read from the API server as the scheduler's cache
        would hold them."""
        wanted = set(nodes)
        response = self.core.list_pod_for_all_namespaces(_preload_content=False)
        used: dict[str, dict[str, int]] = {node: {} for node in nodes}
        for pod in json.loads(response.data).get("items") or []:
            node = (pod.get("spec") or {}).get("nodeName")
            if node not in wanted or is_finished(pod):
                continue
            if skip_uid and (pod.get("metadata") or {}).get("uid") == skip_uid:
                continue
            try:
                asked = requests_of(pod, EXTENDED)
            except PolicyError:
                continue  # the API server stored it; it cannot be unreadable in practice
            for name, count in asked.items():
                used[node][name] = used[node].get(name, 0) + count
        return used

    def snapshot(self) -> dict[str, dict[str, int]]:
        """What the pods bound to each node ask for, read once: like kube-scheduler's cache,
        ``bind_best(pod, snapshot)`` adds each pod it binds (the assumed pod) to it at once,
        so pods scheduled back to back from one snapshot are counted without a re-read."""
        return self.requested(sorted(self.kubelets))

    def fit(
        self,
        pod: dict[str, Any],
        nodes: list[str],
        snapshot: dict[str, dict[str, int]] | None = None,
    ) -> tuple[list[str], dict[str, str]]:
        """(nodes that fit, node -> reason for the others), as NodeResourcesFit decides for
        extended resources; every node fits a pod that asks for none (but ignored ones)."""
        asked = {
            name: count
            for name, count in requests_of(pod, EXTENDED).items()
            if name not in self.ignored
        }
        if not asked:
            return list(nodes), {}
        uid = (pod.get("metadata") or {}).get("uid", "")
        used = snapshot if snapshot is not None else self.requested(nodes, skip_uid=uid)
        fits: list[str] = []
        unfit: dict[str, str] = {}
        for node in nodes:
            short = [
                name
                for name, count in sorted(asked.items())
                if self.allocatable(node, name) - used[node].get(name, 0) < count
            ]
            if short:
                unfit[node] = ", ".join(f"Insufficient {name}" for name in short)
            else:
                fits.append(node)
        return fits, unfit

    # --- one scheduling cycle -----------------------------------------------------------------

    def bind_best(
        self, pod: dict[str, Any], snapshot: dict[str, dict[str, int]] | None = None
    ) -> Outcome:
        """One scheduling cycle of the pod as cached: fit, filter, prioritize and bind; the
        node bound to, or "" with the reasons, which are then written on the pod as its
        ``PodScheduled=False`` condition. With a ``snapshot`` (see ``snapshot``) the fit reads
        it and the bound pod is added to it."""
        pod = self.cached(pod)
        outcome = self._bind_best(pod, snapshot)
        if outcome.node and snapshot is not None:
            used = snapshot.setdefault(outcome.node, {})
            for name, count in requests_of(pod, EXTENDED).items():
                used[name] = used.get(name, 0) + count
        if not outcome.node:
            self._failed(pod, outcome)
        return outcome

    def _failed(self, pod: dict[str, Any], outcome: Outcome) -> None:
        """kube-scheduler's failure handler: the PodScheduled condition says why, written
        with a status patch (no resourceVersion: the scheduler's write wins) when it changed.
        The cache keeps the pod it had: the informer shows the write later."""
        if outcome.error:
            reason, message = "SchedulerError", outcome.error
        else:
            reason, message = "Unschedulable", outcome.message(len(self.kubelets))
        uid = pod["metadata"]["uid"]
        if self._conditions.get(uid) == (reason, message):
            return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": now,
        }
        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": {"conditions": [condition]}}
            )
        except client.ApiException as exc:
            if exc.status != 404:  # a pod deleted meanwhile has nothing to say
                raise
            return
        self._conditions[uid] = (reason, message)

    def _bind_best(self, pod: dict[str, Any], snapshot: dict | None) -> Outcome:
        nodes, unfit = self.fit(pod, sorted(self.kubelets), snapshot)
        if not nodes:
            return Outcome("", unfit=unfit)
        if self.url is None:
            return self._bind_alone(pod, nodes[0], unfit)
        status, result = self._post("filter", filter_args(pod, nodes))
        if status != 200 or result["Error"]:
            return Outcome("", error=f"filter failed: {status} {result}", unfit=unfit)
        fits = result["NodeNames"] or []
        if not fits:
            return Outcome("", filter_result=result, unfit=unfit)
        _, scores = self._post("prioritize", filter_args(pod, fits))
        order = {name: i for i, name in enumerate(fits)}
        best = max(
            scores or [{"Host": fits[0], "Score": 0}], key=lambda s: (s["Score"], -order[s["Host"]])
        )
        meta = pod["metadata"]
        bind = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": best["Host"],
        }
        status, bound = self._post("bind", bind)
        if status != 200 or bound["Error"]:
            return Outcome(
                "", error=f"bind failed: {status} {bound}", filter_result=result, unfit=unfit
            )
        return Outcome(best["Host"], filter_result=result, unfit=unfit)

    def _bind_alone(self, pod: dict[str, Any], node: str, unfit: dict[str, str]) -> Outcome:
        """No extender: the scheduler's own binder posts the Binding (first fitting node)."""
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            # Raw: the generated client cannot read back the Status a Binding answers with.
            self.core.create_namespaced_binding(meta["namespace"], binding, _preload_content=False)
        except client.ApiException as exc:
            return Outcome("", error=f"bind failed: {exc.status} {exc.body}", unfit=unfit)
        return Outcome(node, unfit=unfit)

    def schedule(self, pod: dict[str, Any], admit: bool = True) -> Outcome:
        """Schedule the pod as cached; a failed bind (an error, not "no node fits") is
        retried, as kube-scheduler requeues the pod, up to ``attempts`` cycles in all.
        ``admit``: the kubelet of the node then admits it."""
        failures: list[str] = []
        for attempt in range(1, self.attempts + 1):
            outcome = self.bind_best(pod)
            outcome.attempts, outcome.failures = attempt, failures
            if outcome.node or not outcome.error or attempt == self.attempts:
                break
            failures.append(outcome.error)
            time.sleep(self.backoff * 2 ** (attempt - 1))
        if outcome.node and admit:
            outcome.admitted, outcome.error = self.admit(self.cached(pod), outcome.node)
        return outcome

    def admit(self, pod: dict[str, Any], node: str) -> tuple[bool, str]:
        """The kubelet of ``node`` admits the bound pod (the agent's Allocate runs), or rejects
        it as a kubelet does."""
        meta = pod["metadata"]
        containers = [
            {
                "name": c["name"],
                "requests": {
                    k: quantity(v, k) for k, v in c["resources"]["limits"].items() if is_extended(k)
                },
            }
            for c in pod["spec"]["containers"]
        ]
        result = self.kubelets[node].admit_pod(
            meta["namespace"], meta["name"], containers, uid=meta["uid"]
        )
        if result.admitted:
            self._running(meta)
        else:
            self._rejected(meta, result.error)
        return result.admitted, result.error

    def _running(self, meta: dict[str, Any]) -> None:
        """The kubelet reports an admitted pod Running once its containers start."""
        self._status(meta, {"phase": "Running"})

    def _rejected(self, meta: dict[str, Any], error: str) -> None:
        """What the kubelet does with a pod it cannot admit (kubelet.rejectPod): phase Failed,
        reason UnexpectedAdmissionError (a device plugin's Allocate failed). Left Pending and
        bound, the pod kept its devices assigned in the extender's books as if it held them."""
        self._status(
            meta, {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": error}
        )

    def _status(self, meta: dict[str, Any], status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def _watched(pod: dict[str, Any]) -> tuple:
    """What of an unscheduled pod makes its update a cluster event: all but its status (and
    resourceVersion), as kube-scheduler tells an update of the pod from its own status write."""
    meta = dict(pod.get("metadata") or {})
    for key in ("resourceVersion", "managedFields", "generation"):
        meta.pop(key, None)
    return json.dumps(meta, sort_keys=True), json.dumps(pod.get("spec") or {}, sort_keys=True)


class QueueRunner:
    """kube-scheduler's main loop around the stand-in: an informer on the pods (the
    scheduler's cache, and its events: an assigned pod deleted, an unscheduled pod updated),
    the node status each kubelet reports every ``node_status_seconds`` (a changed allocatable
    is an event; a real kubelet's nodeStatusUpdateFrequency is 10 s), and one thread that pops
    the ``SchedulingQueue`` and runs a scheduling cycle per pod, never waiting for a kubelet:
    ``on_bound(pod, node)`` is told of each binding.

    With ``manage_new`` every new pending pod of the stand-in's scheduler name in the namespace
    is queued as it appears; otherwise only what ``queue.add`` or ``queue.add_unschedulable``
    is given."""

    def __init__(
        self,
        scheduler: MiniScheduler,
        *,
        on_bound: Any = None,
        manage_new: bool = True,
        node_status_seconds: float = 10.0,
        queue: SchedulingQueue | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.queue = queue or SchedulingQueue()
        self.on_bound = on_bound
        self.manage_new = manage_new
        self.node_status_seconds = node_status_seconds
        self.lock = threading.Lock()
        self._requests: dict[str, tuple[str, dict[str, int]]] = {}  # bound, unfinished pods
        self._assumed: dict[str, tuple[str, dict[str, int]]] = {}  # bound here, not yet seen
        self._pending: dict[str, tuple] = {}  # uid -> _watched() of unscheduled pods
        self._stop = threading.Event()
        self.bound: list[tuple[str, str, float]] = []  # (uid, node, when)
        self.cycles = 0
        self._watcher = ResourceWatcher(
            owner=f"stand-in-{scheduler.namespace}",
            kind="pods",
            list_func=scheduler.core.list_pod_for_all_namespaces,
            on_event=self._on_event,
            on_relist=self._on_relist,
            api_client=scheduler.core.api_client,
            to_dict=True,
            timeout_seconds=300,
            persist=False,
        )
        self._threads: list[threading.Thread] = []

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> QueueRunner:
        for target, name in (
            (self._watcher.run, "stand-in-informer"),
            (self._node_status, "stand-in-node-status"),
            (self._schedule, "stand-in-scheduler"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
            if name == "stand-in-informer" and not self._watcher.synced.wait(30):
                raise RuntimeError("the stand-in's pod informer did not sync")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._watcher.stop()
        with self.queue.cond:
            self.queue.cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> QueueRunner:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- the informer ------------------------------------------------------------------------
    def _on_relist(self, items: list[dict[str, Any]]) -> None:
        with self.lock:
            before = set(self._requests)
            self._requests.clear()
            self._pending.clear()
        for obj in items:
            self._on_event("ADDED", obj)
        with self.lock:
            gone = before - set(self._requests)
        if gone:  # deleted while the watch was down
            self.queue.event(ASSIGNED_POD_DELETE)

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid", "")
        node = (obj.get("spec") or {}).get("nodeName") or ""
        if kind == "DELETED":
            with self.lock:
                self._requests.pop(uid, None)
                self._assumed.pop(uid, None)
                self._pending.pop(uid, None)
            self.queue.forget(uid)
            if node:
                self.queue.event(ASSIGNED_POD_DELETE)
            return
        self.scheduler.cache[uid] = obj
        if node:
            self._bound_seen(uid, node, obj)
            return
        if (obj.get("spec") or {}).get("schedulerName") != STAND_IN:
            return
        if meta.get("namespace") != self.scheduler.namespace:
            return
        watched = _watched(obj)
        with self.lock:
            before = self._pending.get(uid)
            self._pending[uid] = watched
        if before is None:
            if self.manage_new:
                self.queue.add(obj)
        elif before != watched:
            self.queue.event(UNSCHEDULED_POD_UPDATE, uid)

    def _bound_seen(self, uid: str, node: str, obj: dict[str, Any]) -> None:
        self.queue.forget(uid)
        try:
            asked = {} if is_finished(obj) else requests_of(obj, EXTENDED)
        except PolicyError:
            asked = {}
        with self.lock:
            self._pending.pop(uid, None)
            self._assumed.pop(uid, None)
            if asked:
                self._requests[uid] = (node, asked)
            else:
                self._requests.pop(uid, None)

    def used(self) -> dict[str, dict[str, int]]:
        """node -> resource -> requested: kube-scheduler's cache with its assumed pods."""
        used: dict[str, dict[str, int]] = {node: {} for node in self.scheduler.kubelets}
        with self.lock:
            entries = list(self._requests.values()) + list(self._assumed.values())
        for node, asked in entries:
            counts = used.setdefault(node, {})
            for name, count in asked.items():
                counts[name] = counts.get(name, 0) + count
        return used

    # --- node status -------------------------------------------------------------------------
    def _allocatable(self) -> dict[str, dict[str, int]]:
        found = {}
        for node, kubelet in self.scheduler.kubelets.items():
            if kubelet is None:
                continue
            found[node] = {name: kubelet.allocatable(name) for name in kubelet.resources()}
        return found

    def _node_status(self) -> None:
        last = self._allocatable()
        while not self._stop.wait(self.node_status_seconds):
            now = self._allocatable()
            if now != last:
                last = now
                self.queue.event(NODE_ALLOCATABLE_CHANGE)

    # --- scheduling --------------------------------------------------------------------------
    def _schedule(self) -> None:
        while not self._stop.is_set():
            info = self.queue.pop()
            if info is None:
                self.queue.wait(0.1)
                continue
            try:
                self._cycle(info)
            except Exception:
                log.exception("stand-in: scheduling %s failed", info.uid)
                self.queue.failed(info, frozenset())

    def _cycle(self, info: Any) -> None:
        self.cycles += 1
        pod = self.scheduler.cached(info.pod)
        outcome = self.scheduler.bind_best(pod, self.used())
        if not outcome.node:
            self.queue.failed(info, outcome.plugins())
            return
        self.queue.forget(info.uid)
        try:
            asked = requests_of(pod, EXTENDED)
        except PolicyError:
            asked = {}
        with self.lock:
            if info.uid not in self._requests:
                self._assumed[info.uid] = (outcome.node, asked)
        self.bound.append((info.uid, outcome.node, time.monotonic()))
        if self.on_bound is not None:
            self.on_bound(pod, outcome.node)
