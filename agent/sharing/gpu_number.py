"""Policy ``gpu-number``: pods asking for ``volcano.sh/gpu-number`` whole cards.

A whole card is one no pod uses (Volcano's ``isIdleGPU``). The lowest idle ids are taken and
written to the pod as ``volcano.sh/gpu-index``, as Volcano does. Unresolvable when the node has
fewer healthy cards than requested; Unschedulable when enough exist but are in use.
"""

from __future__ import annotations

from agent.sharing.gpu_cards import GPU_NUMBER, GpuPolicy, gpu_requests
from agent.sharing.policy import OK, Code, Pod, PolicyError, Verdict


class GpuNumberPolicy(GpuPolicy):
    name = "gpu-number"
    request = 1

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

    def free_fraction(self, pod: Pod) -> float | None:
        cards = len(self.gpus.cards)
        return len(self.gpus.idle_cards()) / cards if cards else None

    def status(self) -> str:
        return f"{len(self.gpus.idle_cards())} of {len(self.gpus.cards)} cards idle"
