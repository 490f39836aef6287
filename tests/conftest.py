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


LAB_GROUP = "lab"
# niceness of an xdist worker while it runs a test outside the lab group: the lab's CPU vLLM ranks (started by the
# nodes' sshd, nice 0) keep both cores when they need them, and the unit tests fill the time the lab tests wait
UNIT_NICE = 15


def _in_lab_group(item) -> bool:
    """Lab tests (one machine-wide resource, shared session fixtures) and tests marked ``timed`` (they judge
    wall-clock against the reference server, so a starved worker would fail them) run on ONE worker, in order."""
    return (Path(TESTS) / "lab" in Path(str(item.fspath)).parents) or item.get_closest_marker("timed") is not None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """`make test` runs on two xdist workers with ``--dist loadgroup``: the lab group goes to one worker, the other
    unit tests to whichever worker is free. tryfirst: xdist's worker reads the mark in its own modifyitems hook
    (it turns it into the ``@lab`` node-id suffix the scheduler groups by), so the mark must be there first."""
    grouped = [item for item in items if _in_lab_group(item)]
    for item in grouped:
        item.add_marker(pytest.mark.xdist_group(LAB_GROUP))
    # nice the others only when a lab group shares the session (`make check` and `make test-unit` stay as they are)
    config.stash[_NICE_OTHERS] = any(Path(TESTS) / "lab" in Path(str(i.fspath)).parents for i in grouped)


_NICE_OTHERS = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not item.config.stash.get(_NICE_OTHERS, False):
        return
    want = 0 if _in_lab_group(item) else UNIT_NICE
    if os.getpriority(os.PRIO_PROCESS, 0) != want:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, want)
        except PermissionError:       # lowering it back needs root; without root there are no lab tests anyway
            pass
