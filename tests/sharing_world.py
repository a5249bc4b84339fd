"""Builders for the sharing-policy and extender tests: Instances, pods and node objects as the
cluster cache and the scheduler show them."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from agent.domain.slots import InstanceState
from agent.sharing.akri_slots import ASSIGNMENT, CONSUMED
from agent.sharing.policy import ConfigurationInfo, NodeInventory
from agent.sharing.registry import enabled

ALL = ["akri-instance", "akri-configuration", "gpushare", "gpu-number"]


def instance(
    name: str,
    nodes: tuple[str, ...],
    capacity: int = 2,
    held: dict[int, str] | None = None,
    configuration: str | None = None,
) -> InstanceState:
    configuration = configuration or name.rpartition("-")[0]
    usage = {f"{name}-{i}": (held or {}).get(i, "") for i in range(capacity)}
    return InstanceState(
        name=name, configuration=configuration, capacity=capacity, device_usage=usage, nodes=nodes
    )


def configs(*specs: tuple[str, int, bool]) -> dict[str, ConfigurationInfo]:
    return {name: ConfigurationInfo(name, capacity, unique) for name, capacity, unique in specs}


def pod(
    requests: dict[str, Any],
    name: str | None = None,
    annotations: dict[str, str] | None = None,
    node: str = "",
    init: dict[str, Any] | None = None,
) -> dict[str, Any]:
    name = name or f"p-{uuid.uuid4().hex[:8]}"
    limits = {k: str(v) if isinstance(v, int) else v for k, v in requests.items()}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": limits, "requests": limits},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }
    if init:
        body["spec"]["initContainers"] = [
            {"name": "init", "image": "busybox", "resources": {"limits": init}}
        ]
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    if node:
        body["spec"]["nodeName"] = node
    return body


def assigned(
    node: str,
    slots: dict[str, list[str]],
    consumed: dict[str, int] | None = None,
    at: int | None = None,
) -> dict[str, str]:
    annotations = {
        ASSIGNMENT: json.dumps({"node": node, "at": at or time.time_ns(), "slots": slots})
    }
    if consumed:
        annotations[CONSUMED] = json.dumps(consumed)
    return annotations


def gpu_node(name: str, cards: int, memory_per_card: int, unhealthy: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if unhealthy:
        meta["annotations"] = {"volcano.sh/gpu-unhealthy-ids": unhealthy}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "status": {
            "capacity": {
                "volcano.sh/gpu-number": str(cards),
                "volcano.sh/gpu-memory": str(cards * memory_per_card),
            }
        },
    }


def policies(
    node: str,
    instances: list[InstanceState] = (),
    configurations: dict[str, ConfigurationInfo] | None = None,
    node_obj: dict[str, Any] | None = None,
    names: list[str] = ALL,
) -> dict[str, Any]:
    """One node's policies by name, sharing one inventory as the extender builds them."""
    inventory = NodeInventory(
        name=node,
        node=node_obj or {},
        instances=tuple(i for i in instances if node in i.nodes),
        configurations=configurations or {},
    )
    return {cls.name: cls(inventory) for cls in enabled(names)}
