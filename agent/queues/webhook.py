"""The validating admission webhook (``/webhooks/pods/validate``), served by the web process.

Rules (``agent.charges.admission``):
* ``pods`` CREATE: a pod joining a claim or Instance another queue owns is refused when that
  owner opted out, or when the pod is non-preemptible (resource locking);
* ``resourceclaims`` (resource.k8s.io) and ``instances`` (akri.sh) CREATE/UPDATE: the owner
  label is set once and never changed; only ``LABEL_WRITERS`` may add it after creation.
Anything else is allowed. The API server calls it without a session: the view is exempt from
CSRF and login, reads only the cache, and changes nothing (see README, "Admission webhook").
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agent.charges.admission import ALLOW, Joined, Verdict, admit_owner_label, admit_pod
from agent.charges.facts import AKRI, DRA, PodFacts, QueueWorld
from agent.models import Instance
from agent.queues import facts as queue_facts
from agent.queues.cache import pod_claims
from agent.queues.models import Charge, InstanceLabels, Refusal, ResourceClaim
from agent.queues.review import Request, parse, response

log = logging.getLogger(__name__)
AKRI_PREFIX = "akri.sh/"


@csrf_exempt
@require_POST
def validate(request: HttpRequest) -> JsonResponse:
    try:
        review = parse(json.loads(request.body))
    except RequestDataTooBig:
        return _error(413, "the AdmissionReview is larger than this server accepts")
    except (ValueError, UnicodeDecodeError) as exc:
        # json.JSONDecodeError and MalformedReview are ValueErrors.
        return _error(400, f"malformed AdmissionReview: {exc}")
    try:
        verdict = admit(review)
    except (AttributeError, TypeError, ValueError) as exc:
        # The API server sends objects its own schema accepted; this is some other caller.
        return _error(
            400, f"malformed AdmissionReview: request.object is not a valid object ({exc})"
        )
    return JsonResponse(response(review, verdict.allowed, verdict.message, verdict.warnings))


def admit(review: Request) -> Verdict:
    """The decision on a parsed review; refusals are logged and recorded."""
    verdict = decide(review)
    if not verdict.allowed:
        log.info("webhook: refused %s %s: %s", review.operation, review.resource, verdict.message)
        _record(review, verdict)
    return verdict


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def decide(review: Request) -> Verdict:
    if review.resource == "pods" and review.group == "" and review.operation == "CREATE":
        return _pod(review)
    if (review.group, review.resource) in (
        ("resource.k8s.io", "resourceclaims"),
        ("akri.sh", "instances"),
    ):
        return _owner_label(review)
    return ALLOW


def _record(review: Request, verdict: Verdict) -> None:
    """Keep the refusal for the Queues page; a failure to record never changes the answer."""
    meta = (review.obj or {}).get("metadata") or {}
    try:
        Refusal.objects.create(
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
    except DatabaseError:
        log.exception("webhook: refusal not recorded")


def _pod(review: Request):
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
    )
    return admit_pod(pod, joined(namespace, obj), _world(), queue_facts.rules())


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


def joined(namespace: str, pod: dict[str, Any]) -> list[Joined]:
    """The claims and Instances a new pod would use, with their owners as the cache knows."""
    claims = pod_claims(pod)
    instances = _instances_requested(pod)
    out = [_joined(DRA, namespace, c) for c in claims]
    if instances:
        akri_ns = settings.AKRI["NAMESPACE"]
        known = Instance.objects.filter(namespace=akri_ns, name__in=instances)
        out += [_joined(AKRI, akri_ns, n) for n in known.values_list("name", flat=True)]
    return out


def _instances_requested(pod: dict[str, Any]) -> set[str]:
    """Instances named by ``akri.sh/<instance>`` requests or limits of any container."""
    spec = pod.get("spec") or {}
    names = set()
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for key in {**(resources.get("requests") or {}), **(resources.get("limits") or {})}:
            if key.startswith(AKRI_PREFIX):
                names.add(key[len(AKRI_PREFIX) :])
    return names


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
