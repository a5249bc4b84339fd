"""``manage.py cordon INSTANCE... --reason TEXT`` (or ``--node`` / ``--configuration``).

No new pod gets a slot of a cordoned Instance; pods holding slots keep them. Every Instance is
written on its own and audited on its own, so a failure on one does not hide the others; the
exit status is 1 when any was refused or failed.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agent import cordon as service


class Command(BaseCommand):
    help = "Cordon Instances: no new pod gets one of their slots (held slots stay held)."
    action = "cordon"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("instances", nargs="*", help="Instance names")
        parser.add_argument("--node", default="", help="every Instance this node can use")
        parser.add_argument("--configuration", default="", help="every Instance of it")
        parser.add_argument("--reason", default="", help="why (shown wherever it is marked)")
        parser.add_argument("--namespace", default="")
        parser.add_argument("--user", default="", help="who, for the audit (default: $USER)")

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = options["namespace"] or settings.AKRI["NAMESPACE"]
        names = self._targets(namespace, options)
        user = options["user"] or _os_user()
        failed = 0
        for name in names:
            try:
                result = self._act(namespace, name, user, options["reason"])
            except service.CordonError as exc:
                failed += 1
                self.stderr.write(f"{name}: {exc.outcome}: {exc}")
                continue
            self.stdout.write(f"{name}: {result.outcome}: {result.detail}")
        if failed:
            raise CommandError(f"{failed} of {len(names)} Instances not {self.action}ed")

    def _act(self, namespace: str, name: str, user: str, reason: str) -> service.Result:
        return service.cordon(namespace, name, user=f"cli:{user}", reason=reason)

    def _targets(self, namespace: str, options: dict[str, Any]) -> list[str]:
        names = list(dict.fromkeys(options["instances"]))
        node, configuration = options["node"], options["configuration"]
        if names and (node or configuration):
            raise CommandError("name Instances, or select them with --node/--configuration")
        if node or configuration:
            names = service.instances_of(namespace, node=node, configuration=configuration)
            if not names:
                raise CommandError("no Instance matches --node/--configuration; nothing changed")
        if not names:
            raise CommandError("name at least one Instance, or use --node/--configuration")
        return names


def _os_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no login name in a container: still audited, as "unknown"
        return "unknown"
