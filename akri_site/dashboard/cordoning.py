"""Cordons over JSON: ``/api/cordons/`` lists them (viewers; the API under ``/api/`` is
read-only), ``/instances/<namespace>/<name>/cordon/`` reads one (viewers) and sets or clears it.

POST ``{"action": "cordon"|"uncordon", "reason": "..."}`` (a token, or the session with its
CSRF token) is for those who may release slots by hand (operators and admins:
``access.can_release``), since a cordon, like a release, changes what pods can get. The work and its audit are ``agent.cordon``'s, shared with the management
command; a refusal that never reaches it (role, malformed body) is audited here, so every
attempt leaves a row whatever happened.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from kubernetes.client.rest import ApiException
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.response import Response

from agent import cordon as service
from agent import drain as draining
from agent.domain.cordon import ANNOTATION, parse_cordon
from agent.models import AuditEntry, Instance
from akri_site.dashboard.access import can_release
from akri_site.dashboard.apiauth import ApiView

ACTIONS = ("cordon", "uncordon", "drain")


def cordon_state(row: Instance | None) -> dict[str, Any]:
    """The cordon of a cached Instance as the API and the pages show it."""
    found = parse_cordon({ANNOTATION: row.cordon}) if row and row.cordon is not None else None
    if found is None:
        return {"cordoned": False, "by": "", "reason": "", "at": "", "says": "not cordoned"}
    return {
        "cordoned": True,
        "by": found.by,
        "reason": found.reason,
        "at": found.at,
        "says": found.describe(),
    }


def _refused(request: Any, action: str, target: str, reason: Any, detail: str) -> None:
    user = request.user
    AuditEntry.objects.create(
        at=timezone.now(),
        user=user if getattr(user, "pk", None) else None,
        username=user.get_username()[:150],
        action=action,
        target=target[:512],
        reason=reason if isinstance(reason, str) else "",
        outcome="refused",
        detail=detail,
    )


def _drain(request: Any, namespace: str, name: str, body: dict, reason: Any) -> Response:
    """``{"action": "drain", "dry_run": true|false, "grace": s, "timeout": s, "reason": ...}``:
    the preview (writes nothing) or the drain itself, one outcome per pod."""
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        why = "dry_run must be true or false"
        _refused(request, "drain", f"{namespace}/{name}", reason, why)
        return Response({"detail": why}, status=400)
    try:
        if dry_run:
            pods = draining.preview(namespace, name)
        else:
            pods = draining.drain(
                namespace,
                name,
                user=request.user,
                reason=reason,
                grace=body.get("grace"),
                timeout=body.get("timeout", 30),
            )
    except draining.DrainInputError as exc:
        return Response({"detail": str(exc), "outcome": "refused"}, status=400)
    except service.CordonError as exc:
        code = 503 if exc.outcome == "failed" else 404 if "does not exist" in str(exc) else 400
        return Response({"detail": str(exc), "outcome": exc.outcome}, status=code)
    except ApiException as exc:
        if exc.status == 404:
            return Response({"detail": f"Instance {name} does not exist"}, status=404)
        return Response({"detail": f"the API server said {exc.status}"}, status=503)
    return Response({"instance": name, "dry_run": dry_run, "pods": [p.as_dict() for p in pods]})


class CordonListView(ApiView):
    """Every cordoned Instance in the cache, by namespace and name."""

    @extend_schema(summary="Cordoned Instances", responses={200: dict})
    def get(self, request: Any) -> Response:
        unknown = sorted(set(request.query_params) - {"namespace", "format"})
        if unknown:
            return Response({"detail": f"unknown parameter {unknown[0]!r}"}, status=400)
        rows = Instance.objects.filter(cordon__isnull=False).order_by("namespace", "name")
        if request.query_params.get("namespace"):
            rows = rows.filter(namespace=request.query_params["namespace"])
        results = [{"namespace": r.namespace, "instance": r.name, **cordon_state(r)} for r in rows]
        return Response({"count": len(results), "results": results})


class CordonView(ApiView):
    @extend_schema(summary="An Instance's cordon", responses={200: dict})
    def get(self, request: Any, namespace: str, name: str) -> Response:
        row = Instance.objects.filter(namespace=namespace, name=name).first()
        if row is None:
            return Response({"detail": f"no Instance {namespace}/{name}"}, status=404)
        return Response({"instance": name, "namespace": namespace, **cordon_state(row)})

    @extend_schema(summary="Cordon or uncordon an Instance", request=dict, responses={200: dict})
    def post(self, request: Any, namespace: str, name: str) -> Response:
        target = f"{namespace}/{name}"
        try:
            data = request.data
        except ParseError:
            data = None  # refused below, and audited like any other refusal
        body = data if isinstance(data, dict) else None
        action = body.get("action") if body else None
        reason = body.get("reason", "") if body else ""
        audited_action = action if action in ACTIONS else "cordon"
        if not can_release(request.user):
            why = "operators and admins may cordon; viewers may only read"
            _refused(request, audited_action, target, reason, why)
            return Response({"detail": why}, status=status.HTTP_403_FORBIDDEN)
        if body is None or action not in ACTIONS:
            why = 'send a JSON object {"action": "cordon"|"uncordon", "reason": "..."}'
            _refused(request, audited_action, target, reason, why)
            return Response({"detail": why}, status=400)
        if action == "drain":
            return _drain(request, namespace, name, body, reason)
        act = service.cordon if action == "cordon" else service.uncordon
        try:
            result = act(namespace, name, user=request.user, reason=reason)
        except service.CordonError as exc:
            code = 404 if "does not exist" in str(exc) else 400
            if exc.outcome == "failed":
                code = 503
            return Response({"detail": str(exc), "outcome": exc.outcome}, status=code)
        row = Instance.objects.filter(namespace=namespace, name=name).first()
        return Response(
            {"instance": name, "outcome": result.outcome, "detail": result.detail}
            | cordon_state(row)
        )
