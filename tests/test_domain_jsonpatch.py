"""The RFC 6902 applier used to check our conditional patches (and by the simulator)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.domain.jsonpatch import (
    JsonPatchError,
    JsonPatchTestFailed,
    apply_json_patch,
    json_equal,
    parse_pointer,
    pointer,
)

DOC = {"a": {"b": 1, "c/d": 2, "e~f": 3}, "l": [1, 2, 3]}


def test_pointer_escapes_tilde_and_slash():
    assert pointer("spec", "deviceUsage", "a/b~c") == "/spec/deviceUsage/a~1b~0c"
    assert parse_pointer("/spec/deviceUsage/a~1b~0c") == ["spec", "deviceUsage", "a/b~c"]
    assert parse_pointer("/~01") == ["~1"]  # unescape ~1 before ~0
    assert parse_pointer("") == []


@given(st.lists(st.text(max_size=6), max_size=4))
def test_pointer_round_trips(tokens):
    assert parse_pointer(pointer(*tokens)) == tokens


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([{"op": "add", "path": "/a/x", "value": 9}], {**DOC, "a": {**DOC["a"], "x": 9}}),
        ([{"op": "add", "path": "/l/1", "value": 9}], {**DOC, "l": [1, 9, 2, 3]}),
        ([{"op": "add", "path": "/l/-", "value": 9}], {**DOC, "l": [1, 2, 3, 9]}),
        ([{"op": "remove", "path": "/a/c~1d"}], {**DOC, "a": {"b": 1, "e~f": 3}}),
        ([{"op": "remove", "path": "/l/0"}], {**DOC, "l": [2, 3]}),
        ([{"op": "replace", "path": "/a/e~0f", "value": 0}], {**DOC, "a": {**DOC["a"], "e~f": 0}}),
        ([{"op": "test", "path": "/a/b", "value": 1}], DOC),
        (
            [{"op": "move", "from": "/a/b", "path": "/z"}],
            {**DOC, "a": {"c/d": 2, "e~f": 3}, "z": 1},
        ),
        ([{"op": "copy", "from": "/l", "path": "/m"}], {**DOC, "m": [1, 2, 3]}),
        ([{"op": "replace", "path": "", "value": 5}], 5),
    ],
)
def test_ops(ops, expected):
    assert apply_json_patch(DOC, ops) == expected


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "remove", "path": "/a/missing"}],
        [{"op": "replace", "path": "/a/missing", "value": 1}],
        [{"op": "add", "path": "/missing/x", "value": 1}],
        [{"op": "add", "path": "/l/5", "value": 1}],
        [{"op": "add", "path": "/l/01", "value": 1}],
        [{"op": "remove", "path": "/l/3"}],
        [{"op": "test", "path": "/missing", "value": 1}],
        [{"op": "move", "from": "/a", "path": "/a/x"}],
        [{"op": "frobnicate", "path": "/a"}],
        [{"op": "add", "path": "/a/x"}],
        [{"op": "add", "path": "a", "value": 1}],
        [{"op": "add", "path": "/a/b/c", "value": 1}],
        ["not an op"],
    ],
)
def test_bad_ops_raise(ops):
    with pytest.raises(JsonPatchError):
        apply_json_patch(DOC, ops)


def test_a_patch_must_be_a_list():
    with pytest.raises(JsonPatchError):
        apply_json_patch(DOC, {"op": "test", "path": "", "value": DOC})


def test_failed_test_raises_and_leaves_the_document_alone():
    doc = {"a": {"b": 1}}
    ops = [
        {"op": "replace", "path": "/a/b", "value": 2},
        {"op": "test", "path": "/a/b", "value": 1},
    ]
    with pytest.raises(JsonPatchTestFailed):
        apply_json_patch(doc, ops)
    assert doc == {"a": {"b": 1}}


def test_json_equality_is_not_python_equality():
    assert not json_equal(True, 1)
    assert not json_equal(0, False)
    assert json_equal(1, 1.0)
    assert json_equal({"a": [1, {"b": ""}]}, {"a": [1, {"b": ""}]})
    assert not json_equal([1, 2], [2, 1])
    assert not json_equal("", None)
