"""Shared test support for every suite: ``tests/support`` (run-folder builders, ...) imports as
``support`` (``from support.runs import build_run``), so no test module imports another."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


def pytest_collection_modifyitems(config, items):
    """`make test` runs on two xdist workers with ``--dist loadgroup``: every lab test goes to ONE worker, in
    file order (the lab is one machine-wide resource and its tests share session fixtures), while the unit
    tests run on the other; without xdist the mark does nothing."""
    lab_dir = Path(TESTS) / "lab"
    for item in items:
        if lab_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.xdist_group("lab"))
