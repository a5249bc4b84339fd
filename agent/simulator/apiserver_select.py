"""Label and field selectors for the API-server simulator.

Parsing follows k8s.io/apimachinery `labels.Parse` and `fields.ParseSelector` closely enough for
the syntaxes clients send: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`,
`k>1`, `k<1`, joined by commas. A parse error raises `SelectorError`, which the server turns into
a 400 BadRequest like the real one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Requirement = tuple[str, str, tuple[str, ...]]

_KEY_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?")
_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


class SelectorError(ValueError):
    """A selector string that does not parse."""


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside a parenthesised value set."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t.strip() for t in terms]


def _check_key(key: str, text: str) -> str:
    if not key or not _KEY_RE.fullmatch(key):
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r} in {text!r}")
    return key


def _check_value(value: str, text: str) -> str:
    if len(value) > 63 or not _VALUE_RE.fullmatch(value):
        raise SelectorError(
            f"unable to parse requirement: invalid label value {value!r} in {text!r}"
        )
    return value


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse a label selector into (key, operator, values) requirements; empty means everything."""
    if not text or not text.strip():
        return []
    reqs: list[Requirement] = []
    for term in _split_terms(text):
        if not term:
            raise SelectorError(f"unable to parse requirement: empty term in {text!r}")
        m = re.fullmatch(r"(\S+?)\s+(in|notin)\s*\((.*)\)", term)
        if m:
            values = tuple(v.strip() for v in m.group(3).split(","))
            if m.group(3).strip() == "":
                raise SelectorError(f"unable to parse requirement: empty value set in {text!r}")
            for v in values:
                _check_value(v, text)
            reqs.append((_check_key(m.group(1), text), m.group(2), values))
            continue
        m = re.fullmatch(r"([^=!<>\s]+)\s*(==|=|!=|<|>)\s*(.*)", term)
        if m:
            key, op, value = m.group(1), m.group(2), m.group(3).strip()
            if op in ("<", ">"):
                if not re.fullmatch(r"-?\d+", value):
                    raise SelectorError(
                        f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must be "
                        f"an integer in {text!r}"
                    )
            else:
                _check_value(value, text)
            op = {"==": "=", "=": "="}.get(op, op)
            reqs.append((_check_key(key, text), op, (value,)))
            continue
        if term.startswith("!"):
            reqs.append((_check_key(term[1:].strip(), text), "!exists", ()))
            continue
        reqs.append((_check_key(term, text), "exists", ()))
    return reqs


def labels_match(reqs: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    """True when every requirement holds for the given labels."""
    labels = labels or {}
    for key, op, values in reqs:
        present = key in labels
        value = labels.get(key)
        if op == "=":
            ok = present and value == values[0]
        elif op == "!=":
            ok = not present or value != values[0]
        elif op == "in":
            ok = present and value in values
        elif op == "notin":
            ok = not present or value not in values
        elif op == "exists":
            ok = present
        elif op == "!exists":
            ok = not present
        else:  # "<" or ">": the label must be an integer too
            try:
                number = int(value) if present else None
            except ValueError:
                number = None
            bound = int(values[0])
            ok = number is not None and (number > bound if op == ">" else number < bound)
        if not ok:
            return False
    return True


FieldRequirement = tuple[str, str, str]


def parse_field_selector(
    text: str | None, allowed: Callable[[str], bool]
) -> list[FieldRequirement]:
    """Parse `a=b,c!=d`; a field the resource does not support raises SelectorError."""
    if not text or not text.strip():
        return []
    reqs: list[FieldRequirement] = []
    for term in text.split(","):
        term = term.strip()
        m = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(.*)", term)
        if not m:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        field, op, value = m.group(1), m.group(2), m.group(3).strip()
        if not allowed(field):
            raise SelectorError(f"field label not supported: {field}")
        reqs.append((field, "!=" if op == "!=" else "=", value))
    return reqs


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted field path, as the real field sets present it ("" if absent)."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def fields_match(reqs: list[FieldRequirement], obj: Mapping[str, Any]) -> bool:
    """True when every field requirement holds for the object."""
    for field, op, value in reqs:
        actual = field_value(obj, field)
        if (actual == value) != (op == "="):
            return False
    return True
