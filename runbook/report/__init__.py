"""Step 08 — the run's report: one self-contained HTML page, every figure recomputed from the run's raw
files, and the drift from the previous good run of the same profile.

    report_path, model = runbook.report.run(step, results_root="", drift_tolerance=0.2)

Modules: ``page`` (collect → model → HTML, the results index, the step's own checks),
``drift`` (the pure comparison of two report models). Check names → code: ``page.report_checks``.
"""
from __future__ import annotations

from pathlib import Path

from .drift import DEFAULT_REL_TOL
from .page import ReportModel, collect, headline, report_checks, resolve_run, write_index, write_report


def run(step, *, results_root: str | Path = "", drift_tolerance: float = DEFAULT_REL_TOL
        ) -> tuple[Path, ReportModel]:
    """Write ``report.html`` and the results index; record the step's checks and headline figures."""
    root = Path(results_root) if results_root else step.run.path.parent
    report_path, model = write_report(step.run.path, results_root=root, rel_tol=drift_tolerance,
                                      redactor=step.run.redactor)
    step.add(report_checks(model, report_path, root / "index.html"))
    step.data.update({"report": str(report_path.relative_to(step.run.path)), "headline": headline(model),
                      "figures": len(model.figures), "mismatched": [f.key for f in model.inconsistent()],
                      "notes": model.notes, "drift": model.drift.to_dict() if model.drift is not None else None})
    return report_path, model
