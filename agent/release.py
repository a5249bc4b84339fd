"""A person's release of slots by hand: what the confirmation shows, and the release itself.

Two pages offer it, the admin's slot list and the dashboard's slot map; both call these
functions so that the rules cannot drift apart: the operator confirms the holder value they
saw, the claim store releases only if the slot still holds it (a conditional write on the API
server), and every attempt is audited whatever its outcome (the claim store audits what reached
it, ``audit_refusal`` what never did).

A release is not the end of the story: a slot whose pod still runs is claimed back at once by
its node's agent (it never takes a device from a running pod). So after the write the slot is
watched on the API server for a moment (``settle``), and the outcome says what it came to:
released, or restored by node X because pod Y runs there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from agent.models import AuditEntry, Pod, Slot, SlotPodBinding

log = logging.getLogger(__name__)

RELEASE_PERMISSION = "agent.release_slot"
RUNNING_PHASES = ("Running", "Pending")
REASON_MAX = 1000
# A release names each slot; beyond this many, the operator should narrow the selection.
RELEASE_MAX = 200
# How long a released slot is watched for its node's agent claiming it back: longer when its
# pod was known to run (a restore is then expected: the demo's agents take 25 ms, a busy
# node's a few hundred), briefly otherwise.
SETTLE_SECONDS = 2.0
SETTLE_IDLE_SECONDS = 0.5
SETTLE_POLL_SECONDS = 0.05


@dataclass
class ReleaseItem:
    """One slot on the confirmation page: what the operator is about to release."""

    slot: Slot
    pod: str
    container: str
    pod_row: Pod | None

    @property
    def target(self) -> str:
        return f"{self.slot.instance.namespace}/{self.slot.instance.name}/{self.slot.key}"

    @property
    def pod_running(self) -> bool:
        row = self.pod_row
        return row is not None and row.phase in RUNNING_PHASES and not row.deleting

    @property
    def pod_state(self) -> str:
        if not self.pod:
            return "holder pod not known"
        if self.pod_row is None:
            return "pod not in the cache (gone?)"
        state = self.pod_row.phase or "phase unknown"
        return f"{state}, being deleted" if self.pod_row.deleting else state


def release_items(slots: QuerySet[Slot]) -> list[ReleaseItem]:
    items = []
    for slot in slots.select_related("instance").order_by("instance__name", "index"):
        pod, container = "", slot.container
        if slot.pod_name:
            pod = f"{slot.pod_namespace}/{slot.pod_name}"
        elif slot.holder_node:
            # The Slot row may not carry its pod yet; the holder node's slot-to-pod map may.
            binding = SlotPodBinding.objects.filter(node=slot.holder_node, slot=slot.key).first()
            if binding and binding.pod_name:
                pod = f"{binding.pod_namespace}/{binding.pod_name}"
                container = binding.container
        pod_row = None
        if pod:
            ns, name = pod.split("/", 1)
            pod_row = Pod.objects.filter(namespace=ns, name=name).first()
        items.append(ReleaseItem(slot, pod, container, pod_row))
    return items


def confirmation(slots: QuerySet[Slot]) -> dict[str, Any]:
    """What a confirmation page shows: the held slots, the free ones, the running holders."""
    items = release_items(slots)
    return {
        "held": [i for i in items if i.slot.level != Slot.Level.FREE],
        "free": [i for i in items if i.slot.level == Slot.Level.FREE],
        "running": [i for i in items if i.pod_running],
        "reason_max": REASON_MAX,
    }


def audit_refusal(user: Any, target: str, holder: str, reason: str, why: str) -> None:
    """Refusals that never reached the claim store are audited here."""
    _audit(user, target, holder, reason, "refused", why)


def _audit(user: Any, target: str, holder: str, reason: str, outcome: str, detail: str) -> None:
    """An audit row for what the claim store did not record itself."""
    AuditEntry.objects.create(
        at=timezone.now(),
        user=user,
        username=user.get_username(),
        action="release_slot",
        target=target,
        holder=holder,
        reason=reason,
        outcome=outcome,
        detail=detail,
    )


def release(
    user: Any,
    slots: QuerySet[Slot],
    wanted: Iterable[int],
    expected: Mapping[int, str],
    reason: str,
) -> dict[str, list[str]]:
    """Release ``slots`` if each still holds the value the operator confirmed (``expected``,
    by slot id); ``wanted`` are the ids asked for, so that one gone meanwhile is reported.

    Returns the slot keys by outcome: released, free (nothing to do), refused, failed.
    """
    from agent.kube import claims  # the claim store talks to the API server: load on use

    reason = reason.strip()[:REASON_MAX]
    outcomes: dict[str, list[str]] = {
        "released": [],
        "restored": [],
        "free": [],
        "refused": [],
        "failed": [],
    }
    found = set()
    released: list[ReleaseItem] = []
    items = {item.slot.pk: item for item in release_items(slots)}
    for slot in slots.select_related("instance").order_by("instance__name", "index"):
        found.add(slot.pk)
        inst = slot.instance
        target = f"{inst.namespace}/{inst.name}/{slot.key}"
        seen = expected.get(slot.pk)
        if seen is None:
            audit_refusal(user, target, slot.value, reason, "no holder value was confirmed")
            outcomes["refused"].append(f"{slot.key} (no holder value was confirmed)")
            continue
        try:
            result = claims.manual_release(
                inst.namespace, inst.name, slot.key, seen, user=user, reason=reason
            )
        except claims.SlotChanged as exc:
            now = getattr(exc, "actual", None)
            said = f"now {now!r}" if now is not None else str(exc)
            outcomes["refused"].append(f"{slot.key} (changed meanwhile: {said})")
        except claims.ClaimStoreError as exc:
            outcomes["failed"].append(f"{slot.key} ({exc})")
        except Exception as exc:  # the claim store failed in a way it did not record
            log.exception("manual release of %s failed", target)
            _audit(user, target, seen, reason, "failed", f"{type(exc).__name__}: {exc}")
            outcomes["failed"].append(f"{slot.key} ({type(exc).__name__}: {exc})")
        else:
            if result == "already free":
                outcomes["free"].append(slot.key)
            else:
                released.append(items.get(slot.pk) or ReleaseItem(slot, "", "", None))
    for pk in sorted(set(wanted) - found):
        audit_refusal(user, f"slot #{pk}", "", reason, "slot no longer in the cache")
        outcomes["refused"].append(f"slot #{pk} (no longer in the cache)")
    taken_back = settle(released) if released else {}
    for item in released:
        back = taken_back.get(item.slot.pk)
        if back is None:
            outcomes["released"].append(item.slot.key)
        else:
            outcomes["restored"].append(_restored_words(item, *back))
    return outcomes


def holder_node(value: str) -> str:
    """The node a ``deviceUsage`` value names: ``node`` or ``C:vdev:node``."""
    return value.rsplit(":", 1)[-1] if value.startswith("C:") else value


def _restored_words(item: ReleaseItem, value: str, after: float) -> str:
    by = holder_node(value) or value
    if by != holder_node(item.slot.value):
        # Not the holder's node taking it back: the device went to someone else meanwhile.
        return f"{item.slot.key} (taken by {by} {after:.2f} s later, for another pod)"
    pod = f": pod {item.pod} still runs there" if item.pod else ""
    return f"{item.slot.key} (restored by {by} {after:.2f} s later{pod})"


def settle(
    released: list[ReleaseItem],
    *,
    timeout: float | None = None,
    read: Callable[[str, str], dict[str, Any]] | None = None,
) -> dict[int, tuple[str, float]]:
    """Watch the released slots on the API server: ``{slot id: (new value, seconds after)}``
    for those claimed back within the window (``SETTLE_SECONDS`` when a holder pod was known
    to run, else ``SETTLE_IDLE_SECONDS``); it ends early once every slot is taken back."""
    if timeout is None:
        running = any(item.pod_running for item in released)
        timeout = SETTLE_SECONDS if running else SETTLE_IDLE_SECONDS
    read = read or _read_instance
    started = time.monotonic()
    pending = {item.slot.pk: item.slot for item in released}
    back: dict[int, tuple[str, float]] = {}
    while pending:
        instances = {(s.instance.namespace, s.instance.name) for s in pending.values()}
        for namespace, name in sorted(instances):
            try:
                usage = read(namespace, name)["spec"].get("deviceUsage") or {}
            except Exception as exc:  # the release stands; only its aftermath is unknown
                log.info("release: cannot re-read %s/%s: %s", namespace, name, exc)
                usage = None
            for pk, slot in list(pending.items()):
                if (slot.instance.namespace, slot.instance.name) != (namespace, name):
                    continue
                if usage is None:
                    del pending[pk]  # reported as released: the write itself went through
                elif usage.get(slot.key):
                    back[pk] = (usage[slot.key], time.monotonic() - started)
                    del pending[pk]
        if not pending or time.monotonic() - started >= timeout:
            break
        time.sleep(SETTLE_POLL_SECONDS)
    return back


def _read_instance(namespace: str, name: str) -> dict[str, Any]:
    from agent.kube import claims  # the API server: load on use, as ``release``

    return claims._api_for(namespace).get_instance(name)


def _short(names: list[str]) -> str:
    shown = ", ".join(names[:10])
    return shown + (f" and {len(names) - 10} more" if len(names) > 10 else "")


def report(outcomes: Mapping[str, list[str]]) -> list[tuple[str, str]]:
    """What happened, as (level, sentence) pairs; level is a ``django.contrib.messages`` tag."""
    said = []
    if outcomes["released"]:
        n = len(outcomes["released"])
        said.append(
            (
                "success",
                f"Released {n} slot{'s' if n != 1 else ''}: {_short(outcomes['released'])}.",
            )
        )
    if outcomes.get("restored"):
        said.append(
            (
                "warning",
                "Released, but not free: taken again at once. A node's agent claims back the"
                " slot of a pod that still runs there (it never takes a device from a running"
                " pod): "
                + _short(outcomes["restored"])
                + ". To free the device, evict or delete the pod.",
            )
        )
    if outcomes["free"]:
        said.append(("info", f"Already free, nothing to do: {_short(outcomes['free'])}."))
    if outcomes["refused"]:
        said.append(
            ("warning", "Not released, left as they are: " + _short(outcomes["refused"]) + ".")
        )
    if outcomes["failed"]:
        said.append(
            (
                "error",
                "Could not release (the API server was not written): "
                + _short(outcomes["failed"])
                + ". Try again, or check the API server.",
            )
        )
    return said
