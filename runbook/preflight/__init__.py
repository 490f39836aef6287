"""Step 00 — preflight: can these nodes run the recipe at all? Reads facts, changes nothing.

    runbook.preflight.run(step)        # checks, node facts and its PreflightRecord into the step

Check names → code: every row is built in ``verify.py`` (``run_checks`` and the ``_<topic>`` helpers).
"""
from __future__ import annotations

from .verify import preflight_record, run_checks


def run(step) -> None:
    """Read every node's facts, compare them with the profile, record checks and facts in ``step``."""
    checks, facts = run_checks(step.cluster, step.profile, site=step.site)
    step.add(checks)
    step.data.update(facts)
    step.record = preflight_record(facts)   # what `runbook plan --facts` and the report read (records.PreflightRecord)
