"""The Instance-level (IL) device plugin: resource ``akri.sh/<instance>``, one per Instance
this node can use, one kubelet device per slot.

Health per slot follows ``il_health`` (free or held by this node: Healthy; anything else:
Unhealthy). Allocate claims each requested slot as ``<node>`` through the claim store: a slot
of another Instance or beyond capacity is INVALID_ARGUMENT; a slot held by someone else is
refused Akri-style ("Unable to claim slot ..."); a slot this node already holds is success,
since the kubelet re-asks for devices it has (Akri PR #556). A request is all or nothing: what
this call claimed is released again if a later slot cannot be had.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from agent.domain.naming import il_resource_name
from agent.domain.slots import format_il, il_devices
from agent.kube.claims import (
    ClaimStoreError,
    InstanceGone,
    SlotTaken,
    UnknownSlot,
    WriteUnknown,
)
from agent.node.assignments import il_preferred
from agent.node.host import PluginHost
from agent.node.plugin import AllocateRefused, DevicePlugin, Respond
from agent.node.responses import Granted, container_response
from agent.protos import deviceplugin_pb2 as dp

log = logging.getLogger(__name__)


def claim_refusal(instance: str, key: str, exc: Exception) -> AllocateRefused:
    """Akri's wording for a claim that did not happen (akri-compat.md §4)."""
    if isinstance(exc, SlotTaken):
        holder = exc.holder or "an unrecognised value"
        return AllocateRefused(
            grpc.StatusCode.UNKNOWN,
            f"Unable to claim slot {key} of Instance {instance}: held by {holder}",
        )
    if isinstance(exc, UnknownSlot):
        return AllocateRefused(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid device id {key}: {exc}")
    if isinstance(exc, InstanceGone):
        return AllocateRefused(
            grpc.StatusCode.UNKNOWN, f"Unable to claim slot {key}: Instance {instance} is gone"
        )
    return AllocateRefused(grpc.StatusCode.UNKNOWN, f"Unable to claim slot {key}: {exc}")


class InstancePlugin(DevicePlugin):
    level = "IL"

    def __init__(self, agent: PluginHost, instance: str) -> None:
        super().__init__(agent, instance, il_resource_name(instance))
        self.instance = instance

    def options(self) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(
            pre_start_required=False,
            get_preferred_allocation_available=self.agent.assignments.enabled,
        )

    def preferred(self, request: dp.PreferredAllocationRequest) -> dp.PreferredAllocationResponse:
        if not self.agent.assignments.enabled:
            return super().preferred(request)  # not offered: UNIMPLEMENTED, as before
        response = dp.PreferredAllocationResponse()
        for container in request.container_requests:
            ids = il_preferred(self.agent.assignments, self.resource_name, container)
            response.container_responses.add(deviceIDs=ids)
        return response

    def devices(self) -> list[tuple[str, str]]:
        state = self.agent.view.state(self.instance)
        if state is None:
            return []
        return il_devices(
            state.name,
            state.capacity,
            state.device_usage,
            self.agent.node_name,
            cordoned=state.cordon is not None,
        )

    # --- Allocate ---------------------------------------------------------------------------
    def allocate(self, request: dp.AllocateRequest, respond: Respond) -> None:
        obj = self._current()
        self._check_ids(request, obj)
        wanted = format_il(self.agent.node_name)
        claimed: list[str] = []
        # The reconciler must not act on this Instance between our claim and its binding; the
        # kubelet has its answer before the binding is written, the lock still held.
        with self.agent.serialized(self.instance):
            try:
                for container in request.container_requests:
                    for key in dict.fromkeys(container.devices_ids):
                        if self._claim(key, wanted, obj) == "claimed":
                            claimed.append(key)
                        obj = self.agent.view.instance(self.instance) or obj
            except AllocateRefused:
                self._roll_back(claimed, wanted)
                raise
            respond(self._answer(request, obj, wanted))
            for container in request.container_requests:
                for key in dict.fromkeys(container.devices_ids):
                    self.agent.allocated(self.instance, key, wanted, key, self.resource_name)

    def _current(self) -> dict[str, Any]:
        obj = self.agent.view.instance(self.instance)
        if obj is None:
            raise AllocateRefused(
                grpc.StatusCode.UNKNOWN, f"Unable to claim slot: Instance {self.instance} is gone"
            )
        return obj

    def _check_ids(self, request: dp.AllocateRequest, obj: dict[str, Any]) -> None:
        """Every id must be a slot of this Instance before anything is written."""
        state = self.agent.view.state_of(obj)
        if not request.container_requests:
            raise AllocateRefused(grpc.StatusCode.INVALID_ARGUMENT, "no container requests")
        for container in request.container_requests:
            if not container.devices_ids:
                raise AllocateRefused(grpc.StatusCode.INVALID_ARGUMENT, "no device ids requested")
            for key in container.devices_ids:
                if state.view(key) is None:
                    raise AllocateRefused(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"Invalid device id {key}: not a slot of Instance {self.instance} "
                        f"(capacity {state.capacity})",
                    )

    def _claim(self, key: str, wanted: str, obj: dict[str, Any]) -> str:
        node = self.agent.node_name
        try:
            return self.agent.claims.claim(
                self.instance,
                key,
                wanted,
                node=node,
                detail=f"Allocate through {self.resource_name}",
                current=obj,
            )
        except WriteUnknown as exc:
            # The server may still apply it: undo it like the claims this call made.
            self._roll_back([key], wanted)
            raise claim_refusal(self.instance, key, exc) from None
        except (SlotTaken, UnknownSlot, ClaimStoreError) as exc:
            raise claim_refusal(self.instance, key, exc) from None

    def _roll_back(self, claimed: list[str], wanted: str) -> None:
        for key in claimed:
            self.agent.release_quietly(
                self.instance, key, wanted, "a later slot of the same Allocate was refused"
            )

    def _answer(
        self, request: dp.AllocateRequest, obj: dict[str, Any], wanted: str
    ) -> dp.AllocateResponse:
        device = self.agent.device_of(self.instance)
        response = dp.AllocateResponse()
        for container in request.container_requests:
            keys = list(dict.fromkeys(container.devices_ids))
            grants = [Granted(obj, device, key, wanted) for key in keys]
            response.container_responses.append(container_response(grants))
        return response
