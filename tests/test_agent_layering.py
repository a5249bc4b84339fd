"""The agent owns its plugins; the plugins see only ``PluginHost`` (no import back)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from agent.node.agent import NodeAgent
from agent.node.host import PluginHost

NODE = Path(__file__).resolve().parents[1] / "agent" / "node"
PLUGIN_MODULES = ("plugin.py", "il.py", "cl.py", "host.py", "responses.py")


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_plugin_module_imports_the_agent_back():
    for name in PLUGIN_MODULES:
        assert "agent.node.agent" not in imported_modules(NODE / name), name


def test_the_node_agent_offers_everything_a_plugin_host_must():
    members = set(typing.get_type_hints(PluginHost)) | {
        name for name, value in vars(PluginHost).items() if callable(value) and name[0] != "_"
    }
    assert "claims" in members and "release_quietly" in members
    declared = set(typing.get_type_hints(NodeAgent.__init__)) | set(dir(NodeAgent))
    instance_attributes = {
        node.attr
        for node in ast.walk(ast.parse((NODE / "agent.py").read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    assert members <= declared | instance_attributes, members - declared - instance_attributes
