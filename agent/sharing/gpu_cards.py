"""The GPU cards of one node, as Volcano's gpushare device keeps them, shared by the
``gpushare`` (``volcano.sh/gpu-memory``) and ``gpu-number`` (``volcano.sh/gpu-number``)
policies: a card with any pod on it is not idle for a whole-card request.

Cards come from the Node's capacity: ``volcano.sh/gpu-number`` cards of
``volcano.sh/gpu-memory`` / number memory each, less those listed in the node annotation
``volcano.sh/gpu-unhealthy-ids``. A pod's cards are its ``volcano.sh/gpu-index`` annotation
(comma-separated ids), written at bind with ``volcano.sh/predicate-time``, as Volcano does;
its device plugin reads them back. Memory counts per card the pod's whole request, as in
Volcano; finished pods count nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

from agent.sharing.pods import annotations_of, is_finished, quantity, requests_of, uid_of
from agent.sharing.policy import NodeInventory, Pod, PolicyError, SharingPolicy

GPU_MEMORY = "volcano.sh/gpu-memory"
GPU_NUMBER = "volcano.sh/gpu-number"
GPU_INDEX = "volcano.sh/gpu-index"
PREDICATE_TIME = "volcano.sh/predicate-time"
UNHEALTHY_IDS = "volcano.sh/gpu-unhealthy-ids"
SHARED_KEY = "volcano.sh/gpu"


def _capacity(node: Mapping[str, Any], resource: str) -> int:
    value = ((node.get("status") or {}).get("capacity") or {}).get(resource)
    if value is None:
        return 0
    try:
        return quantity(value, resource)
    except PolicyError:
        return 0


def gpu_index(pod: Pod) -> list[int]:
    """Card ids of ``volcano.sh/gpu-index``; empty when absent or malformed."""
    value = annotations_of(pod).get(GPU_INDEX)
    if not isinstance(value, str) or not value:
        return []
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        return []


def gpu_requests(pod: Pod) -> tuple[int, int]:
    """(memory, number) a pod asks for."""
    asked = requests_of(pod, "volcano.sh/")
    return asked.get(GPU_MEMORY, 0), asked.get(GPU_NUMBER, 0)


class GpuCards:
    def __init__(self, inventory: NodeInventory) -> None:
        node = inventory.node or {}
        number = _capacity(node, GPU_NUMBER)
        total = _capacity(node, GPU_MEMORY)
        self.memory_per_card = total // number if number else 0
        unhealthy = set(self._unhealthy(node))
        self.cards: dict[int, dict[str, int]] = {
            i: {} for i in range(number) if i not in unhealthy
        }  # card id -> pod uid -> memory it uses there

    @classmethod
    def of(cls, inventory: NodeInventory) -> GpuCards:
        return inventory.shared_book(SHARED_KEY, cls)

    @staticmethod
    def _unhealthy(node: Mapping[str, Any]) -> list[int]:
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(UNHEALTHY_IDS) or ""
        return [int(p) for p in str(raw).split(",") if p.strip().isdigit()]

    def idle_memory(self, card: int) -> int:
        return max(0, self.memory_per_card - sum(self.cards[card].values()))

    def idle_cards(self) -> list[int]:
        return sorted(card for card, pods in self.cards.items() if not pods)

    def add(self, pod: Pod) -> None:
        if is_finished(pod):
            return
        memory, number = gpu_requests(pod)
        if memory <= 0 and number <= 0:
            return
        uid = uid_of(pod)
        for card in gpu_index(pod):
            if card in self.cards:
                self.cards[card][uid] = memory

    def remove(self, pod: Pod) -> None:
        uid = uid_of(pod)
        for pods in self.cards.values():
            pods.pop(uid, None)

    def book(self, pod: Pod, cards: list[int]) -> dict[str, str]:
        memory, _ = gpu_requests(pod)
        uid = uid_of(pod)
        for card in cards:
            self.cards[card][uid] = memory
        return {
            PREDICATE_TIME: str(time.time_ns()),
            GPU_INDEX: ",".join(str(card) for card in cards),
        }

    def check(self) -> None:
        for card, pods in self.cards.items():
            assert all(m >= 0 for m in pods.values()), f"card {card} books a negative request"

    def status(self) -> str:
        if not self.cards:
            return "no healthy GPU cards"
        used = sum(1 for pods in self.cards.values() if pods)
        idle = sum(self.idle_memory(c) for c in self.cards)
        return (
            f"{len(self.cards)} cards of {self.memory_per_card} memory, {used} in use, "
            f"{idle} memory idle"
        )


class GpuPolicy(SharingPolicy):
    """What ``gpushare`` and ``gpu-number`` share: the node's cards, and which of the two
    requests (memory: index 0, number: 1 of ``gpu_requests``) is theirs."""

    request: ClassVar[int] = 0

    def __init__(self, inventory: NodeInventory) -> None:
        super().__init__(inventory)
        self.gpus = GpuCards.of(inventory)

    def _asked(self, pod: Pod) -> int:
        return gpu_requests(pod)[self.request]

    def add_resource(self, pod: Pod) -> None:
        if self._asked(pod) > 0:
            self.gpus.add(pod)

    def sub_resource(self, pod: Pod) -> None:
        if self._asked(pod) > 0:
            self.gpus.remove(pod)

    def has_device_request(self, pod: Pod) -> bool:
        return self._asked(pod) > 0

    def release(self, pod: Pod) -> None:
        self.gpus.remove(pod)
