"""Lease election rules (agent.domain.lease): who may take the Lease, and what is written."""

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.domain.lease import (
    LeaseRecord,
    Timing,
    acquired_spec,
    may_acquire,
    microtime,
    released_spec,
)

NOW = dt.datetime(2026, 11, 24, 7, 0, 0, tzinfo=dt.UTC)
names = st.text("abc-_0123", min_size=1, max_size=6)


def test_anyone_may_take_a_missing_or_empty_lease():
    assert may_acquire(None, "a", 0.0)
    assert may_acquire(LeaseRecord(holder="", duration=10), "a", 0.0)


def test_the_holder_may_always_renew():
    assert may_acquire(LeaseRecord(holder="a", duration=10), "a", 0.0)


def test_a_rival_waits_until_the_record_is_unchanged_for_longer_than_the_lease():
    record = LeaseRecord(holder="a", duration=10)
    assert not may_acquire(record, "b", 10.0)
    assert may_acquire(record, "b", 10.01)


@given(names, names, st.floats(1, 60), st.floats(0, 120))
def test_a_rival_never_takes_a_live_lease(holder, me, duration, seen_for):
    record = LeaseRecord(holder=holder, duration=duration)
    if holder != me and seen_for <= duration:
        assert not may_acquire(record, me, seen_for)


def test_a_takeover_counts_a_transition_and_sets_the_acquire_time():
    old = LeaseRecord("a", 10, "2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:05.000000Z", 3)
    spec = acquired_spec(old, "b", Timing(10, 7, 2), NOW)
    assert spec == {
        "holderIdentity": "b",
        "leaseDurationSeconds": 10,
        "acquireTime": "2026-11-24T07:00:00.000000Z",
        "renewTime": "2026-11-24T07:00:00.000000Z",
        "leaseTransitions": 4,
    }


def test_a_renew_keeps_the_acquire_time_and_the_count():
    old = LeaseRecord("a", 10, "2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:05.000000Z", 3)
    spec = acquired_spec(old, "a", Timing(), NOW)
    assert spec["acquireTime"] == "2026-01-01T00:00:00.000000Z"
    assert spec["renewTime"] == "2026-11-24T07:00:00.000000Z"
    assert spec["leaseTransitions"] == 3


def test_a_first_holder_starts_at_zero_transitions():
    assert acquired_spec(None, "a", Timing(), NOW)["leaseTransitions"] == 0


def test_a_release_empties_the_holder_and_shortens_the_lease():
    spec = released_spec(LeaseRecord("a", 10, transitions=2), NOW)
    assert spec["holderIdentity"] == ""
    assert spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 2


@given(st.datetimes(min_value=dt.datetime(1970, 1, 1), timezones=st.just(dt.UTC)))
def test_microtime_always_has_six_fractional_digits(moment):
    text = microtime(moment)
    assert text.endswith("Z")
    assert len(text.split(".")[1]) == len("000000Z")
    assert dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC) == moment


def test_microtime_refuses_a_naive_datetime():
    with pytest.raises(ValueError):
        microtime(dt.datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("lease", "renew", "retry"),
    [(10, 10, 2), (10, 12, 2), (10, 2, 2), (10, 7, 0)],
)
def test_timing_refuses_combinations_that_allow_two_leaders_or_flapping(lease, renew, retry):
    with pytest.raises(ValueError):
        Timing(lease, renew, retry)


def test_the_default_timing_fails_over_within_15_seconds():
    assert Timing().worst_failover <= 15
