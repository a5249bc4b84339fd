"""Runs the node agent for one node until SIGTERM or SIGINT (see ``agent.node.agent``)."""

from __future__ import annotations

import logging
import os
import signal
import threading

from django.conf import settings
from django.core import checks
from django.core.management.base import BaseCommand, CommandError

from agent import exporter
from agent.discovery.debugecho import DEFAULT_AVAILABILITY_PATH
from agent.kube.client import new_api_client
from agent.node.agent import NodeAgent, default_handlers

log = logging.getLogger(__name__)

REGISTRATION_SOCKET_NAME = "agent-registration.sock"


class Command(BaseCommand):
    help = "Run the node agent: discovery, Instances and the kubelet device plugins of one node."
    # The model checks only: the others (admin, URLs, templates) import the web's views, REST
    # framework and PostgreSQL driver, about 18 MB of every agent, for pages it never serves.
    requires_system_checks = [checks.Tags.models]

    def add_arguments(self, parser):
        conf = settings.AKRI
        parser.add_argument(
            "--node-name", default=os.environ.get("NODE_NAME", ""), help="this node (NODE_NAME)"
        )
        parser.add_argument("--namespace", default=conf["NAMESPACE"])
        parser.add_argument(
            "--kubeconfig", default=None, help="default: settings / KUBECONFIG, else in-cluster"
        )
        parser.add_argument("--device-plugin-dir", default=conf["DEVICE_PLUGIN_DIR"])
        parser.add_argument("--pod-resources-socket", default=conf["POD_RESOURCES_SOCKET"])
        parser.add_argument(
            "--registration-socket",
            default=os.path.join(conf["DISCOVERY_HANDLERS_DIRECTORY"], REGISTRATION_SOCKET_NAME),
            help="where external discovery handlers register (Akri's v0 Registration)",
        )
        parser.add_argument(
            "--offline-grace",
            type=float,
            default=conf["OFFLINE_GRACE_SECONDS"],
            help="seconds a shared device may go unseen before this node leaves its Instance",
        )
        parser.add_argument(
            "--discovery-reconnect",
            type=float,
            default=conf["DISCOVERY_RECONNECT_SECONDS"],
            help="seconds a failed external discovery handler endpoint is re-dialled before it "
            "is dropped until it registers again (0: at once, as Akri)",
        )
        parser.add_argument(
            "--debug-echo-availability",
            default=DEFAULT_AVAILABILITY_PATH,
            help="debugEcho's availability file (OFFLINE in it = no devices)",
        )
        parser.add_argument(
            "--no-reconcile", action="store_true", help="do not run node-local slot reconciliation"
        )

    def handle(self, *args, **options):
        node = options["node_name"]
        if not node:
            raise CommandError("--node-name (or NODE_NAME) is required")
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
        agent = NodeAgent(
            node,
            new_api_client(options["kubeconfig"]),
            options["namespace"],
            options["device_plugin_dir"],
            options["pod_resources_socket"],
            options["registration_socket"],
            handlers=default_handlers(options["debug_echo_availability"]),
            offline_grace=options["offline_grace"],
            discovery_reconnect=options["discovery_reconnect"],
            reconcile=not options["no_reconcile"],
        )
        os.makedirs(options["device_plugin_dir"], exist_ok=True)
        agent.start()
        # Started after the agent, and nothing waits on it: /metrics never delays Allocate, and
        # a port it cannot have is a log line, not an exit (agent.exporter).
        metrics_server = exporter.serve("agent")
        self.stdout.write(f"agent for {node} running; SIGTERM stops it")
        try:
            while not stopping.wait(1.0):
                pass
        finally:
            self.stdout.write(f"agent for {node} stopping")
            agent.stop()
            if metrics_server is not None:
                metrics_server.stop()
        self.stdout.write(f"agent for {node} stopped")
