"""Writing a run's report: collect + render + ``<run>/report.html`` (atomic) + the results index."""
from __future__ import annotations

from pathlib import Path

from ..evidence import RunDir
from ..secrets import Redactor, default_redactor
from .collector import DEFAULT_REL_TOL, collect
from .html_page import render_html
from .index import REPORT_NAME, write_index
from .model import ReportModel

__all__ = ["write_report"]


def write_report(run_dir: str | Path, *, results_root: str | Path | None = None, rel_tol: float = DEFAULT_REL_TOL,
                 index: bool = True, redactor: Redactor | None = None) -> tuple[Path, ReportModel]:
    """Collect, render and write ``<run>/report.html`` atomically (and the results index)."""
    run = Path(run_dir)
    red = redactor or default_redactor()
    model = collect(run, results_root=results_root, rel_tol=rel_tol, redactor=red)
    page = render_html(model, redactor=red)
    path = RunDir(run, red).write_text(REPORT_NAME, page)
    if index:
        write_index(Path(results_root) if results_root else run.parent, redactor=red)
    return path, model
