"""Names and formats shared with Akri v0.13 (akri-compat.md §3, §4.1)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.domain.naming import (
    broker_envs,
    cdi_name,
    cl_device_id,
    cl_resource_name,
    digest_from_instance_name,
    env_suffix,
    il_resource_name,
    instance_digest,
    instance_name,
    is_dns_label,
    is_dns_subdomain,
    is_property_name,
    is_qualified_name,
    is_resource_name_valid,
    parse_cl_device_id,
    plugin_socket_name,
    plugin_socket_path,
    slot_index,
    slot_key,
)

names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True)


@pytest.mark.parametrize(
    ("device_id", "shared", "node", "digest"),
    [
        ("my_shared_device", True, "my_node", "4294ea"),
        ("my_local_device", False, "my_node", "e77db4"),
        ("my_local_device", False, "my_other_node", "099763"),
        ("foo0", True, "node-a", "8120fe"),
        ("foo1", True, "node-a", "a19705"),
        ("bar0", True, "node-a", "d46b65"),
        ("bar1", True, "node-a", "ab76e6"),
    ],
)
def test_instance_digest_matches_akri_vectors(device_id, shared, node, digest):
    assert instance_digest(device_id, shared, node) == digest


def test_shared_digest_ignores_the_node():
    assert instance_digest("foo0", True, "node-a") == instance_digest("foo0", True, "node-b")


def test_unshared_digest_is_id_and_node_without_separator():
    assert instance_digest("ab", False, "c") == instance_digest("a", False, "bc")
    assert instance_digest("ab", False, "c") == instance_digest("abc", True, "")


def test_instance_and_cdi_names():
    assert instance_name("akri-debug-echo-foo", "8120fe") == "akri-debug-echo-foo-8120fe"
    assert cdi_name("akri-debug-echo-foo", "8120fe") == "akri.sh/akri-debug-echo-foo=8120fe"
    assert instance_name("a.b", "8120fe") == "a.b-8120fe"  # v0.13 keeps dots


def test_digest_from_instance_name():
    assert digest_from_instance_name("cfg", "cfg-8120fe") == "8120fe"
    assert digest_from_instance_name("cfg", "cfg-8120FE") is None
    assert digest_from_instance_name("cfg", "other-8120fe") is None
    assert digest_from_instance_name("cfg", "cfg-8120fe-0") is None


def test_slot_keys():
    assert slot_key("cfg-8120fe", 0) == "cfg-8120fe-0"
    assert slot_index("cfg-8120fe", "cfg-8120fe-0") == 0
    assert slot_index("cfg-8120fe", "cfg-8120fe-17") == 17
    with pytest.raises(ValueError):
        slot_key("cfg-8120fe", -1)


@pytest.mark.parametrize(
    "key",
    [
        "cfg-8120fe",
        "cfg-8120fe-",
        "cfg-8120fe-01",
        "cfg-8120fe--1",
        "cfg-8120fe-+1",
        "cfg-8120fe-1.0",
        "cfg-8120fe-a",
        "cfg-8120fe-١",  # a non-ASCII digit
        "cfg-a19705-0",
        "cfg-8120fe-0-1",
        "cfg-8120fe-" + "9" * 5000,
        "",
    ],
)
def test_slot_index_refuses_keys_of_other_instances_and_odd_spellings(key):
    assert slot_index("cfg-8120fe", key) is None


@given(names, st.integers(min_value=0, max_value=10**6))
def test_slot_key_round_trips(instance, index):
    assert slot_index(instance, slot_key(instance, index)) == index


@given(names, st.text(max_size=20))
def test_slot_index_accepts_only_canonical_keys(instance, suffix):
    key = f"{instance}-{suffix}"
    index = slot_index(instance, key)
    assert index is None or slot_key(instance, index) == key


def test_resource_names():
    assert il_resource_name("cfg-8120fe") == "akri.sh/cfg-8120fe"
    assert cl_resource_name("cfg") == "akri.sh/cfg"


def test_cl_device_ids():
    assert cl_device_id("cfg", 3) == "cfg-3"
    assert parse_cl_device_id("cfg", "cfg-3") == 3
    assert parse_cl_device_id("cfg", "3") is None  # v0.12 bare numbers
    assert parse_cl_device_id("cfg", "other-3") is None
    assert parse_cl_device_id("cfg", "cfg-03") is None
    with pytest.raises(ValueError):
        cl_device_id("cfg", -1)


@given(names, st.integers(min_value=0, max_value=10**6))
def test_cl_device_id_round_trips(configuration, n):
    assert parse_cl_device_id(configuration, cl_device_id(configuration, n)) == n


def test_broker_envs_emit_plain_and_suffixed_names():
    assert env_suffix("8120fe") == "8120FE"
    assert broker_envs({"DEBUG_ECHO_DESCRIPTION": "foo0"}, "8120fe") == {
        "DEBUG_ECHO_DESCRIPTION": "foo0",
        "DEBUG_ECHO_DESCRIPTION_8120FE": "foo0",
    }
    assert broker_envs({}, "8120fe") == {}


@given(st.dictionaries(st.from_regex(r"[A-Z_]{1,8}", fullmatch=True), st.text(max_size=5)))
def test_broker_envs_contains_every_property_both_ways(properties):
    envs = broker_envs(properties, "ab76e6")
    for key in properties:
        assert key in envs
        assert f"{key}_AB76E6" in envs
    assert len(envs) <= 2 * len(properties)


def test_plugin_socket_names():
    assert plugin_socket_name("cfg-8120fe", 1700000000) == "cfg-8120fe-1700000000.sock"
    assert plugin_socket_path("cfg", 5) == "/var/lib/kubelet/device-plugins/cfg-5.sock"


def test_kubernetes_name_rules():
    assert is_dns_label("node-a")
    assert not is_dns_label("Node-a")
    assert not is_dns_label("a" * 64)
    assert not is_dns_label("a.b")
    assert is_dns_subdomain("a.b-c")
    assert not is_dns_subdomain("-a")
    assert not is_dns_subdomain("a" * 254)
    assert is_qualified_name("akri.sh/cfg-8120fe")
    assert is_qualified_name("plain")
    assert not is_qualified_name("Akri.sh/x")
    assert not is_qualified_name("akri.sh/")
    assert not is_qualified_name("akri.sh/" + "a" * 64)


def test_long_instance_names_make_invalid_resource_names():
    assert is_resource_name_valid(il_resource_name("c" * 56 + "-8120fe"))
    assert not is_resource_name_valid(il_resource_name("c" * 57 + "-8120fe"))
    assert not is_resource_name_valid("no-prefix")


def test_property_names():
    assert is_property_name("_a1")
    assert is_property_name("DEBUG_ECHO")
    assert not is_property_name("1a")
    assert not is_property_name("a-b")
    assert not is_property_name("a\n")
    assert not is_property_name("")
