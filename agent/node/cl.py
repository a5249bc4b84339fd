"""The Configuration-level (CL) device plugin: resource ``akri.sh/<configuration>``, one per
Configuration on each node that can use at least one of its Instances.

It advertises virtual devices ``<configuration>-<n>`` (``cl_devices``: vdevs this node holds
stay Healthy, as any plugin's held devices do, and of the rest as many are Healthy as slots can
be claimed now, so that kube-scheduler's allocatable minus requests is what is free).
Allocate maps each requested vdev to a real slot with ``plan_cl_claims`` and writes
``C:<vdev>:<node>`` there through the claim store, the slots of one request concurrently. It
is all or nothing: if any claim fails, every claim this call made is released and the kubelet
gets a clear refusal ("3 unique devices requested, 2 available").

One lock per plugin serialises Allocates (Akri PR #844): two plans from one snapshot could map
two vdevs onto the same free slot. A slot lost to another node between plan and write makes
the plan run again on fresh Instances; what was already claimed then shows as held by this
node and is kept, as a kubelet re-ask would be (Akri #843). A plan that finds too few free
slots is made once more on Instances re-read from the API server before the kubelet is refused:
the view may not have heard of a release yet.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

import grpc

from agent.domain.cl import cl_devices, held_vdevs, plan_cl_claims, preferred_allocation
from agent.domain.errors import InsufficientDevices, InvalidDeviceId
from agent.domain.naming import cl_resource_name, parse_cl_device_id
from agent.domain.slots import format_cl
from agent.kube.claims import ClaimStoreError, SlotTaken, UnknownSlot, WriteUnknown
from agent.node.assignments import cl_plan
from agent.node.host import PluginHost
from agent.node.il import claim_refusal
from agent.node.plugin import AllocateRefused, DevicePlugin, Respond
from agent.node.responses import Granted, container_response
from agent.protos import deviceplugin_pb2 as dp

log = logging.getLogger(__name__)

PLAN_ATTEMPTS = 3

Claim = tuple[str, str, str]  # (instance, slot key, value)


class ConfigurationPlugin(DevicePlugin):
    level = "CL"

    def __init__(self, agent: PluginHost, configuration: str) -> None:
        super().__init__(agent, configuration, cl_resource_name(configuration))
        self.configuration = configuration
        self._allocate_lock = threading.Lock()
        self._taken = None  # the extender's assignment for the request being allocated

    def options(self) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def unique(self) -> bool:
        spec = self.agent.view.spec(self.configuration)
        return spec.unique_devices if spec else True

    def devices(self) -> list[tuple[str, str]]:
        states = self.agent.view.states(self.configuration)
        return cl_devices(self.configuration, states, self.agent.node_name, self.unique())

    def preferred(self, request: dp.PreferredAllocationRequest) -> dp.PreferredAllocationResponse:
        response = dp.PreferredAllocationResponse()
        for container in request.container_requests:
            ids = preferred_allocation(
                list(container.available_deviceIDs),
                list(container.must_include_deviceIDs),
                container.allocation_size,
            )
            response.container_responses.add(deviceIDs=ids)
        return response

    # --- Allocate ---------------------------------------------------------------------------
    def allocate(self, request: dp.AllocateRequest, respond: Respond) -> None:
        if not request.container_requests:
            raise AllocateRefused(grpc.StatusCode.INVALID_ARGUMENT, "no container requests")
        instances = [o["metadata"]["name"] for o in self.agent.view.instances(self.configuration)]
        with self._allocate_lock, self.agent.serialized(*instances):
            made: list[Claim] = []
            plans: list[list[Claim]] = []
            try:
                for container in request.container_requests:
                    plans.append(self._allocate_container(list(container.devices_ids), made))
            except AllocateRefused:
                for instance, key, value in made:
                    self.agent.release_quietly(
                        instance, key, value, "the same Allocate was refused"
                    )
                raise
            respond(self._answer(plans))
            for container, plan in zip(request.container_requests, plans, strict=True):
                for (instance, key, value), vdev in zip(plan, container.devices_ids, strict=True):
                    self.agent.allocated(instance, key, value, vdev, self.resource_name)

    def _allocate_container(self, vdevs: list[str], made: list[Claim]) -> list[Claim]:
        if not vdevs:
            raise AllocateRefused(grpc.StatusCode.INVALID_ARGUMENT, "no device ids requested")
        self._taken = self.agent.assignments.take(self.resource_name, len(vdevs))
        for attempt in range(PLAN_ATTEMPTS):
            plan = self._plan(vdevs)
            if attempt == 0:
                # After planning: asking for more devices than there are says so first.
                self._check_advertised(vdevs)
            if self._claim_all(plan, made):
                return plan
            log.info("%s: a planned slot was taken meanwhile; planning again", self.resource_name)
        raise AllocateRefused(
            grpc.StatusCode.UNKNOWN,
            f"Unable to claim slots for {self.resource_name}: other nodes kept taking them",
        )

    def _check_advertised(self, vdevs: list[str]) -> None:
        """Refuse an id this plugin could never list. A well-formed vdev beyond the current
        list passes once the plan has found slots for it: the list grows and shrinks as slots
        are held and freed (held + claimable, agent.domain.cl), and in a burst the kubelet may
        send an id from the list before the last one (it picked while our shorter list was on
        its way). Refused, that pod failed admission (UnexpectedAdmissionError) with its slots
        free; a vdev is a count, and one not listed is held by no pod of this node."""
        advertised = {device_id for device_id, _ in self.devices()}
        for vdev in vdevs:
            if vdev not in advertised and parse_cl_device_id(self.configuration, vdev) is None:
                raise AllocateRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Invalid device id {vdev}: not a device of {self.resource_name}",
                )

    def _plan(self, vdevs: list[str]) -> list[Claim]:
        node = self.agent.node_name
        try:
            try:
                plan = self._plan_from_view(vdevs)
            except InsufficientDevices:
                # The view may lag behind the API server (a release not heard of yet). Like
                # the claim store's, a decision to write nothing must come from the API
                # server: re-read what the view counts as busy, then plan once more.
                self._refresh_busy()
                try:
                    plan = self._plan_from_view(vdevs)
                except InsufficientDevices:
                    if not self._free_offered_again(vdevs):
                        raise
                    plan = self._plan_from_view(vdevs)
        except InvalidDeviceId as exc:
            raise AllocateRefused(
                grpc.StatusCode.INVALID_ARGUMENT, f"Invalid device id {exc.device_id}: {exc.reason}"
            ) from None
        except InsufficientDevices as exc:
            raise AllocateRefused(
                grpc.StatusCode.UNKNOWN, f"Unable to allocate {self.resource_name}: {exc}"
            ) from None
        return [(instance, key, format_cl(vdev, node)) for vdev, instance, key in plan]

    def _plan_from_view(self, vdevs: list[str]) -> list[tuple[str, str, str]]:
        states = self.agent.view.states(self.configuration)
        node, unique = self.agent.node_name, self.unique()
        assigned = cl_plan(self._taken, states, node, vdevs, unique, self.configuration)
        return assigned or plan_cl_claims(states, node, vdevs, unique, self.configuration)

    def _free_offered_again(self, vdevs: list[str]) -> bool:
        """Unique mode: free the slots of held vdevs in a request that cannot be planned with
        them, so that it is planned afresh; True when something was freed.

        The kubelet offers a vdev this node holds only to the pod that holds it (a re-ask of a
        request that was planned distinct) or once that pod has ended and before our release
        is through. So held vdevs in a request that needs distinct devices and cannot keep
        them belong to ended pods, and the new pod must not get an UnexpectedAdmissionError
        for a slot that is ours to give.
        """
        if not self.unique():
            return False
        node = self.agent.node_name
        held = held_vdevs(self.agent.view.states(self.configuration), node, self.configuration)
        stale = [(*held[vdev], format_cl(vdev, node)) for vdev in vdevs if vdev in held]
        for instance, key, value in stale:
            self.agent.release_quietly(
                instance, key, value, f"{value} offered again to a new pod; planned afresh"
            )
        return bool(stale)

    def _refresh_busy(self) -> None:
        """Re-read, concurrently, the usable Instances the view shows with a slot in use: only
        they can have more free slots than the view says."""
        names = [
            state.name
            for state in self.agent.view.states(self.configuration)
            if state.usable_by(self.agent.node_name) and state.used_count()
        ]
        list(self.agent.claim_pool.map(self.agent.refresh_instance, names))

    def _claim_all(self, plan: list[Claim], made: list[Claim]) -> bool:
        """Claim every slot of ``plan`` at once. True when all are ours now; False when one
        was taken by someone else (plan again). Other failures refuse the request."""
        # All but one go to the pool; this thread makes the last claim itself rather than
        # wait idle (one thread fewer to wake for the request).
        futures: list[Future] = [
            self.agent.claim_pool.submit(self._claim_one, *claim) for claim in plan[:-1]
        ]
        last: Future = Future()
        try:
            last.set_result(self._claim_one(*plan[-1]))
        except Exception as exc:
            last.set_exception(exc)
        taken: list[Claim] = []
        refusal: AllocateRefused | None = None
        for claim, future in zip(plan, [*futures, last], strict=True):
            try:
                if future.result() == "claimed":
                    made.append(claim)
            except SlotTaken:
                taken.append(claim)
            except WriteUnknown as exc:
                made.append(claim)  # the server may still apply it: roll it back with the rest
                refusal = refusal or claim_refusal(claim[0], claim[1], exc)
            except (UnknownSlot, ClaimStoreError) as exc:
                refusal = refusal or claim_refusal(claim[0], claim[1], exc)
        if refusal is not None:
            raise refusal
        for instance, _, _ in taken:
            self.agent.refresh_instance(instance)
        return not taken

    def _claim_one(self, instance: str, key: str, value: str) -> str:
        return self.agent.claims.claim(
            instance,
            key,
            value,
            node=self.agent.node_name,
            detail=f"Allocate through {self.resource_name}",
            current=self.agent.view.instance(instance),
        )

    def _answer(self, plans: list[list[Claim]]) -> dp.AllocateResponse:
        response = dp.AllocateResponse()
        for plan in plans:
            grants = []
            for instance, key, value in plan:
                obj = self.agent.view.instance(instance) or {"metadata": {"name": instance}}
                grants.append(Granted(obj, self.agent.device_of(instance), key, value))
            response.container_responses.append(container_response(grants, self.configuration))
        return response
