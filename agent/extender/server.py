"""The extender's HTTP server (aiohttp): ``POST <prefix>/filter``, ``/prioritize``, ``/bind``
and ``GET /healthz``.

The scheduler treats anything but HTTP 200 as a failed call, and a filter failure fails the
pod's whole scheduling attempt; so every answer is 200, and trouble goes into ``Error``
(filter, bind). Prioritize has no error field: a bad body gets an empty list, which the
scheduler reads as "no opinion". Filter and prioritize run on the loop (short CPU work under
the books' lock); bind's API calls run in a thread, each with a timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import OrderedDict
from typing import Any

from aiohttp import web

from agent.extender import protocol
from agent.extender.binder import AlreadyBound, Binder, BindError
from agent.extender.state import SchedulerState
from agent.scheduling.recorder import VerdictRecorder
from agent.sharing.policy import PolicyError

log = logging.getLogger(__name__)

MAX_BODY = 256 * 1024 * 1024  # a NodeList of thousands of full Node objects
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
    ) -> None:
        self.state = state
        self.binder = binder
        self.recorder = recorder
        self.pack = pack
        # Pods of recent filters by uid, so that bind need not read the pod back; filter
        # runs on the loop and bind in a thread, hence the lock.
        self._pods: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._pods_lock = threading.Lock()

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
        self._remember(args.pod)
        self._record(args.pod, decision)
        return protocol.filter_result(
            args, decision.fits, decision.failed, decision.unresolvable, decision.error
        )

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

    def _remember(self, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        if isinstance(uid, str) and uid:
            with self._pods_lock:
                self._pods[uid] = pod
                self._pods.move_to_end(uid)
                while len(self._pods) > REMEMBERED_PODS:
                    self._pods.popitem(last=False)

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
            pod = self._pod(args)
            self._bind(pod, args)
        except (BindError, PolicyError) as exc:
            log.info(
                "bind %s/%s to %s refused: %s", args.pod_namespace, args.pod_name, args.node, exc
            )
            return protocol.binding_result(str(exc))
        return protocol.binding_result()

    def _pod(self, args: protocol.BindingArgs) -> dict[str, Any]:
        with self._pods_lock:
            pod = self._pods.get(args.pod_uid)
        if pod is None:
            pod = self.binder.get_pod(args.pod_namespace, args.pod_name)
        return pod

    def _bind(self, pod: dict[str, Any], args: protocol.BindingArgs) -> None:
        try:
            annotations = self.state.allocate(pod, args.node)
        except PolicyError as exc:
            raise PolicyError(f"pod no longer fits node {args.node}: {exc}") from None
        written = False
        try:
            if annotations:
                self.binder.annotate(pod, annotations)
                written = True
            self.binder.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
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
        with self._pods_lock:
            self._pods.pop(args.pod_uid, None)
        if self.recorder is not None:
            self.recorder.record(
                args.pod_namespace, args.pod_name, args.pod_uid, {"bound_to": args.node}
            )


async def _body(request: web.Request) -> Any:
    """The decoded JSON body, or a BadRequest-shaped marker the handlers answer."""
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        return _Malformed(f"the body is not JSON: {exc}")


class _Malformed(dict):
    """A body that did not decode; every parser refuses it with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


def make_app(extender: Extender, prefix: str = "") -> web.Application:
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""

    async def filter_view(request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, _Malformed):
            return web.json_response(protocol.filter_result(None, [], {}, {}, body.reason))
        try:
            return web.json_response(extender.filter(body))
        except Exception as exc:  # a bug must still answer the scheduler, not 500
            log.exception("filter failed")
            error = f"extender error: {exc}"
            return web.json_response(protocol.filter_result(None, [], {}, {}, error))

    async def prioritize_view(request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, _Malformed):
            log.warning("bad prioritize request: %s", body.reason)
            return web.json_response([])
        try:
            return web.json_response(extender.prioritize(body))
        except Exception:
            log.exception("prioritize failed")
            return web.json_response([])

    async def bind_view(request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, _Malformed):
            return web.json_response(protocol.binding_result(body.reason))
        try:
            result = await asyncio.get_running_loop().run_in_executor(None, extender.bind, body)
        except Exception as exc:
            log.exception("bind failed")
            result = protocol.binding_result(f"extender error: {exc}")
        return web.json_response(result)

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(f"{prefix}/filter", filter_view)
    app.router.add_post(f"{prefix}/prioritize", prioritize_view)
    app.router.add_post(f"{prefix}/bind", bind_view)
    app.router.add_get("/healthz", healthz)
    return app
