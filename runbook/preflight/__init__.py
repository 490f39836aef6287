"""Step 00 — preflight: can these nodes run the recipe at all? Reads facts, changes nothing.

    outcome = runbook.preflight.run(step)   # checks, node facts and its PreflightRecord into the step; shows nothing

Check names → code: every row is built in ``verify.py`` (``run_checks`` and the ``_<topic>`` helpers).
"""
from __future__ import annotations

from ..step import StepOutcome
from .verify import preflight_record, run_checks


def run(step) -> StepOutcome:
    """Read every node's facts, compare them with the profile, record checks and facts in ``step``; the notebook
    shows the table (``step.finish``), so the outcome shows nothing more."""
    checks, facts = run_checks(step.cluster, step.profile, site=step.site)
    step.add(checks)
    step.data.update(facts)
    step.record = preflight_record(facts)   # what `runbook plan --facts` and the report read (records.PreflightRecord)
    return step.outcome(None)
