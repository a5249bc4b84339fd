"""A person's cordon and uncordon of Instances: the conditional write and its audit.

The rules (what the annotation says, the patches that write it) are in
``agent.domain.cordon``; this module carries them out against the API server for the
management command and the JSON API, so that both audit alike. As with the manual release
(``agent.kube.claims.manual_release``), every attempt leaves an ``AuditEntry`` whatever its
outcome: done, unchanged (already so), refused (bad input, Instance gone) or failed (the API
server could not be written).

The write is conditional (a JSON-patch ``test`` of the annotation or of the resourceVersion);
on a conflict it re-reads and decides again, a bounded number of times. The API server's
answer goes into the cache at once, so the dashboard shows the cordon before the watch echoes
it; the agents and the extender follow the watch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent.domain.cordon import (
    CordonInputError,
    cordon_of,
    cordon_patch,
    new_cordon,
    uncordon_patch,
)
from agent.kube import cache
from agent.kube.client import AkriApi, new_api_client, status_of
from agent.models import AuditEntry, Instance, visible_to

log = logging.getLogger(__name__)

CORDON_PERMISSION = "agent.release_slot"  # operators (and admins) hold it; viewers do not
ATTEMPTS = 5


class CordonError(Exception):
    """The cordon could not be changed; ``outcome`` is "refused" or "failed"."""

    def __init__(self, message: str, outcome: str = "refused") -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True)
class Result:
    instance: str
    outcome: str  # "done" or "unchanged"
    detail: str


def _username(user: Any) -> str:
    if isinstance(user, str):
        return user
    return getattr(user, "get_username", lambda: str(user))()


def _audit(
    user: Any, action: str, namespace: str, instance: str, reason: str, outcome: str, detail: str
) -> None:
    AuditEntry.objects.create(
        at=timezone.now(),
        user=user if getattr(user, "pk", None) else None,
        username=_username(user)[:150],
        action=action,
        target=f"{namespace}/{instance}"[:512],
        reason=reason if isinstance(reason, str) else "",
        outcome=outcome,
        detail=detail,
    )


def _write(api: AkriApi, name: str, make_ops: Any) -> tuple[str, dict[str, Any] | None]:
    """Decide from a fresh read and write conditionally; ("done"|"unchanged", answer)."""
    for _ in range(ATTEMPTS):
        obj = _call(api.get_instance, name, "reading")
        ops = make_ops(obj)
        if not ops:
            return "unchanged", obj
        answer = _call(api.patch_instance, name, "writing", ops)
        if answer is not None:
            return "done", answer
        # None: someone wrote meanwhile (the test failed); re-read and decide again.
    raise CordonError(f"Instance {name} kept changing; gave up after {ATTEMPTS} tries", "failed")


def _call(func: Any, name: str, doing: str, *args: Any) -> dict[str, Any] | None:
    """One API call; None on a failed condition, CordonError for anything else, so that
    every outcome is audited (a dropped connection too)."""
    try:
        return func(name, *args)
    except ApiException as exc:
        if exc.status in (409, 422) and args:
            return None
        if exc.status == 404:
            raise CordonError(f"Instance {name} does not exist") from None
        message = status_of(exc)[2]
        raise CordonError(f"{doing} Instance {name} failed: {message}", "failed") from None
    except (HTTPError, OSError) as exc:
        raise CordonError(f"{doing} Instance {name} failed: {exc}", "failed") from None


def _apply(answer: dict[str, Any] | None) -> None:
    if answer is None:
        return
    try:
        cache.apply_instance(answer, direct=True)
    except Exception:  # the watch brings it anyway; the write itself succeeded
        log.exception("caching the cordon of %s failed", answer["metadata"]["name"])


def cordon(
    namespace: str, name: str, *, user: Any, reason: str, api: AkriApi | None = None
) -> Result:
    """Cordon one Instance; idempotent (an existing cordon is kept, outcome "unchanged")."""
    api = api or AkriApi(new_api_client(), namespace)
    try:
        wanted = new_cordon(_username(user), reason, timezone.now().isoformat())
    except CordonInputError as exc:
        _audit(user, "cordon", namespace, name, reason, "refused", str(exc))
        raise CordonError(str(exc)) from None
    try:
        outcome, answer = _write(api, name, lambda obj: cordon_patch(obj, wanted))
    except CordonError as exc:
        _audit(user, "cordon", namespace, name, reason, exc.outcome, str(exc))
        raise
    current = cordon_of(answer)
    detail = current.describe() if current else ""
    if outcome == "unchanged":
        detail = f"already {detail}"
    _apply(answer)
    _audit(user, "cordon", namespace, name, reason, outcome, detail)
    return Result(name, outcome, detail)


def uncordon(
    namespace: str, name: str, *, user: Any, reason: str = "", api: AkriApi | None = None
) -> Result:
    """Remove the cordon of one Instance; idempotent ("unchanged" when there was none)."""
    api = api or AkriApi(new_api_client(), namespace)
    try:
        reason = new_cordon(_username(user), reason, "").reason
    except CordonInputError as exc:
        _audit(user, "uncordon", namespace, name, reason, "refused", str(exc))
        raise CordonError(str(exc)) from None
    before: list[Any] = []

    def ops(obj: dict[str, Any]) -> list[dict]:
        before[:] = [cordon_of(obj)]
        return uncordon_patch(obj)

    try:
        outcome, answer = _write(api, name, ops)
    except CordonError as exc:
        _audit(user, "uncordon", namespace, name, reason, exc.outcome, str(exc))
        raise
    was = before[0] if before else None
    detail = f"was {was.describe()}" if was else "was not cordoned"
    _apply(answer)
    _audit(user, "uncordon", namespace, name, reason, outcome, detail)
    return Result(name, outcome, detail)


def instances_of(namespace: str, *, node: str = "", configuration: str = "") -> list[str]:
    """Names of the Instances a node can use and/or of a Configuration, from the cache."""
    rows = Instance.objects.filter(namespace=namespace, deleting=False)
    if node:
        rows = rows.filter(visible_to(node))
    if configuration:
        rows = rows.filter(configuration_name=configuration)
    return list(rows.order_by("name").values_list("name", flat=True))
