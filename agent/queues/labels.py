"""The owner label's create-only write (``owner_label_patch``), and adopting a lost race.

A write that loses (422: the labels map or the resourceVersion changed) re-reads the object
and adopts the label there, so every replica and every restart ends on the one label the API
server holds. A passing failure (no answer, 429, 5xx) raises ``ApiAway`` for the caller to try
again later; other refusals are reported and left to the next recompute.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent.charges.admission import owner_label_patch
from agent.charges.facts import DRA, ClaimFacts, QueueWorld, Settings
from agent.charges.owner import ClaimCharge, decide
from agent.kube.client import GROUP, INSTANCES, JSON_PATCH, VERSION
from agent.queues.kinds import RESOURCE_CLAIMS
from agent.queues.models import (
    InstanceLabels,
    ResourceClaim,
)
from agent.retrying import ApiAway, api_away

log = logging.getLogger(__name__)


def write_label(
    api_client: client.ApiClient,
    claim: ClaimFacts,
    charge: ClaimCharge,
    the_world: QueueWorld,
    the_rules: Settings,
) -> tuple[ClaimCharge, str]:
    """Write the first bind's owner label create-only; the claim decided again on the label
    the API server holds now, and what happened: "written", "adopted", "present" or an error."""
    target = LabelTarget(api_client, claim)
    what = "present"
    try:
        current = target.read()
        labels = (current.get("metadata") or {}).get("labels") or {}
        if the_rules.label_key not in labels:
            rv = current["metadata"].get("resourceVersion", "")
            ops = owner_label_patch(labels, rv, the_rules.label_key, charge.write_label)
            try:
                current, what = target.patch(ops), "written"
            except ApiException as exc:
                if exc.status != 422:
                    raise
                current, what = target.read(), "adopted"  # lost the race: adopt the winner's
    except ApiException as exc:
        if api_away(exc):
            raise ApiAway(f"{claim.key}: {exc.status} {exc.reason}") from exc
        log.warning("queues: owner label of %s not written (%s)", claim.key, exc.status)
        return charge, f"{claim.key}: {exc.status} {exc.reason}"
    except (HTTPError, OSError) as exc:
        raise ApiAway(f"{claim.key}: {exc}") from exc
    labels = (current.get("metadata") or {}).get("labels") or {}
    target.remember(labels)
    fresh = ClaimFacts(**{**claim.__dict__, "labels": labels})
    return decide(fresh, the_world, the_rules), what


class LabelTarget:
    """The API object behind a claim: an Instance or a ResourceClaim, as plain dicts."""

    def __init__(self, api_client: client.ApiClient, claim: ClaimFacts) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.claim = claim
        if claim.kind == DRA:
            self.path = (RESOURCE_CLAIMS.group, RESOURCE_CLAIMS.version, claim.namespace)
            self.plural = RESOURCE_CLAIMS.plural
        else:
            self.path = (GROUP, VERSION, claim.namespace)
            self.plural = INSTANCES

    def read(self) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(*self.path, self.plural, self.claim.name)

    def patch(self, ops: list[dict]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(
            *self.path, self.plural, self.claim.name, ops, _content_type=JSON_PATCH
        )

    def remember(self, labels: dict[str, str]) -> None:
        """Ahead of the watch, so that the next recompute does not try the write again."""
        c = self.claim
        if c.kind == DRA:
            ResourceClaim.objects.filter(namespace=c.namespace, name=c.name).update(labels=labels)
        else:
            InstanceLabels.objects.update_or_create(
                namespace=c.namespace, name=c.name, defaults={"labels": labels}
            )
