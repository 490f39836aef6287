"""Step 00 — preflight: can these nodes run the recipe at all? Reads facts, changes nothing.

    runbook.preflight.run(step)        # checks and node facts into the step

Check names → code: every row is built in ``verify.py`` (``run_checks`` and the ``_<topic>`` helpers).
"""
from __future__ import annotations

from .verify import run_checks


def run(step) -> None:
    """Read every node's facts, compare them with the profile, record checks and facts in ``step``."""
    checks, facts = run_checks(step.cluster, step.profile)
    step.add(checks)
    step.data.update(facts)
