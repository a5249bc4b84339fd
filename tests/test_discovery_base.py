"""The discovery interface: devices, validation, the publisher every session uses, the registry."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.discovery.base import (
    MAX_DEVICES,
    MAX_PROPERTIES_PER_DEVICE,
    MAX_PROPERTY_NAME_LENGTH,
    MAX_PROPERTY_VALUE_BYTES,
    DevicePublisher,
    DeviceSpec,
    DiscoveredDevice,
    HandlerRegistry,
    InvalidDeviceList,
    Mount,
    PollingSession,
    merge_device_lists,
    screen_devices,
    validate_devices,
)


class Recorder:
    """Collects a session's callbacks and waits, with a bound, for what a test expects."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.lists: list[list[DiscoveredDevice]] = []
        self.errors: list[str] = []

    def on_devices(self, devices: list[DiscoveredDevice]) -> None:
        with self.cond:
            self.lists.append(devices)
            self.cond.notify_all()

    def on_error(self, message: str) -> None:
        with self.cond:
            self.errors.append(message)
            self.cond.notify_all()

    @property
    def ids(self) -> list[str] | None:
        with self.cond:
            return [d.id for d in self.lists[-1]] if self.lists else None

    def wait_for(self, predicate: Callable[[Recorder], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate`` holds; re-checked on every callback and every 10 ms, since
        it may also look at state that does not notify (scan counters, servers)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"timed out; lists={self.lists} errors={self.errors}"
                self.cond.wait(min(remaining, 0.01))

    def wait_for_ids(self, ids: list[str], timeout: float = 5.0) -> None:
        self.wait_for(lambda r: r.ids == ids, timeout)


def device(id: str, **properties: str) -> DiscoveredDevice:
    return DiscoveredDevice(id=id, properties=properties)


def test_a_device_is_hashable_and_its_properties_compare_to_a_dict():
    a = DiscoveredDevice(
        "cam",
        {"B": "2", "A": "1"},
        mounts=[Mount("/c", "/h", True)],
        device_specs=[DeviceSpec("/dev/x", "/dev/x", "rw")],
    )
    b = DiscoveredDevice("cam", {"A": "1", "B": "2"}, (Mount("/c", "/h", True),), (a.device_specs))
    assert a == b and hash(a) == hash(b)
    assert a.properties == {"A": "1", "B": "2"}
    assert list(a.properties) == ["A", "B"]
    assert isinstance(a.mounts, tuple)
    with pytest.raises(TypeError):
        a.properties["C"] = "3"  # type: ignore[index]


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ([device("")], "empty id"),
        ([device("a"), device("a")], "more than once"),
        ([device("a", **{"A" * (MAX_PROPERTY_NAME_LENGTH + 1): "x"})], "longer than"),
        ([device("a", V="x" * (MAX_PROPERTY_VALUE_BYTES + 1))], "more than 16384"),
        (
            [device("a", **{f"P{i}": "x" for i in range(MAX_PROPERTIES_PER_DEVICE + 1)})],
            "more than 128",
        ),
        ([device("a", **{"1ABC": "x"})], "not a valid environment variable name"),
        ([device("a", **{"A B": "x"})], "not a valid environment variable name"),
        ([DiscoveredDevice("a", mounts=(Mount("rel", "/h"),))], "not an absolute path"),
        ([DiscoveredDevice("a", device_specs=(DeviceSpec("/d", "/d", "rx"),))], "r, w and m"),
        ([DiscoveredDevice("a", device_specs=(DeviceSpec("/d", "/d", ""),))], "r, w and m"),
    ],
)
def test_it_refuses_invalid_device_lists(devices, message):
    with pytest.raises(InvalidDeviceList, match=message):
        validate_devices(devices)


def test_it_accepts_env_names_akri_handlers_emit_and_values_at_the_limit():
    validate_devices(
        [
            device(
                "/devices/x",
                **{
                    "USB_RESOURCE_AKRI_SH_UDEV-USB-KEYBOARD": "1",
                    "a.b": "2",
                    "_X": "y" * MAX_PROPERTY_VALUE_BYTES,
                },
            ),
            DiscoveredDevice("b", device_specs=(DeviceSpec("/dev/b", "/dev/b", "rwm"),)),
        ]
    )


def test_the_publisher_delivers_only_changes_sorted_by_id():
    rec = Recorder()
    pub = DevicePublisher("h", rec.on_devices, rec.on_error)
    assert pub.publish([]) is True  # the first list always goes, even an empty one
    assert pub.publish([device("b"), device("a")]) is True
    assert pub.publish([device("a"), device("b")]) is False
    assert [[d.id for d in lst] for lst in rec.lists] == [[], ["a", "b"]]


def test_the_publisher_leaves_a_bad_device_out_and_names_it_once(caplog):
    rec = Recorder()
    pub = DevicePublisher("h", rec.on_devices, rec.on_error)
    with caplog.at_level(logging.ERROR, logger="agent.discovery.base"):
        assert pub.publish([device("a"), device("x", **{"A=B": "1"})]) is True
        assert pub.publish([device("a"), device("x", **{"A=B": "1"})]) is False
        assert pub.publish([device("b"), device("x", **{"A=B": "1"})]) is True
    assert [[d.id for d in lst] for lst in rec.lists] == [["a"], ["b"]]
    [line] = [r.getMessage() for r in caplog.records]
    assert "h: 1 bad device(s) left out, the other 1 used: device 'x': property name 'A=B'" in line
    assert rec.errors == []


def test_the_publisher_refuses_an_oversized_list_whole_and_keeps_the_previous_one(caplog):
    rec = Recorder()
    pub = DevicePublisher("h", rec.on_devices, rec.on_error)
    pub.publish([device("a")])
    with caplog.at_level(logging.ERROR, logger="agent.discovery.base"):
        assert pub.publish([device(f"d{i}") for i in range(MAX_DEVICES + 1)]) is False
    assert rec.ids == ["a"] and pub.current == [device("a")]
    assert f"more than {MAX_DEVICES}" in rec.errors[-1]
    assert "keeping the previous one" in caplog.text
    # The next good list goes out even though unchanged, so the agent can clear the error.
    assert pub.publish([device("a")]) is True
    assert len(rec.lists) == 2


def test_screening_keeps_the_first_of_a_repeated_id_and_every_good_device():
    screened = screen_devices([device("a", N="1"), device(""), device("a", N="2"), device("b")])
    assert screened.accepted == (device("a", N="1"), device("b"))
    assert len(screened.problems) == 2
    assert "device #2 in the list has an empty id" in screened.problems[0]
    assert "'a' is reported more than once" in screened.problems[1]


@given(
    st.lists(
        st.builds(
            device,
            st.sampled_from(["", "a", "b", "c"]),
            **{"A": st.sampled_from(["1", "2"])},
        ),
        max_size=8,
    )
)
def test_screening_accepts_each_good_id_once_and_names_every_other_device(devices):
    screened = screen_devices(devices)
    ids = [d.id for d in screened.accepted]
    assert len(ids) == len(set(ids)) and "" not in ids
    assert set(ids) == {d.id for d in devices} - {""}
    assert len(screened.accepted) + len(screened.problems) == len(devices)
    validate_devices(list(screened.accepted))


endpoint_lists = st.lists(
    st.lists(st.builds(device, st.sampled_from(["a", "b", "c", "d"]), N=st.sampled_from("12"))),
    max_size=4,
)


@given(endpoint_lists, st.integers(min_value=0, max_value=3), st.lists(st.just(device("z"))))
def test_merging_keeps_every_endpoints_devices_and_one_list_never_erases_another(
    lists, changed, replacement
):
    merged = merge_device_lists(lists)
    assert [d.id for d in merged] == list(dict.fromkeys(d.id for lst in lists for d in lst))
    for d in merged:  # a shared id is the first endpoint's device
        assert d == next(x for lst in lists for x in lst if x.id == d.id)
    if changed < len(lists):
        others = {d.id for i, lst in enumerate(lists) if i != changed for d in lst}
        lists[changed] = replacement
        assert others <= {d.id for d in merge_device_lists(lists)}


def test_the_publisher_reports_an_error_once_until_something_else_happens():
    rec = Recorder()
    pub = DevicePublisher("h", rec.on_devices, rec.on_error)
    pub.error("down")
    pub.error("down")
    pub.publish([])
    pub.error("down")
    assert rec.errors == ["down", "down"]


def test_the_publisher_survives_a_failing_callback_and_stays_silent_after_close(caplog):
    def boom(devices):
        raise RuntimeError("agent bug")

    errors: list[str] = []
    pub = DevicePublisher("h", boom, errors.append)
    with caplog.at_level(logging.ERROR):
        assert pub.publish([device("a")]) is True
    assert "on_devices" in caplog.text
    pub.close()
    assert pub.publish([device("b")]) is False
    pub.error("late")
    assert errors == []


def test_the_registry_replaces_by_name_and_notifies_listeners():
    class Handler:
        shared = True

        def __init__(self, name):
            self.name = name

        def start(self, *args):  # pragma: no cover - never started here
            raise NotImplementedError

    registry = HandlerRegistry()
    seen: list[str] = []
    registry.add_listener(seen.append)
    registry.add_listener(lambda name: 1 / 0)  # a broken listener must not stop the others
    first, second = Handler("x"), Handler("x")
    registry.register(first)
    registry.register(Handler("a"))
    registry.register(second)
    assert registry.get("x") is second
    assert registry.names() == ["a", "x"]
    assert registry.unregister("x", first) is False
    assert registry.unregister("x") is True
    assert registry.get("x") is None
    assert seen == ["x", "a", "x", "x"]


def test_a_polling_session_reports_a_failing_step_and_keeps_polling():
    rec = Recorder()
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("sysfs went away")
        return [device("a")]

    session = PollingSession(
        "t", step, 0.01, DevicePublisher("t", rec.on_devices, rec.on_error)
    ).start()
    try:
        rec.wait_for_ids(["a"])
    finally:
        session.stop()
    assert rec.errors == ["t discovery failed: sysfs went away"]
