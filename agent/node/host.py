"""What a device plugin needs of the agent that runs it: the narrow interface it is handed.

The agent (``agent.node.agent``) builds and owns its plugins (``plugin``, ``il``, ``cl``); the
plugins see only this ``PluginHost``, so the dependency runs one way, agent -> plugins, and a
reader of a plugin knows everything it can reach. ``NodeAgent`` satisfies it; a test or a
benchmark may hand in anything else that does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol

from agent.discovery.base import DiscoveredDevice
from agent.kube.claims import ClaimStore
from agent.node.assignments import Assignments, NoAssignments
from agent.node.loop import LoopThread
from agent.node.view import ClusterView


class PluginHost(Protocol):
    """The agent as its plugins see it."""

    node_name: str
    view: ClusterView  # what the cluster says, in memory
    claims: ClaimStore  # conditional slot writes on behalf of this node
    claim_pool: Executor  # a CL request's concurrent claims
    loop: LoopThread  # serves every plugin; ``loop.blocking`` runs Allocate's work
    plugin_dir: str  # where the plugin sockets go
    kubelet_socket: str  # where Register goes
    register_slots: asyncio.Semaphore  # concurrent Register calls of this agent
    assignments: Assignments | NoAssignments  # the scheduler extender's, when enabled

    def device_of(self, instance: str) -> DiscoveredDevice | None:
        """The device this node discovered behind ``instance``, if any."""

    def serialized(self, *instances: str) -> contextlib.AbstractContextManager:
        """The reconciler's per-Instance locks, held around claim and ``allocated``."""

    def allocated(
        self, instance: str, slot: str, value: str, device_id: str, resource_name: str
    ) -> None:
        """After a granted claim: the reconciler maps the slot to its pod."""

    def release_quietly(self, instance: str, key: str, value: str, why: str) -> None:
        """Undo a claim of a refused Allocate (failures are logged, never raised)."""

    def refresh_instance(self, name: str) -> None:
        """Read one Instance from the API server into the view (after losing a race)."""

    def defer_notifications(self) -> Callable[..., None]:
        """Device-list updates wait until the returned release is called, then go out
        together."""
