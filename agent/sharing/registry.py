"""Finding policies: the ``akri_site.sharing_policies`` entry-point group names each policy
class; settings say which are enabled (seed 004's "the only place you hook in"). A third party
adds a policy by declaring an entry point in its own package, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import entry_points

from agent.sharing.policy import SharingPolicy

GROUP = "akri_site.sharing_policies"


class UnknownPolicy(ValueError):
    """A policy enabled in settings that no installed package provides."""


def available() -> dict[str, type[SharingPolicy]]:
    """Every installed policy by name."""
    found: dict[str, type[SharingPolicy]] = {}
    for point in entry_points(group=GROUP):
        cls = point.load()
        if not (isinstance(cls, type) and issubclass(cls, SharingPolicy)):
            raise UnknownPolicy(f"entry point {point.name} ({point.value}) is not a SharingPolicy")
        found[point.name] = cls
    return found


def enabled(names: Iterable[str]) -> list[type[SharingPolicy]]:
    """The classes of the named policies, in the order given; UnknownPolicy names the missing."""
    installed = available()
    missing = [name for name in names if name not in installed]
    if missing:
        known = ", ".join(sorted(installed)) or "none"
        raise UnknownPolicy(
            f"sharing policies not installed: {', '.join(missing)} (known: {known})"
        )
    return [installed[name] for name in names]
