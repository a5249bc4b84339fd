"""Resource quantities as kube-apiserver stores them, for the API-server simulator.

A real server decodes every quantity into ``resource.Quantity`` and writes it back in its
canonical form: ``1000`` is stored as ``1k``, ``0.5`` as ``500m``, ``2048Ki`` as ``2Mi``. Code
that reads pods and nodes must therefore accept every form of the grammar, and a simulator
that stored quantities as sent would hide code that does not (issue 27: a gpushare node of
capacity ``2k`` read as "cards have 0").

The rules (k8s.io/apimachinery/pkg/api/resource, ``CanonicalizeBytes``):
- the format is the one the value was written in: a binary suffix (``Ki`` .. ``Ei``) is
  BinarySI, an exponent (``e3``) DecimalExponent, anything else DecimalSI;
- BinarySI is kept only for whole values of at least 1024 in magnitude, as the largest power
  of 1024 that divides the value; otherwise it is shown as DecimalSI;
- decimal forms move trailing zeros into the exponent, then lower it to a multiple of 3 and
  name it with a suffix (``k``, ``M``, ... ``E``; ``m``, ``u``, ``n``) or as ``e<n>``;
- precision finer than 10^-9 is rounded up (away from zero), and zero is ``0``.

Validation of container resources follows the pod validation of core/v1: quantities are not
negative, an extended resource (a name outside the ``kubernetes.io`` namespace) is a whole
number, has a limit, and its request equals its limit. Requests default to limits.
"""

from __future__ import annotations

import re
from decimal import ROUND_UP, Decimal

from agent.sharing.pods import is_extended

_GRAMMAR = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_NAMES = {exponent: name for name, exponent in _DECIMAL.items()}
_NANO = Decimal("1e-9")


class QuantityError(ValueError):
    """Not a quantity in Kubernetes' grammar."""


def parse(text: str) -> tuple[Decimal, str]:
    """(value, format) of a quantity string; format is ``BinarySI``, ``DecimalSI`` or
    ``DecimalExponent``."""
    if not isinstance(text, str):
        raise QuantityError(f"quantities must match the regular expression: {text!r}")
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise QuantityError(
            "quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    number = Decimal(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * (Decimal(1024) ** _BINARY[suffix]), "BinarySI"
    if len(suffix) > 1 and suffix[0] in ("e", "E"):  # an exponent; "E" alone is exa
        return number.scaleb(int(suffix[1:])), "DecimalExponent"
    return number.scaleb(_DECIMAL[suffix]), "DecimalSI"


def canonical(value: str | int) -> str:
    """The form a real API server stores ``value`` in."""
    if isinstance(value, bool):
        raise QuantityError(f"a quantity must be a string or a number: {value!r}")
    if isinstance(value, int):
        value = str(value)
    amount, form = parse(value)
    if amount.as_tuple().exponent < -9:
        amount = amount.quantize(_NANO, rounding=ROUND_UP)
    if amount == 0:
        return "0"
    if form == "BinarySI":
        if abs(amount) >= 1024 and amount == amount.to_integral_value():
            return _binary(int(amount))
        form = "DecimalSI"
    return _decimal(amount, form)


def _binary(amount: int) -> str:
    power = 0
    while amount % 1024 == 0 and power < 6:
        amount //= 1024
        power += 1
    suffix = next((name for name, p in _BINARY.items() if p == power), "")
    return f"{amount}{suffix}"


def _decimal(amount: Decimal, form: str) -> str:
    sign, digits, exponent = amount.normalize().as_tuple()
    mantissa = int("".join(map(str, digits)))
    # Lower the exponent to a multiple of 3 (Python's % is never negative), and keep it
    # within the suffixes there are.
    lower = exponent % 3
    mantissa, exponent = mantissa * 10**lower, exponent - lower
    if exponent > 18:
        mantissa, exponent = mantissa * 10 ** (exponent - 18), 18
    text = f"{'-' if sign else ''}{mantissa}"
    if form == "DecimalExponent":
        return text + (f"e{exponent}" if exponent else "")
    return text + _DECIMAL_NAMES[exponent]


def container_problems(container: dict, path: str) -> list[tuple[str, str]]:
    """Default requests from limits and canonicalize ``container``'s resources in place;
    (field, problem) for each quantity the pod validation refuses."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return []
    problems: list[tuple[str, str]] = []
    parsed: dict[str, dict[str, Decimal]] = {}
    for part in ("limits", "requests"):
        values = resources.get(part)
        if not isinstance(values, dict):
            continue
        parsed[part] = {}
        for name, raw in values.items():
            where = f"{path}.resources.{part}[{name}]"
            try:
                text = canonical(raw)
            except QuantityError as exc:
                problems.append((where, f"Invalid value: {raw!r}: {exc}"))
                continue
            values[name] = text
            amount = parse(text)[0]
            parsed[part][name] = amount
            if amount < 0:
                problems.append(
                    (where, f'Invalid value: "{text}": must be greater than or equal to 0')
                )
            elif is_extended(name) and amount != amount.to_integral_value():
                problems.append((where, f'Invalid value: "{text}": must be an integer'))
    limits = resources.get("limits")
    if isinstance(limits, dict) and limits:
        requests = resources.setdefault("requests", {})
        if isinstance(requests, dict):
            for name, text in limits.items():
                if name not in requests and name in parsed.get("limits", {}):
                    requests[name] = text
                    parsed.setdefault("requests", {})[name] = parsed["limits"][name]
    for name, amount in parsed.get("requests", {}).items():
        if not is_extended(name):
            continue
        limit = parsed.get("limits", {}).get(name)
        if limit is None:
            problems.append(
                (
                    f"{path}.resources.limits",
                    "Required value: Limit must be set for non overcommitable resources",
                )
            )
        elif limit != amount:
            problems.append(
                (
                    f"{path}.resources.requests[{name}]",
                    f'Invalid value: "{resources["requests"][name]}": must be equal to {name} '
                    f"limit of {resources['limits'][name]}",
                )
            )
    return problems


def pod_problems(pod: dict) -> list[tuple[str, str]]:
    """Conform a pod's container resources as the API server does; the problems found."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return []
    problems: list[tuple[str, str]] = []
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        if not isinstance(containers, list):
            continue
        for i, container in enumerate(containers):
            if isinstance(container, dict):
                problems += container_problems(container, f"spec.{key}[{i}]")
    return problems


def node_problems(node: dict) -> list[tuple[str, str]]:
    """Canonicalize a node's status capacity and allocatable; the problems found."""
    status = node.get("status")
    if not isinstance(status, dict):
        return []
    problems: list[tuple[str, str]] = []
    for part in ("capacity", "allocatable"):
        values = status.get(part)
        if not isinstance(values, dict):
            continue
        for name, raw in values.items():
            try:
                values[name] = canonical(raw)
            except QuantityError as exc:
                problems.append((f"status.{part}[{name}]", f"Invalid value: {raw!r}: {exc}"))
    return problems
