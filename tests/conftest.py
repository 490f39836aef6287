"""Shared test support for every suite: ``tests/support`` (run-folder builders, ...) imports as
``support`` (``from support.runs import build_run``), so no test module imports another."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """`make test` runs on two xdist workers with ``--dist loadgroup``: every lab test goes to ONE worker, in
    file order (the lab is one machine-wide resource and its tests share session fixtures), the unit tests to
    whichever worker is free. tryfirst: xdist's worker reads the mark in its own modifyitems hook (it turns it
    into the ``@lab`` node-id suffix the scheduler groups by), so the mark must be there before that runs."""
    lab_dir = Path(TESTS) / "lab"
    for item in items:
        if lab_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.xdist_group("lab"))


# niceness of an xdist worker while it runs a unit test: the lab's CPU vLLM ranks (started by the nodes' sshd, nice 0)
# keep both cores when they need them, and the unit tests use the time the lab tests spend waiting
UNIT_NICE = 15


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    lab = Path(TESTS) / "lab" in Path(str(item.fspath)).parents
    want = 0 if lab else UNIT_NICE
    if os.getpriority(os.PRIO_PROCESS, 0) != want:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, want)
        except PermissionError:       # lowering it back needs root; without root there are no lab tests anyway
            pass
