"""Tokens made before issue 29 (DRF's authtoken, kept in clear) become hashed ApiTokens.

They keep working, now with an expiry (AKRI_API_TOKEN_DAYS from today), and their clear keys are
deleted from the database. Not reversible: the clear keys are gone by design.
"""

import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.utils import timezone


def hash_old_tokens(apps, schema_editor):
    Token = apps.get_model("authtoken", "Token")
    ApiToken = apps.get_model("dashboard", "ApiToken")
    days = getattr(settings, "AKRI_API_TOKEN_DAYS", 90)
    now = timezone.now()
    for old in Token.objects.all():
        ApiToken.objects.create(
            user_id=old.user_id,
            name="made before tokens were hashed",
            prefix=old.key[:8],
            digest=hashlib.sha256(old.key.encode()).hexdigest(),
            created_at=old.created,
            expires_at=now + timedelta(days=days) if days > 0 else None,
        )
    Token.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0001_api_tokens"),
        ("authtoken", "0004_alter_tokenproxy_options"),
    ]

    operations = [migrations.RunPython(hash_old_tokens, migrations.RunPython.noop)]
