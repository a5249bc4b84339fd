"""The Instance lifecycle as conditional writes: join, follow the Configuration, leave.

Akri semantics (akri-compat.md §1.2, §6), with JSON patches instead of server-side apply:

- ``ensure``: the Instance exists, lists this node in ``spec.nodes``, and has the
  Configuration's capacity and broker properties (a key the Configuration no longer has stays
  until the Instance is recreated: it cannot be told from a device property). Create it if missing (409 AlreadyExists is
  fine: another node was first), else add this node with a patch whose ``test`` is the current
  list. Capacity follows through ``resize_patch`` (grow adds free slots; a held slot is never
  dropped), properties through a replace conditioned on the resourceVersion.
- ``leave``: remove this node from ``spec.nodes``; when no node would be left, delete the
  Instance with a resourceVersion precondition, so a node that joined a moment ago is not lost.

A failed ``test`` (422) or precondition (409) means someone else wrote first: re-read and decide
again, a bounded number of times. deviceUsage values are never written here, except the free
keys a resize adds or drops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent.domain.claims import add_node_patch, resize_patch
from agent.domain.jsonpatch import pointer
from agent.domain.naming import cdi_name, instance_name
from agent.domain.slots import InstanceState, initial_usage
from agent.kube.client import GROUP, VERSION, AkriApi, status_of
from agent.node.view import is_deleting, nodes_of, rv_of

log = logging.getLogger(__name__)

ATTEMPTS = 8


class InstanceWriteError(Exception):
    """The API server could not be written now; the caller retries later."""


@dataclass(frozen=True)
class DesiredInstance:
    """What this node wants an Instance to look like, from discovery and its Configuration."""

    configuration: str
    configuration_uid: str
    digest: str
    capacity: int
    shared: bool
    # Device properties, then the Configuration's brokerProperties over them.
    device_properties: dict[str, str] = field(default_factory=dict)
    configuration_properties: dict[str, str] = field(default_factory=dict)

    @property
    def broker_properties(self) -> dict[str, str]:
        return {**self.device_properties, **self.configuration_properties}

    def properties_to_write(self, current: dict[str, str]) -> dict[str, str] | None:
        """The brokerProperties to write, or None when ``current`` needs nothing.

        The Configuration's values are enforced; of the device's, only missing keys are
        added. Nodes that see one device slightly differently would otherwise overwrite each
        other forever."""
        wanted = dict(current)
        wanted.update({k: v for k, v in self.device_properties.items() if k not in current})
        wanted.update(self.configuration_properties)
        return None if wanted == current else wanted

    @property
    def name(self) -> str:
        return instance_name(self.configuration, self.digest)

    def body(self, node: str) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name}
        if self.configuration_uid:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Configuration",
                    "name": self.configuration,
                    "uid": self.configuration_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Instance",
            "metadata": metadata,
            "spec": {
                "configurationName": self.configuration,
                "cdiName": cdi_name(self.configuration, self.digest),
                "capacity": self.capacity,
                "shared": self.shared,
                "nodes": [node],
                "brokerProperties": dict(self.broker_properties),
                "deviceUsage": initial_usage(self.name, self.capacity),
            },
        }


class InstanceWriter:
    """Conditional Instance writes for one node. ``applied(obj)`` gets every answer object,
    ``deleted(name, rv)`` every Instance this node deleted."""

    def __init__(
        self,
        api: AkriApi,
        node: str,
        applied: Callable[[dict[str, Any]], None],
        deleted: Callable[[str, str], None],
    ) -> None:
        self.api = api
        self.node = node
        self._applied = applied
        self._deleted = deleted

    # --- join -------------------------------------------------------------------------
    def ensure(self, current: dict[str, Any] | None, desired: DesiredInstance) -> dict | None:
        """Make the Instance match ``desired`` for this node; returns it (None if it is being
        deleted and must be recreated later). Raises InstanceWriteError."""
        obj = current
        for _ in range(ATTEMPTS):
            if obj is None:
                obj = self._create(desired)
                if obj is not None:
                    continue
                obj = self._get(desired.name)
                continue
            if is_deleting(obj):
                return None  # wait for it to go, then create it anew
            ops = self._next_ops(obj, desired)
            if not ops:
                return obj
            obj = self._patch(desired.name, ops)
        raise InstanceWriteError(f"Instance {desired.name}: gave up after {ATTEMPTS} conflicts")

    def _next_ops(self, obj: dict[str, Any], desired: DesiredInstance) -> list[dict]:
        """One change at a time, each conditional on what ``obj`` shows."""
        spec = obj.get("spec") or {}
        rv = rv_of(obj)
        ops = add_node_patch(spec.get("nodes"), self.node, rv)
        if ops:
            return ops
        if spec.get("capacity") != desired.capacity:
            state = InstanceState.from_object(obj, desired.capacity)
            return resize_patch(state, desired.capacity, rv)
        properties = desired.properties_to_write(dict(spec.get("brokerProperties") or {}))
        if properties is not None:
            return [
                {"op": "test", "path": pointer("metadata", "resourceVersion"), "value": rv},
                {"op": "add", "path": pointer("spec", "brokerProperties"), "value": properties},
            ]
        return []

    def _create(self, desired: DesiredInstance) -> dict[str, Any] | None:
        """The created object, or None when it exists already (409)."""
        try:
            created = self.api.create_instance(desired.body(self.node))
        except ApiException as exc:
            code, reason, message = status_of(exc)
            if code == 409:
                return None
            raise InstanceWriteError(
                f"creating Instance {desired.name}: {code} {message}"
            ) from None
        except HTTPError as exc:
            raise InstanceWriteError(f"creating Instance {desired.name}: {exc}") from None
        log.info("created Instance %s (nodes [%s])", desired.name, self.node)
        self._applied(created)
        return created

    # --- leave ------------------------------------------------------------------------
    def leave(self, current: dict[str, Any] | None, name: str) -> None:
        """Take this node out of the Instance; delete it when no node is left."""
        obj = current
        for _ in range(ATTEMPTS):
            if obj is None:
                obj = self._get(name)
                if obj is None:
                    return
            nodes = nodes_of(obj)
            if self.node not in nodes:
                return
            if not [n for n in nodes if n != self.node]:
                if self._delete(name, rv_of(obj)):
                    return
                obj = None  # precondition failed: someone wrote since; decide again
                continue
            ops = [
                {"op": "test", "path": pointer("spec", "nodes"), "value": nodes},
                {
                    "op": "replace",
                    "path": pointer("spec", "nodes"),
                    "value": [n for n in nodes if n != self.node],
                },
            ]
            obj = self._patch(name, ops)
            if obj is not None and self.node not in nodes_of(obj):
                log.info("left Instance %s (nodes now %s)", name, nodes_of(obj))
                return
        raise InstanceWriteError(f"Instance {name}: leaving gave up after {ATTEMPTS} conflicts")

    def _delete(self, name: str, rv: str) -> bool:
        """True when the Instance is gone (deleted now, or already)."""
        try:
            self.api.delete_instance(name, resource_version=rv or None)
        except ApiException as exc:
            code, _, message = status_of(exc)
            if code == 404:
                self._deleted(name, "")
                return True
            if code == 409:
                return False
            raise InstanceWriteError(f"deleting Instance {name}: {code} {message}") from None
        except HTTPError as exc:
            raise InstanceWriteError(f"deleting Instance {name}: {exc}") from None
        log.info("deleted Instance %s: no node sees it any more", name)
        self._deleted(name, rv)
        return True

    # --- plumbing ---------------------------------------------------------------------
    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get_instance(name)
        except ApiException as exc:
            code, _, message = status_of(exc)
            if code == 404:
                return None
            raise InstanceWriteError(f"reading Instance {name}: {code} {message}") from None
        except HTTPError as exc:
            raise InstanceWriteError(f"reading Instance {name}: {exc}") from None

    def _patch(self, name: str, ops: list[dict]) -> dict[str, Any] | None:
        """The answer, or the re-read object after a conflict (None when it is gone)."""
        try:
            answer = self.api.patch_instance(name, ops)
        except ApiException as exc:
            code, _, message = status_of(exc)
            if code in (409, 422):
                return self._get(name)
            if code == 404:
                return None
            raise InstanceWriteError(f"writing Instance {name}: {code} {message}") from None
        except HTTPError as exc:
            raise InstanceWriteError(f"writing Instance {name}: {exc}") from None
        self._applied(answer)
        return answer
