"""The queue-charge part of ``scripts/demo``: three queues sharing the simulated devices.

* team-a's pod binds first to an Instance of the demo's debugEcho Configuration, so team-a owns it (label written);
  a preemptible team-b pod then shares it: team-a pays, team-b "uses others'".
* team-c owns another Instance and has opted out: a team-a pod asking for it is refused.
* A non-preemptible team-b pod (priority 125) asking for team-a's Instance is refused
  (resource locking).
* A DRA ResourceClaim used by team-a and team-b pods (the demo plays the scheduler and
  writes ``status.reservedFor``), and one, unlabelled, used by both from the start: an orphan.

Pods are admitted as on a cluster: the demo starts the admission webhook as deploy/ runs it
(``manage.py runweb --webhook`` over TLS, on the demo's database) and registers deploy/'s
ValidatingWebhookConfiguration in the simulated API server, whose admission chain calls it for
every pod created (the demo's and the workload generator's) and every write to a labelled
Instance: a refused pod is never created, and the refusal shows on the Queues page. Without
openssl (for its certificate) the demo runs without the webhook and says so, as a cluster with
``failurePolicy: Ignore`` does while the webhook is away.
This thread also plays Celery beat for charges: a full recompute and a sample every interval.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from kubernetes import client
from kubernetes.client.rest import ApiException

from agent.models import Instance
from agent.queues import history, live, recompute
from agent.queues.models import Charge
from agent.queues.served import ProjectWebhook, make_tls, manifest_configuration

log = logging.getLogger(__name__)
OPTED_OUT = "team-c"
DEVICE_CLASS = "gpu.example.com"
CONFIGURATION = "akri-debug-echo-gpu"


class QueueDemo:
    def __init__(self, cluster: Any, *, interval: float = 10.0) -> None:
        self.cluster = cluster
        self.interval = interval
        self.api_client = cluster.api_client
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Set once the owners are in place: random workload before that could take them first.
        self.ready = threading.Event()
        self.webhook: ProjectWebhook | None = None
        self._tls_dir = ""

    def then(self, fn: Any, timeout: float = 60.0) -> None:
        """Call ``fn`` once the scenario's owners are in place (or after ``timeout``)."""
        self.ready.wait(timeout)
        if not self._stop.is_set():
            fn()

    def start(self) -> QueueDemo:
        conf = settings.AKRI_QUEUES
        conf["OPT_OUT"] = sorted({*conf["OPT_OUT"], OPTED_OUT})
        # A demo lasts minutes: sample every beat, so that the chart moves while one watches.
        conf["SAMPLE_SECONDS"] = min(float(conf["SAMPLE_SECONDS"]), self.interval)
        # The web workers are processes started after this: they read the same settings.
        os.environ["AKRI_QUEUE_OPT_OUT"] = ",".join(conf["OPT_OUT"])
        os.environ["AKRI_QUEUE_SAMPLE_SECONDS"] = str(conf["SAMPLE_SECONDS"])
        self.webhook = self._register_webhook()
        self._thread = threading.Thread(target=self._run, name="queue-demo", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.webhook is not None:
            self.webhook.stop()
        if self._tls_dir:
            shutil.rmtree(self._tls_dir, ignore_errors=True)

    def _register_webhook(self) -> ProjectWebhook | None:
        """deploy/'s webhook, served and registered as an operator would (url: client config:
        the simulated API server reaches no Service)."""
        self._tls_dir = tempfile.mkdtemp(prefix="akri-demo-webhook-")
        if shutil.which("openssl") is None:
            log.warning("queue demo: openssl not found, so pods are admitted without the webhook")
            return None
        tls = make_tls(Path(self._tls_dir))
        env = {
            "AKRI_NAMESPACE": self.cluster.namespace,
            # The simulator authenticates nobody: the demo's label writes (its worker and
            # controller, in this process) are made by system:anonymous.
            "AKRI_QUEUE_LABEL_WRITERS": "system:anonymous",
        }
        server = ProjectWebhook(tls, env, Path(self._tls_dir) / "webhook.log", inherit=True)
        server.start()
        client.CustomObjectsApi(self.api_client).create_cluster_custom_object(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            manifest_configuration(tls.ca_bundle, url=server.url),
        )
        return server

    # --- the story ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._scenario()
        except Exception:
            log.exception("queue demo: the scenario stopped")
        finally:
            self.ready.set()
        while not self._stop.wait(self.interval):
            self.beat()
        close_old_connections()

    def beat(self) -> None:
        try:
            outcome = recompute.recompute(None, api_client=self.api_client)
            history.sample()
            if outcome.written:
                live.publish()
        except Exception:
            log.exception("queue demo: charge recompute failed")

    def _scenario(self) -> None:
        shared, private = self._instances()
        resource = f"akri.sh/{shared}"
        self._run_pod("team-a-train", "node-a", resource, "team-a")
        self._wait_owner("instance", shared, "team-a")
        self._run_pod("team-b-infer", "node-b", resource, "team-b", priority=50)
        self._run_pod("team-c-batch", "node-c", f"akri.sh/{private}", OPTED_OUT)
        self._wait_owner("instance", private, OPTED_OUT)
        self._run_pod("team-a-peek", "node-a", f"akri.sh/{private}", "team-a")  # opt-out
        self._run_pod("team-b-critical", "node-c", resource, "team-b", priority=125)  # locking
        self._dra()
        self.beat()

    def _instances(self) -> tuple[str, str]:
        """Two Instances of the demo's own Configuration (the workload generator uses them
        too, but capacity 3 leaves room)."""
        from agent.simulator.cluster import debug_echo_configuration

        try:
            self.cluster.akri.create_configuration(
                debug_echo_configuration(CONFIGURATION, ["gpu0", "gpu1"], capacity=3, unique=True)
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self._stop.is_set():
            names = sorted(
                Instance.objects.filter(configuration_name=CONFIGURATION).values_list(
                    "name", flat=True
                )
            )
            if len(names) >= 2:
                return names[0], names[1]
            self._stop.wait(0.5)
        raise RuntimeError("the debugEcho Instances did not appear")

    def _wait_owner(self, kind: str, name: str, queue: str, timeout: float = 60) -> None:
        """Until the first bind is labelled (the node agents learn pods on their sweep)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stop.is_set():
            self.beat()
            if Charge.objects.filter(kind=kind, name=name, owner=queue, source="label").exists():
                return
            self._stop.wait(1.0)
        log.warning("queue demo: %s %s has no owner label yet", kind, name)

    def _run_pod(
        self, name: str, node: str, resource: str, queue: str, priority: int | None = None
    ) -> bool:
        labels = {"kai.scheduler/queue": queue}
        return self.cluster.run_pod(name, node, {resource: 1}, labels=labels, priority=priority)

    # --- DRA ---------------------------------------------------------------------------------
    def _dra(self) -> None:
        custom = client.CustomObjectsApi(self.api_client)
        core = client.CoreV1Api(self.api_client)
        ns = self.cluster.namespace
        try:
            custom.create_cluster_custom_object(
                "resource.k8s.io", "v1", "deviceclasses",
                {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                 "metadata": {"name": DEVICE_CLASS}, "spec": {}},
            )  # fmt: skip
        except ApiException as exc:
            if exc.status != 409:
                raise
        pods = {}
        for name, queue in (("team-a-dra", "team-a"), ("team-b-dra", "team-b")):
            body = {
                "metadata": {"name": name, "labels": {"kai.scheduler/queue": queue}},
                "spec": {
                    "containers": [{"name": "main", "image": "busybox"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "training-gpu"}],
                },
            }
            pods[name] = core.create_namespaced_pod(ns, body).to_dict()
        for claim in ("training-gpu", "migrated-gpu"):
            custom.create_namespaced_custom_object(
                "resource.k8s.io", "v1", ns, "resourceclaims",
                {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": claim},
                 "spec": {"devices": {"requests": [
                     {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}},
            )  # fmt: skip
        # team-a binds first (owner), team-b joins later; "migrated-gpu" arrives used by both.
        self._reserve("training-gpu", [pods["team-a-dra"]])
        self._wait_owner("resourceclaim", "training-gpu", "team-a")
        self._reserve("training-gpu", [pods["team-a-dra"], pods["team-b-dra"]])
        self._reserve("migrated-gpu", [pods["team-b-dra"], pods["team-a-dra"]])

    def _reserve(self, claim: str, pods: list[dict[str, Any]]) -> None:
        custom = client.CustomObjectsApi(self.api_client)
        ns = self.cluster.namespace
        body = custom.get_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims", claim
        )
        body["status"] = {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DEVICE_CLASS, "pool": "node-a", "device": claim}]}},
            "reservedFor": [
                {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
                for p in pods
            ],
        }  # fmt: skip
        custom.replace_namespaced_custom_object_status(
            "resource.k8s.io", "v1", ns, "resourceclaims", claim, body
        )
