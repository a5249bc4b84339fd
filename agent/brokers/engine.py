"""The broker deployer: read the cluster, ask ``agent.domain.brokers.plan``, write the answer.

Three scopes share one path (read -> plan -> write -> record):

- an Instance (after an Instance or broker pod event): its Pods or Job and its Service, and
  the Configuration Service when one of its pods runs;
- a Configuration (after a Configuration event, or its deletion): everything of it;
- the level pass (Celery beat): every Configuration, and broker objects whose Configuration is
  gone. It repairs drift: a broker deleted by hand comes back, a Pending one is replaced.

Every write is idempotent. Names are deterministic; a create answered 409 reads the object and
adopts it when it carries our labels and owner, reports it otherwise; deletes carry a uid
precondition and take 404/409 as done. A create the API server refuses (400/422) marks the
Configuration blocked under its current generation and fingerprint: reported on its page and in
the log, tried again only once the Configuration changes. Other API errors raise ``Retry`` for
the task to retry with backoff. Nothing without our labels and owner references is touched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent.brokers.models import BrokerAction, ConfigurationBrokers
from agent.domain import brokers as rules
from agent.kube.client import AkriApi, status_of

log = logging.getLogger(__name__)

REFUSED = (400, 422)
POD_SELECTOR = rules.CONFIGURATION_LABEL
OURS_SELECTOR = f"{rules.CONTROLLER_LABEL}={rules.CONTROLLER_VALUE}"


class Retry(Exception):
    """A passing API failure: the task tries again later."""


@dataclass
class Outcome:
    scope: str
    created: int = 0
    deleted: int = 0
    adopted: int = 0
    problems: list[str] = field(default_factory=list)
    error: str = ""
    needs_configuration: bool = False  # a Configuration-level run should follow

    def merge(self, other: Outcome) -> None:
        self.created += other.created
        self.deleted += other.deleted
        self.adopted += other.adopted
        self.problems += other.problems
        self.error = self.error or other.error


# --- the API side ---------------------------------------------------------------------------
class BrokerApi:
    """Pods, Jobs and Services of one namespace as plain dicts; counts its writes."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.akri = AkriApi(api_client, namespace)
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.writes = 0

    @staticmethod
    def _raw(call: Any, *args: Any, **kwargs: Any) -> Any:
        """The answer as plain JSON: the typed client's models (built, then turned back into
        dicts) cost more CPU than the request itself, and a 1.20 server answers a Service
        delete with a Status the typed client cannot read as the Service it promises."""
        answer = call(*args, _preload_content=False, **kwargs)
        try:
            return json.loads(answer.data or b"null")
        finally:
            answer.release_conn()

    def list(self, kind: str, selector: str) -> list[rules.Found]:
        funcs = {
            rules.POD: self.core.list_namespaced_pod,
            rules.JOB: self.batch.list_namespaced_job,
            rules.SERVICE: self.core.list_namespaced_service,
        }
        answer = self._raw(funcs[kind], self.namespace, label_selector=selector)
        return [rules.Found.from_object(kind, o) for o in answer.get("items") or []]

    def read(self, kind: str, name: str) -> rules.Found | None:
        funcs = {
            rules.POD: self.core.read_namespaced_pod,
            rules.JOB: self.batch.read_namespaced_job,
            rules.SERVICE: self.core.read_namespaced_service,
        }
        try:
            return rules.Found.from_object(kind, self._raw(funcs[kind], name, self.namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, body: dict[str, Any]) -> None:
        funcs = {
            rules.POD: self.core.create_namespaced_pod,
            rules.JOB: self.batch.create_namespaced_job,
            rules.SERVICE: self.core.create_namespaced_service,
        }
        self.writes += 1
        self._raw(funcs[body["kind"]], self.namespace, body)

    def delete(self, kind: str, name: str, uid: str) -> None:
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
            # A Job's pods go with it (a real server's GC does it; nothing is left running).
            propagation_policy="Background" if kind == rules.JOB else None,
        )
        funcs = {
            rules.POD: self.core.delete_namespaced_pod,
            rules.JOB: self.batch.delete_namespaced_job,
            rules.SERVICE: self.core.delete_namespaced_service,
        }
        self.writes += 1
        self._raw(funcs[kind], name, self.namespace, body=options)

    def set_owner(self, kind: str, name: str, owner: dict[str, Any]) -> None:
        assert kind == rules.SERVICE
        self.writes += 1
        patch = {"metadata": {"ownerReferences": [owner]}}
        # A merge patch replaces the list; a strategic merge adds to it (its merge key is the
        # uid), and a real server refuses two controller references (422).
        self._raw(
            self.core.patch_namespaced_service,
            name,
            self.namespace,
            patch,
            _content_type="application/merge-patch+json",
        )

    def live_nodes(self, names: Iterable[str] | None = None) -> set[str]:
        """Nodes that exist: all of them, or those of ``names`` (one read each)."""
        if names is None:
            answer = self._raw(self.core.list_node)
            return {n["metadata"]["name"] for n in answer.get("items") or []}
        live = set()
        for name in names:
            try:
                self._raw(self.core.read_node, name)
                live.add(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return live

    def get_or_none(self, get: Any, name: str) -> dict[str, Any] | None:
        try:
            return get(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


# --- the scopes -----------------------------------------------------------------------------
def reconcile_instance(
    api: BrokerApi, configuration: str, instance: str, now: datetime | None = None
) -> Outcome:
    """One Instance's brokers and Service."""
    return _guarded(f"instance {instance}", lambda: _instance(api, configuration, instance, now))


def reconcile_configuration(
    api: BrokerApi, configuration: str, now: datetime | None = None
) -> Outcome:
    return _guarded(
        f"configuration {configuration}", lambda: _configuration(api, configuration, now)
    )


def level_pass(api: BrokerApi, now: datetime | None = None) -> Outcome:
    """Every Configuration in the namespace, and objects of Configurations that are gone."""
    return _guarded("level pass", lambda: _level(api, now))


def _guarded(scope: str, work: Any) -> Outcome:
    try:
        return work()
    except ApiException as exc:
        code, reason, message = status_of(exc)
        raise Retry(f"{scope}: {code} {reason} {message}".strip()) from exc
    except (HTTPError, OSError) as exc:
        raise Retry(f"{scope}: {exc}") from exc


def _instance(api: BrokerApi, configuration: str, name: str, now: datetime | None) -> Outcome:
    obj = api.get_or_none(api.akri.get_instance, name)
    config_obj = api.get_or_none(api.akri.get_configuration, configuration)
    instances = [rules.InstanceFacts.from_object(obj)] if obj else []
    config = rules.ConfigFacts.from_object(config_obj) if config_obj else None
    found: list[rules.Found] = []
    if rules.label_value_ok(name):  # else no selector can find it, nor could we label it
        selector = f"{rules.INSTANCE_LABEL}={name}"
        found = api.list(rules.POD, selector) + api.list(rules.SERVICE, selector)
        if config is None or _wants_jobs(config):
            found += api.list(rules.JOB, selector)
    running = any(f.kind == rules.POD and f.phase in rules.RUNNING_PHASES for f in found)
    if running and config is not None and config.spec.get("configurationServiceSpec"):
        # Only a running pod makes the Configuration Service wanted: read it only then.
        service = api.read(rules.SERVICE, rules.configuration_service_name(configuration))
        found += [service] if service else []
    nodes = api.live_nodes({n for i in instances for n in i.nodes})
    scope = rules.Scope(instance=name)
    return _apply(
        api, f"instance {name}", configuration, config, instances, found, nodes, now, scope
    )


def _configuration(api: BrokerApi, configuration: str, now: datetime | None) -> Outcome:
    # Instances before the broker objects: a broker made after our list of Instances belongs
    # to an Instance we might not know, so the objects are read last.
    config_obj = api.get_or_none(api.akri.get_configuration, configuration)
    instances = _instances(api, configuration)
    selector = f"{rules.CONFIGURATION_LABEL}={configuration}"
    kinds = (rules.POD, rules.JOB, rules.SERVICE) if rules.label_value_ok(configuration) else ()
    found = [f for kind in kinds for f in api.list(kind, selector)]
    config = rules.ConfigFacts.from_object(config_obj) if config_obj else None
    nodes = api.live_nodes()
    scope = rules.Scope(configuration_level=True)
    return _apply(
        api,
        f"configuration {configuration}",
        configuration,
        config,
        instances,
        found,
        nodes,
        now,
        scope,
    )


def _level(api: BrokerApi, now: datetime | None) -> Outcome:
    instances = [
        rules.InstanceFacts.from_object(o) for o in api.akri.list_instances().get("items") or []
    ]
    configs = {
        c["metadata"]["name"]: rules.ConfigFacts.from_object(c)
        for c in api.akri.list_configurations().get("items") or []
    }
    found = api.list(rules.POD, POD_SELECTOR) + [
        f for kind in (rules.JOB, rules.SERVICE) for f in api.list(kind, OURS_SELECTOR)
    ]
    nodes = api.live_nodes()
    names = set(configs) | {f.labels.get(rules.CONFIGURATION_LABEL, "") for f in found}
    total = Outcome("level pass")
    for name in sorted(n for n in names if n):
        mine = [f for f in found if f.labels.get(rules.CONFIGURATION_LABEL) == name]
        total.merge(
            _apply(
                api, f"configuration {name}", name, configs.get(name), instances, mine, nodes, now
            )
        )
    return total


def _instances(api: BrokerApi, configuration: str) -> list[rules.InstanceFacts]:
    items = api.akri.list_instances().get("items") or []
    facts = [rules.InstanceFacts.from_object(o) for o in items]
    return [i for i in facts if i.configuration == configuration]


def _wants_jobs(config: rules.ConfigFacts) -> bool:
    broker = config.spec.get("brokerSpec")
    return isinstance(broker, dict) and broker.get("brokerJobSpec") is not None


# --- plan and write -------------------------------------------------------------------------
def _apply(
    api: BrokerApi,
    label: str,
    configuration: str,
    config: rules.ConfigFacts | None,
    instances: list[rules.InstanceFacts],
    found: list[rules.Found],
    nodes: set[str],
    now: datetime | None,
    scope: rules.Scope = rules.WHOLE,
) -> Outcome:
    outcome = Outcome(label)
    key = _config_key(config)
    state = _state(api.namespace, configuration)
    blocked = config is not None and state is not None and state.blocks(key)
    plan = rules.plan(
        config,
        instances,
        found,
        configuration=configuration,
        live_nodes=nodes,
        now=now or timezone.now(),
        scope=scope,
    )
    if blocked:
        # Refused before under this very Configuration: only removals until it changes.
        plan.create, plan.adopt = [], []
        outcome.error = state.error
    outcome.error = plan.error or outcome.error
    outcome.problems += plan.problems
    book = _Book(api.namespace, configuration)
    for item in plan.delete:
        _delete(api, book, outcome, item)
    for owner_change in plan.adopt:
        api.set_owner(owner_change.kind, owner_change.name, owner_change.owner)
        outcome.adopted += 1
        book.add(owner_change.kind, owner_change.name, "", BrokerAction.Action.ADOPTED, "re-owned")
    for body in plan.create:
        refused = _create(api, book, outcome, configuration, body)
        if refused:
            outcome.error = refused
            break  # the spec is at fault: every other create would be refused the same way
    book.save()
    if config is not None and (state is not None or outcome.error or outcome.problems):
        _record_state(api.namespace, configuration, key, outcome, scope.instance is None)
    outcome.needs_configuration = plan.needs_configuration
    return outcome


def _config_key(config: rules.ConfigFacts | None) -> str:
    if config is None:
        return ""
    return f"{config.generation}:{rules.fingerprint(config)}"


def _delete(api: BrokerApi, book: _Book, outcome: Outcome, item: rules.Delete) -> None:
    try:
        api.delete(item.kind, item.name, item.uid)
    except ApiException as exc:
        if exc.status not in (404, 409):  # gone already, or a namesake we must not touch
            raise
        return
    outcome.deleted += 1
    book.add(item.kind, item.name, "", BrokerAction.Action.DELETED, item.why)
    log.info("brokers: deleted %s %s/%s (%s)", item.kind, api.namespace, item.name, item.why)


def _create(
    api: BrokerApi, book: _Book, outcome: Outcome, configuration: str, body: dict[str, Any]
) -> str:
    """Create, or adopt what is already there; the refusal message when the server refuses."""
    kind, name = body["kind"], body["metadata"]["name"]
    instance = body["metadata"]["labels"].get(rules.INSTANCE_LABEL, "")
    try:
        api.create(body)
    except ApiException as exc:
        if exc.status in REFUSED:
            code, reason, message = status_of(exc)
            why = f"the API server refused {kind} {name}: {code} {reason} {message}".strip()
            book.add(kind, name, instance, BrokerAction.Action.REFUSED, why)
            log.error("brokers: %s/%s: %s", api.namespace, configuration, why)
            return why
        if exc.status != 409:
            raise
        return _adopt(api, book, outcome, configuration, body, instance)
    outcome.created += 1
    book.add(kind, name, instance, BrokerAction.Action.CREATED, "")
    return ""


def _adopt(
    api: BrokerApi,
    book: _Book,
    outcome: Outcome,
    configuration: str,
    body: dict[str, Any],
    instance: str,
) -> str:
    kind, name = body["kind"], body["metadata"]["name"]
    existing = api.read(kind, name)
    if existing is None:
        return ""  # gone again meanwhile: the next event or pass makes it
    if rules.is_ours(existing, configuration):
        outcome.adopted += 1
        book.add(kind, name, instance, BrokerAction.Action.ADOPTED, "already there")
        return ""
    problem = f"{kind} {name} exists but is not ours (labels or owner): left alone"
    outcome.problems.append(problem)
    book.add(kind, name, instance, BrokerAction.Action.CONFLICT, problem)
    return ""


class _Book:
    """Action rows of one run, written together."""

    def __init__(self, namespace: str, configuration: str) -> None:
        self.namespace, self.configuration = namespace, configuration
        self.rows: list[BrokerAction] = []

    def add(self, kind: str, name: str, instance: str, action: str, detail: str) -> None:
        self.rows.append(
            BrokerAction(
                namespace=self.namespace,
                configuration=self.configuration,
                instance=instance,
                kind=kind,
                name=name,
                action=action,
                detail=detail[:2000],
            )
        )

    def save(self) -> None:
        if self.rows:
            BrokerAction.objects.bulk_create(self.rows)


def _state(namespace: str, configuration: str) -> ConfigurationBrokers | None:
    return ConfigurationBrokers.objects.filter(
        namespace=namespace, configuration=configuration
    ).first()


def _record_state(
    namespace: str, configuration: str, key: str, outcome: Outcome, whole: bool
) -> None:
    """Remember a blocking error under the Configuration's key; clear it once a run of the
    whole Configuration (or any run after a change) goes through."""
    problems = "\n".join(p for p in outcome.problems if p != outcome.error)
    with transaction.atomic():
        row = (
            ConfigurationBrokers.objects.select_for_update()
            .filter(namespace=namespace, configuration=configuration)
            .first()
        )
        if row is None:
            if not outcome.error and not problems:
                return
            row = ConfigurationBrokers(namespace=namespace, configuration=configuration)
        if outcome.error:
            if row.blocked_key != key or row.error != outcome.error:
                log.error("brokers: %s/%s blocked: %s", namespace, configuration, outcome.error)
            row.error, row.blocked_key = outcome.error, key
        elif whole or row.blocked_key != key:
            row.error, row.blocked_key = "", ""
        if whole or problems:
            row.problems = problems
        row.save()
