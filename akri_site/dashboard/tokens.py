"""API tokens: stored as a hash, shown once, expiring, listed and revoked per user.

A token is 32 random bytes (``secrets.token_urlsafe``): guessing is hopeless, so a plain
SHA-256 of it is enough to find and check it (no salt or slow hash: those defend low-entropy
passwords), and a database dump or the admin shows nobody a usable key. The key exists in
clear only in the answer that made it (``manage.py apitoken``, the admin's "add" page, the
user's own tokens page); after that only its first characters (``prefix``) identify it.

A request signs in with ``Authorization: Token <key>`` as before (DRF's header), through
``HashedTokenAuthentication``: an unknown, expired or revoked key, or a user who is inactive, is
a 401.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

PREFIX_CHARS = 8
# last_used_at is written at most this often per token: a script polling every second must not
# turn every read of the API into a write.
USED_RESOLUTION = timedelta(minutes=1)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def issue(user: Any, name: str = "", days: float | None = None) -> tuple[Any, str]:
    """A new token for ``user``: (the row, the key). The key is not stored: show it now."""
    from akri_site.dashboard.models import ApiToken

    key = secrets.token_urlsafe(32)
    days = settings.AKRI_API_TOKEN_DAYS if days is None else days
    row = ApiToken.objects.create(
        user=user,
        name=name[:100],
        prefix=key[:PREFIX_CHARS],
        digest=digest(key),
        expires_at=timezone.now() + timedelta(days=days) if days > 0 else None,
    )
    return row, key


class HashedTokenAuthentication(TokenAuthentication):
    """DRF's ``Token <key>`` header, checked against the stored hashes."""

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        from akri_site.dashboard.models import ApiToken

        token = ApiToken.objects.select_related("user").filter(digest=digest(key)).first()
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        now = timezone.now()
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed(
                "Token expired; ask for a new one (manage.py apitoken USER)."
            )
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        if token.last_used_at is None or now - token.last_used_at >= USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token
