"""The 08 step's own checks: report written and self-contained, figures agree with what the steps
recorded, drift computed, the run verdict (informational: PASS validated, N/A candidate — never FAIL),
results index written."""
from __future__ import annotations

from pathlib import Path

from ..checks import Check, Status, check, not_applicable
from .html_parts import external_refs, fmt
from .index import REPORT_NAME
from .model import ReportModel
from .runfiles import relative

__all__ = ["report_checks"]


def report_checks(model: ReportModel, html_path: str | Path | None = None,
                  index_path: str | Path | None = None) -> list[Check]:
    """The report step's checks: written and self-contained, figures agree, drift computed."""
    out = []
    if html_path is not None:
        p = Path(html_path)
        text = p.read_text() if p.exists() else ""
        ext = external_refs(text)
        out.append(check("report written", bool(text) and not ext, node="local",
                         observed=(f"{relative(Path(model.run_path), p)}: {len(text) // 1024} KiB"
                                   + (f"; external references: {', '.join(ext[:3])}" if ext else ", self-contained"))
                         if text else f"{p} missing",
                         expected="report.html written, no external resources",
                         fix="see the traceback of the cell that wrote the report", evidence=[REPORT_NAME] if text else []))
    with_rec = [f for f in model.figures if f.recorded is not None]
    bad = model.inconsistent()
    if not model.figures:
        out.append(not_applicable("figures recomputed", "no figures in this run's evidence (no measuring step ran)",
                                  node="local"))
    else:
        out.append(check("figures recomputed", not bad, node="local",
                         observed=(f"{len(model.figures)} figures recomputed from raw files; {len(with_rec)} compared "
                                   f"with what the steps recorded, all agree") if not bad else
                         "; ".join(f"{f.key}: recomputed {fmt(f.value)} != recorded {fmt(f.recorded)} ({f.source})"
                                   for f in bad[:5]),
                         expected="every recomputed figure equals the step's recorded value",
                         fix="a step recorded a number its raw evidence does not support: inspect the named raw file",
                         data={"figures": len(model.figures), "compared": len(with_rec), "mismatched": [f.key for f in bad]}))
    d = model.drift
    if d is None:
        out.append(check("drift", False, node="local", warn_only=True, observed="not computed: " +
                         "; ".join(n for n in model.notes if n.startswith("drift")) or "drift disabled",
                         expected="drift against the previous good run"))
    elif d.previous_run_id is None:
        out.append(not_applicable("drift", f"no previous good run of profile {model.profile_name!r} under "
                                  f"{d.results_root}", node="local"))
    else:
        summary = d.summary()
        out.append(Check(name="drift", node="local", status=Status.WARN if d.significant else Status.PASS,
                         observed=f"vs {d.previous_run_id}: {summary}", expected="no drift from the previous good run",
                         fix="see the Drift section of the report" if d.significant else "",
                         data={"previous": d.previous_run_id, "items": len(d.items)}))
    v = model.verdict
    if v is not None and v.validated:
        out.append(check("run verdict", True, node="local", observed="validated: " + "; ".join(v.met),
                         expected="validated (every requirement met)", data=v.to_dict()))
    else:   # a candidate run is not a failed run: informational N/A with what is missing
        reason = "; ".join(v.missing) if v is not None else "not computed"
        out.append(not_applicable("run verdict", f"candidate: {reason}", node="local",
                                  expected="validated (every requirement met)"))
    if index_path is not None:
        ip = Path(index_path)
        out.append(check("results index written", ip.exists(), node="local", observed=str(ip),
                         expected="results/index.html and index.json"))
    return out
