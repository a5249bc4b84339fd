"""Find anything (issue 17): one search over Configurations, Instances, nodes and pods, a page
per pod, and the raw object (YAML) of Configurations and Instances as the cache holds them.

Everything reads the ORM cache, like the other pages; searches are SQL ``icontains`` capped per
kind, so a short term on a large cluster costs a few bounded queries.
"""

from __future__ import annotations

from typing import Any

import yaml
from django.db.models import Count, Max, Min, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from agent.models import Configuration, Instance, Pod, Slot, SlotEvent, SlotPodBinding
from agent.queues.models import Charge, InstanceLabels, QueuePod, Refusal
from agent.scheduling.models import PodVerdict
from akri_site.dashboard import podstatus, queries, slotmap
from akri_site.dashboard.access import can_release, viewer_required
from akri_site.dashboard.forms import known_nodes
from akri_site.dashboard.views import _render

SEARCH_CAP = 20
SEARCH_MAX = 200


def _named(term: str, ns_field: str = "namespace", name_field: str = "name") -> Q:
    """Objects whose ``namespace/name`` contains ``term`` (any case). Names hold no ``/``, so a
    term with one ends the namespace and starts the name."""
    ns, sep, name = term.partition("/")
    if not sep:
        return Q(**{f"{name_field}__icontains": term})
    if "/" in name:
        return Q(pk__in=[])
    return Q(**{f"{ns_field}__iendswith": ns, f"{name_field}__istartswith": name})


def _group(kind: str, total: int, items: list[dict[str, str]]) -> dict[str, Any]:
    return {"kind": kind, "total": total, "items": items, "capped": total > len(items)}


def search_results(term: str) -> list[dict[str, Any]]:
    """Matches per kind, each capped at SEARCH_CAP: [{kind, total, items: [{name, url, detail}]}]."""
    groups = []
    configs = Configuration.objects.filter(_named(term)).order_by("namespace", "name")
    groups.append(
        _group(
            "Configurations",
            configs.count(),
            [
                {
                    "name": f"{c.namespace}/{c.name}",
                    "url": reverse("dashboard:configuration", args=[c.namespace, c.name]),
                    "detail": c.discovery_handler or "",
                }
                for c in configs[:SEARCH_CAP]
            ],
        )
    )
    instances = Instance.objects.filter(_named(term)).order_by("namespace", "name")
    groups.append(
        _group(
            "Instances",
            instances.count(),
            [
                {
                    "name": f"{i.namespace}/{i.name}",
                    "url": reverse("dashboard:instance", args=[i.namespace, i.name]),
                    "detail": f"of {i.configuration_name}",
                }
                for i in instances[:SEARCH_CAP]
            ],
        )
    )
    # Nodes are few (hundreds), and some are known only as slot holders: match in Python. The
    # holders come from the kept slot counts (a DISTINCT over every slot cost 30-80 ms).
    holders = slotmap.summary()["nodes"]
    nodes = sorted(n for n in known_nodes(holders) if term.lower() in n.lower())
    groups.append(
        _group(
            "Nodes",
            len(nodes),
            [
                {"name": n, "url": reverse("dashboard:node", args=[n]), "detail": ""}
                for n in nodes[:SEARCH_CAP]
            ],
        )
    )
    pods = Pod.objects.filter(_named(term)).order_by("namespace", "name")
    found = {(p.namespace, p.name): p.phase or "phase unknown" for p in pods[: SEARCH_CAP + 1]}
    total = pods.count()
    # A slot may name a pod the pod cache does not hold (gone, or not ours to watch).
    holders = (
        Slot.objects.filter(_named(term, "pod_namespace", "pod_name"))
        .exclude(pod_name="")
        .order_by("pod_namespace", "pod_name")
        .values_list("pod_namespace", "pod_name")
        .distinct()[: SEARCH_CAP + 1]
    )
    for key in holders:
        if key not in found:
            found[key] = "not in the pod cache"
            total += 1
    pod_items = [
        {
            "name": f"{ns}/{name}",
            "url": reverse("dashboard:pod", args=[ns, name]),
            "detail": phase,
        }
        for (ns, name), phase in sorted(found.items())[:SEARCH_CAP]
    ]
    groups.append(_group("Pods", total, pod_items))
    return groups


@require_GET
@viewer_required
def search(request: HttpRequest) -> HttpResponse:
    term = request.GET.get("q", "").strip()
    extra = sorted(set(request.GET) - {"q"})
    if extra:
        return _render(
            request,
            "dashboard/search.html",
            400,
            term=term,
            errors=[f"Unknown parameter “{extra[0][:60]}”: search takes only q."],
        )
    if len(term) > SEARCH_MAX:
        return _render(
            request,
            "dashboard/search.html",
            400,
            term=term[:SEARCH_MAX],
            errors=[f"q: at most {SEARCH_MAX} characters."],
        )
    if not term:
        return _render(request, "dashboard/search.html", term="", groups=None)
    groups = search_results(term)
    items = [i for g in groups for i in g["items"]]
    if len(items) == 1 and items[0]["name"].lower() in (term.lower(), f"default/{term.lower()}"):
        return redirect(items[0]["url"])  # the one thing asked for by its name
    return _render(
        request,
        "dashboard/search.html",
        term=term,
        groups=groups,
        total=sum(g["total"] for g in groups),
        cap=SEARCH_CAP,
    )


def _charges_of(pod: str) -> list[Charge]:
    """Queue charges this pod takes part in (``Charge.users`` is a JSON list of dicts)."""
    near = Charge.objects.filter(users__icontains=f'"{pod}"')
    return [c for c in near if any(u.get("pod") == pod for u in c.users)]


@require_GET
@viewer_required
def pod_detail(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    key = f"{namespace}/{name}"
    pod = Pod.objects.filter(namespace=namespace, name=name).first()
    slots = list(
        Slot.objects.filter(pod_namespace=namespace, pod_name=name)
        .select_related("instance")
        .order_by("instance__name", "index")
    )
    bindings = list(
        SlotPodBinding.objects.filter(pod_namespace=namespace, pod_name=name).order_by(
            "node", "slot"
        )
    )
    events = queries.recent_events(SlotEvent.objects.filter(pod=key))
    queue_pod = QueuePod.objects.filter(namespace=namespace, name=name).first()
    verdict = PodVerdict.objects.filter(namespace=namespace, name=name).first()
    # A pod the admission webhook refused was never created: the Queues page links here to say
    # what was refused, and how often.
    refused = Refusal.objects.filter(resource="pods", namespace=namespace, name=name)
    refusals = list(
        refused.values("rule", "claim", "queue", "owner")
        .annotate(count=Count("id"), first=Min("at"), last=Max("at"))
        .order_by("-last")[:20]
    )
    for group in refusals:
        same = refused.filter(**{k: group[k] for k in ("rule", "claim", "queue", "owner")})
        group["message"] = same.order_by("-at", "-id").values_list("message", flat=True)[0]
    if not (pod or slots or bindings or events or queue_pod or verdict or refusals):
        raise Http404(f"No pod {key} is known: not in the pod cache, holding no slot.")
    return _render(
        request,
        "dashboard/pod.html",
        key=key,
        namespace=namespace,
        name=name,
        pod=pod,
        slots=slots,
        bindings=bindings,
        events=events,
        queue_pod=queue_pod,
        charges=_charges_of(key),
        verdict=verdict,
        refusals=refusals,
        # Conditions and events from the API server: why it is Pending, what happened to it.
        live_status=podstatus.pod_status(namespace, name) if pod else None,
        can_release=can_release(request.user),
    )


# The raw object, as `kubectl get -o yaml` would lay it out, from what the cache keeps.


def _metadata(row: Configuration | Instance, labels: dict[str, str] | None = None) -> dict:
    meta: dict[str, Any] = {"name": row.name, "namespace": row.namespace}
    if row.uid:
        meta["uid"] = row.uid
    if row.resource_version:
        meta["resourceVersion"] = row.resource_version
    if getattr(row, "generation", 0):
        meta["generation"] = row.generation
    if row.created_at:
        meta["creationTimestamp"] = row.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    if labels:
        meta["labels"] = dict(sorted(labels.items()))
    return meta


def configuration_object(row: Configuration) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": _metadata(row),
        "spec": row.spec,
    }


def instance_object(row: Instance) -> dict[str, Any]:
    labels = InstanceLabels.objects.filter(namespace=row.namespace, name=row.name).first()
    spec: dict[str, Any] = {
        "configurationName": row.configuration_name,
        "cdiName": row.cdi_name,
        "capacity": row.capacity,
        "brokerProperties": row.broker_properties,
        "shared": row.shared,
        "nodes": row.nodes,
        "deviceUsage": row.device_usage,
    }
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": _metadata(row, labels.labels if labels else None),
        "spec": spec,
    }


def to_yaml(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, allow_unicode=True)


@require_GET
@viewer_required
def configuration_yaml(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    return _yaml_page(
        request,
        Configuration,
        namespace,
        name,
        configuration_object,
        left_out="status, annotations, managedFields, ownerReferences and finalizers",
    )


@require_GET
@viewer_required
def instance_yaml(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    return _yaml_page(
        request,
        Instance,
        namespace,
        name,
        instance_object,
        left_out="annotations, managedFields, ownerReferences and finalizers",
    )


def _yaml_page(
    request: HttpRequest,
    model: type[Configuration] | type[Instance],
    namespace: str,
    name: str,
    as_object: Any,
    left_out: str,
) -> HttpResponse:
    """The raw object of one cached Configuration or Instance, as YAML, with what the cache
    does not keep named."""
    row = get_object_or_404(model, namespace=namespace, name=name)
    kind = model.__name__
    return _render(
        request,
        "dashboard/object_yaml.html",
        kind=kind,
        row=row,
        page_url=reverse(f"dashboard:{kind.lower()}", args=[namespace, name]),
        text=to_yaml(as_object(row)),
        left_out=left_out,
    )
