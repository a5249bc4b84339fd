"""Drain an Instance: cordon it, then evict the pods that hold its slots, with a preview first.

Who holds a slot is read from the API server, in the pods' own words: the ``akri-site.io/holds``
annotation their node's agent writes (``agent.domain.holdings``). Pods are evicted through the
Eviction API, never deleted, so PodDisruptionBudgets are honoured, with the pod's uid as a
precondition (a new pod of the same name is left alone) and an optional grace period. Each pod
gets its own outcome:

- ``evicted``: the API server accepted the eviction; ``evicted, still terminating`` when the
  pod had not gone by the timeout (its grace period runs on; its agent frees the slots after);
- ``blocked by a budget``: 429, a PodDisruptionBudget allows no disruption now (its words kept);
- ``gone``: the pod was not there any more (404, or another pod of that name now);
- ``left to the broker rules``: a broker pod of the Instance (label ``akri.sh/instance``) holds
  no slot and follows the Instance itself (``agent.brokers``), so a drain does not touch it;
- ``failed``: anything else, with the API server's words.

The drain cordons first, as ``kubectl drain`` does, so that an evicted pod's replacement cannot
land on the same device. The preview (``dry_run``) writes nothing: each eviction is sent with
``dryRun=All``, which the API server checks against the budgets exactly as a real one, so "what
would block" is the server's answer, not a guess. Every pod's eviction is audited
(``drain_evict``) and the drain as a whole (``drain``), refusals included.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone
from kubernetes import client
from kubernetes.client.rest import ApiException

from agent import cordon as cordoning
from agent.domain.brokers import INSTANCE_LABEL
from agent.domain.cordon import CordonInputError, new_cordon
from agent.domain.holdings import HOLDS, parse_holds, split_key
from agent.domain.naming import slot_index
from agent.kube.client import AkriApi, new_api_client, status_of
from agent.models import AuditEntry

QUEUE_KEYS = (
    "kai.scheduler/queue",
    "kueue.x-k8s.io/queue-name",
    "scheduling.volcano.sh/queue-name",
    "volcano.sh/queue-name",
)
MAX_GRACE = 24 * 3600
MAX_TIMEOUT = 3600

EVICTED = "evicted"
TERMINATING = "evicted, still terminating"
BLOCKED = "blocked by a budget"
GONE = "gone"
BROKER = "left to the broker rules"
FAILED = "failed"
WOULD_EVICT = "would be evicted"


class DrainInputError(ValueError):
    """A grace period, timeout or reason that cannot be used; nothing was done."""


@dataclass
class PodOutcome:
    namespace: str
    name: str
    uid: str = ""
    node: str = ""
    queue: str = ""
    owner: str = ""
    slots: list[str] = field(default_factory=list)
    outcome: str = ""
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "pod": f"{self.namespace}/{self.name}",
            "uid": self.uid,
            "node": self.node,
            "queue": self.queue or "no queue label",
            "owner": self.owner or "no owner",
            "slots": list(self.slots),
            "outcome": self.outcome,
            "detail": self.detail,
        }


def check_limits(grace: Any, timeout: Any) -> tuple[int | None, float]:
    """Strict parsers for the knobs: a typo must be an error, not a default."""
    bad_grace = isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= MAX_GRACE
    if grace is not None and bad_grace:
        raise DrainInputError(f"grace must be whole seconds from 0 to {MAX_GRACE}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise DrainInputError("timeout must be a number of seconds")
    if not 0 <= timeout <= MAX_TIMEOUT:
        raise DrainInputError(f"timeout must be from 0 to {MAX_TIMEOUT} seconds")
    return grace, float(timeout)


def _queue(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    for source in (meta.get("labels") or {}, meta.get("annotations") or {}):
        for key in QUEUE_KEYS:
            if source.get(key):
                return str(source[key])
    return ""


def _owner(pod: dict[str, Any]) -> str:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return ", ".join(f"{r.get('kind', '?')}/{r.get('name', '?')}" for r in refs)


def _pods(api_client: client.ApiClient) -> list[dict[str, Any]]:
    core = client.CoreV1Api(api_client)
    response = core.list_pod_for_all_namespaces(_preload_content=False)
    return json.loads(response.data).get("items") or []


def holders(namespace: str, instance: str, pods: list[dict[str, Any]]) -> list[PodOutcome]:
    """Pods that say they hold a slot of ``instance``, and its broker pods, by name."""
    found: list[PodOutcome] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        slots = []
        for key in parse_holds((meta.get("annotations") or {}).get(HOLDS)) or {}:
            ns, slot = split_key(key)
            if ns == namespace and slot_index(instance, slot) is not None:
                slots.append(slot)
        broker = (meta.get("labels") or {}).get(INSTANCE_LABEL) == instance
        if not slots and not broker:
            continue
        found.append(
            PodOutcome(
                namespace=meta.get("namespace", ""),
                name=meta.get("name", ""),
                uid=meta.get("uid", ""),
                node=(pod.get("spec") or {}).get("nodeName", ""),
                queue=_queue(pod),
                owner=_owner(pod),
                slots=sorted(slots),
                outcome=BROKER if broker and not slots else "",
                detail="a broker pod follows its Instance (agent.brokers)"
                if broker and not slots
                else "",
            )
        )
    return sorted(found, key=lambda p: (p.namespace, p.name))


def _evict(core: client.CoreV1Api, pod: PodOutcome, grace: int | None, dry_run: bool) -> None:
    options: dict[str, Any] = {"preconditions": {"uid": pod.uid}} if pod.uid else {}
    if grace is not None:
        options["gracePeriodSeconds"] = grace
    if dry_run:
        options["dryRun"] = ["All"]
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
    }
    if options:
        body["deleteOptions"] = options
    kwargs = {"dry_run": "All"} if dry_run else {}
    core.create_namespaced_pod_eviction(pod.name, pod.namespace, body, **kwargs)


def _try(core: client.CoreV1Api, pod: PodOutcome, grace: int | None, dry_run: bool) -> None:
    try:
        _evict(core, pod, grace, dry_run)
    except ApiException as exc:
        code, _, text = status_of(exc)
        causes = _causes(exc)
        if code == 429:
            pod.outcome, pod.detail = BLOCKED, causes or text
        elif code in (404, 409):
            pod.outcome, pod.detail = GONE, text
        else:
            pod.outcome, pod.detail = FAILED, f"{code}: {text}"
        return
    except Exception as exc:  # the API server did not answer: nothing is known to be done
        pod.outcome, pod.detail = FAILED, f"{type(exc).__name__}: {exc}"
        return
    pod.outcome = WOULD_EVICT if dry_run else EVICTED


def _causes(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return ""
    causes = ((body.get("details") or {}).get("causes")) or []
    return "; ".join(str(c.get("message", "")) for c in causes if isinstance(c, dict))


def _wait_gone(core: client.CoreV1Api, pods: list[PodOutcome], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = [p for p in pods if p.outcome == EVICTED]
    while waiting:
        still = []
        for pod in waiting:
            try:
                live = core.read_namespaced_pod(pod.name, pod.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                still.append(pod)
                continue
            if live.metadata.uid != pod.uid:
                continue  # another pod of that name: ours is gone
            still.append(pod)
        waiting = still
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    for pod in waiting:
        pod.outcome = TERMINATING
        pod.detail = f"not gone after {timeout:g} s; its grace period runs on"


def _audit(user: Any, action: str, target: str, reason: str, outcome: str, detail: str) -> None:
    AuditEntry.objects.create(
        at=timezone.now(),
        user=user if getattr(user, "pk", None) else None,
        username=cordoning._username(user)[:150],
        action=action,
        target=target[:512],
        reason=reason if isinstance(reason, str) else "",
        outcome=outcome,
        detail=detail,
    )


def preview(namespace: str, instance: str, *, api_client: client.ApiClient | None = None) -> list:
    """What a drain would do now, pod by pod; writes nothing."""
    api_client = api_client or new_api_client()
    AkriApi(api_client, namespace).get_instance(instance)  # 404 -> ApiException
    pods = holders(namespace, instance, _pods(api_client))
    core = client.CoreV1Api(api_client)
    for pod in pods:
        if pod.outcome != BROKER:
            _try(core, pod, None, dry_run=True)
    return pods


def drain(
    namespace: str,
    instance: str,
    *,
    user: Any,
    reason: str,
    grace: Any = None,
    timeout: Any = 30,
    api_client: client.ApiClient | None = None,
) -> list[PodOutcome]:
    """Cordon ``instance`` and evict its holders; audited per pod and as a whole."""
    target = f"{namespace}/{instance}"
    try:
        grace, timeout = check_limits(grace, timeout)
        new_cordon(cordoning._username(user), reason, "")
    except (DrainInputError, CordonInputError) as exc:
        _audit(user, "drain", target, reason, "refused", str(exc))
        raise DrainInputError(str(exc)) from None
    api_client = api_client or new_api_client()
    api = AkriApi(api_client, namespace)
    # Cordon first (audited on its own): the evicted pods' replacements must not come back here.
    try:
        cordoning.cordon(namespace, instance, user=user, reason=reason, api=api)
    except cordoning.CordonError as exc:
        _audit(user, "drain", target, reason, exc.outcome, f"not cordoned: {exc}")
        raise
    pods = holders(namespace, instance, _pods(api_client))
    core = client.CoreV1Api(api_client)
    for pod in pods:
        if pod.outcome == BROKER:
            continue
        _try(core, pod, grace, dry_run=False)
    _wait_gone(core, pods, timeout)
    for pod in pods:
        outcome = {EVICTED: "done", TERMINATING: "done", GONE: "unchanged", BROKER: "unchanged"}
        _audit(
            user,
            "drain_evict",
            f"pod {pod.namespace}/{pod.name}",
            reason,
            outcome.get(pod.outcome, "refused" if pod.outcome == BLOCKED else "failed"),
            f"{pod.outcome}: {pod.detail}".rstrip(": ") + f" (Instance {target})",
        )
    summary = ", ".join(f"{p.namespace}/{p.name}: {p.outcome}" for p in pods) or "no holder"
    _audit(user, "drain", target, reason, "done", summary)
    return pods
