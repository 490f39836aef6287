"""How the standalone tools run on a node: the files shipped and where (each node's own tools dir),
the python, source and packed dir each node uses, node paths quoted for its shell, and a tool's JSON
line read back.

The node-side work is done by stdlib-only scripts in this directory, copied side by side into a
per-node tools dir with ``node.put`` (``ship_tools``) and run with the node's ``python3`` via
``node.run`` (docs/DESIGN.md, remote layer). A script imports only its siblings, so whatever a shipped
script imports must be in its file set: ``pack.py`` needs ``pack_partial.py``, ``pack_writer.py`` and
``layout.py`` beside it. Each prints one JSON line last (``parse_tool_json``).

This module runs on the runbook's machine and is never shipped (not in :data:`TOOL_FILES`): step 03 and the lab's
Engram source (``runbook.lab.engram_source``) both ship and read the tools through it, so it sits below them both.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..facts.node_paths import on_node
from ..facts import node_paths
from ..remote import private_dir_command

HERE = Path(__file__).resolve().parent      # the scripts shipped to the nodes (this directory)
TOOL_FILES = ("layout.py", "pack.py", "pack_partial.py", "pack_writer.py", "check.py", "probe.py", "slim.py")
LAB_TOOL_FILES = ("layout.py", "synth.py")
# under the SSH user's own home (like step 02's tools): a dir in /tmp is the first user's, and refused to the next
# (root rehearsed first, then the non-root operator: "belongs to uid 0, not to spark")
DEFAULT_TOOLS_DIR = "~/.cache/spark-runbook/engram-tools"


def tool_paths(files: Iterable[str] = TOOL_FILES) -> list[Path]:
    return [HERE / name for name in files]


shell_path = node_paths.shell_path      # the one quoting of a node path (step 03's modules take it from here)


def node_tools_dir(tools_dir: str, name: str) -> str:
    """One tools dir per node: two nodes may share a directory (the lab's share /tmp), and a file being replaced
    by one node's ``put`` must never be the script the other node is running."""
    return f"{tools_dir.rstrip('/')}/{name}"


# -- per node: its facts' overrides, its source and packed dir ----------------------

def node_facts(facts: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    return (facts or {}).get(name, {}) or {}


def src_of(profile, nf: Mapping[str, Any]) -> str:
    return str(nf.get("engram_src_dir") or profile.engram_src_dir)


def packed_of(profile, nf: Mapping[str, Any]) -> str:
    return str(nf.get("engram_packed_dir") or profile.engram_packed_dir)


# -- running a tool ----------------------------------------------------------------------------

def ship_tools(node, tools_dir: str = DEFAULT_TOOLS_DIR, files: Iterable[str] = TOOL_FILES) -> str:
    """Copy the standalone scripts into this node's own tools dir (private: 0700 and ours, parent included);
    returns that dir."""
    tools_dir = on_node(node, tools_dir, key="the Engram tools dir")        # `~/…`: this node's home
    tdir = node_tools_dir(tools_dir, node.name)
    node.run(private_dir_command(tools_dir, tdir), timeout=30)
    for path in tool_paths(files):
        node.put(path, f"{tdir}/{path.name}")
    return tdir


def is_dry(node, res=None) -> bool:
    """The command was only recorded, not run (dry run)."""
    return bool((res is not None and res.dry_run) or node.dry_run)


def parse_tool_json(stdout: str, tool: str) -> dict[str, Any]:
    """The last JSON line a tool printed (``{"tool": tool, ...}``), or ``{}``."""
    for line in reversed((stdout or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("tool") == tool:
                return obj
    return {}


def last_json(stdout: str) -> dict[str, Any]:
    for line in reversed((stdout or "").splitlines()):
        if line.strip().startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}


def tail_line(text: str) -> str:
    """The last line of a tool's stderr (or stdout), for a row's observed text."""
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else ""


def parse_stat_lines(text: str) -> dict[str, int]:
    """``stat -c '%s %n'`` lines -> {base name: size}."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        size, _, path = line.strip().partition(" ")
        if size.isdigit() and path:
            out[path.rsplit("/", 1)[-1]] = int(size)
    return out
