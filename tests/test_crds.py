"""The CRDs in deploy/crds: names and columns as Akri's, and the schema accepts what it should.

The schema is checked as the API server checks it (agent.simulator.apiserver_schema): unknown
fields pruned, defaults filled in, nulls of non-nullable fields dropped, then validated.
"""

from pathlib import Path

import pytest
import yaml

from agent.simulator.apiserver_schema import CrdSchema

CRDS = Path(__file__).resolve().parent.parent / "deploy" / "crds"


def load(name: str) -> dict:
    docs = list(yaml.safe_load_all((CRDS / name).read_text()))
    assert len(docs) == 1, "one CRD per file"
    return docs[0]


def version(crd: dict) -> dict:
    (only,) = crd["spec"]["versions"]
    return only


def schema(crd: dict) -> dict:
    return version(crd)["schema"]["openAPIV3Schema"]


def spec_props(crd: dict) -> dict:
    return schema(crd)["properties"]["spec"]["properties"]


def errors(s: dict, value: dict) -> list[tuple[str, str]]:
    """What the API server refuses in `value` under schema `s` (empty list = accepted), after
    it pruned and defaulted it: the simulator's schema check, which tests/test_apiserver_parity
    compares with a real server."""
    crd_schema = CrdSchema(s)
    return crd_schema.errors(crd_schema.normalize(value))


def walk(s: dict, path: str = ""):
    """Every (path, schema) below `s`, through properties, additionalProperties and items."""
    yield path, s
    for key, sub in s.get("properties", {}).items():
        yield from walk(sub, f"{path}.{key}")
    if isinstance(s.get("additionalProperties"), dict):
        yield from walk(s["additionalProperties"], f"{path}.*")
    if "items" in s:
        yield from walk(s["items"], f"{path}[]")


CONFIGURATION = {
    "apiVersion": "akri.sh/v0",
    "kind": "Configuration",
    "metadata": {"name": "akri-debug-echo-foo"},
    "spec": {
        "discoveryHandler": {
            "name": "debugEcho",
            "discoveryDetails": "descriptions:\n- foo0\n- foo1",
            "discoveryProperties": [
                {"name": "PLAIN", "value": "x"},
                {"name": "_from_secret", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                {
                    "name": "FROM_CM",
                    "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k", "optional": True}},
                },
                {"name": "NOTHING"},
            ],
        },
        "capacity": 2,
        "brokerSpec": {"brokerPodSpec": {"containers": [{"name": "b", "image": "nginx"}]}},
        "instanceServiceSpec": {"ports": [{"port": 80}]},
        "configurationServiceSpec": None,
        "brokerProperties": {"KEY": "value"},
    },
}

INSTANCE = {
    "apiVersion": "akri.sh/v0",
    "kind": "Instance",
    "metadata": {"name": "akri-debug-echo-foo-8120fe"},
    "spec": {
        "configurationName": "akri-debug-echo-foo",
        "cdiName": "akri.sh/akri-debug-echo-foo=8120fe",
        "capacity": 2,
        "shared": True,
        "nodes": ["node-a", "node-b"],
        "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": "foo0"},
        "deviceUsage": {
            "akri-debug-echo-foo-8120fe-0": "node-a",
            "akri-debug-echo-foo-8120fe-1": "C:akri-debug-echo-foo-0:node-b",
        },
    },
}


def with_spec(obj: dict, **changes) -> dict:
    return {**obj, "spec": {**obj["spec"], **changes}}


def test_configuration_crd_names_match_akri():
    crd = load("configurations.yaml")
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "configurations.akri.sh"
    assert crd["spec"]["group"] == "akri.sh"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"] == {
        "kind": "Configuration",
        "plural": "configurations",
        "singular": "configuration",
        "shortNames": ["akric"],
        "categories": ["all"],
    }
    v = version(crd)
    assert (v["name"], v["served"], v["storage"]) == ("v0", True, True)
    assert "subresources" not in v


def test_instance_crd_names_match_akri():
    crd = load("instances.yaml")
    assert crd["metadata"]["name"] == "instances.akri.sh"
    assert crd["spec"]["group"] == "akri.sh"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"] == {
        "kind": "Instance",
        "plural": "instances",
        "singular": "instance",
        "shortNames": ["akrii"],
        "categories": ["all"],
    }
    v = version(crd)
    assert (v["name"], v["served"], v["storage"]) == ("v0", True, True)
    assert v["subresources"] == {}  # as Akri's: no /status


def columns(crd: dict) -> list[tuple[str, str, str]]:
    return [(c["name"], c["type"], c["jsonPath"]) for c in version(crd)["additionalPrinterColumns"]]


def test_printer_columns_match_akri():
    assert columns(load("configurations.yaml")) == [
        ("Capacity", "string", ".spec.capacity"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    assert columns(load("instances.yaml")) == [
        ("Config", "string", ".spec.configurationName"),
        ("Shared", "boolean", ".spec.shared"),
        ("Nodes", "string", ".spec.nodes"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


def test_configuration_defaults_and_bounds():
    props = spec_props(load("configurations.yaml"))
    assert props["uniqueDevices"] == {"type": "boolean", "default": True}
    assert props["capacity"] == {"type": "integer", "default": 1, "minimum": 1, "maximum": 1024}
    assert props["discoveryHandler"]["required"] == ["name"]
    assert props["discoveryHandler"]["properties"]["name"]["minLength"] == 1
    assert props["brokerSpec"]["properties"]["brokerPodSpec"][
        "x-kubernetes-preserve-unknown-fields"
    ]
    assert props["brokerSpec"]["properties"]["brokerJobSpec"][
        "x-kubernetes-preserve-unknown-fields"
    ]


def test_instance_defaults_and_list_types():
    s = schema(load("instances.yaml"))
    assert s["required"] == ["spec"]
    props = s["properties"]["spec"]["properties"]
    assert s["properties"]["spec"]["required"] == ["configurationName", "cdiName", "capacity"]
    assert props["capacity"] == {"type": "integer", "minimum": 0, "maximum": 1024}
    assert props["nodes"]["default"] == []
    assert props["nodes"]["x-kubernetes-list-type"] == "set"
    assert props["deviceUsage"]["default"] == {}
    assert props["deviceUsage"]["x-kubernetes-map-type"] == "granular"
    assert props["deviceUsage"]["additionalProperties"] == {"type": "string"}
    assert props["shared"]["default"] is False
    assert props["brokerProperties"]["default"] == {}


@pytest.mark.parametrize("name", ["configurations.yaml", "instances.yaml"])
def test_schema_is_structural_enough(name):
    # The API server rejects non-structural schemas: every node needs a type, unless it only
    # preserves unknown fields; logical junctors may carry no types.
    for path, node in walk(schema(load(name))):
        assert "type" in node, path
        for junctor in ("oneOf", "anyOf", "allOf"):
            for sub in node.get(junctor, []):
                assert set(sub) <= {"required"}, path
        if "not" in node:
            assert set(node["not"]) <= {"required"}, path


def test_it_accepts_an_akri_configuration():
    assert errors(schema(load("configurations.yaml")), CONFIGURATION) == []


def test_it_accepts_a_configuration_with_only_a_handler_name():
    minimal = {"spec": {"discoveryHandler": {"name": "udev"}}}
    assert errors(schema(load("configurations.yaml")), minimal) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"capacity": 0},
        {"capacity": 1025},
        {"capacity": "2"},
        {"uniqueDevices": "yes"},
        {"discoveryHandler": {"discoveryDetails": ""}},
        {"discoveryHandler": {"name": ""}},
        {"discoveryHandler": {"name": "x", "discoveryProperties": [{"name": "1bad"}]}},
        {"discoveryHandler": {"name": "x", "discoveryProperties": [{"name": "has-dash"}]}},
        {"discoveryHandler": {"name": "x", "discoveryProperties": [{"value": "no name"}]}},
        {
            "discoveryHandler": {
                "name": "x",
                "discoveryProperties": [
                    {"name": "BOTH", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s"}}}
                ],
            }
        },
        {
            "discoveryHandler": {
                "name": "x",
                "discoveryProperties": [
                    {
                        "name": "TWO_SOURCES",
                        "valueFrom": {
                            "secretKeyRef": {"name": "s"},
                            "configMapKeyRef": {"name": "c"},
                        },
                    }
                ],
            }
        },
        {
            "discoveryHandler": {
                "name": "x",
                "discoveryProperties": [{"name": "NO_REF_NAME", "valueFrom": {"secretKeyRef": {}}}],
            }
        },
        {"brokerSpec": {"brokerPodSpec": {}, "brokerJobSpec": {}}},
        {"brokerSpec": {}},
        {"brokerProperties": {"KEY": 1}},
    ],
)
def test_it_rejects_a_bad_configuration(changes):
    assert errors(schema(load("configurations.yaml")), with_spec(CONFIGURATION, **changes))


def test_it_accepts_null_optional_configuration_fields():
    nulls = with_spec(
        CONFIGURATION,
        brokerSpec=None,
        instanceServiceSpec=None,
        discoveryHandler={"name": "x", "discoveryProperties": None},
    )
    assert errors(schema(load("configurations.yaml")), nulls) == []


def test_a_null_slot_value_is_dropped_not_refused():
    s = CrdSchema(schema(load("instances.yaml")))
    normalized = s.normalize(with_spec(INSTANCE, deviceUsage={"k-0": None, "k-1": ""}))
    assert normalized["spec"]["deviceUsage"] == {"k-1": ""}
    assert s.errors(normalized) == []


def test_it_accepts_an_akri_instance():
    assert errors(schema(load("instances.yaml")), INSTANCE) == []


def test_it_accepts_an_instance_without_defaulted_fields():
    spec = {"configurationName": "c", "cdiName": "akri.sh/c=8120fe", "capacity": 0}
    assert errors(schema(load("instances.yaml")), {"spec": spec}) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"capacity": -1},
        {"capacity": 1025},
        {"deviceUsage": {"k-0": 1}},
        {"nodes": [1]},
        {"shared": "true"},
        {"brokerProperties": {"A": True}},
    ],
)
def test_it_rejects_a_bad_instance(changes):
    assert errors(schema(load("instances.yaml")), with_spec(INSTANCE, **changes))


@pytest.mark.parametrize("field", ["configurationName", "cdiName", "capacity"])
def test_it_rejects_an_instance_without_a_required_field(field):
    spec = {k: v for k, v in INSTANCE["spec"].items() if k != field}
    assert errors(schema(load("instances.yaml")), {**INSTANCE, "spec": spec})


def test_it_rejects_an_instance_without_spec():
    assert errors(schema(load("instances.yaml")), {"metadata": {"name": "x"}})


def test_the_validator_itself_can_fail():
    # Guards the tests above: a validator that accepts everything would make them pass.
    def wrap(sub: dict) -> dict:
        return {"type": "object", "properties": {"x": sub}}

    assert errors(wrap({"type": "integer", "minimum": 1}), {"x": 0})
    assert errors(wrap({"type": "string", "pattern": "^a$"}), {"x": "b"})
    assert errors({"type": "object", "required": ["x"]}, {})
    nullable = {"type": "object", "nullable": True, "oneOf": [{"required": ["a"]}]}
    assert not errors(wrap(nullable), {"x": None})
