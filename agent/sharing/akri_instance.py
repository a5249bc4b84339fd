"""Policy ``akri-instance``: pods asking for ``akri.sh/<instance>`` (one specific device).

Fits when the node can see the Instance and it has as many free slots as asked (free in
``deviceUsage`` and not assumed by a pod bound moments ago). Unresolvable when the node cannot
see the Instance, or its capacity is below the request: no eviction would change that.
Unschedulable when the slots exist but are busy. A cordoned Instance (agent.domain.cordon) is
treated as absent, Unresolvable with the cordon in words: evicting pods would not open it.

A name the books know neither as an Instance (anywhere) nor as a Configuration is Unschedulable,
not Unresolvable: it is most often a Configuration or Instance just created (or recreated)
that the controller's cache has not brought to the extender yet, and the pod must be asked
about again once it has (agent.extender.retry), not left waiting for a cluster event.
"""

from __future__ import annotations

import time

from agent.sharing.akri_slots import AkriSlotPolicy, short_name
from agent.sharing.pods import uid_of
from agent.sharing.policy import OK, Code, Pod, PolicyError, Verdict


class AkriInstancePolicy(AkriSlotPolicy):
    name = "akri-instance"
    configuration_level = False

    def _fits(self, instance: str, count: int) -> Verdict:
        state = self.slots.instances.get(instance)
        if state is None and self.slots.unknown(instance):
            return Code.UNSCHEDULABLE, (
                f"akri.sh/{instance} names no Configuration or Instance known to the "
                "extender yet (a new one may still be on its way from the cache)"
            )
        if state is None:
            return Code.UNRESOLVABLE, f"Instance {instance} is not visible to node {self.node}"
        if state.capacity < count:
            return Code.UNRESOLVABLE, (
                f"Instance {instance} has capacity {state.capacity}, {count} slots requested"
            )
        if state.cordon is not None:
            return Code.UNRESOLVABLE, f"Instance {instance} is {state.cordon.describe()}"
        free = self.slots.free_count(instance)
        if free < count:
            return Code.UNSCHEDULABLE, (
                f"Instance {instance}: {count} slots requested, {free} free of {state.capacity}"
            )
        return OK

    def allocate(self, pod: Pod) -> dict[str, str]:
        wanted = self._wanted(pod)
        verdict = self.filter_node(pod)
        if verdict[0] is not Code.SUCCESS:
            raise PolicyError(verdict[1])
        uid, at = uid_of(pod), time.time_ns()
        for resource, count in sorted(wanted.items()):
            keys = self.slots.free(short_name(resource))[:count]
            self.slots.assume(uid, resource, keys, at)
        return self.slots.annotations_for(uid)

    def free_fraction(self, pod: Pod) -> float | None:
        instances = [self.slots.instances.get(short_name(r)) for r in self._wanted(pod)]
        total = sum(s.capacity for s in instances if s is not None)
        free = sum(len(self.slots.free(s.name)) for s in instances if s is not None)
        return free / total if total else None

    def status(self) -> str:
        states = self.slots.instances.values()
        total = sum(s.capacity for s in states)
        free = sum(len(self.slots.free(s.name)) for s in states)
        assumed = sum(
            len(k)
            for slots in self.slots.assumed.values()
            for r, k in slots.items()
            if not self.slots.is_configuration(r)
        )
        return (
            f"{len(self.slots.instances)} Instances visible, {free} of {total} slots free, "
            f"{assumed} assigned through Instance resources and not yet claimed"
        )
