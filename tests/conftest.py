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


from support.lab_group import LAB, in_lab_group  # noqa: E402  (needs TESTS on sys.path, above)

# niceness of an xdist worker while it runs a test outside the lab group: the lab's CPU vLLM ranks (started by the
# nodes' sshd, nice 0) keep both cores when they need them, and the unit tests fill the time the lab tests wait
UNIT_NICE = 15


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs on two xdist workers with ``--dist loadgroup``: the lab group is ONE work unit (one worker,
    in collection order), every other test its own. xdist's own grouping (the ``xdist_group`` mark) writes the
    group into ``item._nodeid``, which pytest 9 no longer reads (node ids live in ``item._id``), so the lab tests
    were spread over both workers; the scheduler decides from the node id instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class LabGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "lab" if in_lab_group(nodeid) else nodeid

    return LabGroupScheduling(config, log)


_NICE_OTHERS = pytest.StashKey[bool]()


def pytest_collection_modifyitems(config, items):
    # nice the others only when lab tests share the session (`make check` and `make test-unit` stay as they are)
    config.stash[_NICE_OTHERS] = any(LAB in Path(str(item.fspath)).parents for item in items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not item.config.stash.get(_NICE_OTHERS, False):
        return
    want = 0 if in_lab_group(item.nodeid) else UNIT_NICE
    if os.getpriority(os.PRIO_PROCESS, 0) != want:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, want)
        except PermissionError:       # lowering it back needs root; without root there are no lab tests anyway
            pass
