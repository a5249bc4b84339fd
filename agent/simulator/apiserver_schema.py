"""Custom resources against their CRD's structural schema, as kube-apiserver treats them.

On every create and update of a custom resource the real server, in this order: drops fields the
schema does not declare (pruning, unless `x-kubernetes-preserve-unknown-fields`), drops `null`
values of non-nullable fields that have no default, fills in `default`s, then validates what is
left against the OpenAPI v3 schema and answers 422 listing every problem. `CrdSchema` does the
same for one served version. Validation itself is `jsonschema`'s (Draft 4, which OpenAPI v3.0
schemas follow, with the nulls `nullable` allows taken out first); this module only turns its errors
into the real server's field errors (`spec.capacity: Invalid value: ...`), whose wording was
taken from kube-apiserver v1.37 (checked by tests/test_apiserver_parity.py on a real server).

Not covered (the CRDs in deploy/crds use none of it): `x-kubernetes-int-or-string`,
`x-kubernetes-embedded-resource`, `x-kubernetes-validations` (CEL), `format`, list-type `map`
keys, the metadata of embedded objects.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator
from typing import Any

import fastjsonschema
from jsonschema import Draft4Validator
from jsonschema.exceptions import ValidationError

# ObjectMeta's fields: anything else under metadata is dropped when the body is decoded.
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "clusterName",
        "managedFields",
    }
)
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")
_TYPE_NAMES = {
    dict: "object",
    list: "array",
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}


class CrdSchema:
    """The structural schema of one served CRD version: prune, default and validate."""

    def __init__(self, schema: dict[str, Any] | None) -> None:
        self.schema = schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        self._plain = _jsonschema(self.schema)
        self._validator = Draft4Validator(self._plain)
        self._check = _compiled(self._plain)

    def normalize(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Pruned, null-dropped and defaulted copy of `obj` (a whole custom resource)."""
        result = {}
        for key, value in obj.items():
            if key == "metadata" and isinstance(value, dict):
                result[key] = {k: v for k, v in value.items() if k in OBJECT_META_FIELDS}
            elif key in _ROOT_FIELDS:
                result[key] = value
            else:
                sub = _property(self.schema, key)
                if sub is not None or self.schema.get("x-kubernetes-preserve-unknown-fields"):
                    result[key] = _normalize(value, sub)
        return _apply_defaults(result, self.schema, root=True)

    def errors(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        """Every schema violation as (field path, message). The real server lists them in no
        stable order (Go map order); here they come in schema order."""
        body = _without_allowed_nulls(
            {k: v for k, v in obj.items() if k not in _ROOT_FIELDS}, self.schema
        )
        found: list[tuple[str, str]] = []
        if not _surely_valid(body, self._check):
            for error in self._validator.iter_errors(body):
                found.extend(_field_errors(error))
        found.extend(_set_duplicates(body, self.schema, ""))
        return list(dict.fromkeys(found))


def _jsonschema(schema: Any) -> Any:
    """An OpenAPI v3 schema as JSON Schema: the Kubernetes extensions, `nullable` and
    `default` are dropped (they are handled here, not by the validator)."""
    if isinstance(schema, list):
        return [_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("default", "nullable", "description"):
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {name: _jsonschema(sub) for name, sub in value.items()}
        else:
            out[key] = _jsonschema(value)
    if schema.get("x-kubernetes-preserve-unknown-fields") and out.get("type") == "object":
        out.setdefault("additionalProperties", True)
    return out


def _compiled(schema: Any) -> Any:
    """``schema`` compiled by fastjsonschema (Python code generated for it once, checked against
    jsonschema by tests/test_apiserver_schema_quick.py), or None when it cannot compile it.
    jsonschema walked an Instance of 110 slots in about 1-3 ms on every write of it: most of a
    release storm's simulator time; the compiled check takes about 10 us. Defaults and formats
    off: ``normalize`` fills defaults itself, and the real server checks no ``format`` here."""
    try:
        return fastjsonschema.compile(schema, use_default=False, use_formats=False)
    except fastjsonschema.JsonSchemaDefinitionException:
        return None


def _surely_valid(value: Any, check: Any) -> bool:
    """True when the compiled ``check`` accepts ``value``; the validator then need not run."""
    if check is None:
        return False
    try:
        check(value)
    except fastjsonschema.JsonSchemaValueException:
        return False
    return True


def _without_allowed_nulls(value: Any, schema: dict[str, Any] | None) -> Any:
    """`value` without the nulls its schema allows (`nullable: true`): such a null is valid
    whatever else the field's schema says (a null `brokerSpec` need not satisfy its oneOf)."""
    if not schema:
        return value
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            sub = _property(schema, key)
            if item is None and sub is not None and sub.get("nullable"):
                continue
            result[key] = _without_allowed_nulls(item, sub)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        return [_without_allowed_nulls(item, items) for item in value]
    return value


def _property(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if not schema:
        return None
    props = schema.get("properties") or {}
    if key in props:
        return props[key]
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        return additional
    return None


def _normalize(value: Any, schema: dict[str, Any] | None) -> Any:
    """Prune unknown fields and drop non-nullable nulls below one value."""
    if schema is None:
        return value  # under x-kubernetes-preserve-unknown-fields: kept as sent
    if isinstance(value, dict) and (schema.get("type") == "object" or "properties" in schema):
        keep = schema.get("x-kubernetes-preserve-unknown-fields")
        result = {}
        for key, sub_value in value.items():
            sub = _property(schema, key)
            if sub is None and not keep:
                continue
            if sub_value is None and sub is not None and _drops_null(sub):
                continue
            result[key] = _normalize(sub_value, sub)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_normalize(item, schema["items"]) for item in value]
    return value


def _drops_null(schema: dict[str, Any]) -> bool:
    return not schema.get("nullable") and "default" not in schema


def _apply_defaults(value: Any, schema: dict[str, Any] | None, root: bool = False) -> Any:
    if not schema:
        return value
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if root and key in _ROOT_FIELDS:
                continue
            if "default" in sub and (
                key not in value or (value[key] is None and not sub.get("nullable"))
            ):
                value[key] = copy.deepcopy(sub["default"])
        for key in list(value):
            if root and key in _ROOT_FIELDS:
                continue
            value[key] = _apply_defaults(value[key], _property(schema, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_apply_defaults(item, schema["items"]) for item in value]
    return value


# -- error wording ---------------------------------------------------------------------------


def _schema_path(parts: Iterable[Any]) -> str:
    """`spec.discoveryHandler.discoveryProperties[0].name`: how the OpenAPI validator names a
    value, both as the field and "in body" (kube-apiserver 1.20 left the list indices out)."""
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def go_value(value: Any) -> str:
    """A value the way field.Invalid prints it (%#v for the JSON-decoded Go value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return json.dumps(value)
    return "null" if value is None else '"' + _type_name(value) + '"'


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), "object")


def _field_errors(error: ValidationError) -> Iterator[tuple[str, str]]:
    parts = list(error.absolute_path)
    path = _schema_path(parts)
    value, kind, expected = error.instance, error.validator, error.validator_value
    if kind == "required":
        present = value if isinstance(value, dict) else {}
        for name in expected:
            if name not in present:
                yield _schema_path([*parts, name]), "Required value"
        return
    if kind == "type":
        actual = _type_name(value)
        wanted = expected[0] if isinstance(expected, list) else expected
        yield (
            path,
            f'Invalid value: "{actual}": {path} in body must be of type {wanted}: "{actual}"',
        )
        if wanted == "integer" and actual == "number":
            # A fraction for an integer also fails the integer format check, which names no
            # field (current servers; 1.20 reported the type alone).
            yield (
                "<nil>",
                f'Invalid value: "": Checked value must be of type integer (default format) '
                f"in {path}",
            )
        return
    if kind == "enum":
        allowed = ", ".join(go_value(v) for v in expected)
        yield path, f"Unsupported value: {go_value(value)}: supported values: {allowed}"
        return
    if kind in ("not", "oneOf", "anyOf"):
        # Composition failures name no field ("<nil>") and quote the value's path instead.
        yield "<nil>", f'Invalid value: "": "{path}" {_composition(error)}'
        if kind == "oneOf" and error.context:
            first = [e for e in error.context if e.schema_path and e.schema_path[0] == 0]
            for sub in first:
                yield from _field_errors(sub)
        return
    yield path, f"Invalid value: {go_value(value)}: {path} in body {_MESSAGES[kind](expected)}"


def _composition(error: ValidationError) -> str:
    if error.validator == "not":
        return "must not validate the schema (not)"
    if error.validator == "anyOf":
        return "must validate at least one schema (anyOf)"
    alternatives = error.validator_value
    valid = sum(1 for alt in alternatives if _valid_against(error.instance, alt))
    found = "Found none valid" if valid == 0 else f"Found {valid} valid alternatives"
    return f"must validate one and only one schema (oneOf). {found}"


def _valid_against(value: Any, schema: Any) -> bool:
    return Draft4Validator(schema).is_valid(value)


_MESSAGES = {
    "minimum": lambda v: f"should be greater than or equal to {v}",
    "maximum": lambda v: f"should be less than or equal to {v}",
    "minLength": lambda v: f"should be at least {v} chars long",
    "maxLength": lambda v: f"should be at most {v} chars long",
    "pattern": lambda v: f"should match '{v}'",
    "minItems": lambda v: f"should have at least {v} items",
    "maxItems": lambda v: f"should have at most {v} items",
    "minProperties": lambda v: f"should have at least {v} properties",
    "maxProperties": lambda v: f"should have at most {v} properties",
    "multipleOf": lambda v: f"should be a multiple of {v}",
    "uniqueItems": lambda v: "shouldn't contain duplicates",
    "additionalProperties": lambda v: "must not have additional properties",
    "exclusiveMinimum": lambda v: "should be greater than the minimum",
    "exclusiveMaximum": lambda v: "should be less than the maximum",
}


def _set_duplicates(
    value: Any, schema: dict[str, Any] | None, prefix: str
) -> Iterator[tuple[str, str]]:
    """`x-kubernetes-list-type: set` lists must not repeat an item."""
    if not schema:
        return
    if isinstance(value, list):
        if schema.get("x-kubernetes-list-type") == "set":
            seen = []
            for index, item in enumerate(value):
                if item in seen:
                    yield f"{prefix}[{index}]", f"Duplicate value: {go_value(item)}"
                else:
                    seen.append(item)
        items = schema.get("items")
        for index, item in enumerate(value):
            yield from _set_duplicates(item, items, f"{prefix}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _set_duplicates(
                item, _property(schema, key), f"{prefix}.{key}" if prefix else key
            )
