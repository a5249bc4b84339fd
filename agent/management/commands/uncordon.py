"""``manage.py uncordon INSTANCE...`` (or ``--node`` / ``--configuration``): new pods may get
the Instances' slots again. Audited per Instance, like ``cordon``."""

from __future__ import annotations

from agent import cordon as service
from agent.management.commands.cordon import Command as CordonCommand


class Command(CordonCommand):
    help = "Uncordon Instances: new pods may get their free slots again."
    action = "uncordon"

    def _act(self, namespace: str, name: str, user: str, reason: str) -> service.Result:
        return service.uncordon(namespace, name, user=f"cli:{user}", reason=reason)
