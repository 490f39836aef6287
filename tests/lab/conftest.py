"""Fixtures for tests that need the embedded netns lab (runbook.lab.netlab).

`lab` (session): brings the lab up (or reuses a healthy running one) and takes it down at the end of
the session only if this session brought it up; set RUNBOOK_KEEP_LAB=1 to keep it anyway.
RUNBOOK_LAB_DIR overrides the lab directory (default <repo>/.lab).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from runbook.lab import netlab


def lab_dir() -> Path:
    return Path(os.environ.get("RUNBOOK_LAB_DIR") or netlab.DEFAULT_LAB_DIR)


@pytest.fixture(scope="session")
def lab() -> netlab.LabInfo:
    if os.geteuid() != 0:
        pytest.skip("the netns lab needs root")
    info = netlab.up(lab_dir())
    print(f"\n[lab] up: reused={info.reused} timings={info.timings}")
    yield info
    if not info.reused and os.environ.get("RUNBOOK_KEEP_LAB") != "1":
        netlab.down(lab_dir())


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The lab's CPU vLLM build (make lab-vllm); tests that serve a model skip without it."""
    from runbook.lab.control import VLLM_PYTHON
    if not VLLM_PYTHON.exists():
        pytest.skip(f"the lab's CPU vLLM venv is missing ({VLLM_PYTHON}); run `make lab-vllm`")
    return VLLM_PYTHON
