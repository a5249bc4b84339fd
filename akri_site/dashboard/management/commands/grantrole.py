"""``manage.py grantrole USER ROLE``: give a user one dashboard role (and only that one).

Operators and admins also get ``is_staff``: manual release happens in the Django admin.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError, CommandParser

from akri_site.dashboard.access import ROLES, ensure_roles


class Command(BaseCommand):
    help = "Give USER exactly one dashboard role: viewer, operator or admin (or none)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("role", choices=[*ROLES, "none"])
        parser.add_argument(
            "--create", action="store_true", help="create the user (no password) if missing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ensure_roles()
        model = get_user_model()
        username, role = options["username"], options["role"]
        try:
            user = model.objects.get_by_natural_key(username)
        except model.DoesNotExist:
            if not options["create"]:
                raise CommandError(f"no user {username!r} (use --create)") from None
            user = model.objects.create_user(username)
        user.groups.remove(*Group.objects.filter(name__in=ROLES))
        if role != "none":
            user.groups.add(Group.objects.get(name=role))
        user.is_staff = role in ("operator", "admin") or user.is_superuser
        user.save(update_fields=["is_staff"])
        self.stdout.write(f"{username}: role {role}, staff={'yes' if user.is_staff else 'no'}")
