"""API tokens in the admin: listed per user with their prefix, never the key; made with the key
shown once; revoked by deleting. DRF's own token admin (keys in clear) is taken away."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest
from rest_framework.authtoken.models import TokenProxy

from akri_site.dashboard import tokens
from akri_site.dashboard.models import ApiToken

if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "created_at", "expires_at", "last_used_at")
    list_filter = ("user",)
    search_fields = ("user__username", "name", "prefix")
    fields = ("user", "name", "expires_at", "prefix", "created_at", "last_used_at")
    readonly_fields = ("prefix", "created_at", "last_used_at")
    autocomplete_fields = ()

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Whose token it is does not change after it is made.
        return (*self.readonly_fields, "user") if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        row, key = tokens.issue(obj.user, obj.name)
        if obj.expires_at is not None:
            row.expires_at = obj.expires_at
            row.save(update_fields=["expires_at"])
        obj.pk = row.pk
        # The only time the key is shown: it is not stored.
        self.message_user(
            request,
            f"Token for {obj.user}: {key} — copy it now; it is not stored and will not be "
            "shown again.",
            messages.WARNING,
        )
