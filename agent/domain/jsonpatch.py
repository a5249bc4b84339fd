"""A small RFC 6902 JSON-patch applier, for tests, the API-server simulator and dry runs.

It mirrors what the API server does with `application/json-patch+json`: ops are applied in
order to a copy, and any failure (a `test` that does not match, a missing path) leaves the
original untouched and raises. Equality follows JSON, not Python: `true` is not `1`.
"""

import copy
from collections.abc import Sequence
from typing import Any


class JsonPatchError(ValueError):
    """The patch is malformed or cannot be applied (the API server answers 422)."""


class JsonPatchTestFailed(JsonPatchError):
    """A `test` op found a different value: someone else wrote first."""


def escape_pointer_token(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str) -> str:
    """A JSON pointer from raw tokens: pointer("spec", "deviceUsage", key)."""
    return "".join("/" + escape_pointer_token(str(token)) for token in tokens)


def parse_pointer(path: str) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise JsonPatchError(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: bools are not numbers, object key order does not matter."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def _array_index(token: str, length: int, for_add: bool) -> int:
    if for_add and token == "-":
        return length
    if not token.isascii() or not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise JsonPatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > length or (index == length and not for_add):
        raise JsonPatchError(f"array index {index} out of range")
    return index


def _parent(doc: Any, tokens: list[str]) -> Any:
    """The container that holds the last token."""
    target = doc
    for token in tokens[:-1]:
        target = _child(target, token)
    return target


def _child(container: Any, token: str) -> Any:
    if isinstance(container, dict):
        if token not in container:
            raise JsonPatchError(f"path member {token!r} does not exist")
        return container[token]
    if isinstance(container, list):
        return container[_array_index(token, len(container), for_add=False)]
    raise JsonPatchError(f"cannot descend into a {type(container).__name__} at {token!r}")


def _get(doc: Any, path: str) -> Any:
    target = doc
    for token in parse_pointer(path):
        target = _child(target, token)
    return target


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = parse_pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_array_index(tokens[-1], len(parent), for_add=True), value)
    else:
        raise JsonPatchError(f"cannot add to a {type(parent).__name__} at {path!r}")
    return doc


def _remove(doc: Any, path: str) -> tuple[Any, Any]:
    tokens = parse_pointer(path)
    if not tokens:
        raise JsonPatchError("cannot remove the whole document")
    parent = _parent(doc, tokens)
    if isinstance(parent, dict):
        if tokens[-1] not in parent:
            raise JsonPatchError(f"path {path!r} does not exist")
        return doc, parent.pop(tokens[-1])
    if isinstance(parent, list):
        return doc, parent.pop(_array_index(tokens[-1], len(parent), for_add=False))
    raise JsonPatchError(f"cannot remove from a {type(parent).__name__} at {path!r}")


def _replace(doc: Any, path: str, value: Any) -> Any:
    tokens = parse_pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    if isinstance(parent, dict):
        if tokens[-1] not in parent:
            raise JsonPatchError(f"path {path!r} does not exist")
        parent[tokens[-1]] = value  # in place, so key order stays as it was
    elif isinstance(parent, list):
        parent[_array_index(tokens[-1], len(parent), for_add=False)] = value
    else:
        raise JsonPatchError(f"cannot replace inside a {type(parent).__name__} at {path!r}")
    return doc


def _field(op: dict, name: str) -> Any:
    if name not in op:
        raise JsonPatchError(f"op {op.get('op')!r} needs {name!r}")
    return op[name]


def _apply_one(doc: Any, op: dict) -> Any:
    if not isinstance(op, dict):
        raise JsonPatchError(f"an op must be an object, got {op!r}")
    kind = op.get("op")
    path = _field(op, "path")
    if kind == "add":
        return _add(doc, path, copy.deepcopy(_field(op, "value")))
    if kind == "remove":
        return _remove(doc, path)[0]
    if kind == "replace":
        return _replace(doc, path, copy.deepcopy(_field(op, "value")))
    if kind == "test":
        try:
            actual = _get(doc, path)
        except JsonPatchError as exc:  # a missing path is a failed condition, not a bad patch
            raise JsonPatchTestFailed(f"test failed at {path!r}: {exc}") from exc
        if not json_equal(actual, _field(op, "value")):
            raise JsonPatchTestFailed(f"test failed at {path!r}: found {actual!r}")
        return doc
    if kind in ("move", "copy"):
        source = _field(op, "from")
        if kind == "move" and (path + "/").startswith(source + "/") and path != source:
            raise JsonPatchError(f"cannot move {source!r} into its own child {path!r}")
        value = copy.deepcopy(_get(doc, source))
        if kind == "move":
            doc, _ = _remove(doc, source) if source else (doc, None)
        return _add(doc, path, value)
    raise JsonPatchError(f"unknown op {kind!r}")


def apply_json_patch(doc: Any, ops: Sequence[dict]) -> Any:
    """Return a patched deep copy of `doc`; raise JsonPatchError and leave `doc` as it was."""
    if not isinstance(ops, list | tuple):
        raise JsonPatchError("a JSON patch must be an array of ops")
    result = copy.deepcopy(doc)
    for op in ops:
        result = _apply_one(result, op)
    return result
