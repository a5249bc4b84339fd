"""Kubernetes quantities, read as the API server writes them (issue 27).

The API server stores quantities canonically (``1000`` -> ``1k``), and ``1Gi`` or ``1e3`` are
valid requests; the project's reader (``agent.sharing.pods.quantity``) and the simulator's
canonical form (``agent.simulator.quantity``) are checked over the whole grammar.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.sharing.pods import quantity, requests_of
from agent.sharing.policy import Code, PolicyError
from agent.simulator.quantity import canonical, parse
from tests.sharing_world import gpu_node, pod, policies

SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"]

digits = st.text("0123456789", min_size=1, max_size=6)
numbers = st.one_of(
    digits,
    st.builds(lambda a, b: f"{a}.{b}", digits, st.text("0123456789", max_size=4)),
    st.builds(lambda b: f".{b}", digits),
)
suffixes = st.one_of(
    st.sampled_from(SUFFIXES),
    st.builds(lambda e, n: f"{e}{n}", st.sampled_from(["e", "E"]), st.integers(-4, 9)),
)
quantities = st.builds(
    lambda sign, n, s: f"{sign}{n}{s}", st.sampled_from(["", "+", "-"]), numbers, suffixes
)


@given(quantities)
def test_every_quantity_of_the_grammar_is_read_or_refused_in_words(text):
    value, _ = parse(text)
    try:
        read = quantity(text, "example.com/x")
    except PolicyError as exc:
        assert value < 0 or value != value.to_integral_value(), text
        assert "example.com/x" in str(exc)
        return
    assert value >= 0 and value == value.to_integral_value(), text
    assert read == int(value)


@given(quantities)
def test_the_canonical_form_keeps_the_value_and_is_stable(text):
    value, _ = parse(text)
    form = canonical(text)
    assert canonical(form) == form
    again, _ = parse(form)
    # Precision beyond 10^-9 is rounded up (away from zero), as the API server does.
    assert abs(again - value) < Decimal("1e-9"), (text, form)
    if value == value.to_integral_value() and value >= 0:
        assert quantity(form, "example.com/x") == int(value)


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        ("1000", "1k"),
        ("2000", "2k"),
        ("1500", "1500"),
        ("1024", "1024"),
        ("1Gi", "1Gi"),
        ("2048Ki", "2Mi"),
        ("1.5Gi", "1536Mi"),
        ("0.5", "500m"),
        ("1e3", "1e3"),
        ("12e2", "1200"),
        ("0", "0"),
        (1000, "1k"),
    ],
)
def test_canonical_forms_as_a_real_api_server_stores_them(written, stored):
    assert canonical(written) == stored


@pytest.mark.parametrize(
    ("value", "count"), [("1k", 1000), ("2k", 2000), ("1Gi", 1 << 30), ("1e3", 1000), (3, 3)]
)
def test_forms_the_api_server_writes_are_read(value, count):
    assert quantity(value, "volcano.sh/gpu-memory") == count


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("500m", "not a whole number"),
        ("1.5", "not a whole number"),
        ("-1", "negative"),
        ("lots", "not a Kubernetes quantity"),
        (" 3", "not a Kubernetes quantity"),
        (True, "not a Kubernetes quantity"),
        (None, "not a Kubernetes quantity"),
    ],
)
def test_a_quantity_that_is_no_count_of_devices_is_refused_in_words(value, words):
    with pytest.raises(PolicyError, match=words):
        quantity(value, "akri.sh/cam")


def test_a_pod_asking_1k_of_gpu_memory_on_a_node_of_2k_fits():
    node = gpu_node("n1", 2, 1000)
    node["status"]["capacity"] = {"volcano.sh/gpu-number": "2", "volcano.sh/gpu-memory": "2k"}
    share = policies("n1", node_obj=node)["gpushare"]
    asking = pod({"volcano.sh/gpu-memory": "1k"})

    assert requests_of(asking, "volcano.sh/") == {"volcano.sh/gpu-memory": 1000}
    assert share.filter_node(asking) == (Code.SUCCESS, "")
    assert "2 cards" in share.status() or "1000" in share.status()


def test_a_fractional_extended_request_is_the_pods_error_verdict():
    share = policies("n1", node_obj=gpu_node("n1", 2, 1000))["gpushare"]

    code, reason = share.filter_node(pod({"volcano.sh/gpu-memory": "500m"}))

    assert code is Code.ERROR
    assert "volcano.sh/gpu-memory" in reason and "whole number" in reason
