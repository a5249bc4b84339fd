"""Runs the controller: the cluster watched into the cache, live deltas to the dashboard."""

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand

from agent.controller import Controller
from agent.kube.client import new_api_client


class Command(BaseCommand):
    help = "Watch Configurations, Instances, Pods and Nodes into the cache and publish live deltas"

    def add_arguments(self, parser):
        parser.add_argument(
            "--kubeconfig", default=None, help="kubeconfig (default: KUBECONFIG or in-cluster)"
        )
        parser.add_argument("--namespace", default=None, help="namespace of Akri's objects")

    def handle(self, *args, **options):
        namespace = options["namespace"] or settings.AKRI["NAMESPACE"]
        controller = Controller(new_api_client(options["kubeconfig"]), namespace).start()
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
        self.stdout.write(f"controller watching namespace {namespace}; SIGTERM to stop")
        stopping.wait()
        controller.stop()
        self.stdout.write("controller stopped")
