"""Deployment checks of our own, run by ``manage.py check --deploy`` beside Django's."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def metrics_token(app_configs: Any, **kwargs: Any) -> list[Warning]:
    if settings.METRICS_TOKEN:
        return []
    return [
        Warning(
            "/metrics is open to anyone who can reach the web process.",
            hint="Set METRICS_TOKEN (or METRICS_TOKEN_FILE) and give Prometheus the same "
            "bearer token.",
            id="akri.W001",
        )
    ]
