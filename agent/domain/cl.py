"""Configuration-level (CL) virtual devices (seed 001, akri-compat.md §4.2-4.3).

The CL plugin of Configuration C on node N advertises virtual devices `C-0 .. C-(count-1)`:
count = number of Instances of C that N can use (N in spec.nodes) when uniqueDevices is true,
or the sum of their capacities when false. Vdevs are not tied to Instances; Allocate maps each
requested vdev to a real slot, written as `C:<vdev>:<N>`.

Health, so that kubelet's and kube-scheduler's arithmetic both come out right:
- vdevs N holds (some slot is `C:<vdev>:N`) are Healthy, as every device plugin keeps a device
  its pod holds: the kubelet's device manager never offers a device an active pod holds, and
  kube-scheduler takes the node's allocatable (its Healthy devices) and subtracts the requests
  of the pods bound there. Marking held vdevs Unhealthy (Akri #849 and its proposed fix)
  subtracts them twice, and a node stops taking CL pods after the first;
- of the rest, the lowest-numbered k are Healthy, k = what N could claim through CL now:
  unique -> usable Instances with a free slot (the most one request can get, since one request
  needs distinct Instances); packing -> free slots of usable Instances;
- the remaining ids up to the count stay listed Unhealthy, so the node's capacity is stable.
So allocatable = held + claimable, and allocatable minus the node's CL requests is exactly what
N can still claim. A slot taken through either plugin disappears from both views. Unlike seed
001's worked example, unique mode does not cap what N holds through CL at one slot per
Instance: uniqueness binds the devices of one request, and two pods may each hold a slot of
the same camera, as two pods may through its Instance-level resource.

A held vdev whose pod has ended but whose release is not through yet is Healthy, and the
kubelet may offer it to a new pod: plan_cl_claims maps it to the slot it holds (ALREADY_OURS),
and the node reconciler binds that slot to the new allocation.

The CL plugin must serialize its own Allocate calls (one lock per plugin, as Akri PR #844):
two concurrent plans from the same snapshot could map one vdev to two slots on this node,
which the per-slot conditions cannot see because the slots differ.
"""

from collections.abc import Iterable, Sequence

from agent.domain.errors import InsufficientDevices, InvalidDeviceId
from agent.domain.naming import cl_device_id, cl_resource_name, parse_cl_device_id
from agent.domain.slots import HEALTHY, UNHEALTHY, InstanceState, UsageKind


def _of_configuration(instances: Iterable[InstanceState], configuration: str) -> list:
    return sorted((s for s in instances if s.configuration == configuration), key=lambda s: s.name)


def usable_instances(
    instances: Iterable[InstanceState], node: str, configuration: str
) -> list[InstanceState]:
    """Instances of `configuration` that `node` can use, by name."""
    return [s for s in _of_configuration(instances, configuration) if s.usable_by(node)]


def held_vdevs(
    instances: Iterable[InstanceState], node: str, configuration: str
) -> dict[str, tuple[str, str]]:
    """vdev -> (instance, slot key) for every slot `node` holds through CL.

    All Instances of the Configuration count, usable or not: kubelet still has those vdevs.
    Should one vdev appear twice (never written by us), the first by (instance, index) wins.
    """
    held: dict[str, tuple[str, str]] = {}
    for state in _of_configuration(instances, configuration):
        for view in state.views():
            usage = view.usage
            if usage.kind is UsageKind.CONFIG and usage.node == node:
                held.setdefault(usage.vdev, (state.name, view.key))
    return held


def cl_count(
    instances: Iterable[InstanceState], node: str, unique: bool, configuration: str
) -> int:
    """How many vdev ids the CL plugin advertises (before adding held ids beyond it)."""
    usable = usable_instances(instances, node, configuration)
    return len(usable) if unique else sum(s.capacity for s in usable)


def cl_claimable(
    instances: Iterable[InstanceState], node: str, unique: bool, configuration: str
) -> int:
    """How many vdevs `node` could claim through CL right now (k in the module docstring)."""
    # A cordoned Instance still counts in cl_count (listed Unhealthy, so the node's capacity
    # stays stable) but offers nothing claimable.
    usable = usable_instances(instances, node, configuration)
    if unique:
        return sum(1 for s in usable if s.claimable_slots())
    return sum(len(s.claimable_slots()) for s in usable)


def cl_devices(
    configuration: str, instances: Sequence[InstanceState], node: str, unique: bool
) -> list[tuple[str, str]]:
    """(vdev id, health) for the CL plugin of `configuration` on `node`, in id order.

    Held vdevs are Healthy wherever they are numbered (an Instance that went away leaves its
    vdev listed while the pod holds it); then the lowest free ids, as many as `node` could
    claim, are Healthy; the ids left below the count are Unhealthy.
    """
    count = cl_count(instances, node, unique, configuration)
    claimable = cl_claimable(instances, node, unique, configuration)
    held = {
        parse_cl_device_id(configuration, vdev)
        for vdev in held_vdevs(instances, node, configuration)
    }
    held.discard(None)
    devices: list[tuple[str, str]] = []
    offered = 0
    n = 0
    while n < count or offered < claimable or n <= max(held, default=-1):
        if n in held:
            devices.append((cl_device_id(configuration, n), HEALTHY))
        elif offered < claimable:
            devices.append((cl_device_id(configuration, n), HEALTHY))
            offered += 1
        elif n < count:
            devices.append((cl_device_id(configuration, n), UNHEALTHY))
        n += 1
    return devices


def _check_vdevs(configuration: str, vdevs: Sequence[str]) -> None:
    seen: set[str] = set()
    for vdev in vdevs:
        if parse_cl_device_id(configuration, vdev) is None:
            raise InvalidDeviceId(vdev, f"not a device of {cl_resource_name(configuration)}")
        if vdev in seen:
            raise InvalidDeviceId(vdev, "requested twice in one container request")
        seen.add(vdev)


def _pick_unique(
    usable: list[InstanceState], exclude: set[str], wanted: int, requested: int
) -> list[tuple[str, str]]:
    """One slot on each of `wanted` distinct Instances, most free slots first (ties by name).

    Taking from the Instance with the most free slots keeps more Instances with a free slot,
    so later unique requests are more likely to find enough distinct devices.
    """
    candidates = [s for s in usable if s.name not in exclude and s.claimable_slots()]
    candidates.sort(key=lambda s: (-len(s.claimable_slots()), s.name))
    if len(candidates) < wanted:
        raise InsufficientDevices(requested, len(exclude) + len(candidates), unique=True)
    return [(s.name, s.claimable_slots()[0]) for s in candidates[:wanted]]


def _pick_packed(
    usable: list[InstanceState], wanted: int, requested: int, reused: int
) -> list[tuple[str, str]]:
    """Free slots filling the most-used Instance first (ties by name), lowest index first.

    Packing keeps whole Instances free for requests that need distinct devices.
    """
    ordered = sorted(usable, key=lambda s: (-s.used_count(), s.name))
    slots = [(s.name, key) for s in ordered for key in s.claimable_slots()]
    if len(slots) < wanted:
        raise InsufficientDevices(requested, reused + len(slots), unique=False)
    return slots[:wanted]


def plan_cl_claims(
    instances: Sequence[InstanceState],
    node: str,
    vdevs: Sequence[str],
    unique: bool,
    configuration: str,
) -> list[tuple[str, str, str]]:
    """(vdev, instance, slot key) for each vdev of one container request, in request order.

    A vdev `node` already holds maps to its existing slot (kubelet re-asks, Akri #843); the
    caller's claim of it is then ALREADY_OURS. The others get new slots of usable Instances:
    unique -> distinct Instances, also distinct from those of reused vdevs, or the request is
    refused whole with InsufficientDevices; packing -> any free slots. The plan only reads;
    the caller writes each claim with claim_patch and releases what it wrote if a later one
    fails.
    """
    _check_vdevs(configuration, vdevs)
    held = held_vdevs(instances, node, configuration)
    plan = {vdev: held[vdev] for vdev in vdevs if vdev in held}
    if unique and len({name for name, _ in plan.values()}) < len(plan):
        # Two held vdevs on one Instance, offered together to a new pod after their pods
        # ended (a re-ask repeats a request that was planned distinct): they cannot serve a
        # request for distinct devices as they are. The caller frees them and plans afresh.
        raise InsufficientDevices(len(vdevs), len({name for name, _ in plan.values()}), True)
    new = [vdev for vdev in vdevs if vdev not in plan]
    if new:
        usable = usable_instances(instances, node, configuration)
        if unique:
            exclude = {name for name, _ in plan.values()}
            choices = _pick_unique(usable, exclude, len(new), len(vdevs))
        else:
            choices = _pick_packed(usable, len(new), len(vdevs), len(plan))
        plan.update(zip(new, choices, strict=True))
    return [(vdev, *plan[vdev]) for vdev in vdevs]


def _id_order(device_id: str) -> tuple:
    head, _, tail = device_id.rpartition("-")
    if tail.isascii() and tail.isdigit():
        return (0, head, int(tail), device_id)
    return (1, device_id, 0, device_id)


def preferred_allocation(
    available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """GetPreferredAllocation: `must_include`, then the lowest-numbered other available ids.

    No unique/packing difference is needed: vdev ids are not tied to Instances (Allocate picks
    the slots), and IL slot ids of one Instance are interchangeable. Lowest-first keeps the
    choice deterministic and matches which ids ListAndWatch marks Healthy first.
    """
    chosen = list(dict.fromkeys(must_include))
    rest = sorted((d for d in dict.fromkeys(available) if d not in chosen), key=_id_order)
    return chosen + rest[: max(0, size - len(chosen))]
