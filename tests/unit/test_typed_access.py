"""Fields that always exist are read as attributes: no ``getattr(x, "field", default)`` on a node's spec, a command's
result or a node in the package (a default there hides a renamed field and quietly answers for a test double that
lacks it), and no ``SimpleNamespace`` standing in for those types in the unit tests (``support.doubles`` has the
real ones: ``FakeNode``, ``FakeCluster``, ``res``)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from runbook.profile import NodeSpec
from runbook.remote import Cluster, CommandLog, CommandResult
from support.profiles import profile_from

ROOT = Path(__file__).resolve().parents[2]
NODE_SURFACE = {"name", "spec", "dry_run"}          # every Node has them (checked below on a real one)
# every field and property of the types every step reads, and the node's own surface
ALWAYS_THERE = ({f.name for f in dataclasses.fields(NodeSpec)} | {"host_ip", "socket_if", "is_head"}
                | {f.name for f in dataclasses.fields(CommandResult)} | {"ok"}
                | NODE_SURFACE)
DOUBLED = {f.name for f in dataclasses.fields(CommandResult)} | {"ok", "read", "run", "nodes", "spec", "fabric_ip"}


def getattr_defaults(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" and len(node.args) == 3
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in ALWAYS_THERE):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return out


def namespace_doubles(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("SimpleNamespace"):
            doubled = sorted({k.arg for k in node.keywords} & DOUBLED)
            if doubled:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: SimpleNamespace({', '.join(doubled)}, ...)")
    return out


def test_the_checks_see_what_they_look_for(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text('a = getattr(node.spec, "gid", None)\nb = getattr(res, "dry_run", False)\nc = getattr(o, "x", 1)\n'
                   'from types import SimpleNamespace\nd = SimpleNamespace(stdout="", exit_code=1)\n'
                   'e = SimpleNamespace(root=1)\n')
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert [line.split(": ", 1)[1] for line in getattr_defaults(bad)] == [
            "getattr(node.spec, 'gid', None)", "getattr(res, 'dry_run', False)"]
        assert namespace_doubles(bad) == ["x.py:5: SimpleNamespace(exit_code, stdout, ...)"]
    finally:
        ROOT = root
    assert {"gid", "socket_if", "bootstrap_ip", "stdout", "stderr", "dry_run", "name"} <= ALWAYS_THERE
    node = Cluster.offline(profile_from("env/lab.env"), facts={}, log=CommandLog(None)).head   # a real Node, offline
    assert all(hasattr(node, n) for n in NODE_SURFACE)


def test_no_getattr_default_on_a_field_that_always_exists():
    files = sorted((ROOT / "runbook").rglob("*.py"))
    assert len(files) > 100
    found = [hit for f in files for hit in getattr_defaults(f)]
    assert not found, "read these as attributes (the field always exists):\n" + "\n".join(found)


def test_no_namespace_stands_in_for_a_node_or_a_command_result():
    files = sorted((ROOT / "tests" / "unit").rglob("test_*.py"))
    assert len(files) > 50
    found = [hit for f in files for hit in namespace_doubles(f)]
    assert not found, "use support.doubles (FakeNode, FakeCluster, res) instead:\n" + "\n".join(found)
