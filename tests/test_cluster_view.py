"""The agent's in-memory view: newest object wins, and parsed slot views follow the object."""

from __future__ import annotations

from typing import Any

from agent.node.view import ClusterView


def instance(rv: str, usage: dict[str, str], capacity: int | None = 2) -> dict[str, Any]:
    spec: dict[str, Any] = {"configurationName": "cams", "deviceUsage": usage, "nodes": ["a"]}
    if capacity is not None:
        spec["capacity"] = capacity
    return {"metadata": {"name": "cam-1", "resourceVersion": rv}, "spec": spec}


def configuration(capacity: int) -> dict[str, Any]:
    details = "descriptions:\n- foo\n"
    return {
        "metadata": {"name": "cams"},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": details},
            "capacity": capacity,
        },
    }


def test_a_state_is_parsed_once_per_object_and_follows_each_new_one():
    view = ClusterView()
    view.put_instance(instance("1", {"cam-1-0": "", "cam-1-1": ""}))

    first = view.state("cam-1")
    assert first is view.state("cam-1") and view.states("cams") == [first]

    view.put_instance(instance("2", {"cam-1-0": "a", "cam-1-1": ""}))
    second = view.state("cam-1")
    assert second is not first and second.device_usage["cam-1-0"] == "a"

    assert view.put_instance(instance("1", {"cam-1-0": "", "cam-1-1": ""})) is None  # older
    assert view.state("cam-1") is second


def test_an_object_without_capacity_takes_the_configurations_as_it_changes():
    view = ClusterView()
    view.put_instance(instance("1", {"cam-1-0": ""}, capacity=None))
    view.put_configuration(configuration(3))
    assert view.state("cam-1").capacity == 3

    view.put_configuration(configuration(1))
    assert view.state("cam-1").capacity == 1


def test_a_dropped_instance_has_no_state_and_a_stale_object_is_still_parsed():
    view = ClusterView()
    old = instance("1", {"cam-1-0": "a", "cam-1-1": ""})
    view.put_instance(old)
    view.put_instance(instance("2", {"cam-1-0": "", "cam-1-1": ""}))

    # An object the caller held on to (an Allocate that read before the change) is parsed
    # as it is, not answered with the view's newer state.
    assert view.state_of(old).device_usage["cam-1-0"] == "a"
    assert view.state("cam-1").device_usage["cam-1-0"] == ""

    view.drop_instance("cam-1", "3")
    assert view.state("cam-1") is None and view.states("cams") == []
