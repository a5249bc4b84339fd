"""Policy ``gpu-number``: pods asking for ``volcano.sh/gpu-number`` whole cards.

A whole card is one no pod uses (Volcano's ``isIdleGPU``). The lowest idle ids are taken and
written to the pod as ``volcano.sh/gpu-index``, as Volcano does. Unresolvable when the node has
fewer healthy cards than requested; Unschedulable when enough exist but are in use.
"""

from __future__ import annotations

from agent.sharing.gpu_cards import GPU_NUMBER, GpuCards, gpu_requests
from agent.sharing.policy import OK, Code, NodeInventory, Pod, PolicyError, SharingPolicy, Verdict


class GpuNumberPolicy(SharingPolicy):
    name = "gpu-number"

    def __init__(self, inventory: NodeInventory) -> None:
        super().__init__(inventory)
        self.gpus = GpuCards.of(inventory)

    def add_resource(self, pod: Pod) -> None:
        if gpu_requests(pod)[1] > 0:
            self.gpus.add(pod)

    def sub_resource(self, pod: Pod) -> None:
        if gpu_requests(pod)[1] > 0:
            self.gpus.remove(pod)

    def has_device_request(self, pod: Pod) -> bool:
        return gpu_requests(pod)[1] > 0

    def _fit(self, number: int) -> Verdict:
        if len(self.gpus.cards) < number:
            return Code.UNRESOLVABLE, (
                f"{GPU_NUMBER} {number} requested, node {self.node} has "
                f"{len(self.gpus.cards)} healthy cards"
            )
        idle = len(self.gpus.idle_cards())
        if idle < number:
            return Code.UNSCHEDULABLE, (
                f"{GPU_NUMBER} {number} requested, {idle} of {len(self.gpus.cards)} cards of "
                f"node {self.node} idle"
            )
        return OK

    def filter_node(self, pod: Pod) -> Verdict:
        try:
            number = gpu_requests(pod)[1]
        except PolicyError as exc:
            return Code.ERROR, str(exc)
        return self._fit(number) if number > 0 else OK

    def allocate(self, pod: Pod) -> dict[str, str]:
        number = gpu_requests(pod)[1]
        verdict = self._fit(number)
        if verdict[0] is not Code.SUCCESS:
            raise PolicyError(verdict[1])
        return self.gpus.book(pod, self.gpus.idle_cards()[:number])

    def release(self, pod: Pod) -> None:
        self.gpus.remove(pod)

    def free_fraction(self, pod: Pod) -> float | None:
        cards = len(self.gpus.cards)
        return len(self.gpus.idle_cards()) / cards if cards else None

    def status(self) -> str:
        return f"{len(self.gpus.idle_cards())} of {len(self.gpus.cards)} cards idle"
