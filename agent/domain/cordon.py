"""Cordon of an Instance: the annotation that says "no new pod gets a slot of this device".

The state lives in the API server, as annotation ``akri-site.io/cordon`` on the Instance, so
that every agent, extender and web replica reads the same answer and it survives restarts.
Akri's own agent ignores annotations it does not know, so a cluster that runs Akri is not
disturbed. Value: ``{"by": "<user>", "reason": "<text>", "at": "<ISO 8601 UTC>"}``.

What a cordon means, for the rules that read it (``InstanceState.cordon``):
- free slots are not claimable: the plugins report them Unhealthy and Allocate refuses them,
  the extender's policies count them as absent;
- held slots stay exactly as they are (their pods keep running until drained).

A present but unreadable value still cordons (by "unknown"): somebody wrote it meaning to stop
new pods, and guessing "not cordoned" would let them in. Writes are conditional JSON patches,
like slot claims (DESIGN.md invariant 1): the current value (or the resourceVersion when the
annotation or the annotations map is absent, since JSON patch cannot test an absence) is the
condition, so two operators cannot overwrite each other's reason unseen.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.domain.errors import DomainError
from agent.domain.jsonpatch import pointer

ANNOTATION = "akri-site.io/cordon"
ANNOTATIONS_PATH = pointer("metadata", "annotations")
CORDON_PATH = pointer("metadata", "annotations", ANNOTATION)
RESOURCE_VERSION_PATH = pointer("metadata", "resourceVersion")

MAX_REASON = 500
MAX_ACTOR = 150  # Django's username length
UNKNOWN = "unknown"


class CordonInputError(ValueError):
    """An actor or reason that cannot be written (empty actor, over-long or control chars)."""


class InstanceCordoned(DomainError):
    """A new claim on a free slot of a cordoned Instance."""

    def __init__(self, instance: str, key: str, cordon: Cordon) -> None:
        self.instance = instance
        self.key = key
        self.cordon = cordon
        super().__init__(f"Instance {instance} is {cordon.describe()}; slot {key} not given")


@dataclass(frozen=True)
class Cordon:
    by: str
    reason: str = ""
    at: str = ""

    def describe(self) -> str:
        """The cordon in words, as the extender and the dashboard say it."""
        if self.reason:
            return f"cordoned by {self.by}: {self.reason}"
        return f"cordoned by {self.by}"


def _clean(what: str, value: Any, limit: int, required: bool) -> str:
    if not isinstance(value, str):
        raise CordonInputError(f"{what} must be text")
    value = value.strip()
    if required and not value:
        raise CordonInputError(f"{what} must not be empty")
    if len(value) > limit:
        raise CordonInputError(f"{what} is longer than {limit} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise CordonInputError(f"{what} must not contain control characters")
    return value


def new_cordon(by: Any, reason: Any, at: str) -> Cordon:
    """A cordon to write; CordonInputError when the actor or reason is unusable."""
    return Cordon(
        by=_clean("actor", by, MAX_ACTOR, True),
        reason=_clean("reason", reason, MAX_REASON, False),
        at=at,
    )


def format_cordon(cordon: Cordon) -> str:
    return json.dumps({"by": cordon.by, "reason": cordon.reason, "at": cordon.at}, sort_keys=True)


def parse_cordon(annotations: Mapping[str, Any] | None) -> Cordon | None:
    """The cordon an Instance's annotations carry, or None when it is not cordoned."""
    if not annotations or ANNOTATION not in annotations:
        return None
    raw = annotations.get(ANNOTATION)
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        return Cordon(by=UNKNOWN, reason="unreadable cordon annotation")
    by, reason, at = value.get("by"), value.get("reason"), value.get("at")
    return Cordon(
        by=by if isinstance(by, str) and by else UNKNOWN,
        reason=reason if isinstance(reason, str) else "",
        at=at if isinstance(at, str) else "",
    )


def describe_raw(raw: str | None) -> str:
    """The words for a raw annotation value as the cache keeps it ("" when not cordoned)."""
    found = parse_cordon({ANNOTATION: raw}) if raw is not None else None
    return found.describe() if found else ""


def cordon_of(obj: Mapping[str, Any] | None) -> Cordon | None:
    """The cordon of an Instance object (a dict as the API returns it)."""
    meta = (obj or {}).get("metadata") or {}
    annotations = meta.get("annotations")
    return parse_cordon(annotations if isinstance(annotations, Mapping) else None)


def _rv_test(obj: Mapping[str, Any]) -> dict:
    rv = ((obj.get("metadata") or {}).get("resourceVersion")) or ""
    if not rv:
        raise ValueError("a resourceVersion is needed to make this write conditional")
    return {"op": "test", "path": RESOURCE_VERSION_PATH, "value": rv}


def cordon_patch(obj: Mapping[str, Any], cordon: Cordon) -> list[dict]:
    """The conditional patch that cordons ``obj``; [] when it is already cordoned.

    Idempotent: an Instance already cordoned keeps its first cordon (who and why), as a second
    ``kubectl cordon`` changes nothing; uncordon first to change the reason.
    """
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations")
    value = format_cordon(cordon)
    if not isinstance(annotations, Mapping):
        return [
            _rv_test(obj),
            {"op": "add", "path": ANNOTATIONS_PATH, "value": {ANNOTATION: value}},
        ]
    if ANNOTATION in annotations:
        return []
    return [_rv_test(obj), {"op": "add", "path": CORDON_PATH, "value": value}]


def uncordon_patch(obj: Mapping[str, Any]) -> list[dict]:
    """The conditional patch that removes the cordon; [] when there is none."""
    annotations = (obj.get("metadata") or {}).get("annotations")
    if not isinstance(annotations, Mapping) or ANNOTATION not in annotations:
        return []
    current = annotations[ANNOTATION]
    return [
        {"op": "test", "path": CORDON_PATH, "value": current},
        {"op": "remove", "path": CORDON_PATH},
    ]
