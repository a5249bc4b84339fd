"""``allocate``'s webhook figures: what a slot write on a labelled Instance pays for the admission
webhook of ``deploy/`` (issue 30 §3).

The Instance carries the queue owner label, so the webhook ``queue-labels.akri-site.akri.sh``
matches every write to it (its objectSelector). The webhook is the project's own server
(``manage.py runweb --webhook``, TLS, on this process's database) and it is called by the
API-server simulator's admission chain (``agent.simulator.apiserver_admission``), registered
with the manifest's configuration and a ``url:`` client config. The timed call is the Allocate
of ``agent.bench.floor``'s plugin, one conditional write of one slot; rounds alternate between
the configuration registered and deleted (untimed), so both figures see the same run.

Checked, or the benchmark fails: every Allocate succeeded and the API server holds exactly the
value the plugin wrote; the configuration is registered with ``failurePolicy: Fail`` (the
manifest says Ignore, which would time a webhook that was never reached as free), and before
and after the rounds the webhook refuses a change of the owner label through the chain, which
shows the hook matching this Instance and answering.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from kubernetes import client

from agent.bench import percentile
from agent.bench.floor import FloorPlugin
from agent.queues.models import Refusal
from agent.queues.review import MANIFEST_LABEL_KEY
from agent.queues.served import ProjectWebhook, make_tls, manifest_configuration

CONFIGS = ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
LABEL_HOOK = "queue-labels.akri-site.akri.sh"
WARM_UP = 20


def webhook_rounds(rounds: int) -> dict[str, float]:
    """p50 of the floor's Allocate with the webhook registered and without, and their ratio."""
    from agent.bench.agent import _healthy, _instance, _settle, agents, configuration

    with agents(["node-a"], kubelet_process=True) as (api, [node], kubeconfig):
        api.create_configuration(configuration(["foo0"], capacity=3))
        name = _instance(api)
        resource = f"akri.sh/{name}"
        _healthy(node.kubelet, resource, 3)
        _label(api, name)
        custom = client.CustomObjectsApi(api.api_client)
        with tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp:
            tls = make_tls(Path(tmp))
            server = ProjectWebhook(tls, {"AKRI_NAMESPACE": api.namespace}, Path(tmp) / "log")
            server.start()
            body = manifest_configuration(tls.ca_bundle, url=server.url)
            body["metadata"]["name"] = "bench-akri-site-pods"
            for hook in body["webhooks"]:
                hook["failurePolicy"] = "Fail"
            plugin = FloorPlugin.beside(node.agent, kubeconfig, {f"{name}-2": name}).start()
            with_hook: list[float] = []
            without: list[float] = []
            try:
                custom.create_cluster_custom_object(*CONFIGS, body)
                _check_refused(api, name)
                registered, written = True, []
                for i in range(2 * rounds + WARM_UP):
                    want = i % 2 == 0
                    if want != registered:
                        _toggle(custom, body, want)
                        registered = want
                    _settle(node.agent, *written)
                    elapsed = node.kubelet.allocate(resource, [[f"{name}-2"]], plugin.socket_path)
                    written = list(plugin.versions.items())
                    _check_written(api, name, plugin)
                    if i >= WARM_UP:
                        (with_hook if registered else without).append(elapsed)
                if not registered:
                    _toggle(custom, body, True)
                _check_refused(api, name)
            finally:
                plugin.stop()
                _toggle(custom, body, False)
                server.stop()
                # The refusals the checks caused are not the operator's history (the server
                # has stopped: nothing more is written).
                Refusal.objects.filter(name=name).delete()
    hooked, bare = percentile(with_hook, 50), percentile(without, 50)
    return {
        "webhook_floor_p50_ms": hooked,
        "webhook_floor_p99_ms": percentile(with_hook, 99),
        "no_webhook_floor_p50_ms": bare,
        "webhook_over_floor_p50": hooked / bare,
    }


def _label(api: Any, name: str) -> None:
    """The owner label, written before any webhook is registered (as at creation)."""
    labels = api.get_instance(name)["metadata"].get("labels")
    if labels:
        path = "/metadata/labels/" + MANIFEST_LABEL_KEY.replace("~", "~0").replace("/", "~1")
        api.patch_instance(name, [{"op": "add", "path": path, "value": "bench"}])
    else:
        value = {MANIFEST_LABEL_KEY: "bench"}
        api.patch_instance(name, [{"op": "add", "path": "/metadata/labels", "value": value}])


def _toggle(custom: client.CustomObjectsApi, body: dict, registered: bool) -> None:
    if registered:
        custom.create_cluster_custom_object(*CONFIGS, body)
        return
    try:
        custom.delete_cluster_custom_object(*CONFIGS, body["metadata"]["name"])
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def _check_refused(api: Any, name: str) -> None:
    """The webhook, through the chain, refuses to change the owner label: it is registered,
    matches this Instance and answers."""
    path = "/metadata/labels/" + MANIFEST_LABEL_KEY.replace("/", "~1")
    change = [{"op": "replace", "path": path, "value": "someone-else"}]
    try:
        api.patch_instance(name, change)
    except client.ApiException as exc:
        message = json.loads(exc.body or "{}").get("message", "") if exc.body else ""
        if exc.status == 403 and message.startswith(f'admission webhook "{LABEL_HOOK}" denied'):
            return
        raise RuntimeError(
            f"bench allocate: the label change got {exc.status}: {exc.body}"
        ) from exc
    raise RuntimeError("bench allocate: the webhook let the owner label change")


def _check_written(api: Any, name: str, plugin: FloorPlugin) -> None:
    usage = api.get_instance(name)["spec"]["deviceUsage"]
    key = f"{name}-2"
    if usage.get(key) != plugin.values[key]:
        raise RuntimeError(
            f"bench allocate: slot {key} is {usage.get(key)!r} in the API server, the floor "
            f"plugin wrote {plugin.values[key]!r}"
        )
