"""The admission webhook's in-memory index: what a pod's review reads, without a query.

A review reads the owners of the claims and Instances a pod joins, the Instances of the
Configurations it asks for, the queue systems and the rules. Read from the database, that is
a few queries per review (bench ``webhook``); the index holds all of it in dictionaries, so a
review costs microseconds and runs on the event loop (``agent.queues.fastpath``).

Freshness, the invariant: a review is answered from the index only while the index is at most
``MAX_AGE`` seconds old, counted from the moment its reads *began* (so it can only be older than
it says, never newer); otherwise the review takes the database path, exactly as before, and a
rebuild starts. While reviews keep coming the index is rebuilt in a background thread every
``REFRESH_SECONDS``; an idle web process rebuilds nothing. Both paths run the same rules
(``agent.queues.webhook.decide``) over the same facts, so the index can only differ from a
fresh read by changes the cache took in the last ``MAX_AGE`` seconds: the same bound the
database path already had for the queue systems' objects (``webhook.WORLD_SECONDS``), and far
below how long the cache itself trails the API server under load.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace

from django.conf import settings
from django.db import DatabaseError, connections

from agent.charges.admission import ClRequest, Joined, cl_request
from agent.charges.facts import AKRI, DRA, QueueWorld, Settings
from agent.models import Configuration, Instance
from agent.queues import facts as queue_facts
from agent.queues.models import Charge, InstanceLabels, ResourceClaim

log = logging.getLogger(__name__)

# A review uses an index at most this old (seconds since its reads began).
MAX_AGE = 2.0
# While reviews come, the index is rebuilt this often.
REFRESH_SECONDS = 1.0


@dataclass(frozen=True)
class AdmissionIndex:
    """Everything a review needs, read query after query from `built_at` on."""

    built_at: float  # time.monotonic() when the reads began
    world_: QueueWorld
    rules_: Settings
    namespace: str  # the Akri namespace
    # (kind, namespace, name) -> (owner or None, accounted); absent: no owner, accounted.
    owners: dict[tuple[str, str, str], tuple[str | None, bool]] = field(default_factory=dict)
    # Configuration -> its requests' shape, with count 0 (each review sets its own).
    configurations: dict[str, ClRequest] = field(default_factory=dict)

    def age(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.built_at

    # The webhook's Lookup protocol.
    def world(self) -> QueueWorld:
        return self.world_

    def rules(self) -> Settings:
        return self.rules_

    def claim(self, kind: str, namespace: str, name: str) -> Joined:
        owner, accounted = self.owners.get((kind, namespace, name), (None, True))
        return Joined(kind, namespace, name, owner, accounted)

    def configuration(self, name: str, count: int) -> ClRequest | None:
        found = self.configurations.get(name)
        return None if found is None else replace(found, count=count)


def build() -> AdmissionIndex:
    """Read the index from the database (a few queries over the queue-charge cache)."""
    started = time.monotonic()
    label_key = settings.AKRI_QUEUES["LABEL_KEY"]
    namespace = settings.AKRI["NAMESPACE"]
    owners: dict[tuple[str, str, str], tuple[str | None, bool]] = {}
    # As webhook._joined: the charge row's owner and accounted flag, the label over the owner.
    for kind, ns, name, owner, accounted in Charge.objects.values_list(
        "kind", "namespace", "name", "owner", "accounted"
    ):
        owners[(kind, ns, name)] = (owner or None, accounted)
    labelled = [
        (DRA, row) for row in ResourceClaim.objects.values_list("namespace", "name", "labels")
    ] + [(AKRI, row) for row in InstanceLabels.objects.values_list("namespace", "name", "labels")]
    for kind, (ns, name, labels) in labelled:
        owner = (labels or {}).get(label_key)
        if owner:
            _, accounted = owners.get((kind, ns, name), (None, True))
            owners[(kind, ns, name)] = (owner, accounted)
    members: dict[str, dict[str, int]] = defaultdict(dict)
    for name, configuration, capacity in Instance.objects.filter(namespace=namespace).values_list(
        "name", "configuration_name", "capacity"
    ):
        members[configuration][name] = capacity
    the_rules = queue_facts.rules()
    configurations = {}
    for name, unique in Configuration.objects.filter(namespace=namespace).values_list(
        "name", "unique_devices"
    ):
        instances = members.get(name, {})
        owned = {}
        for instance in instances:
            owner = owners.get((AKRI, namespace, instance), (None, True))[0]
            if owner:
                owned[instance] = owner
        accounted = the_rules.accounts(AKRI, name)
        configurations[name] = cl_request(name, 0, unique, instances, owned, accounted)
    return AdmissionIndex(
        built_at=started,
        world_=queue_facts.world(),
        rules_=the_rules,
        namespace=namespace,
        owners=owners,
        configurations=configurations,
    )


class Holder:
    """The current index of this process and its rebuilds (one at a time, in a thread)."""

    def __init__(self, builder=build) -> None:
        self._builder = builder
        self._index: AdmissionIndex | None = None
        self._lock = threading.Lock()
        self._building = False

    def fresh(self, now: float | None = None) -> AdmissionIndex | None:
        """The index if it may answer a review now, else None; starts a rebuild when due."""
        now = time.monotonic() if now is None else now
        index = self._index
        age = None if index is None else index.age(now)
        if age is None or age >= REFRESH_SECONDS:
            self._start_rebuild()
        if age is None or age > MAX_AGE:
            return None
        return index

    def forget(self) -> None:
        """Drop the index (tests that change the cache between reviews)."""
        self._index = None

    def rebuild_now(self) -> AdmissionIndex:
        index = self._builder()
        self._index = index
        return index

    def _start_rebuild(self) -> None:
        with self._lock:
            if self._building:
                return
            self._building = True
        threading.Thread(target=self._rebuild, name="webhook-index", daemon=True).start()

    def _rebuild(self) -> None:
        try:
            self.rebuild_now()
        except DatabaseError as exc:
            # The database path answers meanwhile (and reports its own errors).
            log.warning("webhook: index not rebuilt: %s", exc)
        except Exception:
            log.exception("webhook: index not rebuilt")
        finally:
            # A thread per rebuild: its connection goes with it.
            connections.close_all()
            with self._lock:
                self._building = False


HOLDER = Holder()
