"""The scheduler extender's assignment, honoured at Allocate (issue 14).

The extender writes on each pod it binds which slots it booked for it (``akri.sh/assignment``,
see ``agent.sharing.akri_slots``). The kubelet's device-plugin calls do not say which pod they
are for, so, as Volcano's and HAMi's device plugins do, the pod is identified as the oldest
unfinished pod on this node that has an unconsumed assignment of the right size for the
resource. Its slots are then used, and the agent records that it took them
(``akri.sh/assignment-consumed``, a JSON patch whose ``test`` op makes two takers of the same
slots impossible).

The kubelet admits pods in its own order, so the oldest assignment is not always the pod's
own: in a burst, an Allocate may take another waiting pod's slots. Nothing is overbooked (the
claims are conditional writes), but the records name the wrong pods until the reconciler,
once PodResources has named the pod of each allocation, rewrites them as admitted
(``agent.node.holdings``); ``in_flight`` tells it which resources to leave alone meanwhile.

Whenever the pod cannot be identified (no extender, an API error, an assignment that no longer
fits: a slot taken meanwhile, an Instance gone), the plugins plan as they always did: an
assignment is a hint that makes the scheduler's choice and the agent's agree, never a
condition of Allocate. Off unless ``AKRI_AGENT_ASSIGNMENTS`` is set: the lookup costs one pod
list per Allocate.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from agent.domain.cl import held_vdevs, preferred_allocation, usable_instances
from agent.domain.slots import InstanceState
from agent.kube.client import CoreApi
from agent.sharing.akri_slots import (
    ASSIGNMENT,
    CONSUMED,
    instance_of_slot,
    parse_assignment,
    parse_consumed,
    unconsumed,
)

log = logging.getLogger(__name__)

TIMEOUT = 5.0
ATTEMPTS = 3
# After an assignment is taken, its Allocate claims and binds within a claim's write (the API
# server answers within TIMEOUT-ish); until then a mark on a waiting pod may be that pod's own
# Allocate in flight, and the records of the resource are not rewritten. Should an Allocate
# take longer, the rewrite only unmarks a pod whose slots are being claimed: the extender
# then counts them held once, and an Allocate that takes them again finds them not free.
TAKE_SETTLE_SECONDS = 5.0


def may_take(pod: dict[str, Any], node: str, resource: str, count: int) -> bool:
    """Whether an Allocate for ``count`` devices of ``resource`` may be ``pod``'s: unfinished,
    not being deleted, not Running (the kubelet allocates every device of a pod before it
    starts a container, so a Running pod's Allocates are over, and an assignment it never
    took is stale: taken by a new pod's Allocate, it left that pod's own assignment unused,
    its slots held by nobody and counted taken by the extender), with that many unconsumed."""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed", "Running"):
        return False
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return len(unconsumed(pod, node).get(resource, ())) >= count


def _pointer(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class Taken:
    """Slots of one pod's assignment this Allocate takes."""

    namespace: str
    pod: str
    keys: tuple[str, ...]


def _age(pod: dict[str, Any]) -> tuple:
    meta = pod.get("metadata") or {}
    try:
        at = parse_assignment(meta.get("annotations") or {})[1]
    except Exception:
        at = 0
    return (at, meta.get("creationTimestamp") or "", meta.get("name") or "")


class Assignments:
    """Finds and takes the assignment of the pod an Allocate is for, on one node."""

    enabled = True

    def __init__(self, api_client: client.ApiClient, node: str) -> None:
        self.core = CoreApi(api_client)
        self.node = node
        self._taken_at: dict[str, float] = {}  # resource -> monotonic time of the last take
        self._lock = threading.Lock()

    def in_flight(self, resource: str) -> bool:
        """Whether an assignment of ``resource`` was taken too recently for its Allocate to
        be bound to a pod yet (see TAKE_SETTLE_SECONDS)."""
        with self._lock:
            at = self._taken_at.get(resource)
        return at is not None and time.monotonic() - at < TAKE_SETTLE_SECONDS

    def peek(self, resource: str, count: int) -> tuple[str, ...]:
        """The slots the oldest candidate pod was assigned for ``resource`` (nothing taken)."""
        for pod in self._candidates(resource, count):
            return tuple(unconsumed(pod, self.node)[resource][:count])
        return ()

    def take(self, resource: str, count: int) -> Taken | None:
        """Take ``count`` assigned slots of ``resource`` from the oldest candidate pod."""
        for _ in range(ATTEMPTS):
            try:
                candidates = self._candidates(resource, count)
                if not candidates:
                    return None
                with self._lock:
                    self._taken_at[resource] = time.monotonic()
                taken = self._consume(candidates[0], resource, count)
            except client.ApiException as exc:
                if exc.status in (409, 422):
                    continue  # another taker changed it: look again
                log.info("assignment lookup for %s failed (%s); planning as usual", resource, exc)
                return None
            except Exception as exc:
                log.info("assignment lookup for %s failed (%s); planning as usual", resource, exc)
                return None
            return taken
        return None

    def _candidates(self, resource: str, count: int) -> list[dict[str, Any]]:
        response = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}",
            _preload_content=False,
            _request_timeout=TIMEOUT,
        )
        pods = json.loads(response.data).get("items") or []
        found = [pod for pod in pods if may_take(pod, self.node, resource, count)]
        return sorted(found, key=_age)

    def _consume(self, pod: dict[str, Any], resource: str, count: int) -> Taken:
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        keys = unconsumed(pod, self.node)[resource][:count]
        consumed = parse_consumed(annotations)
        consumed[resource] = consumed.get(resource, 0) + count
        value = json.dumps(consumed, sort_keys=True)
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": _pointer(ASSIGNMENT), "value": annotations[ASSIGNMENT]}
        ]
        if CONSUMED in annotations:
            ops.append({"op": "test", "path": _pointer(CONSUMED), "value": annotations[CONSUMED]})
        ops.append({"op": "add", "path": _pointer(CONSUMED), "value": value})
        self.core.patch_namespaced_pod(
            meta["name"], meta["namespace"], ops, _request_timeout=TIMEOUT, _preload_content=False
        )
        log.info(
            "pod %s/%s: taking its assigned %s slots %s",
            meta["namespace"],
            meta["name"],
            resource,
            keys,
        )
        return Taken(meta["namespace"], meta["name"], tuple(keys))


def cl_plan(
    taken: Taken | None,
    states: Sequence[InstanceState],
    node: str,
    vdevs: Sequence[str],
    unique: bool,
    configuration: str,
) -> list[tuple[str, str, str]] | None:
    """(vdev, instance, slot key) from an assignment, or None when it cannot be used as it is:
    wrong size, a slot not free or of an Instance this node cannot use, or (unique) two slots
    on one Instance. The caller then plans as usual."""
    if taken is None:
        return None
    why = _unusable(taken, states, node, vdevs, unique, configuration)
    if why:
        log.info(
            "pod %s/%s: assignment not used (%s); planning as usual",
            taken.namespace,
            taken.pod,
            why,
        )
        return None
    instances = [instance_of_slot(key) for key in taken.keys]
    return [
        (vdev, instance, key)
        for vdev, instance, key in zip(vdevs, instances, taken.keys, strict=True)
    ]


def il_preferred(
    assignments: Assignments | NoAssignments, resource: str, container: Any
) -> list[str]:
    """GetPreferredAllocation of an Instance-level plugin: the assigned slots when the kubelet
    offers them all, else the usual lowest-first choice."""
    size = container.allocation_size
    available = list(container.available_deviceIDs)
    must = list(container.must_include_deviceIDs)
    taken = assignments.take(resource, size) if not must else None
    if taken is not None and set(taken.keys) <= set(available):
        return list(taken.keys)
    return preferred_allocation(available, must, size)


def _unusable(
    taken: Taken,
    states: Sequence[InstanceState],
    node: str,
    vdevs: Sequence[str],
    unique: bool,
    configuration: str,
) -> str:
    """Why ``taken`` cannot serve this request as it is; "" when it can."""
    if len(taken.keys) != len(vdevs):
        return f"{len(taken.keys)} slots assigned, {len(vdevs)} requested"
    if set(vdevs) & set(held_vdevs(states, node, configuration)):
        return "the kubelet re-asks for devices it holds"
    usable = {s.name: s for s in usable_instances(states, node, configuration)}
    instances = [instance_of_slot(key) for key in taken.keys]
    if unique and len(set(instances)) != len(instances):
        return "two slots on one Instance for unique devices"
    for instance, key in zip(instances, taken.keys, strict=True):
        state = usable.get(instance)
        if state is None:
            return f"Instance {instance} is not usable here"
        if state.cordon is not None:
            return f"Instance {instance} is {state.cordon.describe()}"
        if key not in state.free_slots():
            return f"slot {key} is no longer free"
    return ""


class NoAssignments:
    """The default when assignments are off: nothing is ever found."""

    enabled = False

    def in_flight(self, resource: str) -> bool:
        return False

    def peek(self, resource: str, count: int) -> tuple[str, ...]:
        return ()

    def take(self, resource: str, count: int) -> Taken | None:
        return None


def assignments_for(api_client: client.ApiClient, node: str) -> Assignments | NoAssignments:
    from django.conf import settings

    if settings.AKRI.get("AGENT_ASSIGNMENTS"):
        return Assignments(api_client, node)
    return NoAssignments()
