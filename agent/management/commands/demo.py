"""The main job on the embedded default: a cluster in a box.

One process holds the API-server simulator, three nodes each with an agent and a kubelet
simulator, a shared debugEcho Configuration (capacity 2) and a Configuration-level one, a
workload generator, the controller and cluster reconciliation on a timer; the dashboard is
served by uvicorn worker processes (one per core) over a private redis-server
(``akri_site.webserve.serve_demo``). Prints the URL and a login once the dashboard listens;
the console stays quiet (see ``agent.demo_support``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError

from agent.brokers.specs import with_brokers
from agent.demo_support import (
    ACTIVITY_INTERVAL,
    demo_password,
    forget_previous_cluster,
    free_port_near,
    port_problem,
    quiet_console,
    report_activity,
    wait_until_listening,
)
from agent.simulator.cluster import SimulatedCluster, WorkloadGenerator, debug_echo_configuration

MAX_NODES = 10  # the simulator names nodes node-a .. node-j


def ensure_user(
    username: str, password: str, *, group: str | None = None, superuser: bool = False
) -> None:
    user, _ = User.objects.get_or_create(username=username)
    if not user.check_password(password):
        user.set_password(password)
    user.is_staff = True
    user.is_superuser = superuser
    user.save()
    if group:
        user.groups.add(Group.objects.get(name=group))


class Command(BaseCommand):
    help = (
        "Run akri-site on a simulated cluster on this machine: one process holds an API-server "
        "simulator, NODES nodes each with an agent and a kubelet simulator, a workload "
        "generator and the controller; the dashboard is served by one web worker per core "
        "(sharing a private redis-server when one is installed). Prints the dashboard URL and "
        "a login once the dashboard listens."
    )
    # Django's own options (--settings, --verbosity, ...) mean nothing to a demo user.
    suppressed_base_arguments = {
        "--version",
        "--verbosity",
        "--settings",
        "--pythonpath",
        "--traceback",
        "--no-color",
        "--force-color",
        "--skip-checks",
    }

    def create_parser(self, prog_name, subcommand, **kwargs):
        # People start it as scripts/demo (which runs manage.py demo): --help says so.
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.prog = "scripts/demo"
        return parser

    def add_arguments(self, parser):
        parser.add_argument(
            "--host",
            default="127.0.0.1",
            help="address the dashboard listens on (default 127.0.0.1; 0.0.0.0 for every "
            "interface)",
        )
        parser.add_argument(
            "--port",
            type=_bounded(int, 1, 65535),
            default=8000,
            help="port of the dashboard (default 8000); pick another when 8000 is taken",
        )
        parser.add_argument(
            "--nodes",
            type=_bounded(int, 1, MAX_NODES),
            default=3,
            help=f"simulated nodes, each with an agent and a kubelet (default 3, at most "
            f"{MAX_NODES})",
        )
        parser.add_argument(
            "--pace",
            type=_bounded(float, 0.05, 3600),
            default=1.5,
            help="seconds between the workload generator's new pods (default 1.5; larger is "
            "calmer)",
        )
        parser.add_argument(
            "--password",
            default=None,
            help="password of the demo users admin, operator and viewer; remembered for the "
            "next runs (default: the remembered one, else a new random one)",
        )
        parser.add_argument(
            "--reset-password",
            action="store_true",
            help="forget the remembered password and make a new random one",
        )
        parser.add_argument(
            "--verbose",
            action="store_true",
            help="the full log on the console (default: warnings and an activity line every "
            f"{ACTIVITY_INTERVAL:g}s; LOG_LEVEL=INFO does the same)",
        )

    def handle(self, *args, **options):
        host, port = options["host"], options["port"]
        self._check_port(host, port)  # before anything is printed or started
        quiet = quiet_console(options["verbose"])
        forget_previous_cluster()
        password = self._demo_users(options["password"], options["reset_password"])
        # One controller and one timer of cluster passes, both in this process: nothing
        # campaigns for a Lease, and the dashboard's Leaders card (the web workers read the
        # environment) says election is off rather than "unknown".
        os.environ["AKRI_LEADER_ELECTION"] = "false"
        settings.LEADER_ELECTION["ENABLED"] = False
        if "AKRI_USAGE_SAMPLE_SECONDS" not in os.environ:
            # The charts move within the first minute (a minute's row is replaced, not added).
            settings.AKRI["USAGE_SAMPLE_SECONDS"] = 15.0
        cluster = self._start_cluster(options["nodes"])
        # The web process writes manual releases to the same (simulated) API server.
        settings.AKRI["KUBECONFIG"] = cluster.kubeconfig
        # Queue charges: three queues sharing devices, an opted-out one, refused pods.
        from agent.queues.demo import QueueDemo

        queue_demo = QueueDemo(cluster).start()
        workload = WorkloadGenerator(cluster, interval=options["pace"])
        # The random workload starts once the queues own their devices (or after a minute).
        threading.Thread(target=queue_demo.then, args=(workload.start,), daemon=True).start()
        stop = threading.Event()
        listening = threading.Event()
        threading.Thread(target=self._cluster_reconcile, args=(stop,), daemon=True).start()
        announce = (host, port, cluster, password, quiet, stop, listening)
        threading.Thread(target=self._announce, args=announce, daemon=True).start()
        try:
            self._serve(host, port, quiet)
        finally:
            stop.set()
            if quiet:  # the cluster's shutdown chatter is ours, not news
                logging.getLogger().setLevel(logging.ERROR)
            queue_demo.stop()
            workload.stop()
            cluster.stop()
        if not listening.is_set():
            raise CommandError(f"the dashboard never listened on {host}:{port}; see the log above")

    def _demo_users(self, given: str | None, reset: bool) -> str:
        """admin, operator and viewer with the demo's one password (kept in var/)."""
        password = demo_password(settings.VAR_DIR, given=given, reset=reset)
        ensure_user("admin", password, superuser=True)
        ensure_user("operator", password, group="operator")
        ensure_user("viewer", password, group="viewer")
        return password

    def _start_cluster(self, nodes: int) -> SimulatedCluster:
        return SimulatedCluster(
            nodes=nodes,
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

    def _check_port(self, host: str, port: int) -> None:
        problem = port_problem(host, port)
        if problem is None:
            return
        other = free_port_near(host, port)
        hint = f"scripts/demo --port {other}" if other else "scripts/demo --port PORT"
        self.stderr.write(
            f"demo: {problem}.\nStop that process, or pick another port with --port, e.g. {hint}"
        )
        sys.exit(2)

    def _announce(self, host, port, cluster, password, quiet, stop, listening) -> None:
        """The banner, last: once the dashboard accepts connections. Then the activity line."""
        if not wait_until_listening(host, port, stop):
            return
        listening.set()
        self.stdout.write(self._banner(host, port, cluster, password, quiet))
        if quiet:
            report_activity(self.stdout.write, stop)

    def _banner(self, host: str, port: int, cluster, password: str, quiet: bool) -> str:
        shown = {"0.0.0.0": "localhost", "::": "localhost", "": "localhost"}.get(host, host)
        url = f"http://{shown}:{port}/"
        console = (
            f"Console: warnings, and an activity line every {ACTIVITY_INTERVAL:g}s "
            "(--verbose for the full log)."
            if quiet
            else "Console: the full log."
        )
        return (
            f"\nakri-site demo: {len(cluster.sim_nodes)} simulated nodes, "
            f"API server {cluster.apiserver.url}\n"
            f"  dashboard   {url}\n"
            f"  sign in     admin / {password}   (operator and viewer: the same password)\n"
            f"  admin       {url}admin/\n"
            f"  kubeconfig  {cluster.kubeconfig}\n"
            f"The password stays the same on every run (--reset-password for a new one).\n"
            f"{console} Ctrl-C stops.\n"
        )

    def _serve(self, host: str, port: int, quiet: bool) -> None:
        from akri_site.webserve import serve_demo

        # Web workers are separate processes: they reach the simulated API server this way.
        os.environ["KUBECONFIG"] = settings.AKRI["KUBECONFIG"]
        if quiet:
            # ... and read their log level from it (not this process's quiet settings): errors
            # only, so a visitor's 404 or the two lines a websocket costs stay off the console.
            os.environ["LOG_LEVEL"] = "ERROR"
        serve_demo(host, port)

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


def _bounded(kind, low, high):
    """An argparse type: ``kind`` within [low, high], with a plain message otherwise."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not between {low} and {high}")
        return value

    return parse
