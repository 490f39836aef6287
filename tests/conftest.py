"""Shared test support for every suite: ``tests/support`` (run-folder builders, ...) imports as
``support`` (``from support.runs import build_run``), so no test module imports another."""
from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

