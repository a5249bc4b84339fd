"""``manage.py apitoken USER [--reset | --revoke]``: the JSON API token of a user.

A token (DRF's authtoken, one per user) signs scripts in as that user, so it grants exactly the
user's role: ``grantrole`` changes what the token may do, and a user without a role gets a 403
with it. The command therefore refuses to make a token for a user who has no role or is
inactive. It prints the key on stdout alone, so ``$(manage.py apitoken bot)`` works.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from rest_framework.authtoken.models import Token

from akri_site.dashboard.access import role_of


class Command(BaseCommand):
    help = "Print USER's JSON API token (made if missing), or replace or revoke it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--reset", action="store_true", help="replace the token by a new one")
        action.add_argument("--revoke", action="store_true", help="delete the token")

    def handle(self, *args: Any, **options: Any) -> None:
        user = self._user(options["username"])
        if options["revoke"]:
            deleted, _ = Token.objects.filter(user=user).delete()
            said = "token revoked" if deleted else "had no token"
            self.stderr.write(f"{options['username']}: {said}")
            return
        role = role_of(user)
        if role is None:
            raise CommandError(
                f"{options['username']} has no dashboard role (or is inactive): a token would "
                "be refused. Give one first: manage.py grantrole USER viewer"
            )
        if options["reset"]:
            Token.objects.filter(user=user).delete()
        token, created = Token.objects.get_or_create(user=user)
        state = "new token" if created else "existing token"
        self.stderr.write(f"{options['username']}: {state}, role {role}")
        self.stdout.write(token.key)

    def _user(self, username: str) -> Any:
        model = get_user_model()
        try:
            return model.objects.get(**{model.USERNAME_FIELD: username})
        except model.DoesNotExist:
            raise CommandError(f"no user {username!r}") from None
