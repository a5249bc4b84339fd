"""``manage.py drain INSTANCE --reason TEXT [--grace S] [--timeout S] [--dry-run]``.

Cordons the Instance and evicts the pods holding its slots through the Eviction API
(``agent.drain``); ``--dry-run`` prints what would happen (pods, queue, owner, what would
block) and writes nothing. One line per pod; exit status 1 when a pod was blocked or failed.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from kubernetes.client.rest import ApiException

from agent import cordon as cordoning
from agent import drain as draining
from agent.management.commands.cordon import _os_user


class Command(BaseCommand):
    help = "Cordon an Instance and evict the pods holding its slots (PodDisruptionBudgets apply)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("instance")
        parser.add_argument("--reason", default="")
        parser.add_argument("--grace", type=int, default=None, help="seconds; default: the pod's")
        parser.add_argument("--timeout", type=float, default=30.0, help="wait for pods to go")
        parser.add_argument("--dry-run", action="store_true", help="show, change nothing")
        parser.add_argument("--namespace", default="")
        parser.add_argument("--user", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = options["namespace"] or settings.AKRI["NAMESPACE"]
        name = options["instance"]
        try:
            if options["dry_run"]:
                pods = draining.preview(namespace, name)
            else:
                user = f"cli:{options['user'] or _os_user()}"
                pods = draining.drain(
                    namespace,
                    name,
                    user=user,
                    reason=options["reason"],
                    grace=options["grace"],
                    timeout=options["timeout"],
                )
        except (draining.DrainInputError, cordoning.CordonError) as exc:
            raise CommandError(f"{name}: nothing drained: {exc}") from None
        except ApiException as exc:
            raise CommandError(f"{name}: {exc.status} {exc.reason}") from None
        if not pods:
            self.stdout.write(f"{name}: no pod holds a slot")
        for pod in pods:
            row = pod.as_dict()
            self.stdout.write(
                f"{row['pod']} (node {row['node'] or '?'}, queue {row['queue']}, owner "
                f"{row['owner']}, slots {', '.join(row['slots']) or 'none'}): {row['outcome']}"
                + (f": {row['detail']}" if row["detail"] else "")
            )
        stuck = [p for p in pods if p.outcome in (draining.BLOCKED, draining.FAILED)]
        if stuck and not options["dry_run"]:
            raise CommandError(f"{len(stuck)} of {len(pods)} pods not evicted")
