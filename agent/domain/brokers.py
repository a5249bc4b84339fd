"""Broker deployment as Akri's controller does it: the objects a Configuration wants, and the
writes that take the cluster there. Plain Python, no framework (akri-compat.md §7).

Given a Configuration, its Instances, the nodes that exist and the broker objects found in the
cluster, ``plan`` answers which Pods, Jobs and Services to create and which to delete. Akri's
rules, with the names, labels and owners byte-identical to Akri v0.13 so either controller
recognises the other's brokers:

- ``brokerPodSpec``: one Pod per node in ``Instance.spec.nodes`` (a node without a Node object
  gets none), named ``<node>-<instance>-pod`` (shared) or ``<instance>-pod`` (unshared), with a
  required node affinity on ``metadata.name`` and the Instance as its controller owner;
- ``brokerJobSpec``: one Job per Instance, ``<instance>-<configGeneration>-job``;
- ``{{PLACEHOLDER}}`` in the limits and requests of containers and initContainers becomes
  ``akri.sh/<instance>``; the broker's environment comes from the agent's Allocate answer
  (``brokerProperties``), exactly as with Akri, so nothing is added to the spec here;
- Instance and Configuration Services once a broker pod of theirs is Running, removed when no
  broker pod of theirs is left that is not Failed, Succeeded or being deleted;
- a broker Pod Pending for more than 5 minutes, or Failed / Succeeded / in any other phase, is
  deleted and made again; a Pod on a node that left the Instance goes.

Where we differ from Akri, on purpose:

- The Pending grace counts from ``status.startTime`` or, when the pod never started (never
  scheduled), from its creation: Akri waits forever for a pod without a start time.
- A change of ``brokerSpec`` or ``brokerProperties`` rolls the brokers: each broker carries a
  fingerprint of both (annotation ``FINGERPRINT``); one with another fingerprint is replaced.
  Akri gets the same effect only because its agent recreates Instances on such a change.
- The Configuration-level strategy: a Configuration annotated ``REPLICAS: "N"`` gets N broker
  Pods ``<configuration>-<i>-broker``, owned by the Configuration, each asking
  ``akri.sh/<configuration>`` (any device of the kind, through the Configuration-level plugin)
  instead of one Pod per Instance and node. An annotation, because the CRD schema is Akri's.
- Instance Services also carry the Configuration's label, so one list finds every object
  of a Configuration; Akri's own Instance Services (without it) are recognised too.
- Objects are touched only when they carry our labels (``controller=akri.sh`` and the
  Configuration's label) and an ownerReference to the Instance or Configuration they belong to.
  A name taken by anything else is reported and left alone.
- Names Akri's labels cannot carry (over 63 characters) get no broker and are reported: Akri
  would fail on them at the API server, over and over.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agent.domain.naming import is_qualified_name

AKRI_API_VERSION = "akri.sh/v0"
PLACEHOLDER = "{{PLACEHOLDER}}"
APP_LABEL = "app"
CONTROLLER_LABEL = "controller"
CONTROLLER_VALUE = "akri.sh"
CONFIGURATION_LABEL = "akri.sh/configuration"
INSTANCE_LABEL = "akri.sh/instance"
TARGET_NODE_LABEL = "akri.sh/target-node"
REPLICAS = "brokers.akri-site.io/replicas"
REPLICA_LABEL = "brokers.akri-site.io/replica"
FINGERPRINT = "brokers.akri-site.io/fingerprint"
MAX_REPLICAS = 100
PENDING_GRACE = timedelta(minutes=5)
RUNNING_PHASES = frozenset({"Running", "ContainerCreating", "PodInitializing"})
ENDED_PHASES = frozenset({"Failed", "Succeeded", "Terminating"})

POD, JOB, SERVICE = "Pod", "Job", "Service"


class BrokerSpecError(ValueError):
    """The Configuration asks for brokers in a way we cannot deploy; shown, never retried
    until the Configuration changes."""


# --- facts in -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigFacts:
    name: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ConfigFacts:
        meta = obj.get("metadata") or {}
        return cls(
            name=meta["name"],
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation") or 0),
            spec=obj.get("spec") or {},
            annotations=meta.get("annotations") or {},
        )


@dataclass(frozen=True)
class InstanceFacts:
    name: str
    uid: str
    configuration: str
    shared: bool
    nodes: tuple[str, ...]
    deleting: bool = False

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> InstanceFacts:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        return cls(
            name=meta["name"],
            uid=meta.get("uid", ""),
            configuration=spec.get("configurationName", ""),
            shared=bool(spec.get("shared")),
            nodes=tuple(n for n in spec.get("nodes") or [] if isinstance(n, str)),
            deleting=bool(meta.get("deletionTimestamp")),
        )


@dataclass(frozen=True)
class Found:
    """A Pod, Job or Service found in the cluster under a name we might want."""

    kind: str
    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[tuple[str, str, str], ...] = ()  # (kind, name, uid)
    annotations: Mapping[str, str] = field(default_factory=dict)
    phase: str = ""
    started: datetime | None = None
    deleting: bool = False

    @classmethod
    def from_object(cls, kind: str, obj: Mapping[str, Any]) -> Found:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        owners = tuple(
            (o.get("kind", ""), o.get("name", ""), o.get("uid", ""))
            for o in meta.get("ownerReferences") or []
            if o.get("apiVersion") == AKRI_API_VERSION
        )
        return cls(
            kind=kind,
            name=meta["name"],
            uid=meta.get("uid", ""),
            labels=meta.get("labels") or {},
            owners=owners,
            annotations=meta.get("annotations") or {},
            phase=status.get("phase") or "" if kind == POD else "",
            started=_time(status.get("startTime")) or _time(meta.get("creationTimestamp")),
            deleting=bool(meta.get("deletionTimestamp")),
        )


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


# --- answers out ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Delete:
    kind: str
    name: str
    uid: str  # a precondition: never delete a namesake made after we looked
    why: str


@dataclass(frozen=True)
class Adopt:
    """A Service of ours whose owner is not the current Instance/Configuration: re-own it."""

    kind: str
    name: str
    owner: dict[str, Any]


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[Delete] = field(default_factory=list)
    adopt: list[Adopt] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # objects left alone: names not ours
    error: str = ""  # the Configuration's broker request is unusable (BrokerSpecError)
    needs_configuration: bool = False  # an Instance-scoped run found work for its Configuration

    def empty(self) -> bool:
        return not (self.create or self.delete or self.adopt)


# --- names ----------------------------------------------------------------------------------
def broker_app_name(instance: str, node: str | None, shared: bool, suffix: str) -> str:
    """Akri's ``create_broker_app_name``: dots become dashes; shared devices get the node first."""
    normalized = instance.replace(".", "-")
    if shared and node:
        return f"{node}-{normalized}-{suffix}"
    return f"{normalized}-{suffix}"


def pod_name(instance: str, node: str, shared: bool) -> str:
    return broker_app_name(instance, node, shared, "pod")


def job_name(instance: str, generation: int) -> str:
    # Akri passes the shared flag but no node, so the node never shows in a Job's name.
    return broker_app_name(instance, None, False, f"{generation}-job")


def instance_service_name(instance: str) -> str:
    return f"{instance.replace('.', '-')}-svc"


def configuration_service_name(configuration: str) -> str:
    return f"{configuration}-svc"


def replica_pod_name(configuration: str, index: int) -> str:
    return f"{configuration}-{index}-broker"


# --- the Configuration's broker spec --------------------------------------------------------
@dataclass(frozen=True)
class BrokerKind:
    kind: str  # POD or JOB
    spec: Mapping[str, Any]
    replicas: int = 0  # > 0: the Configuration-level strategy


def broker_kind(config: ConfigFacts) -> BrokerKind | None:
    """What brokers the Configuration wants; None for none; BrokerSpecError when unusable."""
    broker = config.spec.get("brokerSpec")
    replicas = _replicas(config)
    if broker is None:
        if replicas:
            raise BrokerSpecError(f"annotation {REPLICAS} needs a brokerSpec.brokerPodSpec")
        return None
    if not isinstance(broker, Mapping):
        raise BrokerSpecError("brokerSpec must be an object")
    pod, job = broker.get("brokerPodSpec"), broker.get("brokerJobSpec")
    if pod is not None and job is not None:
        raise BrokerSpecError("brokerSpec has both brokerPodSpec and brokerJobSpec; give one")
    if pod is not None:
        _check_pod_spec(pod, "brokerPodSpec")
        return BrokerKind(POD, pod, replicas)
    if job is not None:
        if replicas:
            raise BrokerSpecError(f"annotation {REPLICAS} works with brokerPodSpec only")
        if not isinstance(job, Mapping) or not isinstance(job.get("template"), Mapping):
            raise BrokerSpecError("brokerJobSpec.template must be an object")
        _check_pod_spec(job["template"].get("spec"), "brokerJobSpec.template.spec")
        return BrokerKind(JOB, job)
    return None


def _check_pod_spec(spec: Any, where: str) -> None:
    if not isinstance(spec, Mapping):
        raise BrokerSpecError(f"{where} must be an object")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise BrokerSpecError(f"{where}.containers must be a non-empty list")
    for key in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(key) or []):
            if not isinstance(container, Mapping):
                raise BrokerSpecError(f"{where}.{key}[{i}] must be an object")


def _replicas(config: ConfigFacts) -> int:
    raw = config.annotations.get(REPLICAS)
    if raw is None:
        return 0
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise BrokerSpecError(f"annotation {REPLICAS}={raw!r} is not a whole number") from None
    if not 0 <= value <= MAX_REPLICAS:
        raise BrokerSpecError(f"annotation {REPLICAS}={raw!r} must be 0..{MAX_REPLICAS}")
    return value


def fingerprint(config: ConfigFacts) -> str:
    """What a broker was made from: brokerSpec and brokerProperties (and the strategy)."""
    source = {
        "brokerSpec": config.spec.get("brokerSpec"),
        "brokerProperties": config.spec.get("brokerProperties") or {},
        "replicas": config.annotations.get(REPLICAS),
    }
    text = json.dumps(source, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- object bodies --------------------------------------------------------------------------
def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": AKRI_API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def rewrite_placeholder(pod_spec: Mapping[str, Any], resource: str) -> dict[str, Any]:
    """A copy with the ``{{PLACEHOLDER}}`` limit and request keys renamed to ``resource``."""
    spec = copy.deepcopy(dict(pod_spec))
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            resources = container.get("resources") or {}
            for part in ("limits", "requests"):
                amounts = resources.get(part)
                if isinstance(amounts, dict) and PLACEHOLDER in amounts:
                    amounts[resource] = amounts.pop(PLACEHOLDER)
    return spec


def pin_to_node(pod_spec: dict[str, Any], node: str) -> dict[str, Any]:
    """Append Akri's required node-affinity term (``metadata.name In [node]``)."""
    affinity = pod_spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    terms.append({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]})
    return pod_spec


def broker_pod(
    config: ConfigFacts, instance: InstanceFacts, node: str, spec: Mapping[str, Any], mark: str
) -> dict[str, Any]:
    name = pod_name(instance.name, node, instance.shared)
    labels = {
        APP_LABEL: name,
        CONTROLLER_LABEL: CONTROLLER_VALUE,
        CONFIGURATION_LABEL: config.name,
        INSTANCE_LABEL: instance.name,
        TARGET_NODE_LABEL: node,
    }
    body = rewrite_placeholder(spec, f"akri.sh/{instance.name}")
    return {
        "apiVersion": "v1",
        "kind": POD,
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {FINGERPRINT: mark},
            "ownerReferences": [owner_reference("Instance", instance.name, instance.uid)],
        },
        "spec": pin_to_node(body, node),
    }


def broker_job(
    config: ConfigFacts, instance: InstanceFacts, spec: Mapping[str, Any], mark: str
) -> dict[str, Any]:
    name = job_name(instance.name, config.generation)
    akri_labels = {CONFIGURATION_LABEL: config.name, INSTANCE_LABEL: instance.name}
    job = copy.deepcopy(dict(spec))
    template = job.setdefault("template", {})
    template["spec"] = rewrite_placeholder(template.get("spec") or {}, f"akri.sh/{instance.name}")
    template_meta = template.setdefault("metadata", {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), **akri_labels}
    return {
        "apiVersion": "batch/v1",
        "kind": JOB,
        "metadata": {
            "name": name,
            "labels": {**akri_labels, APP_LABEL: name, CONTROLLER_LABEL: CONTROLLER_VALUE},
            "annotations": {FINGERPRINT: mark},
            "ownerReferences": [owner_reference("Instance", instance.name, instance.uid)],
        },
        "spec": job,
    }


def replica_pod(
    config: ConfigFacts, index: int, spec: Mapping[str, Any], mark: str
) -> dict[str, Any]:
    name = replica_pod_name(config.name, index)
    return {
        "apiVersion": "v1",
        "kind": POD,
        "metadata": {
            "name": name,
            "labels": {
                APP_LABEL: name,
                CONTROLLER_LABEL: CONTROLLER_VALUE,
                CONFIGURATION_LABEL: config.name,
                REPLICA_LABEL: str(index),
            },
            "annotations": {FINGERPRINT: mark},
            "ownerReferences": [owner_reference("Configuration", config.name, config.uid)],
        },
        "spec": rewrite_placeholder(spec, f"akri.sh/{config.name}"),
    }


def instance_service(config: ConfigFacts, instance: InstanceFacts) -> dict[str, Any]:
    body = _service(
        instance_service_name(instance.name),
        config.spec.get("instanceServiceSpec") or {},
        {INSTANCE_LABEL: instance.name},
        owner_reference("Instance", instance.name, instance.uid),
    )
    # Beyond Akri's labels: the Configuration's, so one list finds all of its objects.
    body["metadata"]["labels"][CONFIGURATION_LABEL] = config.name
    return body


def configuration_service(config: ConfigFacts) -> dict[str, Any]:
    return _service(
        configuration_service_name(config.name),
        config.spec.get("configurationServiceSpec") or {},
        {CONFIGURATION_LABEL: config.name},
        owner_reference("Configuration", config.name, config.uid),
    )


def _service(
    name: str, spec: Mapping[str, Any], scope: dict[str, str], owner: dict[str, Any]
) -> dict[str, Any]:
    body = copy.deepcopy(dict(spec))
    body["selector"] = {
        **(body.get("selector") or {}),
        CONTROLLER_LABEL: CONTROLLER_VALUE,
        **scope,
    }
    return {
        "apiVersion": "v1",
        "kind": SERVICE,
        "metadata": {
            "name": name,
            "labels": {APP_LABEL: name, CONTROLLER_LABEL: CONTROLLER_VALUE, **scope},
            "ownerReferences": [owner],
        },
        "spec": body,
    }


# --- what is wanted -------------------------------------------------------------------------
def wanted_brokers(
    config: ConfigFacts,
    kind: BrokerKind,
    instances: Iterable[InstanceFacts],
    live_nodes: set[str] | None,
) -> dict[str, dict[str, Any]]:
    """Broker Pods or Jobs by name. ``live_nodes`` None: every node counts as present."""
    mark = fingerprint(config)
    wanted: dict[str, dict[str, Any]] = {}
    if kind.replicas:
        for i in range(kind.replicas):
            body = replica_pod(config, i, kind.spec, mark)
            wanted[body["metadata"]["name"]] = body
        return wanted
    for instance in sorted(instances, key=lambda i: i.name):
        if instance.deleting or instance.configuration != config.name:
            continue
        if kind.kind == JOB:
            body = broker_job(config, instance, kind.spec, mark)
            wanted[body["metadata"]["name"]] = body
            continue
        for node in sorted(set(instance.nodes)):
            if live_nodes is not None and node not in live_nodes:
                continue
            body = broker_pod(config, instance, node, kind.spec, mark)
            # An unshared Instance's pod name has no node in it: the first node keeps it.
            wanted.setdefault(body["metadata"]["name"], body)
    return wanted


# --- ownership ------------------------------------------------------------------------------
def owner_of(body: Mapping[str, Any]) -> tuple[str, str, str]:
    ref = body["metadata"]["ownerReferences"][0]
    return ref["kind"], ref["name"], ref["uid"]


def is_ours(found: Found, configuration: str) -> bool:
    """Our labels and an Akri ownerReference; anything else is never touched. An Instance
    Service made by Akri itself has no Configuration label: its Instance label and owner do."""
    labels = found.labels
    if labels.get(CONTROLLER_LABEL) != CONTROLLER_VALUE:
        return False
    if labels.get(CONFIGURATION_LABEL) == configuration:
        return any(kind in ("Instance", "Configuration") for kind, _, _ in found.owners)
    instance = labels.get(INSTANCE_LABEL)
    return (
        found.kind == SERVICE
        and CONFIGURATION_LABEL not in labels
        and bool(instance)
        and instance.startswith(f"{configuration}-")
        and any(kind == "Instance" and name == instance for kind, name, _ in found.owners)
    )


# --- the plan -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scope:
    """The part of a Configuration's objects one run decides about.

    - whole (the default): everything;
    - ``instance``: that Instance's Pods or Job and its Service. The Configuration Service is
      not decided (the run saw only this Instance's pods); ``Plan.needs_configuration`` asks
      for a Configuration-level run when it is missing while a pod of this Instance runs;
    - ``configuration_level``: objects of no Instance (the Configuration Service, replica
      pods) and those of Instances that are gone.
    """

    instance: str | None = None
    configuration_level: bool = False

    def covers(self, labels: Mapping[str, str], known: set[str]) -> bool:
        owner = labels.get(INSTANCE_LABEL)
        if self.instance is not None:
            return owner == self.instance
        if self.configuration_level:
            return owner is None or owner not in known
        return True

    @property
    def sees_all_pods(self) -> bool:
        return self.instance is None


WHOLE = Scope()


def plan(
    config: ConfigFacts | None,
    instances: Iterable[InstanceFacts],
    found: Iterable[Found],
    *,
    configuration: str,
    live_nodes: set[str] | None,
    now: datetime,
    scope: Scope = WHOLE,
) -> Plan:
    """The writes that take ``found`` to what ``config`` wants, within ``scope``.

    ``config`` None means the Configuration is gone: every broker object of ours goes.
    ``found`` must hold every object of the scope (and, for Services, the pods they serve).
    """
    instances = [i for i in instances if i.configuration == configuration]
    known = {i.name for i in instances if not i.deleting}
    found = list(found)
    result = Plan()
    try:
        kind = broker_kind(config) if config is not None else None
    except BrokerSpecError as exc:
        result.error = str(exc)
        return result  # leave what exists: an unusable edit must not tear brokers down
    if kind is None:
        known = set()  # no brokers wanted: a Configuration-level run takes everything of ours
    if kind is not None:
        problem, instances = _unlabelable(configuration, instances)
        if problem and not instances:
            result.error = problem  # the Configuration's own name: nothing can be deployed
        elif problem:
            result.problems.append(problem)
    wanted = wanted_brokers(config, kind, instances, live_nodes) if kind else {}
    wanted = {n: b for n, b in wanted.items() if scope.covers(b["metadata"]["labels"], known)}
    ours = [f for f in found if is_ours(f, configuration) and scope.covers(f.labels, known)]
    by_name = {(f.kind, f.name): f for f in found}
    _plan_brokers(result, wanted, ours, by_name, now)
    pods_after = _pods_after(found, configuration, result)
    services = _wanted_services(config, instances, scope, known) if kind else []
    _plan_services(result, configuration, services, ours, by_name, pods_after)
    if scope.instance is not None and config is not None and kind is not None:
        result.needs_configuration = _configuration_service_missing(config, by_name, pods_after)
    return result


def _unlabelable(
    configuration: str, instances: list[InstanceFacts]
) -> tuple[str, list[InstanceFacts]]:
    """Names Akri's labels cannot carry (a label value has at most 63 characters): no
    broker for those, and a reason to show."""
    if not label_value_ok(configuration):
        return f"Configuration name {configuration!r} is not a valid label value", []
    bad = [i.name for i in instances if not label_value_ok(i.name)]
    if not bad:
        return "", instances
    error = (
        f"Instance name {bad[0]!r} is not a valid label value (at most 63 characters)"
        f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}: no broker for it"
    )
    return error, [i for i in instances if i.name not in bad]


def label_value_ok(value: str) -> bool:
    return is_qualified_name(value) and "/" not in value


def _plan_brokers(
    result: Plan,
    wanted: dict[str, dict[str, Any]],
    ours: list[Found],
    by_name: dict[tuple[str, str], Found],
    now: datetime,
) -> None:
    for f in ours:
        if f.kind == SERVICE:
            continue
        body = wanted.get(f.name)
        if body is None or body["kind"] != f.kind:
            if not f.deleting:
                result.delete.append(Delete(f.kind, f.name, f.uid, "not wanted"))
            continue
        why = _replace_reason(f, body, now)
        if why and not f.deleting:
            result.delete.append(Delete(f.kind, f.name, f.uid, why))
    for name, body in wanted.items():
        existing = by_name.get((body["kind"], name))
        if existing is None:
            result.create.append(body)
        elif not is_ours(existing, body["metadata"]["labels"][CONFIGURATION_LABEL]):
            result.problems.append(
                f"{body['kind']} {name} exists but is not ours (labels or owner): left alone"
            )


def _replace_reason(f: Found, body: dict[str, Any], now: datetime) -> str:
    """Why an existing broker of ours must be deleted (to be made again), or ""."""
    if owner_of(body)[2] not in {uid for _, _, uid in f.owners}:
        return "owned by an older object of that name"
    target = body["metadata"]["labels"].get(TARGET_NODE_LABEL)
    if target is not None and f.labels.get(TARGET_NODE_LABEL) != target:
        return f"its node {f.labels.get(TARGET_NODE_LABEL)} left the Instance"
    if f.annotations.get(FINGERPRINT, "") != body["metadata"]["annotations"][FINGERPRINT]:
        return "made from an older brokerSpec or brokerProperties"
    if f.kind != POD or f.phase in RUNNING_PHASES:
        return ""
    if f.phase in ("Pending", ""):
        if f.started is not None and now - f.started > PENDING_GRACE:
            return f"Pending for more than {PENDING_GRACE.seconds // 60} minutes"
        return ""
    return f"phase {f.phase}"


def _pods_after(found: list[Found], configuration: str, result: Plan) -> list[Found]:
    """The Configuration's pods that stay (not being deleted) after the plan's deletions.
    Any pod with the Configuration's label counts, as with Akri: a Job's pods too."""
    going = {(d.kind, d.name) for d in result.delete}
    return [
        f
        for f in found
        if f.kind == POD
        and f.labels.get(CONFIGURATION_LABEL) == configuration
        and (f.kind, f.name) not in going
        and not f.deleting
    ]


def _wanted_services(
    config: ConfigFacts, instances: list[InstanceFacts], scope: Scope, known: set[str]
) -> list[tuple[dict[str, Any], str | None]]:
    """Services the Configuration asks for in ``scope``, each with the Instance whose pods
    it serves (None: every pod of the Configuration)."""
    wanted: list[tuple[dict[str, Any], str | None]] = []
    if config.spec.get("instanceServiceSpec"):
        for instance in instances:
            body = instance_service(config, instance)
            if not instance.deleting and scope.covers(body["metadata"]["labels"], known):
                wanted.append((body, instance.name))
    if config.spec.get("configurationServiceSpec") and scope.sees_all_pods:
        wanted.append((configuration_service(config), None))
    return wanted


def _plan_services(
    result: Plan,
    configuration: str,
    wanted: list[tuple[dict[str, Any], str | None]],
    ours: list[Found],
    by_name: dict[tuple[str, str], Found],
    pods: list[Found],
) -> None:
    keep = set()
    for body, instance in wanted:
        name = body["metadata"]["name"]
        served = [p for p in pods if instance is None or p.labels.get(INSTANCE_LABEL) == instance]
        existing = by_name.get((SERVICE, name))
        running = any(p.phase in RUNNING_PHASES for p in served)
        if existing is None:
            if running:
                result.create.append(body)
            continue
        if not is_ours(existing, configuration):
            if running:
                result.problems.append(f"Service {name} exists but is not ours: left alone")
            continue
        if any(p.phase not in ENDED_PHASES for p in served):
            keep.add(name)
            owner = body["metadata"]["ownerReferences"][0]
            if owner["uid"] not in {uid for _, _, uid in existing.owners}:
                result.adopt.append(Adopt(SERVICE, name, owner))
    for f in ours:
        if f.kind == SERVICE and f.name not in keep and not f.deleting:
            result.delete.append(Delete(SERVICE, f.name, f.uid, "no broker pod left"))


def _configuration_service_missing(
    config: ConfigFacts, by_name: dict[tuple[str, str], Found], pods: list[Found]
) -> bool:
    return (
        bool(config.spec.get("configurationServiceSpec"))
        and (SERVICE, configuration_service_name(config.name)) not in by_name
        and any(p.phase in RUNNING_PHASES for p in pods)
    )


# --- the world after a plan (for tests, simulations and the benchmark's bookkeeping) --------
def found_from_body(body: Mapping[str, Any], uid: str, **status: Any) -> Found:
    """How a body we create looks when found again (no phase: Pending)."""
    meta = body["metadata"]
    return Found(
        kind=body["kind"],
        name=meta["name"],
        uid=uid,
        labels=dict(meta.get("labels") or {}),
        owners=tuple((o["kind"], o["name"], o["uid"]) for o in meta.get("ownerReferences") or []),
        annotations=dict(meta.get("annotations") or {}),
        phase=status.get("phase", "Pending" if body["kind"] == POD else ""),
        started=status.get("started"),
        deleting=False,
    )
