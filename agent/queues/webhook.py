"""The validating admission webhook (``/webhooks/pods/validate``), served by the web process.

Rules (``agent.charges.admission``):
* ``pods`` CREATE: a pod joining a claim or Instance another queue owns is refused when that
  owner opted out, or when the pod is non-preemptible (resource locking); a Configuration-level
  request is refused when the Instances open to the pod cannot hold it;
* ``resourceclaims`` (resource.k8s.io) and ``instances`` (akri.sh) CREATE/UPDATE: the owner
  label is set once and never changed; only ``LABEL_WRITERS`` may add it after creation.
Anything else is allowed. The API server calls it without a session: the view is exempt from
CSRF and login, reads only the cache, and changes nothing (see README, "Admission webhook").

``answer`` is the whole exchange, body in, status and JSON out. The web serves it ahead of
Django from an in-memory index (``agent.queues.fastpath``, ``agent.queues.index``: a
``Lookup`` without queries); this module's ``DbLookup`` and view are the database path, used
when the index is not fresh and by anything that mounts only Django's URLs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agent.charges.admission import (
    ALLOW,
    ClRequest,
    Joined,
    Verdict,
    admit_owner_label,
    admit_pod,
    cl_request,
)
from agent.charges.facts import AKRI, DRA, PodFacts, QueueWorld, Settings
from agent.models import Configuration, Instance
from agent.queues import facts as queue_facts
from agent.queues.cache import owner_uids, pod_claims
from agent.queues.models import Charge, InstanceLabels, Refusal, ResourceClaim
from agent.queues.review import Request, parse, response
from agent.retrying import DATABASE_AWAY
from agent.sharing.pods import quantity
from agent.sharing.policy import PolicyError

log = logging.getLogger(__name__)
AKRI_PREFIX = "akri.sh/"


@csrf_exempt
@require_POST
def validate(request: HttpRequest) -> JsonResponse:
    """The database path under Django (tests, and any server without ``fastpath``)."""
    try:
        body = request.body
    except RequestDataTooBig:
        return _error(413, TOO_BIG)
    status, payload = answer(body, None, _record)
    return JsonResponse(payload, status=status)


TOO_BIG = "the AdmissionReview is larger than this server accepts"
Recorder = Callable[[Request, Verdict], None]


def answer(body: bytes, lookup: Lookup | None, record: Recorder) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) for one AdmissionReview; refusals are logged and handed to
    ``record``. ``lookup`` None reads the database."""
    try:
        review = parse(json.loads(body))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # json.JSONDecodeError and MalformedReview are ValueErrors.
        return 400, {"error": f"malformed AdmissionReview: {exc}"}
    try:
        verdict = admit(review, lookup, record)
    except DATABASE_AWAY as exc:
        # One line, no traceback: an outage would log one per review. The API server applies
        # the webhook's failurePolicy to a 503.
        log.warning("webhook: database unavailable, review not decided: %s", exc)
        return 503, {"error": "database unavailable"}
    except (AttributeError, TypeError, ValueError) as exc:
        # The API server sends objects its own schema accepted; this is some other caller.
        return 400, {
            "error": f"malformed AdmissionReview: request.object is not a valid object ({exc})"
        }
    return 200, response(review, verdict.allowed, verdict.message, verdict.warnings)


def admit(review: Request, lookup: Lookup | None = None, record: Recorder | None = None) -> Verdict:
    """The decision on a parsed review; refusals are logged and recorded."""
    verdict = decide(review, lookup)
    if not verdict.allowed:
        log.info("webhook: refused %s %s: %s", review.operation, review.resource, verdict.message)
        (record or _record)(review, verdict)
    return verdict


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def decide(review: Request, lookup: Lookup | None = None) -> Verdict:
    """The verdict on a review, from ``lookup`` (the in-memory index of ``agent.queues.index``)
    or, without one, from the database."""
    if review.resource == "pods" and review.group == "" and review.operation == "CREATE":
        return _pod(review, lookup or DbLookup())
    if (review.group, review.resource) in (
        ("resource.k8s.io", "resourceclaims"),
        ("akri.sh", "instances"),
    ):
        return _owner_label(review)
    return ALLOW


def _record(review: Request, verdict: Verdict) -> None:
    """Keep the refusal for the Queues page; a failure to record never changes the answer."""
    try:
        refusal_row(review, verdict).save()
    except DatabaseError:
        log.exception("webhook: refusal not recorded")


def refusal_row(review: Request, verdict: Verdict) -> Refusal:
    meta = (review.obj or {}).get("metadata") or {}
    return Refusal(
        at=timezone.now(),
        operation=review.operation,
        resource=review.resource,
        namespace=review.namespace or str(meta.get("namespace") or ""),
        name=str(meta.get("name") or meta.get("generateName") or "")[:253],
        username=review.username[:253],
        queue=verdict.queue,
        claim=verdict.claim[:600],
        owner=verdict.owner,
        rule=verdict.rule,
        message=verdict.message,
    )


def _pod(review: Request, lookup: Lookup) -> Verdict:
    obj = review.obj or {}
    meta = obj.get("metadata") or {}
    namespace = review.namespace or meta.get("namespace") or ""
    name = meta.get("name") or f"{meta.get('generateName', '')}*"
    pod = PodFacts(
        namespace,
        name,
        str(meta.get("uid") or ""),
        _strings(meta.get("labels")),
        _strings(meta.get("annotations")),
        _priority(obj),
        str(meta.get("creationTimestamp") or ""),
        owner_uids=tuple(owner_uids(meta)),
    )
    joins, cl = joined(namespace, obj, lookup)
    return admit_pod(pod, joins, lookup.world(), lookup.rules(), cl)


class Lookup(Protocol):
    """What a pod's review reads: the queue systems, the rules, and the owners of what it joins."""

    def world(self) -> QueueWorld: ...

    def rules(self) -> Settings: ...

    def claim(self, kind: str, namespace: str, name: str) -> Joined: ...

    def configuration(self, name: str, count: int) -> ClRequest | None:
        """The Configuration-level request of ``count`` devices (None: no such Configuration)."""


class DbLookup:
    """Answers from the database (the path when the in-memory index is not fresh)."""

    def world(self) -> QueueWorld:
        return _world()

    def rules(self) -> Settings:
        return queue_facts.rules()

    def claim(self, kind: str, namespace: str, name: str) -> Joined:
        return _joined(kind, namespace, name)

    def configuration(self, name: str, count: int) -> ClRequest | None:
        namespace = settings.AKRI["NAMESPACE"]
        row = Configuration.objects.filter(namespace=namespace, name=name).first()
        if row is None:
            return None
        instances = dict(
            Instance.objects.filter(namespace=namespace, configuration_name=name).values_list(
                "name", "capacity"
            )
        )
        owners = {
            n: o
            for n, o in Charge.objects.filter(kind=AKRI, namespace=namespace, resource=name)
            .exclude(owner="")
            .values_list("name", "owner")
            if n in instances
        }
        label_key = settings.AKRI_QUEUES["LABEL_KEY"]
        labelled = InstanceLabels.objects.filter(
            namespace=namespace,
            name__in=Instance.objects.filter(namespace=namespace, configuration_name=name).values(
                "name"
            ),
        )
        for n, labels in labelled.values_list("name", "labels"):
            if (labels or {}).get(label_key):
                owners[n] = labels[label_key]
        accounted = self.rules().accounts(AKRI, name)
        return cl_request(name, count, row.unique_devices, instances, owners, accounted)


# The queue systems' objects change rarely and reading them all took half of each review
# (bench ``webhook``: 7.6 ms -> see README); a view at most WORLD_SECONDS old is used.
WORLD_SECONDS = 2.0
_world_cache: tuple[float, QueueWorld] | None = None
_world_lock = threading.Lock()


def forget_world() -> None:
    """Drop the cached view (tests that change queue objects or settings between reviews)."""
    global _world_cache
    _world_cache = None


def _world() -> QueueWorld:
    global _world_cache
    now = time.monotonic()
    cached = _world_cache
    if cached is not None and now - cached[0] < WORLD_SECONDS:
        return cached[1]
    with _world_lock:
        if _world_cache is None or now - _world_cache[0] >= WORLD_SECONDS:
            _world_cache = (time.monotonic(), queue_facts.world())
        return _world_cache[1]


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _priority(obj: dict[str, Any]) -> int | None:
    value = (obj.get("spec") or {}).get("priority")
    return value if isinstance(value, int) else None


def joined(
    namespace: str, pod: dict[str, Any], lookup: Lookup
) -> tuple[list[Joined], list[ClRequest]]:
    """The claims and Instances a new pod would use, with their owners as the cache knows, and
    its Configuration-level requests (``akri.sh/<configuration>``)."""
    out = [lookup.claim(DRA, namespace, c) for c in pod_claims(pod)]
    cl = []
    akri_ns = settings.AKRI["NAMESPACE"]
    for name, count in sorted(akri_requests(pod).items()):
        request = lookup.configuration(name, count)
        if request is not None:
            cl.append(request)
        else:
            out.append(lookup.claim(AKRI, akri_ns, name))
    return out, cl


def akri_requests(pod: dict[str, Any]) -> dict[str, int]:
    """``akri.sh/<name>`` -> devices the pod asks for: the larger of its containers' sum and
    any one init container's (as the scheduler counts a pod's request)."""
    spec = pod.get("spec") or {}
    for key in ("containers", "initContainers"):
        if not isinstance(spec.get(key) or [], list):
            raise TypeError(f"spec.{key} must be a list")
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, count in _requested(container).items():
            total[name] = total.get(name, 0) + count
    for container in spec.get("initContainers") or []:
        for name, count in _requested(container).items():
            total[name] = max(total.get(name, 0), count)
    return total


def _requested(container: Any) -> dict[str, int]:
    resources = container.get("resources") or {}
    found: dict[str, int] = {}
    for key in ("limits", "requests"):
        for name, value in (resources.get(key) or {}).items():
            if name.startswith(AKRI_PREFIX):
                found.setdefault(name[len(AKRI_PREFIX) :], _count(value))
    return found


def _count(value: Any) -> int:
    """An extended resource's quantity, in any form the API server writes (``2k``); anything
    else counts as one device (the API server refuses such a pod itself)."""
    try:
        return max(quantity(value, "request"), 1)
    except PolicyError:
        return 1


def _joined(kind: str, namespace: str, name: str) -> Joined:
    label_key = settings.AKRI_QUEUES["LABEL_KEY"]
    row = Charge.objects.filter(kind=kind, namespace=namespace, name=name).first()
    if kind == DRA:
        claim = ResourceClaim.objects.filter(namespace=namespace, name=name).first()
        labels = claim.labels if claim is not None else {}
    else:
        found = InstanceLabels.objects.filter(namespace=namespace, name=name).first()
        labels = found.labels if found is not None else {}
    # The label is the truth; a first bind decided but not yet written counts too.
    owner = (labels or {}).get(label_key) or (row.owner if row is not None else "") or None
    accounted = row.accounted if row is not None else True
    return Joined(kind, namespace, name, owner, accounted)


def _owner_label(review: Request):
    obj = review.obj or {}
    meta = obj.get("metadata") or {}
    old_meta = (review.old or {}).get("metadata") or {}
    namespace = review.namespace or meta.get("namespace") or ""
    kind = "ResourceClaim" if review.resource == "resourceclaims" else "Instance"
    return admit_owner_label(
        operation=review.operation,
        old_labels=_strings(old_meta.get("labels")),
        new_labels=_strings(meta.get("labels")),
        username=review.username,
        writers=frozenset(settings.AKRI_QUEUES["LABEL_WRITERS"]),
        label_key=settings.AKRI_QUEUES["LABEL_KEY"],
        shown=f"{kind} {namespace}/{meta.get('name', '')}",
    )
