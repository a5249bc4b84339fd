"""``manage.py grantrole USER ROLE``: leave a user with exactly one dashboard role's rights.

Whatever the user held before is taken away: other roles, permissions granted to the user
directly, and ``is_superuser`` (a superuser passes every check, so a "viewer" who is still a
superuser could release slots). Operators and admins get ``is_staff``: manual release happens
in the Django admin. The command says what it changed.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from akri_site.dashboard.access import ADMIN, OPERATOR, ROLES, ensure_roles


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
        username, role = options["username"], options["role"]
        with transaction.atomic():
            user, created = self._user(username, options["create"])
            changes = grant(user, role)
        if created:
            changes.insert(0, "created (no password: set one with changepassword)")
        for change in changes:
            self.stdout.write(f"{username}: {change}")
        self.stdout.write(f"{username}: role {role}, staff={'yes' if user.is_staff else 'no'}")

    def _user(self, username: str, create: bool) -> tuple[Any, bool]:
        model = get_user_model()
        try:
            field = model.USERNAME_FIELD
            return model.objects.select_for_update().get(**{field: username}), False
        except model.DoesNotExist:
            if not create:
                raise CommandError(f"no user {username!r} (use --create)") from None
            return model.objects.create_user(username), True


def grant(user: Any, role: str) -> list[str]:
    """Set ``user`` to exactly ``role`` ("none" for no role); return what changed, in words."""
    changes: list[str] = []
    held = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    wanted = set() if role == "none" else {role}
    for name in sorted(held - wanted):
        changes.append(f"removed role {name}")
    for name in sorted(wanted - held):
        changes.append(f"added role {name}")
    user.groups.remove(*Group.objects.filter(name__in=held - wanted))
    user.groups.add(*Group.objects.filter(name__in=wanted - held))
    direct = list(user.user_permissions.values_list("codename", flat=True))
    if direct:
        user.user_permissions.clear()
        changes.append(f"removed permissions granted directly: {', '.join(sorted(direct))}")
    if user.is_superuser:
        user.is_superuser = False
        changes.append("removed superuser")
    staff = role in (OPERATOR, ADMIN)
    if user.is_staff != staff:
        user.is_staff = staff
        changes.append("added staff" if staff else "removed staff")
    user.save(update_fields=["is_superuser", "is_staff"])
    return changes
