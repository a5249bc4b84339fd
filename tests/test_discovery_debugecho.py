"""debugEcho: Akri's test handler, embedded."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from agent.discovery import debugecho
from agent.discovery.base import DiscoveryError
from agent.discovery.debugecho import DebugEchoHandler, parse_descriptions

from .test_discovery_base import Recorder

DETAILS = "descriptions:\n- foo0\n- foo1\n"


@pytest.fixture
def availability_path():
    directory = tempfile.mkdtemp(prefix="d", dir="/tmp")
    yield os.path.join(directory, "debug-echo-availability.txt")
    shutil.rmtree(directory)


@pytest.fixture
def handler(availability_path):
    return DebugEchoHandler(availability_path=availability_path, poll_interval=0.02)


@pytest.fixture
def started(handler):
    sessions = []

    def start(details: str = DETAILS) -> Recorder:
        rec = Recorder()
        sessions.append(handler.start(details, {}, rec.on_devices, rec.on_error))
        return rec

    yield start
    for session in sessions:
        session.stop()


def test_it_reports_one_device_per_description(started):
    rec = started()
    rec.wait_for(lambda r: len(r.lists) == 1)
    foo0, foo1 = rec.lists[0]
    assert (foo0.id, foo1.id) == ("foo0", "foo1")
    assert foo0.properties == {"DEBUG_ECHO_DESCRIPTION": "foo0"}
    assert foo0.mounts == () and foo0.device_specs == ()
    assert rec.errors == []


def test_empty_descriptions_is_valid_and_reports_no_devices(started):
    rec = started("descriptions: []")
    rec.wait_for(lambda r: r.lists == [[]])


@pytest.mark.parametrize(
    ("details", "message"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("descriptions: [unclosed", "not valid YAML"),
        ("- foo0", "mapping with 'descriptions'"),
        ("description: [foo0]", "mapping with 'descriptions'"),
        ("descriptions: foo0", "list of strings"),
        ("descriptions: [1, 2]", "list of strings"),
        ("descriptions: [foo0, foo0]", "repeats foo0"),
    ],
)
def test_it_refuses_invalid_details(handler, details, message):
    with pytest.raises(DiscoveryError, match=message):
        handler.start(details, {}, lambda devices: None, lambda error: None)


def test_parse_descriptions_keeps_order():
    assert parse_descriptions(DETAILS) == ["foo0", "foo1"]


def test_offline_empties_the_list_and_online_restores_it(handler, started):
    rec = started()
    rec.wait_for_ids(["foo0", "foo1"])
    handler.set_available(False)
    rec.wait_for_ids([])
    handler.set_available(True)
    rec.wait_for_ids(["foo0", "foo1"])
    assert [len(lst) for lst in rec.lists] == [2, 0, 2]


def test_a_file_saying_offline_at_start_gives_an_empty_first_list(availability_path, started):
    with open(availability_path, "w") as f:
        f.write("status: OFFLINE\n")  # Akri looks for the word anywhere in the file
    rec = started()
    rec.wait_for(lambda r: r.lists == [[]])


def test_it_sends_only_on_change(monkeypatch, started):
    polls = []
    real = debugecho.is_available

    def counting(path):
        polls.append(path)
        return real(path)

    monkeypatch.setattr(debugecho, "is_available", counting)
    rec = started()
    rec.wait_for(lambda r: len(polls) >= 6)
    assert len(rec.lists) == 1


def test_no_callback_after_stop(handler):
    rec = Recorder()
    session = handler.start(DETAILS, {}, rec.on_devices, rec.on_error)
    rec.wait_for(lambda r: len(r.lists) == 1)
    session.stop()
    handler.set_available(False)
    assert not session._thread.is_alive()
    assert len(rec.lists) == 1


@pytest.mark.parametrize(("value", "shared"), [(None, True), ("true", True), ("false", False)])
def test_shared_comes_from_the_akri_env_variable(value, shared):
    env = {} if value is None else {"DEBUG_ECHO_INSTANCES_SHARED": value}
    assert DebugEchoHandler.from_env(env).shared is shared


def test_a_typo_in_the_shared_variable_is_an_error():
    with pytest.raises(ValueError, match="DEBUG_ECHO_INSTANCES_SHARED"):
        DebugEchoHandler.from_env({"DEBUG_ECHO_INSTANCES_SHARED": "ture"})


def test_the_defaults_are_akris():
    h = DebugEchoHandler()
    assert (h.name, h.shared, h.availability_path, h.poll_interval) == (
        "debugEcho",
        True,
        "/tmp/debug-echo-availability.txt",
        10.0,
    )
