"""Policy ``gpushare``: pods asking for ``volcano.sh/gpu-memory`` share one card by memory.

The pod needs one card whose idle memory covers its whole request (Volcano's rule). Of the
cards that fit, the one with the least idle memory wins (best fit, ties by id), which keeps
roomy cards for larger requests; Volcano itself takes the lowest id. The chosen card goes on
the pod as ``volcano.sh/gpu-index`` with ``volcano.sh/predicate-time``, as Volcano writes it.
Unresolvable when the node has no card at all or cards smaller than the request.
"""

from __future__ import annotations

from agent.sharing.gpu_cards import GPU_MEMORY, GpuPolicy, gpu_requests
from agent.sharing.policy import OK, Code, Pod, PolicyError, Verdict


class GpuSharePolicy(GpuPolicy):
    name = "gpushare"
    request = 0

    def _best_card(self, memory: int) -> tuple[Verdict, int | None]:
        if not self.gpus.cards:
            return (Code.UNRESOLVABLE, f"node {self.node} has no healthy GPU cards"), None
        if memory > self.gpus.memory_per_card:
            return (
                Code.UNRESOLVABLE,
                f"{GPU_MEMORY} {memory} requested, cards of node {self.node} have "
                f"{self.gpus.memory_per_card}",
            ), None
        fits = [(self.gpus.idle_memory(c), c) for c in self.gpus.cards]
        fits = [pair for pair in fits if pair[0] >= memory]
        if not fits:
            return (
                Code.UNSCHEDULABLE,
                f"{GPU_MEMORY} {memory} requested, no card of node {self.node} has that free",
            ), None
        return OK, min(fits)[1]

    def filter_node(self, pod: Pod) -> Verdict:
        try:
            memory = gpu_requests(pod)[0]
        except PolicyError as exc:
            return Code.ERROR, str(exc)
        if memory <= 0:
            return OK
        return self._best_card(memory)[0]

    def allocate(self, pod: Pod) -> dict[str, str]:
        verdict, card = self._best_card(gpu_requests(pod)[0])
        if card is None:
            raise PolicyError(verdict[1])
        return self.gpus.book(pod, [card])

    def free_fraction(self, pod: Pod) -> float | None:
        total = self.gpus.memory_per_card * len(self.gpus.cards)
        return sum(self.gpus.idle_memory(c) for c in self.gpus.cards) / total if total else None

    def status(self) -> str:
        return self.gpus.status()
