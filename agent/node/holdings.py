"""The agent's word on each pod of its node: which slots it holds (``akri-site.io/holds``), and
the scheduler extender's assignment made true (``akri.sh/assignment`` and
``akri.sh/assignment-consumed``).

Why on the pod, written by the agent: only the node knows which pod holds which device (the
kubelet's PodResources, read by the slot reconciler into its bindings), and the agent keeps
its books in its own database. Written on the pod, the fact reaches every process that
watches pods through the API server (the controller builds ``Slot.pod_*`` from it for the
queue charges, the dashboard and the webhook), lives exactly as long as the pod, and costs
one write per admitted pod, none per claim: ``deviceUsage`` (the slot's truth) keeps Akri's
format and its writers do not contend with these. Only this node's pods are written, and
only from the reconciler's own books.

Every write is a JSON patch that ``test``s each annotation it changes at the value the pod
watch showed (the resourceVersion when one is added), so a write decided on a stale view
fails and is decided again; writing what is already there is skipped, so passes may repeat.

The assignment: Allocate takes the oldest unconsumed assignment on the node, but the kubelet
admits pods in its own order, so a pod may run on another's assigned slots. Once the
reconciler has named the pod of every allocation of a resource (nothing in flight), the
records are rewritten by ``agent.domain.holdings.reassign``: an admitted pod's assignment
becomes what it holds, all consumed; the waiting pods keep the reservations nobody holds.
Waiting pods are written first, so that the extender never sees a reserved slot unclaimed.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client.rest import ApiException

from agent.domain.holdings import (
    HOLDS,
    Assigned,
    annotation_patch,
    format_holds,
    merged,
    parse_holds,
    reassign,
)
from agent.domain.naming import AKRI_PREFIX
from agent.kube.client import CoreApi
from agent.models import Configuration, Slot
from agent.sharing.akri_slots import (
    ASSIGNMENT,
    CONSUMED,
    format_assignment,
    parse_assignment,
    parse_consumed,
)
from agent.sharing.policy import PolicyError

log = logging.getLogger(__name__)

# The annotations the agent reads of its node's pods (the pod index keeps only these).
NOTES = (HOLDS, ASSIGNMENT, CONSUMED)
PATCH_TIMEOUT = 5.0


class PodLike(Protocol):
    namespace: str
    name: str
    uid: str
    resource_version: str
    created: str
    annotated: bool  # the pod has an annotations map
    notes: tuple[tuple[str, str], ...]  # its NOTES annotations

    @property
    def terminated(self) -> bool: ...


class BindingLike(Protocol):
    slot: str
    resource_name: str
    pod_namespace: str
    pod_name: str
    pod_uid: str
    container: str

    @property
    def pod_known(self) -> bool: ...


@dataclass(frozen=True)
class Change:
    """Annotations to write on one pod, with what they were when decided."""

    namespace: str
    name: str
    seen: dict[str, str] | None  # its NOTES as seen; None: no annotations map at all
    resource_version: str
    changes: dict[str, str | None]
    waiting: bool = False  # gives a waiting pod its reservation back

    def patch(self) -> list[dict[str, Any]]:
        return annotation_patch(self.seen, self.resource_version, self.changes)


class Publisher:
    """Decides and writes the annotations of one node's pods (see the module docstring).

    ``in_flight(resource)`` says an Allocate of that resource may be under way that the
    reconciler has not bound yet (an assignment taken moments ago): its records wait.
    """

    def __init__(
        self,
        core: CoreApi,
        node: str,
        namespace: str,
        *,
        in_flight: Callable[[str], bool] = lambda resource: False,
    ) -> None:
        self.core = core
        self.node = node
        self.namespace = namespace
        self.in_flight = in_flight
        # The last plan left some records alone because an Allocate was in flight: the
        # caller plans again a little later.
        self.deferred = False

    # --- deciding -------------------------------------------------------------------------
    def plan(self, pods: Iterable[PodLike], bindings: Iterable[BindingLike]) -> list[Change]:
        """The writes that would make every live pod's annotations true, waiting pods first."""
        self.deferred = False
        live = [p for p in pods if not p.terminated]
        bindings = list(bindings)
        held = _held(live, bindings)
        records = self._records(live, held, bindings)
        out = []
        for pod in live:
            key = (pod.namespace, pod.name)
            notes = dict(pod.notes)
            changes = self._holds_change(notes, held.get(key, {}))
            changes.update(records.get(key, {}))
            changes = {k: v for k, v in changes.items() if notes.get(k) != v}
            if changes:
                waiting = key in records and not held.get(key)
                seen = notes if pod.annotated else None
                out.append(
                    Change(pod.namespace, pod.name, seen, pod.resource_version, changes, waiting)
                )
        return sorted(out, key=lambda c: not c.waiting)

    def _holds_change(self, notes: Mapping[str, str], mine: Mapping[str, tuple]) -> dict:
        current = parse_holds(notes.get(HOLDS))
        slots = {slot: container for slot, (container, _resource) in mine.items()}
        if current is None and not slots:
            return {}  # never held anything here: nothing to say
        wanted = merged(current, self.namespace, slots)
        if current == wanted and HOLDS in notes:
            return {}
        return {HOLDS: format_holds(wanted)}

    def _records(
        self,
        live: list[PodLike],
        held: Mapping[tuple[str, str], Mapping[str, tuple]],
        bindings: list[BindingLike],
    ) -> dict[tuple[str, str], dict[str, str | None]]:
        """New ``akri.sh/assignment``/``-consumed`` values of the pods whose record is wrong."""
        assigned: dict[str, list[Assigned]] = defaultdict(list)
        parsed: dict[tuple[str, str], tuple[int, dict[str, list[str]], dict[str, int]]] = {}
        for pod in live:
            notes = dict(pod.notes)
            if ASSIGNMENT not in notes:
                continue
            try:
                node, at, slots = parse_assignment(notes)
            except PolicyError:
                continue
            key = (pod.namespace, pod.name)
            if node != self.node or (HOLDS in notes and not held.get(key)):
                # Another node's, or a pod admitted once that holds nothing now (a slot
                # released under it): it will not Allocate again, its record stays.
                continue
            consumed = parse_consumed(notes)
            parsed[key] = (at, slots, consumed)
            for resource, keys in slots.items():
                taken = min(max(consumed.get(resource, 0), 0), len(keys))
                assigned[resource].append(
                    Assigned(key, (at, pod.created, pod.name), tuple(keys), taken)
                )
        if not assigned:
            return {}
        unnamed = {b.resource_name for b in bindings if not b.pod_known}
        settled = [r for r in assigned if r not in unnamed and not self.in_flight(r)]
        self.deferred = len(settled) < len(assigned)
        if not settled:
            return {}
        busy = self._busy({s for r in settled for a in assigned[r] for s in a.slots})
        unique = self._unique(settled)
        new: dict[tuple[str, str], dict[str, tuple[tuple[str, ...], int]]] = defaultdict(dict)
        for resource in settled:
            holding = {
                pod: [slot for slot, (_c, r) in slots.items() if r == resource]
                for pod, slots in held.items()
            }
            for pod, record in reassign(
                assigned[resource], holding, busy, unique=resource in unique
            ).items():
                new[pod][resource] = record
        out: dict[tuple[str, str], dict[str, str | None]] = {}
        for pod, records in new.items():
            at, slots, consumed = parsed[pod]
            slots, consumed = dict(slots), dict(consumed)
            for resource, (keys, taken) in records.items():
                slots[resource] = list(keys)
                consumed[resource] = taken
            consumed = {r: n for r, n in consumed.items() if n}
            out[pod] = {
                ASSIGNMENT: format_assignment(self.node, at, slots),
                CONSUMED: json.dumps(consumed, sort_keys=True) if consumed else None,
            }
            log.info(
                "pod %s/%s: assignment recorded as admitted: %s",
                pod[0],
                pod[1],
                {r: f"{list(k)} ({n} taken)" for r, (k, n) in records.items()},
            )
        return out

    def _busy(self, keys: set[str]) -> set[str]:
        """Slots of ``keys`` that ``deviceUsage`` (this agent's cache) shows held by anyone."""
        rows = Slot.objects.filter(instance__namespace=self.namespace, key__in=sorted(keys))
        return set(rows.exclude(value="").values_list("key", flat=True))

    def _unique(self, resources: list[str]) -> set[str]:
        """Configuration-level resources whose Configuration asks for unique devices."""
        names = {r[len(AKRI_PREFIX) + 1 :]: r for r in resources}
        rows = Configuration.objects.filter(namespace=self.namespace, name__in=sorted(names))
        return {names[n] for n, unique in rows.values_list("name", "unique_devices") if unique}

    # --- writing --------------------------------------------------------------------------
    def write(self, change: Change) -> dict[str, Any] | None:
        """Apply one change; the pod as written, or None when there was nothing to write or
        the pod is gone. A failed ``test`` (the pod changed) raises ``ApiException`` 422."""
        ops = change.patch()
        if not ops:
            return None
        try:
            return self.core.patch_namespaced_pod(
                change.name, change.namespace, ops, _request_timeout=PATCH_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


def _held(
    live: list[PodLike], bindings: list[BindingLike]
) -> dict[tuple[str, str], dict[str, tuple[str, str]]]:
    """pod -> slot -> (container, resource), from the reconciler's bindings (what PodResources
    named), for the pod of that name that is alive now (a binding with another UID was an
    older pod's)."""
    uids = {(p.namespace, p.name): p.uid for p in live}
    out: dict[tuple[str, str], dict[str, tuple[str, str]]] = defaultdict(dict)
    for b in bindings:
        key = (b.pod_namespace, b.pod_name)
        if not b.pod_known or key not in uids:
            continue
        if b.pod_uid and uids[key] and b.pod_uid != uids[key]:
            continue
        out[key][b.slot] = (b.container, b.resource_name)
    return out


def notes_of(meta: Mapping[str, Any]) -> tuple[bool, tuple[tuple[str, str], ...]]:
    """(has an annotations map, the NOTES among them) of a pod's metadata."""
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        return False, ()
    return True, tuple((k, str(annotations[k])) for k in NOTES if k in annotations)
