"""Sign-in lockouts (django-axes) in the site's own audit trail.

axes keeps its rows (every failed sign-in, every attempt that locked); the audit page is where
operators look for "who did what", so a lockout, and an admin lifting one, are written there
too, as an ``AuditEntry`` like any other action by or against a person.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from agent.models import AuditEntry


def locked_out(
    sender: Any, request: Any = None, username: str = "", ip_address: str = "", **kwargs: Any
) -> None:
    """axes' ``user_locked_out``: the sign-in that hit the limit, or one refused while locked.

    One entry per locked user name or address within a cool-off, not one per refused attempt:
    whoever hammers a locked account must not grow the audit trail without bound."""
    now = timezone.now()
    target = f"user {username or '?'} / address {ip_address or '?'}"[:512]
    same = Q(username=(username or "")[:150]) | Q(target__endswith=f"/ address {ip_address or '?'}")
    if AuditEntry.objects.filter(
        same, action="sign-in locked out", at__gte=now - settings.AXES_COOLOFF_TIME
    ).exists():
        return
    AuditEntry.objects.create(
        at=now,
        username=(username or "")[:150],
        action="sign-in locked out",
        target=target,
        outcome="refused",
        detail="too many wrong passwords; an admin unlocks in admin → Axes → Access attempts",
    )


def attempt_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """An access attempt removed (admin, ``axes_reset*``, or cool-off expiry): unlocked."""
    # Only a lock lifted: a success after a few wrong passwords also clears its attempt.
    if instance.failures_since_start < settings.AXES_FAILURE_LIMIT:
        return
    AuditEntry.objects.create(
        at=timezone.now(),
        username=(instance.username or "")[:150],
        action="sign-in unlocked",
        target=f"user {instance.username or '?'} / address {instance.ip_address or '?'}"[:512],
        outcome="done",
        detail=f"{instance.failures_since_start} failed attempts cleared",
    )


def client_address(request: Any) -> str:
    """The address a lockout counts: REMOTE_ADDR, which runweb sets from X-Forwarded-For only
    for AKRI_FORWARDED_ALLOW_IPS. Never a header read here (axes would use django-ipware if it
    were installed, and a client writes its own X-Forwarded-For)."""
    return request.META.get("REMOTE_ADDR") or ""


def client_username(request: Any, credentials: dict | None = None) -> str | None:
    """The user name a lockout counts, as axes would read it, cut to what a user name can be
    (150): axes stores it in a 255-character column, and a 5,000-character guess was a 500
    on PostgreSQL."""
    field = settings.AXES_USERNAME_FORM_FIELD
    if credentials:
        name = credentials.get(field)
    else:
        name = getattr(request, "data", request.POST).get(field)
    return None if name is None else str(name)[:150]
