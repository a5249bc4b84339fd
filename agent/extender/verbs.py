"""What the extender does for each verb, without HTTP: filter, prioritize, bind.

Bind is the verb that writes, so it believes nothing it is sent but names. It reads the pod
and the node from the API server and binds only a pod that is still Pending, unbound, the
same pod (uid) the scheduler means, asking for the devices the filter was shown (when this
process filtered it), to a node that exists and that kube-scheduler's own node filters would
have let through (``placement``). Only then are the slots booked, written on the pod and the
Binding created. A filter never leaves anything bind will use but the requests it saw, by uid:
the pod body a filter is sent cannot be trusted to be the pod that exists, nor to be current
(kube-scheduler sends the pod from its cache, and writes ``PodScheduled=False`` on it after
every failed attempt).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from agent.extender import placement, protocol
from agent.extender.binder import AlreadyBound, Binder, BindError
from agent.extender.retry import Retrier
from agent.extender.state import SchedulerState
from agent.scheduling.recorder import VerdictRecorder
from agent.sharing.pods import EXTENDED, requests_of
from agent.sharing.policy import PolicyError

log = logging.getLogger(__name__)

# Requests of recently filtered pods, by uid: a few hundred bytes each.
REMEMBERED_PODS = 4096


class Extender:
    """What the handlers share: the books, the binder and the verdict recorder."""

    def __init__(
        self,
        state: SchedulerState,
        binder: Binder | None,
        recorder: VerdictRecorder | None = None,
        *,
        pack: bool = False,
        retrier: Retrier | None = None,
    ) -> None:
        self.state = state
        self.binder = binder
        self.recorder = recorder
        self.pack = pack
        self.retrier = retrier
        # uid -> the extended resources the filtered pod asked for. Filter runs on the loop and
        # bind in a thread, hence the lock.
        self._seen: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._seen_lock = threading.Lock()

    # --- filter -----------------------------------------------------------------------------
    def filter(self, body: Any) -> dict[str, Any]:
        try:
            args = protocol.parse_args(body)
        except protocol.BadRequest as exc:
            return protocol.filter_result(None, [], {}, {}, f"bad filter request: {exc}")
        if args.nodes is not None:
            for node in args.nodes:
                self.state.set_node(node["metadata"]["name"], node)
        decision = self.state.filter(args.pod, args.names)
        if not decision.error:
            self._saw(args.pod)
        self._record(args.pod, decision)
        self._remember(args.pod, decision)
        return protocol.filter_result(
            args, decision.fits, decision.failed, decision.unresolvable, decision.error
        )

    def _remember(self, pod: dict[str, Any], decision: Any) -> None:
        """A pod refused where room may come is looked at again (agent.extender.retry)."""
        if self.retrier is None or not decision.interested or decision.error:
            return
        if decision.fits:
            self.retrier.placed(str((pod.get("metadata") or {}).get("uid")))
        elif decision.failed or decision.unresolvable:
            # Unresolvable nodes too: a Configuration whose Instances the cache has not
            # brought yet reads as "sees 0" until they come.
            self.retrier.refused_pod(pod, [*decision.failed, *decision.unresolvable])

    def _record(self, pod: dict[str, Any], decision: Any) -> None:
        if self.recorder is None or not decision.interested:
            return
        meta = pod.get("metadata") or {}
        self.recorder.record_decision(
            meta.get("namespace", ""),
            meta["name"],
            meta.get("uid", ""),
            decision.fits,
            decision.failed,
            decision.unresolvable,
            decision.error,
        )

    def _saw(self, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        if not isinstance(uid, str) or not uid:
            return
        try:
            asked = requests_of(pod, EXTENDED)
        except PolicyError:
            return
        with self._seen_lock:
            self._seen[uid] = asked
            self._seen.move_to_end(uid)
            while len(self._seen) > REMEMBERED_PODS:
                self._seen.popitem(last=False)

    # --- prioritize -------------------------------------------------------------------------
    def prioritize(self, body: Any) -> list[dict[str, Any]]:
        try:
            args = protocol.parse_args(body)
        except protocol.BadRequest as exc:
            log.warning("bad prioritize request: %s", exc)
            return []
        return protocol.priority_list(self.state.scores(args.pod, args.names, self.pack))

    # --- bind -------------------------------------------------------------------------------
    def bind(self, body: Any) -> dict[str, Any]:
        try:
            args = protocol.parse_binding(body)
        except protocol.BadRequest as exc:
            return protocol.binding_result(f"bad bind request: {exc}")
        if self.binder is None:
            return protocol.binding_result("this extender does not bind")
        try:
            pod = self.binder.get_pod(args.pod_namespace, args.pod_name)
            if self._bound_there_already(pod, args):
                return protocol.binding_result()
            self._check_pod(pod, args)
            self._check_node(pod, args.node)
            self._bind(pod, args)
        except (BindError, PolicyError) as exc:
            log.info(
                "bind %s/%s to %s refused: %s", args.pod_namespace, args.pod_name, args.node, exc
            )
            return protocol.binding_result(str(exc))
        return protocol.binding_result()

    def _bound_there_already(self, pod: dict[str, Any], args: protocol.BindingArgs) -> bool:
        """A retried bind of a pod bound to this node: count it as its annotations say."""
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if node != args.node or not self._same_uid(pod, args):
            return False
        self.state.adopt(pod, node)
        self._done(pod, args)
        return True

    @staticmethod
    def _same_uid(pod: dict[str, Any], args: protocol.BindingArgs) -> bool:
        return not args.pod_uid or (pod.get("metadata") or {}).get("uid") == args.pod_uid

    def _check_pod(self, pod: dict[str, Any], args: protocol.BindingArgs) -> None:
        """The pod the scheduler means, waiting for a node, asking for what the filter saw."""
        meta = pod.get("metadata") or {}
        name = f"pod {args.pod_namespace}/{args.pod_name}"
        if not self._same_uid(pod, args):
            raise BindError(f"{name} has uid {meta.get('uid')}, not {args.pod_uid}")
        if meta.get("deletionTimestamp"):
            raise BindError(f"{name} is being deleted")
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            raise BindError(f"{name} is bound to {bound} already")
        phase = (pod.get("status") or {}).get("phase")
        if phase != "Pending":
            raise BindError(f"{name} is {phase or 'in no phase'}, not Pending")
        with self._seen_lock:
            seen = self._seen.get(str(meta.get("uid")))
        if seen is not None:
            asked = requests_of(pod, EXTENDED)
            if asked != seen:
                raise BindError(
                    f"{name} asks for {_listed(asked)}, but the filter was shown a pod asking "
                    f"for {_listed(seen)}"
                )

    def _check_node(self, pod: dict[str, Any], node_name: str) -> None:
        node = self.binder.get_node(node_name)
        why = placement.refusal(pod, node)
        if why:
            raise BindError(why)

    def _bind(self, pod: dict[str, Any], args: protocol.BindingArgs) -> None:
        try:
            annotations = self.state.allocate(pod, args.node)
        except PolicyError as exc:
            raise PolicyError(f"pod no longer fits node {args.node}: {exc}") from None
        uid = (pod.get("metadata") or {}).get("uid") or args.pod_uid
        written = False
        try:
            if annotations:
                self.binder.annotate(pod, annotations)
                written = True
            self.binder.bind(args.pod_namespace, args.pod_name, uid, args.node)
        except AlreadyBound as exc:
            # What the pod carries is what counts now, not what this call booked.
            self.state.adopt(exc.pod, exc.node)
            if exc.node != args.node:
                raise
        except BindError:
            self.state.release(pod, args.node)
            if written:
                try:
                    self.binder.unannotate(args.pod_namespace, args.pod_name, annotations)
                except BindError as exc:
                    log.warning("%s (left for the assignment timeout)", exc)
            raise
        self._done(pod, args)

    def _done(self, pod: dict[str, Any], args: protocol.BindingArgs) -> None:
        uid = str((pod.get("metadata") or {}).get("uid"))
        with self._seen_lock:
            self._seen.pop(uid, None)
        if self.retrier is not None:
            self.retrier.placed(uid)
        if self.recorder is not None:
            self.recorder.record(
                args.pod_namespace, args.pod_name, args.pod_uid, {"bound_to": args.node}
            )


def _listed(asked: dict[str, int]) -> str:
    if not asked:
        return "no extended resource"
    return ", ".join(f"{count} {name}" for name, count in sorted(asked.items()))
