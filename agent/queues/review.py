"""AdmissionReview (``admission.k8s.io/v1``) in and out: parsing that refuses malformed
reviews with a clear reason, and the response shape the API server expects (uid echoed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
# The owner label the ValidatingWebhookConfiguration of deploy/ selects (objectSelector of
# queue-labels.akri-site.akri.sh in deploy/base/webhook.yaml; tests hold the two equal).
MANIFEST_LABEL_KEY = "akri-site.io/queue"


def label_key_problem(key: str) -> str | None:
    """Why ``AKRI_QUEUE_LABEL`` cannot be used, or None.

    The API server sends the webhook only objects carrying the manifest's label key, so with
    any other key the rule "set once, never changed" would silently never be asked. A start-up
    refusal says so where a rendered selector would need every install path (kustomize,
    cert-manager, set-webhook-ca) to render it too."""
    if key == MANIFEST_LABEL_KEY:
        return None
    return (
        f"AKRI_QUEUE_LABEL is {key!r}, but the admission webhook of deploy/ "
        f"(queue-labels.akri-site.akri.sh in deploy/base/webhook.yaml) is only sent objects "
        f"labelled {MANIFEST_LABEL_KEY}: owner labels under {key!r} could be changed or "
        f"removed unchecked. Unset AKRI_QUEUE_LABEL (or set it to {MANIFEST_LABEL_KEY})."
    )


class MalformedReview(ValueError):
    """The body is not an AdmissionReview we can answer (HTTP 400 with this message)."""


@dataclass(frozen=True)
class Request:
    uid: str
    api_version: str  # the review's own apiVersion, echoed in the answer
    group: str
    resource: str
    operation: str
    namespace: str
    username: str
    obj: dict[str, Any] | None
    old: dict[str, Any] | None


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedReview(f"{what} must be a JSON object")
    return value


def _optional(value: Any, what: str) -> dict[str, Any] | None:
    return None if value is None else _mapping(value, what)


def parse(body: Any) -> Request:
    review = _mapping(body, "the body")
    if review.get("kind") != KIND:
        raise MalformedReview(f"kind must be {KIND}, not {review.get('kind')!r}")
    version = review.get("apiVersion")
    if version not in (API_VERSION, "admission.k8s.io/v1beta1"):
        raise MalformedReview(f"apiVersion must be {API_VERSION}, not {version!r}")
    request = _mapping(review.get("request"), "request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("request.uid must be a non-empty string")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise MalformedReview(f"request.operation must be one of {', '.join(OPERATIONS)}")
    resource = _mapping(request.get("resource"), "request.resource")
    user = _optional(request.get("userInfo"), "request.userInfo") or {}
    obj = _optional(request.get("object"), "request.object")
    if operation in ("CREATE", "UPDATE") and obj is None:
        raise MalformedReview(f"request.object is required for {operation}")
    return Request(
        uid=uid,
        api_version=version,
        group=str(resource.get("group") or ""),
        resource=str(resource.get("resource") or ""),
        operation=operation,
        namespace=str(request.get("namespace") or ""),
        username=str(user.get("username") or ""),
        obj=obj,
        old=_optional(request.get("oldObject"), "request.oldObject"),
    )


def response(
    request: Request, allowed: bool, message: str = "", warnings: tuple[str, ...] = ()
) -> dict[str, Any]:
    answer: dict[str, Any] = {"uid": request.uid, "allowed": allowed}
    if not allowed:
        answer["status"] = {"code": 403, "reason": "Forbidden", "message": message}
    if warnings:
        answer["warnings"] = list(warnings)
    return {"apiVersion": request.api_version, "kind": KIND, "response": answer}
