"""The claim store: claiming and releasing slots as conditional writes to the API server.

The API server is the truth. A claim reads the Instance from the cache, sends a JSON patch
whose ``test`` ops make it fail rather than overwrite a change it has not seen, and on a
conflict re-reads the Instance from the API server and decides again: taken by another holder
is ``SlotTaken``; already ours is success. Only after the API server said yes are the cache
row and the event row written. Transient errors are retried a bounded number of times with
jittered backoff. Not a 500 saying an admission webhook could not be called: under
``failurePolicy: Fail`` the API server made no write, and asking again waits out the webhook's
timeout again (6 attempts of a 5 s timeout kept an Allocate half a minute before its error), so
that one is answered at once (``WebhookFailed``) and the slot stays free.

Releases of several slots of one Instance that are due together (a Job's pods ending at once)
can go as one patch (``release_many``): a ``test`` + ``replace`` pair per slot, all or nothing
at the API server. On a conflict nobody can tell which ``test`` failed, so, as for one slot,
the Instance is re-read and every slot decided again: the ones changed meanwhile are refused,
the others go in the next attempt. Event rows and metrics stay one per slot.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent import metrics
from agent.domain.claims import (
    ClaimOutcome,
    ReleaseOutcome,
    claim_ops,
    decide_claim,
    decide_release,
    release_ops,
)
from agent.domain.cordon import ANNOTATION as CORDON_ANNOTATION
from agent.domain.cordon import cordon_of
from agent.domain.errors import SlotChanged, SlotTaken
from agent.domain.slots import InstanceState
from agent.kube import cache
from agent.kube.client import AkriApi, new_api_client, status_of
from agent.models import AuditEntry, Instance, SlotEvent

log = logging.getLogger(__name__)

__all__ = [
    "ClaimStore",
    "ClaimStoreError",
    "Cordoned",
    "InstanceGone",
    "SlotChanged",
    "SlotTaken",
    "UnknownSlot",
    "WebhookFailed",
    "WriteUnknown",
    "manual_release",
]


class ClaimStoreError(Exception):
    """The API server could not be written after the bounded retries, or refused for good."""


class InstanceGone(ClaimStoreError):
    """The Instance does not exist (any more)."""


class UnknownSlot(ClaimStoreError):
    """The key is not a slot of the Instance."""


class Cordoned(ClaimStoreError):
    """A new claim on a free slot of a cordoned Instance (agent.domain.cordon)."""


class WriteUnknown(ClaimStoreError):
    """The last write got no answer (a timeout, a dropped connection): the API server may
    still apply it. A caller that gives up must undo it as if it had happened (a release is
    conditional, so it frees nothing that this write did not claim)."""


class WebhookFailed(ClaimStoreError):
    """The API server could not call an admission webhook that must answer (failurePolicy
    Fail: down, slower than its timeout, a bad certificate). Nothing was written. Not retried:
    the webhook's health is not a race another attempt can win, and each attempt can cost its
    whole timeout."""


# kube-apiserver's words for a webhook call that failed under failurePolicy Fail (a 500
# InternalError: "Internal error occurred: failed calling webhook "<name>": ...").
_WEBHOOK_FAILED = "failed calling webhook"

# Codes worth retrying as they are; 409/422 mean "re-read and decide" instead.
_TRANSIENT = {429, 500, 502, 503, 504}
_CONFLICT = {409, 422}


@dataclass(frozen=True)
class _Plan:
    """One decision of a claim or release: the patch to write, or what to answer without
    writing (a result, or a refusal to raise)."""

    ops: list[dict[str, Any]] | None = None
    result: str = ""
    refusal: Exception | None = None


class ClaimStore:
    """Conditional slot writes for one namespace, on behalf of one actor (a node or a user)."""

    def __init__(
        self,
        api: AkriApi,
        actor: str,
        *,
        attempts: int = 6,
        backoff: float = 0.02,
        on_applied: Callable[[dict[str, Any]], None] | None = None,
        sync: Any = None,
        parse: Callable[[dict[str, Any]], InstanceState] = InstanceState.from_object,
    ) -> None:
        self.api = api
        self.actor = actor
        self.attempts = attempts
        self.backoff = backoff
        # Called with the API server's answer after the cache took it (agents refresh health).
        self.on_applied = on_applied
        # With the process's CacheSync the cache write happens behind the claim, in order
        # with the watch; without one (the web process, tests) it happens before returning.
        self.sync = sync
        # Instance object -> slot view. An agent hands in its view's, which keeps the parse of
        # each object it holds: the plugin that planned the claim has already parsed it.
        self.parse = parse
        # The newest Instance this store has read or written, by name: a caller trying one slot
        # after another can pass it as ``current`` instead of the cache.
        self.last_seen: dict[str, dict[str, Any]] = {}

    # --- public -------------------------------------------------------------------------
    def claim(
        self,
        instance: str,
        key: str,
        wanted: str,
        *,
        cause: str = SlotEvent.Cause.ALLOCATE,
        node: str = "",
        pod: str = "",
        detail: str = "",
        run: Any = None,
        current: dict[str, Any] | None = None,
    ) -> str:
        """Make ``key`` hold ``wanted``. Returns "claimed" or "already ours".

        Raises ``SlotTaken`` when another holder has it, ``UnknownSlot``, ``InstanceGone`` or
        ``ClaimStoreError``. ``current`` is the Instance as the caller last saw it (else the cache);
        only a decision to write comes from it, anything else is confirmed by a fresh read.
        """

        # A cordon stops new pods only. A restore writes back the slot of a pod that already
        # runs on the device (after a release by hand, say): that slot is held in fact, and a
        # cordon leaves held slots as they are.
        new_pod = cause == SlotEvent.Cause.ALLOCATE

        def plan(state: InstanceState, rv: str) -> _Plan:
            outcome = decide_claim(state, key, wanted)
            if outcome is ClaimOutcome.CORDONED and not new_pod:
                outcome = ClaimOutcome.CLAIM
            if outcome is ClaimOutcome.CLAIM:
                return _Plan(ops=claim_ops(state, key, wanted, rv))
            if outcome is ClaimOutcome.ALREADY_OURS:
                return _Plan(result="already ours")
            if outcome is ClaimOutcome.NO_SLOT:
                return _Plan(refusal=UnknownSlot(f"{key} is not a slot of Instance {instance}"))
            if outcome is ClaimOutcome.CORDONED:
                why = state.cordon.describe() if state.cordon else "cordoned"
                return _Plan(refusal=Cordoned(f"Instance {instance} is {why}"))
            return _Plan(refusal=SlotTaken(key, state.device_usage.get(key, "")))

        attribution = cache.Attribution(
            cause, self.actor, node=node, pod=pod, detail=detail, run=run
        )
        result = self._change("claim", "claimed", instance, key, wanted, plan, attribution, current)
        if result == "claimed" and new_pod:
            self._undo_if_cordoned(instance, key, wanted, node)
        return result

    def _undo_if_cordoned(self, instance: str, key: str, wanted: str, node: str) -> None:
        """A claim decided from a view that had not heard of a cordon yet passes its
        conditions (the slot's ""): JSON patch cannot test that an annotation is absent. The
        API server's answer is the truth at the moment of the write, so when it carries a
        cordon, the cordon came first: undo the claim (conditionally) and refuse it. A cordon
        written after the claim is not in the answer, and the slot is then held, as it should
        be."""
        found = cordon_of(self.last_seen.get(instance))
        if found is None:
            return
        self.release(
            instance,
            key,
            wanted,
            node=node,
            detail=f"rolled back: Instance {instance} is {found.describe()}",
        )
        raise Cordoned(f"Instance {instance} is {found.describe()}")

    def release(
        self,
        instance: str,
        key: str,
        expected: str,
        *,
        cause: str = SlotEvent.Cause.RELEASE,
        node: str = "",
        pod: str = "",
        detail: str = "",
        run: Any = None,
        current: dict[str, Any] | None = None,
    ) -> str:
        """Free ``key`` if it still holds ``expected``. Returns "released" or "already free".

        Raises ``SlotChanged`` when it holds something else, ``InstanceGone`` or
        ``ClaimStoreError``.
        """

        def plan(state: InstanceState, rv: str) -> _Plan:
            outcome = decide_release(state, key, expected)
            if outcome is ReleaseOutcome.RELEASE:
                return _Plan(ops=release_ops(state, key, expected))
            if outcome in (ReleaseOutcome.ALREADY_FREE, ReleaseOutcome.NO_SLOT):
                return _Plan(result="already free")
            return _Plan(refusal=SlotChanged(key, expected, state.device_usage.get(key, "")))

        attribution = cache.Attribution(
            cause, self.actor, node=node, pod=pod, detail=detail, run=run
        )
        return self._change("release", "released", instance, key, "", plan, attribution, current)

    def release_many(
        self,
        instance: str,
        expected: Mapping[str, str],
        attributions: Mapping[str, cache.Attribution],
        *,
        current: dict[str, Any] | None = None,
    ) -> dict[str, str | ClaimStoreError | SlotChanged]:
        """Free each key of ``expected`` (key -> the holder value we believe it has) that still
        holds it, in one conditional write when nothing changed meanwhile.

        Returns, per key, what ``release`` would have returned ("released", "already free")
        or raised (``SlotChanged``; ``ClaimStoreError`` for the keys still pending after
        ``attempts`` conflicts). ``InstanceGone`` and a write refused or failing for good
        concern every key alike, and are raised as ``release`` raises them.
        """
        outcomes: dict[str, str | ClaimStoreError | SlotChanged] = {}
        pending = dict(expected)
        obj = current or self.last_seen.get(instance) or self._cached(instance)
        fresh = False
        started = time.perf_counter()
        for attempt in range(self.attempts):
            if obj is None:
                obj, fresh = self._read(instance), True
                self.last_seen[instance] = obj
            ops, unsure = self._release_plan(self.parse(obj), pending, outcomes, fresh)
            if unsure:
                obj = None  # a decision not to write is only taken from a fresh read
                continue
            if not ops:
                return outcomes
            changes = [(key, "", attributions[key]) for key in pending]
            answer = self._attributed_write(instance, changes, ops, attempt)
            if answer is None:
                obj = None  # conflict: re-read and decide again, slot by slot
                continue
            elapsed = time.perf_counter() - started
            for key in pending:
                metrics.CLAIM_SECONDS.labels("release").observe(elapsed)
                outcomes[key] = "released"
            self._applied(answer, {key: attributions[key] for key in pending})
            return outcomes
        gave_up = ClaimStoreError(
            f"release of {len(pending)} slots of {instance} gave up after {self.attempts}"
            " conflicting attempts"
        )
        outcomes.update(dict.fromkeys(pending, gave_up))
        return outcomes

    @staticmethod
    def _release_plan(
        state: InstanceState,
        pending: dict[str, str],
        outcomes: dict[str, str | ClaimStoreError | SlotChanged],
        fresh: bool,
    ) -> tuple[list[dict[str, Any]], bool]:
        """The folded patch for the ``pending`` slots that still hold what we expect. Slots
        with nothing to write leave ``pending`` for ``outcomes`` when ``fresh``; otherwise the
        answer is ([], True): read the Instance first."""
        ops: list[dict[str, Any]] = []
        for key, value in list(pending.items()):
            outcome = decide_release(state, key, value)
            if outcome is ReleaseOutcome.RELEASE:
                for op in release_ops(state, key, value):
                    if op not in ops:  # the capacity test, once for all
                        ops.append(op)
                continue
            if not fresh:
                return [], True
            del pending[key]
            if outcome is ReleaseOutcome.CHANGED:
                outcomes[key] = SlotChanged(key, value, state.device_usage.get(key, ""))
            else:
                outcomes[key] = "already free"
        return ops, False

    def _change(
        self,
        verb: str,
        done: str,
        instance: str,
        key: str,
        value: str,
        plan: Callable[[InstanceState, str], _Plan],
        attribution: cache.Attribution,
        current: dict[str, Any] | None,
    ) -> str:
        """What claim and release share: decide, write conditionally, and on a conflict
        re-read from the API server and decide again. A decision to write starts from what
        the caller, this store or the cache saw last; a decision not to (a result or a
        refusal) is only taken from a fresh read."""
        obj = current or self.last_seen.get(instance) or self._cached(instance)
        fresh = False
        started = time.perf_counter()
        for attempt in range(self.attempts):
            if obj is None:
                obj, fresh = self._read(instance), True
                self.last_seen[instance] = obj
            decided = plan(self.parse(obj), obj["metadata"].get("resourceVersion", ""))
            if decided.ops is None:
                if not fresh:
                    obj = None  # confirm with the API server first
                    continue
                if decided.refusal is not None:
                    raise decided.refusal
                return decided.result
            answer = self._attributed_write(
                instance, [(key, value, attribution)], decided.ops, attempt
            )
            if answer is None:
                obj = None  # conflict: re-read and decide again
                continue
            metrics.CLAIM_SECONDS.labels(verb).observe(time.perf_counter() - started)
            self._applied(answer, {key: attribution})
            return done
        raise ClaimStoreError(f"{verb} of {key} gave up after {self.attempts} conflicting attempts")

    # --- steps ----------------------------------------------------------------------------
    def _cached(self, instance: str) -> dict[str, Any] | None:
        row = (
            Instance.objects.filter(namespace=self.api.namespace, name=instance)
            .values(
                "name",
                "resource_version",
                "configuration_name",
                "capacity",
                "device_usage",
                "nodes",
                "shared",
                "cordon",
            )
            .first()
        )
        if row is None or not row["resource_version"]:
            return None
        metadata: dict[str, Any] = {"name": row["name"], "resourceVersion": row["resource_version"]}
        if row["cordon"] is not None:
            # A claim decided from the cache must see the cordon, or it would write past it.
            metadata["annotations"] = {CORDON_ANNOTATION: row["cordon"]}
        return {
            "metadata": metadata,
            "spec": {
                "configurationName": row["configuration_name"],
                "capacity": row["capacity"],
                "deviceUsage": row["device_usage"],
                "nodes": row["nodes"],
                "shared": row["shared"],
            },
        }

    def _read(self, instance: str) -> dict[str, Any]:
        for attempt in range(self.attempts):
            try:
                return self.api.get_instance(instance)
            except ApiException as exc:
                code, _, message = status_of(exc)
                if code == 404:
                    raise InstanceGone(f"Instance {instance} not found") from None
                if code not in _TRANSIENT or attempt == self.attempts - 1:
                    raise ClaimStoreError(
                        f"reading Instance {instance}: {code} {message}"
                    ) from None
            except HTTPError as exc:
                if attempt == self.attempts - 1:
                    raise ClaimStoreError(f"reading Instance {instance}: {exc}") from None
            self._sleep(attempt)
        raise ClaimStoreError(f"reading Instance {instance} failed")  # pragma: no cover

    def _attributed_write(
        self,
        instance: str,
        changes: list[tuple[str, str, cache.Attribution]],
        ops: list[dict[str, Any]],
        attempt: int,
    ) -> dict[str, Any] | None:
        """``_write``, with the sync told beforehand who is writing what (key, new value,
        attribution): the watch may bring the change into the cache before our own answer
        does."""
        if self.sync is None:
            return self._write(instance, ops, attempt)
        for key, value, attribution in changes:
            self.sync.expect(instance, key, value, attribution)
        try:
            answer = self._write(instance, ops, attempt)
        except BaseException:
            self._forget_all(instance, changes)
            raise
        if answer is None:
            self._forget_all(instance, changes)
        return answer

    def _forget_all(self, instance: str, changes: list[tuple[str, str, Any]]) -> None:
        for key, value, _ in changes:
            self.sync.forget(instance, key, value)

    def _write(
        self, instance: str, ops: list[dict[str, Any]], attempt: int
    ) -> dict[str, Any] | None:
        """The API server's answer, or None on a conflict (re-read and decide)."""
        while True:
            try:
                return self.api.patch_instance(instance, ops)
            except ApiException as exc:
                code, _, message = status_of(exc)
                if code in _CONFLICT:
                    return None
                if code == 404:
                    raise InstanceGone(f"Instance {instance} not found") from None
                if code == 500 and _WEBHOOK_FAILED in message:
                    raise WebhookFailed(
                        f"writing Instance {instance}: {code} {message} (an admission webhook"
                        " failed; nothing was written, not retried)"
                    ) from None
                if code not in _TRANSIENT or attempt >= self.attempts - 1:
                    raise ClaimStoreError(
                        f"writing Instance {instance}: {code} {message}"
                    ) from None
            except HTTPError as exc:
                if attempt >= self.attempts - 1:
                    raise WriteUnknown(f"writing Instance {instance}: {exc}") from None
            self._sleep(attempt)
            attempt += 1

    def _sleep(self, attempt: int) -> None:
        # Full jitter: concurrent claimers that collided spread out instead of colliding again.
        time.sleep(random.uniform(0, self.backoff * (2**attempt)))

    def _applied(self, answer: dict[str, Any], attributions: dict[str, cache.Attribution]) -> None:
        self.last_seen[answer["metadata"]["name"]] = answer
        if self.sync is not None:
            self.sync.submit_direct(answer, attributions)
        else:
            self._apply_now(answer, attributions)
        if self.on_applied is not None:
            self.on_applied(answer)

    def _apply_now(
        self, answer: dict[str, Any], attributions: dict[str, cache.Attribution]
    ) -> None:
        try:
            cache.resolve_runs(attributions.values())
            cache.apply_instance(answer, attributions, direct=True)
        except Exception:  # the API write stands; the watch will bring the cache along
            log.exception(
                "cache update after a successful write to %s failed", answer["metadata"]["name"]
            )


_web_client_lock = threading.Lock()
_web_clients: dict[str, AkriApi] = {}


def _api_for(namespace: str) -> AkriApi:
    with _web_client_lock:
        if namespace not in _web_clients:
            _web_clients[namespace] = AkriApi(new_api_client(), namespace)
        return _web_clients[namespace]


def manual_release(
    namespace: str,
    instance: str,
    key: str,
    expected: str,
    *,
    user: Any,
    reason: str,
    api: AkriApi | None = None,
) -> str:
    """A person's release of one slot from the admin: conditional, and audited whatever happens."""
    username = getattr(user, "get_username", lambda: str(user))()
    store = ClaimStore(api or _api_for(namespace), f"user:{username}")
    target = f"{namespace}/{instance}/{key}"

    def audit(outcome: str, detail: str) -> None:
        AuditEntry.objects.create(
            at=timezone.now(),
            user=user if getattr(user, "pk", None) else None,
            username=username,
            action="release_slot",
            target=target,
            holder=expected,
            reason=reason,
            outcome=outcome,
            detail=detail,
        )

    try:
        result = store.release(
            instance, key, expected, cause=SlotEvent.Cause.MANUAL, detail=reason, current=None
        )
    except SlotChanged as exc:
        audit("refused", str(exc))
        raise
    except InstanceGone as exc:
        audit("refused", str(exc))
        raise SlotChanged(key, expected, "") from exc
    except ClaimStoreError as exc:
        audit("failed", str(exc))
        raise
    audit("done", result)
    return result
