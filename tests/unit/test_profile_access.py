"""Product code reads the profile's keys directly (``profile.min_tcp_gbps``): the profile is always a validated
:class:`~runbook.profile.Profile` (tests build real ones, ``support.profiles.profile_from``), so a ``getattr``
with a default or a ``hasattr`` on it only hides a misspelt key behind a restated default."""
from __future__ import annotations

import ast
from pathlib import Path

import runbook

PKG = Path(runbook.__file__).resolve().parent

#: keys read before they exist in the model (none now)
PENDING_KEYS: set[str] = set()


def _names_a_profile(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return text == "profile" or text.endswith(".profile") or text.endswith("_profile")


def _defaulted_reads() -> list[str]:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
                continue
            fn, target = node.func.id, node.args[0]
            key = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
            if not _names_a_profile(target) or key in PENDING_KEYS:
                continue
            if (fn == "getattr" and len(node.args) == 3) or fn == "hasattr":
                found.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_sees_a_defaulted_read():
    tree = ast.parse("x = getattr(step.profile, 'fabric_mtu', 9000)")
    call = tree.body[0].value
    assert _names_a_profile(call.args[0]) and len(call.args) == 3


def test_no_getattr_with_a_default_on_a_profile():
    assert list(PKG.rglob("*.py")), "no product modules found"
    assert _defaulted_reads() == []
