"""Runs the controller: the cluster watched into the cache, live deltas to the dashboard.

Replicas elect one leader through the ``akri-site-controller`` Lease (``agent.leader``): only
the leader runs the watchers; the others wait as candidates and take over within the lease
(under 12 s with the defaults) when the leader dies, or at once when it shuts down cleanly.

``kill -USR1`` writes every thread's stack to stderr: for a replica that seems stuck.
Every replica serves ``/metrics`` on ``METRICS_PORT`` (``agent.exporter``); its ``akri_leader``
is 1 on the leader only. ``/healthz`` on the same port answers 503 while the replica leads but
its watchers are not running (a term that would not start is retried, then handed over).
"""

import contextlib
import faulthandler
import logging
import signal
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connections

from agent import exporter, metrics
from agent.controller import Controller
from agent.heap import SyncCollection
from agent.kube.client import new_api_client
from agent.leader import CONTROLLER_LEASE, configured_timing
from agent.leader.election import LeaderElector

log = logging.getLogger(__name__)


# A term whose watchers will not start (the database away, a start step failing) is tried this
# often, backing off, before this replica resigns so that another can lead.
START_ATTEMPTS = 5
START_BACKOFF_FIRST = 1.0
START_BACKOFF_MAX = 30.0


class Term:
    """The controller of one leadership term: a fresh one each time this replica leads.

    A term that cannot start is retried with backoff while this replica still leads, then
    handed over (``elector.resign``): a leader that renews its Lease but watches nothing would
    keep every other replica from doing the work. ``healthy`` is what the liveness probe asks.
    """

    def __init__(self, kubeconfig: str | None, namespace: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.controller: Controller | None = None
        self.heap: SyncCollection | None = None
        self.elector: LeaderElector | None = None  # set once made; None: no election
        self.sleep = time.sleep

    def leading(self) -> bool:
        return self.elector is None or self.elector.is_leading()

    def start(self) -> None:
        delay = START_BACKOFF_FIRST
        for attempt in range(1, START_ATTEMPTS + 1):
            if not self.leading():
                return  # lost the Lease meanwhile: on_stopped comes next
            controller = Controller(new_api_client(self.kubeconfig), self.namespace)
            try:
                self.controller = controller.start()
            except Exception:
                log.exception(
                    "controller: starting its watchers failed (attempt %d of %d)",
                    attempt,
                    START_ATTEMPTS,
                )
                with contextlib.suppress(Exception):
                    controller.stop()
                # A connection the failure broke must not be the next attempt's.
                connections.close_all()
                if attempt < START_ATTEMPTS:
                    self.sleep(delay)
                    delay = min(delay * 2, START_BACKOFF_MAX)
                continue
            if settings.AKRI["CONTROLLER_GC_FREEZE"]:
                self.heap = SyncCollection(self.controller.listed).start()
            metrics.LEADER.labels(CONTROLLER_LEASE).set(1)
            return
        log.error(
            "controller: its watchers did not start in %d attempts; stepping down so that "
            "another replica can lead",
            START_ATTEMPTS,
        )
        if self.elector is not None:
            self.elector.resign("its watchers would not start")

    def stop(self) -> None:
        metrics.LEADER.labels(CONTROLLER_LEASE).set(0)
        heap, self.heap = self.heap, None
        if heap is not None:
            heap.stop()
        controller, self.controller = self.controller, None
        if controller is not None:
            controller.stop()

    def healthy(self) -> tuple[bool, str]:
        """(alive, why): a replica that leads must have its watchers running; a follower is
        alive as long as it campaigns."""
        if not self.leading():
            return True, "following"
        controller = self.controller
        if controller is None:
            return False, "leading, but its watchers are not running"
        stopped = controller.stopped_watchers()
        if stopped:
            return False, f"leading, but these watchers ended: {', '.join(stopped)}"
        return True, "leading, watching"


class Command(BaseCommand):
    help = "Watch Configurations, Instances, Pods and Nodes into the cache and publish live deltas"

    def add_arguments(self, parser):
        parser.add_argument(
            "--kubeconfig", default=None, help="kubeconfig (default: KUBECONFIG or in-cluster)"
        )
        parser.add_argument("--namespace", default=None, help="namespace of Akri's objects")
        parser.add_argument(
            "--no-leader-elect",
            action="store_true",
            default=not settings.LEADER_ELECTION["ENABLED"],
            help="run without a Lease (one replica only; AKRI_LEADER_ELECTION=false)",
        )

    def handle(self, *args, **options):
        namespace = options["namespace"] or settings.AKRI["NAMESPACE"]
        term = Term(options["kubeconfig"], namespace)
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        # akri_leader 0 until this replica leads: every replica reports, so that a sum of 0
        # means none leads (alert AkriLeaderLost).
        metrics.LEADER.labels(CONTROLLER_LEASE).set(0)
        # Its thread is a daemon: an error escaping below ends the process all the same.
        # /healthz beside it: the liveness probe fails while this replica leads without its
        # watchers, so the kubelet restarts it and the Lease goes to another.
        metrics_server = exporter.serve("controller", health=term.healthy)

        def until_stopped() -> None:
            # In steps: Python runs a handler only when the main thread wakes, and a signal
            # the kernel hands to another thread does not wake an untimed wait.
            while not stopping.wait(1.0):
                pass

        if options["no_leader_elect"]:
            term.start()
            self.stdout.write(f"controller watching namespace {namespace}; SIGTERM to stop")
            until_stopped()
            term.stop()
        else:
            elector = LeaderElector(
                new_api_client(options["kubeconfig"]),
                namespace,
                CONTROLLER_LEASE,
                timing=configured_timing(),
                on_started=term.start,
                on_stopped=term.stop,
            )
            term.elector = elector
            elector.start()
            self.stdout.write(
                f"controller {elector.identity}: candidate for Lease {namespace}/"
                f"{CONTROLLER_LEASE}; watching namespace {namespace} while leading"
            )
            until_stopped()
            log.info("controller %s: stopping", elector.identity)
            elector.stop()  # releases the Lease and stops the watchers when leading
        if metrics_server is not None:
            metrics_server.stop()
        self.stdout.write("controller stopped")
