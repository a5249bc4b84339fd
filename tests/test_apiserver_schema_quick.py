"""The simulator's compiled schema check (fastjsonschema, ``_surely_valid``) agrees with
jsonschema's Draft 4 validator: where it says valid, the validator is skipped."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft4Validator

from agent.simulator.apiserver_schema import CrdSchema, _compiled, _jsonschema, _surely_valid

CRDS = Path(__file__).resolve().parent.parent / "deploy" / "crds"

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 300),
    st.floats(-3, 300, allow_nan=False),
    st.sampled_from(["", "node-a", "C:0:node-a"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["capacity", "deviceUsage", "nodes", "shared", "x", "a-0"]),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)
types = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null"])
schemas = st.recursive(
    st.fixed_dictionaries(
        {},
        optional={"type": types, "minimum": st.integers(0, 5), "maximum": st.integers(0, 5)},
    ),
    lambda inner: st.fixed_dictionaries(
        {},
        optional={
            "type": types,
            "properties": st.dictionaries(st.sampled_from(["x", "capacity", "nodes"]), inner),
            "additionalProperties": st.one_of(st.booleans(), inner),
            "required": st.lists(st.sampled_from(["x", "capacity"]), max_size=2, unique=True),
            "items": inner,
            "enum": st.lists(scalars, min_size=1, max_size=2),
        },
    ),
    max_leaves=6,
)


def instance_schema() -> dict:
    crd = next(d for d in yaml.safe_load_all((CRDS / "instances.yaml").read_text()) if d)
    return _jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


@settings(max_examples=400, deadline=None)
@given(value=values, schema=schemas)
def test_it_vouches_only_for_what_the_validator_accepts(value, schema):
    check = _compiled(schema)
    if check is None:  # a schema it cannot compile (one no object satisfies): jsonschema decides
        assert not _surely_valid(value, check)
    else:
        assert _surely_valid(value, check) == Draft4Validator(schema).is_valid(value)


@settings(max_examples=300, deadline=None)
@given(spec=values)
def test_it_vouches_only_for_instances_the_validator_accepts(spec):
    schema = instance_schema()
    body = {"spec": spec}
    assert _surely_valid(body, _compiled(schema)) == Draft4Validator(schema).is_valid(body)


def test_a_valid_instance_is_vouched_for_and_an_invalid_one_still_gets_its_errors():
    crd = next(d for d in yaml.safe_load_all((CRDS / "instances.yaml").read_text()) if d)
    checked = CrdSchema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    spec = {
        "configurationName": "cams",
        "capacity": 3,
        "shared": True,
        "nodes": ["node-a"],
        "deviceUsage": {f"cams-0-{i}": "" for i in range(3)},
        "brokerProperties": {},
        "cdiName": "akri.sh/cams=0",
    }
    assert _surely_valid({"spec": spec}, checked._check)
    assert checked.errors({"spec": spec}) == []

    bad = dict(spec, deviceUsage={"cams-0-0": 7})
    assert not _surely_valid({"spec": bad}, checked._check)
    assert checked.errors({"spec": bad}) != []


def test_every_crd_schema_the_project_ships_compiles():
    """A schema fastjsonschema could not compile would leave every write to jsonschema alone."""
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in (d for d in yaml.safe_load_all(path.read_text()) if d):
            for version in crd["spec"]["versions"]:
                schema = CrdSchema(version["schema"]["openAPIV3Schema"])
                assert schema._check is not None, (path.name, version["name"])
