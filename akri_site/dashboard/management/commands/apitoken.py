"""``manage.py apitoken USER [--name N] [--days D] | --list | --revoke ID | --revoke-all``.

A token signs scripts in as its user, so it grants exactly the user's role: ``grantrole``
changes what the token may do, and a user without a role gets a 403 with it. The command
therefore refuses to make a token for a user who has no role or is inactive.

Tokens are stored as hashes (``akri_site.dashboard.tokens``): a new token's key is printed
once, on stdout alone (so ``$(manage.py apitoken bot)`` works), and never again. A user may
have several (one per script); ``--list`` shows them by prefix, ``--revoke`` deletes one.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from akri_site.dashboard import tokens
from akri_site.dashboard.access import role_of
from akri_site.dashboard.models import ApiToken


class Command(BaseCommand):
    help = "Make a JSON API token for USER (printed once), or list or revoke USER's tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for")
        parser.add_argument(
            "--days",
            type=float,
            default=None,
            help="days until it expires (default AKRI_API_TOKEN_DAYS; 0: never)",
        )
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--list", action="store_true", help="list the user's tokens")
        action.add_argument("--revoke", metavar="ID", type=int, help="delete one token")
        action.add_argument("--revoke-all", action="store_true", help="delete all of them")

    def handle(self, *args: Any, **options: Any) -> None:
        user = self._user(options["username"])
        mine = ApiToken.objects.filter(user=user)
        if options["list"]:
            self._list(mine)
        elif options["revoke"] is not None:
            deleted, _ = mine.filter(pk=options["revoke"]).delete()
            if not deleted:
                raise CommandError(f"{user}: no token {options['revoke']}")
            self.stderr.write(f"{user}: token {options['revoke']} revoked")
        elif options["revoke_all"]:
            deleted, _ = mine.delete()
            self.stderr.write(f"{user}: {deleted} token(s) revoked")
        else:
            self._issue(user, options["name"], options["days"])

    def _issue(self, user: Any, name: str, days: float | None) -> None:
        role = role_of(user)
        if role is None:
            raise CommandError(
                f"{user} has no dashboard role (or is inactive): a token would be refused. "
                "Give one first: manage.py grantrole USER viewer"
            )
        if days is not None and days < 0:
            raise CommandError("--days must be 0 (never) or more")
        row, key = tokens.issue(user, name, days)
        until = row.expires_at.strftime("%Y-%m-%d %H:%M UTC") if row.expires_at else "never"
        self.stderr.write(
            f"{user}: new token {row.pk} ({row.prefix}…), role {role}, expires {until}; "
            "the key is printed once and not stored"
        )
        self.stdout.write(key)

    def _list(self, mine: Any) -> None:
        rows = list(mine)
        if not rows:
            self.stderr.write("no tokens")
        for row in rows:
            until = row.expires_at.strftime("%Y-%m-%d %H:%M") if row.expires_at else "never"
            used = row.last_used_at.strftime("%Y-%m-%d %H:%M") if row.last_used_at else "never"
            state = " EXPIRED" if row.expired else ""
            self.stdout.write(
                f"{row.pk}\t{row.prefix}…\t{row.name or '-'}\texpires {until}{state}\tused {used}"
            )

    def _user(self, username: str) -> Any:
        model = get_user_model()
        try:
            return model.objects.get(**{model.USERNAME_FIELD: username})
        except model.DoesNotExist:
            raise CommandError(f"no user {username!r}") from None
