"""Objects the queue-charge tests create: pods of a queue, DRA claims, minimal queue CRDs."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from agent.bench.claims import instance_body

LABEL = "akri-site.io/queue"


def pod_body(
    name: str,
    queue: str | None = None,
    *,
    resource: str | None = None,
    claim: str | None = None,
    priority: int | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod of a KAI queue using an Akri resource and/or a ResourceClaim."""
    meta_labels = dict(labels or {})
    if queue:
        meta_labels["kai.scheduler/queue"] = queue
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if resource:
        container["resources"] = {"limits": {resource: "1"}, "requests": {resource: "1"}}
    spec: dict[str, Any] = {"containers": [container]}
    if claim:
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimName": claim}]
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": meta_labels},
        "spec": spec,
    }


def claim_body(name: str, device_class: str, labels: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
        },
    }


def device_class_body(name: str, annotations: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {},
    }


def reserve(api_client: client.ApiClient, namespace: str, name: str, pods: list[dict]) -> dict:
    """Allocate one device to the claim and reserve it for ``pods`` (what the scheduler does)."""
    custom = client.CustomObjectsApi(api_client)
    claim = custom.get_namespaced_custom_object(
        "resource.k8s.io", "v1", namespace, "resourceclaims", name
    )
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "g0"}
                ]
            }
        },
        "reservedFor": [
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
            for p in pods
        ],
    }
    return custom.replace_namespaced_custom_object_status(
        "resource.k8s.io", "v1", namespace, "resourceclaims", name, claim
    )


def crd_body(group: str, version: str, plural: str, kind: str, scope: str) -> dict:
    """A minimal CRD standing in for a queue system's (any spec accepted)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"plural": plural, "singular": plural[:-1], "kind": kind},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def held_instance(name: str, configuration: str, holders: int, capacity: int = 3) -> dict:
    """An Instance whose first ``holders`` slots are held through node-a's plugin."""
    body = instance_body(name, capacity, configuration=configuration)
    for i in range(holders):
        body["spec"]["deviceUsage"][f"{name}-{i}"] = "node-a"
    return body
