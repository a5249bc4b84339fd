"""Policy ``akri-configuration``: pods asking for ``akri.sh/<configuration>`` (any N devices).

With ``uniqueDevices`` (the default) N slots must sit on N distinct Instances this node can
see, each with a free slot: exactly what the node's Configuration-level plugin offers the
kubelet beside the vdevs its pods hold (``agent.domain.cl``), so a pod that fits here is
admitted there. Slots the node already holds through that plugin do not count against it:
uniqueness binds the devices of one request. Unresolvable when fewer than N Instances are
visible at all; Unschedulable when enough exist but are busy. With ``uniqueDevices: false`` any free
slots do (packing), Unresolvable when the visible Instances' capacities add up to less than N.

Allocation mirrors the agent's own choice: unique takes the Instances with the most free slots
first (keeping more Instances free for later unique requests); packing fills the most-used
Instance first (keeping whole Instances free).

Cordoned Instances (agent.domain.cordon) count as absent: no new pod may get their slots, and
a refusal names them with the cordon in words, so the operator sees why a node with devices
turns pods away.
"""

from __future__ import annotations

import time

from agent.domain.slots import InstanceState
from agent.sharing.akri_slots import AkriSlotPolicy, short_name
from agent.sharing.pods import uid_of
from agent.sharing.policy import OK, Code, Pod, PolicyError, Verdict


class AkriConfigurationPolicy(AkriSlotPolicy):
    name = "akri-configuration"
    configuration_level = True

    def _fits(self, name: str, count: int) -> Verdict:
        return self._plan(name, count, choose=False)[0]

    def _plan(
        self, configuration: str, count: int, choose: bool = True
    ) -> tuple[Verdict, list[str]]:
        """The verdict, and (with ``choose``) the slots to take."""
        info = self.slots.configurations[configuration]
        visible = self.slots.usable(configuration)
        usable = [s for s in visible if s.cordon is None]
        if info.unique_devices:
            verdict, keys = self._plan_unique(configuration, usable, count, choose)
        else:
            verdict, keys = self._plan_packed(configuration, usable, count)
        if verdict[0] is not Code.SUCCESS:
            verdict = (verdict[0], verdict[1] + self.slots.cordon_note(visible))
        return verdict, keys

    def _plan_unique(
        self, configuration: str, usable: list[InstanceState], count: int, choose: bool
    ) -> tuple[Verdict, list[str]]:
        if len(usable) < count:
            return (
                Code.UNRESOLVABLE,
                f"{count} unique {configuration} devices requested, node {self.node} sees "
                f"{len(usable)}",
            ), []
        available = self.slots.with_free(configuration)
        if available < count:
            return (
                Code.UNSCHEDULABLE,
                f"{count} unique {configuration} devices requested, {available} of "
                f"{len(usable)} free on node {self.node}",
            ), []
        if not choose:
            return OK, []
        frees = sorted(
            ((self.slots.free(s.name), s.name) for s in usable if self.slots.free_count(s.name)),
            key=lambda pair: (-len(pair[0]), pair[1]),
        )
        return OK, [free[0] for free, _ in frees[:count]]

    def _plan_packed(
        self, configuration: str, usable: list[InstanceState], count: int
    ) -> tuple[Verdict, list[str]]:
        total = sum(s.capacity for s in usable)
        if total < count:
            return (
                Code.UNRESOLVABLE,
                f"{count} {configuration} slots requested, node {self.node} sees {total}",
            ), []
        frees = [(s, self.slots.free(s.name)) for s in usable]
        frees.sort(key=lambda pair: (-(pair[0].capacity - len(pair[1])), pair[0].name))
        keys = [key for _, free in frees for key in free]
        if len(keys) < count:
            return (
                Code.UNSCHEDULABLE,
                f"{count} {configuration} slots requested, {len(keys)} of {total} free on "
                f"node {self.node}",
            ), []
        return OK, keys[:count]

    def allocate(self, pod: Pod) -> dict[str, str]:
        wanted = self._wanted(pod)
        plans: dict[str, list[str]] = {}
        for resource, count in sorted(wanted.items()):
            verdict, keys = self._plan(short_name(resource), count)
            if verdict[0] is not Code.SUCCESS:
                raise PolicyError(verdict[1])
            plans[resource] = keys
        uid, at = uid_of(pod), time.time_ns()
        for resource, keys in plans.items():
            self.slots.assume(uid, resource, keys, at)
        return self.slots.annotations_for(uid)

    def free_fraction(self, pod: Pod) -> float | None:
        usable = [s for r in self._wanted(pod) for s in self.slots.usable(short_name(r))]
        total = sum(s.capacity for s in usable)
        free = sum(len(self.slots.free(s.name)) for s in usable)
        return free / total if total else None

    def status(self) -> str:
        parts = []
        for configuration in sorted({s.configuration for s in self.slots.instances.values()}):
            if configuration not in self.slots.configurations:
                continue
            usable = self.slots.usable(configuration)
            free = sum(1 for s in usable if self.slots.free(s.name))
            parts.append(
                f"{configuration}: {free} of {len(usable)} Instances with a free slot, "
                f"{self.slots.cl_held(configuration)} held or assigned here"
            )
        return "; ".join(parts) or "no Configuration-level devices visible"
