"""deviceUsage values, slot views, IL health and resizing (akri-compat.md §2, §4.3)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.domain.naming import slot_index, slot_key
from agent.domain.slots import (
    FREE,
    HEALTHY,
    UNHEALTHY,
    InstanceState,
    SlotView,
    Usage,
    UsageKind,
    format_cl,
    format_il,
    holders,
    il_devices,
    il_health,
    initial_usage,
    parse_usage,
    resize_usage,
    slot_views,
    stray_keys,
)

INST = "cfg-8120fe"
parts = st.text(st.characters(blacklist_characters=":"), min_size=1, max_size=12)
values = st.one_of(
    st.just(""),
    parts,
    st.builds(lambda v, n: f"C:{v}:{n}", parts, parts),
    st.text(max_size=12),
)


def k(i: int) -> str:
    return slot_key(INST, i)


@pytest.mark.parametrize(
    ("value", "usage"),
    [
        (None, FREE),
        ("", FREE),
        ("node-a", Usage(UsageKind.NODE, node="node-a", raw="node-a")),
        ("C", Usage(UsageKind.NODE, node="C", raw="C")),
        (
            "C:cfg-0:node-b",
            Usage(UsageKind.CONFIG, node="node-b", vdev="cfg-0", raw="C:cfg-0:node-b"),
        ),
        ("C:0:node-b", Usage(UsageKind.CONFIG, node="node-b", vdev="0", raw="C:0:node-b")),
    ],
)
def test_parse_usage_known_formats(value, usage):
    assert parse_usage(value) == usage


@pytest.mark.parametrize(
    "value",
    ["C:node-a", "N:node-a", "C::node-a", "C:cfg-0:", "X:cfg-0:node-a", "C:a:b:c", ":", "a:", ":a"],
)
def test_parse_usage_reports_other_values_as_foreign(value):
    assert parse_usage(value) == Usage(UsageKind.FOREIGN, raw=value)


def test_parse_usage_reports_non_strings_as_foreign():
    assert parse_usage(3) == Usage(UsageKind.FOREIGN, raw="3")


def test_format_refuses_values_that_would_not_parse_back():
    with pytest.raises(ValueError):
        format_il("")
    with pytest.raises(ValueError):
        format_il("a:b")
    with pytest.raises(ValueError):
        format_cl("cfg-0", "")
    with pytest.raises(ValueError):
        format_cl("a:b", "node")


@given(parts)
def test_il_format_round_trips(node):
    assert parse_usage(format_il(node)) == Usage(UsageKind.NODE, node=node, raw=node)


@given(parts, parts)
def test_cl_format_round_trips(vdev, node):
    value = format_cl(vdev, node)
    assert parse_usage(value) == Usage(UsageKind.CONFIG, node=node, vdev=vdev, raw=value)


@given(values)
def test_parse_usage_keeps_the_raw_value(value):
    assert parse_usage(value).raw == value


def test_held_by():
    assert parse_usage("node-a").held_by("node-a")
    assert parse_usage("C:cfg-0:node-a").held_by("node-a")
    assert not parse_usage("C:cfg-0:node-a").held_by("node-b")
    assert not parse_usage("").held_by("")
    assert not parse_usage("C:node-a").held_by("node-a")


def test_slot_views_treat_missing_keys_as_free():
    views = slot_views(INST, 3, {k(1): "node-a"})
    assert [(v.key, v.index, v.usage.kind, v.surplus) for v in views] == [
        (k(0), 0, UsageKind.FREE, False),
        (k(1), 1, UsageKind.NODE, False),
        (k(2), 2, UsageKind.FREE, False),
    ]
    assert slot_views(INST, 2, None) == slot_views(INST, 2, {})


def test_slot_views_show_held_surplus_and_hide_free_surplus_and_stray_keys():
    usage = {k(0): "", k(3): "node-a", k(2): "", k(5): "junk:", "other-0": "node-a", k(1): ""}
    views = slot_views(INST, 2, usage)
    assert [v.key for v in views] == [k(0), k(1), k(3), k(5)]
    assert views[2] == SlotView(k(3), 3, parse_usage("node-a"), True)
    assert views[3].usage.kind is UsageKind.FOREIGN
    assert stray_keys(INST, usage) == {"other-0": "node-a"}


@pytest.mark.parametrize(
    ("value", "surplus", "health"),
    [
        ("", False, HEALTHY),
        ("node-a", False, HEALTHY),
        ("node-b", False, UNHEALTHY),
        ("C:cfg-0:node-a", False, UNHEALTHY),
        ("C:cfg-0:node-b", False, UNHEALTHY),
        ("C:node-a", False, UNHEALTHY),
        ("node-a", True, UNHEALTHY),
    ],
)
def test_il_health_on_node_a(value, surplus, health):
    assert il_health(parse_usage(value), "node-a", surplus=surplus) == health


def test_il_devices_lists_every_slot_with_its_health():
    usage = {k(0): "node-a", k(1): "node-b", k(3): "node-a"}
    assert il_devices(INST, 3, usage, "node-a") == [
        (k(0), HEALTHY),
        (k(1), UNHEALTHY),
        (k(2), HEALTHY),
        (k(3), UNHEALTHY),
    ]


def test_initial_usage_prefills_free_keys():
    assert initial_usage(INST, 2) == {k(0): "", k(1): ""}
    assert initial_usage(INST, 0) == {}


def test_resize_grows_with_free_slots():
    assert resize_usage(INST, {k(0): "node-a"}, 3) == {k(0): "node-a", k(1): "", k(2): ""}


def test_resize_shrinks_only_free_slots():
    usage = {k(0): "", k(1): "node-a", k(2): "", k(3): "C:0:x", "stray": "", k(4): "?:"}
    assert resize_usage(INST, usage, 1) == {
        k(0): "",
        k(1): "node-a",
        k(3): "C:0:x",
        "stray": "",
        k(4): "?:",
    }


def test_resize_refuses_negative_capacity():
    with pytest.raises(ValueError):
        resize_usage(INST, {}, -1)


usages = st.dictionaries(
    st.one_of(st.integers(0, 8).map(k), st.sampled_from(["stray", f"{INST}-01"])),
    values,
    max_size=8,
)


@given(usages, st.integers(0, 8))
def test_resize_never_drops_a_held_or_foreign_slot(usage, capacity):
    resized = resize_usage(INST, usage, capacity)
    for key, value in usage.items():
        if not parse_usage(value).is_free or slot_index(INST, key) is None:
            assert resized[key] == value
    for i in range(capacity):
        assert k(i) in resized
    for key, value in resized.items():
        index = slot_index(INST, key)
        if index is not None and index >= capacity:
            assert not parse_usage(value).is_free


@given(usages, st.integers(0, 8))
def test_every_non_free_slot_key_appears_in_slot_views(usage, capacity):
    keys = {v.key for v in slot_views(INST, capacity, usage)}
    for key, value in usage.items():
        if slot_index(INST, key) is not None and not parse_usage(value).is_free:
            assert key in keys


def state(usage: dict, capacity: int = 3, nodes=("node-a",)) -> InstanceState:
    return InstanceState(INST, "cfg", capacity, usage, tuple(nodes))


def test_instance_state_helpers():
    s = state({k(0): "node-a", k(1): "", k(2): "C:cfg-0:node-a", k(4): "node-a"})
    assert s.free_slots() == [k(1)]
    assert s.held_by("node-a") == [k(0), k(2), k(4)]
    assert s.held_by("node-b") == []
    assert s.used_count() == 2
    assert s.usable_by("node-a") and not s.usable_by("node-b")
    assert s.view(k(4)).surplus
    assert s.view(k(3)) is None
    assert s.usage(k(9)) == FREE


def test_instance_state_is_a_snapshot():
    usage = {k(0): ""}
    s = state(usage)
    usage[k(0)] = "node-a"
    assert s.free_slots() == [k(0), k(1), k(2)]
    with pytest.raises(TypeError):
        s.device_usage[k(0)] = "node-a"


def test_instance_state_from_an_akri_v013_object():
    obj = {
        "metadata": {"name": INST, "resourceVersion": "7"},
        "spec": {"configurationName": "cfg", "cdiName": "akri.sh/cfg=8120fe", "capacity": 2},
    }
    s = InstanceState.from_object(obj)
    assert (s.name, s.configuration, s.capacity, s.nodes, s.shared) == (INST, "cfg", 2, (), False)
    assert s.device_usage == {}
    assert not s.device_usage_present


def test_instance_state_from_an_akri_v012_object_infers_capacity():
    obj = {"metadata": {"name": INST}, "spec": {"deviceUsage": {k(0): "", k(1): "node-a"}}}
    assert InstanceState.from_object(obj).capacity == 2
    assert InstanceState.from_object(obj, default_capacity=5).capacity == 5
    assert InstanceState.from_object(obj).device_usage_present


def test_holders_groups_slots_by_node():
    a = state({k(0): "node-a", k(1): "C:cfg-0:node-b", k(2): "junk:"})
    assert holders([a]) == {"node-a": [(INST, k(0))], "node-b": [(INST, k(1))]}
