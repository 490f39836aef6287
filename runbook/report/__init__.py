"""Step 08 — the run's report: one self-contained HTML page, every figure recomputed from the run's raw
files, and the drift from the previous good run of the same profile.

    report_path, model = runbook.report.run(step, results_root="", drift_tolerance=0.2).shown

Modules, in the order the data flows:

* ``runfiles``  -- reading a run folder (JSON, sidecars, the evidence paths the steps recorded);
* ``model``     -- ``ReportFigure``/``StepInfo``/``ReportModel`` dataclasses, agreement rule, headline figures;
* ``recompute`` -- figures of 00–04 from their raw files (one function per step section);
* ``recompute_bench`` -- the 07 figures from ``requests.jsonl``/``chunks.jsonl`` beside ``result.json``;
* ``verdict``   -- validated / candidate with what is missing, from the run folder alone;
* ``nextstep``  -- the headline's text and reasons, what to run next (the first failing row's fix, or the comparison);
* ``collector`` -- run folder → model (the above, guarded: a broken section becomes a note), drift;
* ``drift``     -- the pure comparison of two report models;
* ``plots``, ``html_parts``, ``html_sections``, ``html_page`` -- model → self-contained HTML;
* ``index``     -- ``results/index.{json,html}``; ``write`` -- ``report.html`` + index on disk;
* ``checks``    -- the 08 step's own checks (``report_checks``): check names → code.
"""
from __future__ import annotations

from pathlib import Path

from .checks import report_checks
from .collector import DEFAULT_REL_TOL, collect, resolve_run
from .html_page import render_html
from .index import index_entries, write_index
from .model import ReportFigure, ReportModel, headline
from .write import write_report
from ..step import StepOutcome

__all__ = ["run", "collect", "render_html", "write_report", "write_index", "index_entries", "report_checks",
           "resolve_run", "headline", "ReportFigure", "ReportModel", "DEFAULT_REL_TOL"]


def run(step, *, results_root: str | Path = "", drift_tolerance: float = DEFAULT_REL_TOL) -> StepOutcome:
    """Write ``report.html`` and the results index; record the step's checks and headline figures. Shows
    ``(report_path, model)``: the page written and the :class:`ReportModel` it renders."""
    root = Path(results_root) if results_root else step.run.path.parent
    report_path, model = write_report(step.run.path, results_root=root, rel_tol=drift_tolerance,
                                      redactor=step.run.redactor)
    step.add(report_checks(model, report_path, root / "index.html"))
    step.data.update({"report": str(report_path.relative_to(step.run.path)), "headline": headline(model),
                      "figures": len(model.figures), "mismatched": [f.key for f in model.inconsistent()],
                      "notes": model.notes, "drift": model.drift.to_dict() if model.drift is not None else None,
                      "verdict": model.verdict.to_dict() if model.verdict is not None else None})
    return step.outcome((report_path, model))
