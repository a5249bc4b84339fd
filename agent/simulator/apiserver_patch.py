"""Patch algorithms for the API-server simulator: JSON merge patch, JSON patch, strategic merge.

Every function returns a new document and never mutates its input: the store shares unchanged
subtrees between versions of an object, so in-place edits would corrupt history.

- `merge_patch` is RFC 7386 (objects merged recursively, `null` deletes, lists replaced whole).
- `json_patch` is RFC 6902 (add, remove, replace, move, copy, test; `-` appends). Failures raise
  `PatchError` with the HTTP code the real server answers (422 for a failed test or a missing
  path).
- `strategic_merge_patch` is an approximation of Kubernetes' strategic merge patch for built-in
  types: lists with a well-known merge key (containers by `name`, conditions by `type`, ...)
  are merged item by item, `finalizers` is merged as a set, `$patch: delete|replace` and
  `$deleteFromPrimitiveList/<field>` directives are honoured and `$setElementOrder` / `$retainKeys`
  are dropped. Every other list is replaced whole, as a merge patch would.
"""

from __future__ import annotations

import copy
from typing import Any

# Field name -> merge key, for the list fields of built-in types whose Go struct declares
# `patchStrategy:"merge"`. Ports depend on the parent: container ports merge by containerPort,
# service ports by port.
_SMP_MERGE_KEYS = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "addresses": "type",
    "taints": "key",
}
_SMP_PRIMITIVE_SETS = {"finalizers"}


class PatchError(Exception):
    """A patch that cannot be applied; `code` is the HTTP status the server answers."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = merge_patch(result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    return result


# -- JSON patch (RFC 6902) -------------------------------------------------------------------


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(422, f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list, token: str, path: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(422, f"invalid array index {token!r} in {path}")
    i = int(token)
    if i > len(container) or (i == len(container) and not allow_end):
        raise PatchError(422, f"array index {i} out of bounds in {path}")
    return i


def _get(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for token in parts:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(422, f"path {path} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, path, allow_end=False)]
        else:
            raise PatchError(422, f"path {path} does not exist")
    return node


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        raise PatchError(422, f"operation not allowed on the document root: {path!r}")
    return _get(doc, parts[:-1], path)


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent, token = _parent(doc, parts, path), parts[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, path, allow_end=True), value)
    else:
        raise PatchError(422, f"path {path} does not exist")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    parent, token = _parent(doc, parts, path), parts[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(422, f"unable to remove nonexistent key: {token}: missing value")
        return parent.pop(token)
    if isinstance(parent, list):
        return parent.pop(_index(parent, token, path, allow_end=False))
    raise PatchError(422, f"path {path} does not exist")


def json_patch(doc: Any, ops: Any) -> Any:
    """Apply an RFC 6902 patch (a list of operations) to a copy of `doc`."""
    if not isinstance(ops, list):
        raise PatchError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict):
            raise PatchError(400, "json: cannot unmarshal non-object operation")
        name = op.get("op")
        path = op.get("path")
        parts = _pointer(path)
        if name in ("add", "replace", "test") and "value" not in op:
            raise PatchError(422, f"missing value for {name} operation on {path}")
        if name == "add":
            doc = _add(doc, parts, copy.deepcopy(op["value"]), path)
        elif name == "remove":
            _remove(doc, parts, path)
        elif name == "replace":
            if not parts:
                doc = copy.deepcopy(op["value"])
                continue
            parent = _parent(doc, parts, path)
            if isinstance(parent, dict) and parts[-1] not in parent:
                raise PatchError(
                    422, f"replace operation does not apply: doc is missing key: {path}"
                )
            _remove(doc, parts, path)
            doc = _add(doc, parts, copy.deepcopy(op["value"]), path)
        elif name in ("move", "copy"):
            source = op.get("from")
            from_parts = _pointer(source)
            if name == "move":
                if parts[: len(from_parts)] == from_parts and len(parts) > len(from_parts):
                    raise PatchError(422, f"cannot move {source} into its own child {path}")
                value = _remove(doc, from_parts, source)
            else:
                value = copy.deepcopy(_get(doc, from_parts, source))
            doc = _add(doc, parts, value, path)
        elif name == "test":
            try:
                actual = _get(doc, parts, path)
            except PatchError:
                actual = _MISSING
            if actual is _MISSING or not _json_equal(actual, op["value"]):
                raise PatchError(422, f"testing value {path} failed: test failed")
        else:
            raise PatchError(422, f"Unexpected kind: {name}")
    return doc


_MISSING = object()


def _json_equal(a: Any, b: Any) -> bool:
    # JSON has no bool/int distinction problems in Python except True == 1; keep them apart.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# -- strategic merge patch (approximation) ---------------------------------------------------


def strategic_merge_patch(target: Any, patch: Any, parent_field: str = "") -> Any:
    """Apply a strategic merge patch to a built-in object (see the module docstring)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [v for v in result[field] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value, key)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _smp_list(result.get(key), value, key, parent_field)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _smp_list(current: Any, patch: list, field: str, parent_field: str) -> list:
    if not isinstance(current, list):
        current = []
    if field in _SMP_PRIMITIVE_SETS:
        merged = list(current)
        merged.extend(v for v in patch if v not in merged)
        return merged
    key = _SMP_MERGE_KEYS.get(field)
    if field == "ports":
        key = "containerPort" if parent_field in ("containers", "initContainers") else "port"
    dict_items = all(isinstance(item, dict) for item in patch + current)
    if (
        key is None
        or not dict_items
        or any(key not in item for item in patch if not _is_directive(item))
    ):
        return copy.deepcopy(patch)
    if any(item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not _is_directive(i)]
    merged = list(current)
    for item in patch:
        position = next((i for i, cur in enumerate(merged) if cur.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if position is not None:
                merged.pop(position)
            continue
        if position is None:
            merged.append(strategic_merge_patch({}, item, field))
        else:
            merged[position] = strategic_merge_patch(merged[position], item, field)
    return merged


def _is_directive(item: Any) -> bool:
    return isinstance(item, dict) and item.get("$patch") == "replace" and len(item) == 1
