"""The main job on the embedded default: a cluster in a box, in one process.

API-server simulator, three nodes each with an agent and a kubelet simulator, a shared debugEcho
Configuration (capacity 2) and a Configuration-level one, a workload generator, the controller,
cluster reconciliation on a timer, and the dashboard under Daphne. Prints the URL and a login.
"""

from __future__ import annotations

import secrets
import threading

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand

from agent.brokers.specs import with_brokers
from agent.simulator.cluster import SimulatedCluster, WorkloadGenerator, debug_echo_configuration


def ensure_user(
    username: str, password: str, *, group: str | None = None, superuser: bool = False
) -> None:
    user, _ = User.objects.get_or_create(username=username)
    user.set_password(password)
    user.is_staff = True
    user.is_superuser = superuser
    user.save()
    if group:
        user.groups.add(Group.objects.get(name=group))


class Command(BaseCommand):
    help = (
        "Run a simulated cluster with agents, controller, workload and the dashboard in one process"
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--nodes", type=int, default=3)
        parser.add_argument("--pace", type=float, default=1.5, help="seconds between new pods")
        parser.add_argument(
            "--password", default=None, help="password of the demo users (default: random)"
        )

    def handle(self, *args, **options):
        password = options["password"] or secrets.token_urlsafe(9)
        ensure_user("admin", password, superuser=True)
        ensure_user("operator", password, group="operator")
        ensure_user("viewer", password, group="viewer")

        cluster = SimulatedCluster(
            nodes=options["nodes"],
            configurations=[
                # debugEcho brokers, one per Instance and node, as Akri's chart deploys them.
                with_brokers(
                    debug_echo_configuration(
                        "akri-debug-echo-foo", ["foo0", "foo1"], capacity=2, unique=True
                    )
                ),
                debug_echo_configuration(
                    "akri-debug-echo-bar", ["bar0", "bar1", "bar2"], capacity=2, unique=False
                ),
            ],
        ).start()
        # The web process writes manual releases to the same (simulated) API server.
        settings.AKRI["KUBECONFIG"] = cluster.kubeconfig
        workload = WorkloadGenerator(cluster, interval=options["pace"]).start()
        stop = threading.Event()
        threading.Thread(target=self._cluster_reconcile, args=(stop,), daemon=True).start()

        url = f"http://{options['host']}:{options['port']}/"
        self.stdout.write(
            f"\nakri-site demo: {options['nodes']} simulated nodes, API server {cluster.apiserver.url}\n"
            f"  dashboard  {url}\n"
            f"  login      admin / {password}   (also operator, viewer with the same password)\n"
            f"  kubeconfig {cluster.kubeconfig}\n"
            "Ctrl-C to stop.\n"
        )
        try:
            self._serve(options["host"], options["port"])
        finally:
            stop.set()
            workload.stop()
            cluster.stop()

    def _serve(self, host: str, port: int) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        from akri_site.asgi import application

        Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=True,
        ).run()

    def _cluster_reconcile(self, stop: threading.Event) -> None:
        """Celery beat's job when there is no broker: the cluster-wide pass on a timer."""
        try:
            from agent import tasks
        except ImportError:
            return
        while not stop.wait(30):
            try:
                tasks.reconcile_cluster.apply(kwargs={"trigger": "schedule"})
            except Exception:  # noqa: BLE001 - the demo keeps going; the run row records errors
                self.stderr.write("cluster reconciliation failed; see the log")
            # Beat's broker level pass, queued to the in-process broker runner.
            from agent.brokers.dispatch import Dispatcher

            Dispatcher().level(settings.AKRI["NAMESPACE"])
