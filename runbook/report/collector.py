"""Run folder → ``ReportModel``: manifest, profile, provenance, every sidecar's checks, then each step's
figures recomputed from its raw files, the verdict (validated / candidate), then the drift from the
previous good run.

    model = collect(run_dir)                 # pure: reads the run folder; no notebook text

A section that cannot be built becomes a note on the model, never an exception (the report step must
not fail on an optional gap).
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

from ..checks import Status
from ..errors import RunbookError
from ..evidence import RESULTS_ROOT, RunDir, discover_steps, previous_good_run
from ..secrets import Redactor, default_redactor
from . import drift as drift_mod
from . import recompute, recompute_bench
from .masking import mask_mapping
from .model import CANDIDATE, STEP_TITLES, CheckRow, ReportModel, StepInfo, Verdict, step_title
from .runfiles import load_json, read_sidecars, where
from .verdict import run_verdict

__all__ = ["collect", "drift_for", "resolve_run", "DEFAULT_REL_TOL", "SECTIONS"]

DEFAULT_REL_TOL = drift_mod.DEFAULT_REL_TOL
#: (section name, builder) in page order; the name prefixes the note when the builder raises
def rehearsal(model: ReportModel, run: Path, sidecars: dict) -> None:
    """A rehearsal's substitutions as the run recorded them (``rehearsal.json``; absent on other runs)."""
    model.rehearsal = load_json(run / "rehearsal.json") or {}


SECTIONS = (("rehearsal", rehearsal), ("preflight", recompute.preflight), ("network", recompute.network), ("weights", recompute.weights),
            ("engram", recompute.engram), ("launch", recompute.launch), ("bench", recompute_bench.bench))


def resolve_run(run: str | Path, results_root: str | Path | None = None) -> Path:
    """A run id (under ``results_root``) or a path to a run folder."""
    p = Path(run)
    if (p / "manifest.json").exists():
        return p
    cand = Path(results_root or RESULTS_ROOT) / str(run)
    if (cand / "manifest.json").exists():
        return cand
    raise RunbookError(f"no run {run!r}", observed=f"no manifest.json in {p} or {cand}",
                       fix="give a run id listed under results/ (or --results DIR), or a run folder path")


def steps_of(run_manifest: dict, sidecars: dict[str, dict], red: Redactor) -> list[StepInfo]:
    """Every known step (notebooks, manifest, sidecars) with its status and check records."""
    m_steps = run_manifest.get("steps", {}) or {}
    names = sorted(set(discover_steps()) | set(STEP_TITLES) | set(m_steps) | set(sidecars))
    steps = []
    for name in names:
        entry, sc = m_steps.get(name) or {}, sidecars.get(name)
        ran = bool(entry) or sc is not None
        info = StepInfo(name=name, title=step_title(name), ran=ran,
                        status=str(entry.get("status") or (sc or {}).get("status") or ("not run" if not ran else "")),
                        sidecar_status=str((sc or {}).get("status", "")), has_sidecar=sc is not None,
                        seconds=entry.get("seconds"), error=red.redact(str(entry.get("error") or "")))
        for rec in (sc or {}).get("checks", []) or []:
            info.checks.append(CheckRow(step=name, name=str(rec.get("name", "")), node=str(rec.get("node", "")),
                                        status=str(rec.get("status", "")), observed=str(rec.get("observed", "")),
                                        expected=str(rec.get("expected", "")), fix=str(rec.get("fix", "")),
                                        evidence=[str(e) for e in rec.get("evidence", []) or []],
                                        cause=str(rec.get("cause", ""))))
        cnt = {s.value: 0 for s in Status}
        for c in info.checks:
            cnt[c.status] = cnt.get(c.status, 0) + 1
        info.counts = cnt if info.checks else dict(entry.get("checks") or {})
        steps.append(info)
    return steps


def collect(run_dir: str | Path, *, results_root: str | Path | None = None, drift: bool = True,
            rel_tol: float = DEFAULT_REL_TOL, redactor: Redactor | None = None) -> ReportModel:
    """Build the report model from the files of one run folder (no notebook text is read).

    ``drift=True`` also compares with the previous good run of the same profile under
    ``results_root`` (default: the run folder's parent), see :mod:`runbook.report.drift`."""
    run = Path(run_dir)
    red = redactor or default_redactor()
    manifest = load_json(run / "manifest.json") or {}
    sidecars = read_sidecars(run)
    model = ReportModel(run_id=str(manifest.get("run_id") or run.name), run_path=str(run),
                        generated=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                        manifest=manifest, profile=mask_mapping(load_json(run / "profile.json") or {}, red),
                        provenance=load_json(run / "provenance.json") or {},
                        steps=steps_of(manifest, sidecars, red),
                        other_servers=RunDir(run, red).evidence_of_other_servers())
    for name, builder in SECTIONS:
        try:
            builder(model, run, sidecars)
        except Exception as exc:  # noqa: BLE001 - an optional section never breaks the report
            model.notes.append(f"{name}: section could not be built ({type(exc).__name__}: {exc}); {where(exc)}")
    try:
        model.verdict = run_verdict(model, run, sidecars)
    except Exception as exc:  # noqa: BLE001 - unreadable evidence makes a candidate, never a crash
        reason = f"verdict: could not be computed ({type(exc).__name__}: {exc}); {where(exc)}"
        model.notes.append(reason)
        model.verdict = Verdict(CANDIDATE, missing=[reason])
    if drift:
        try:
            model.drift = drift_for(model, results_root=results_root or run.parent, rel_tol=rel_tol, redactor=red)
        except Exception as exc:  # noqa: BLE001
            model.notes.append(f"drift: could not be computed ({type(exc).__name__}: {exc})")
    return model


def drift_for(model: ReportModel, *, results_root: str | Path | None = None, rel_tol: float = DEFAULT_REL_TOL,
              redactor: Redactor | None = None) -> drift_mod.DriftResult:
    """Compare ``model`` with the previous good run of its profile (``previous_run_id`` None when none)."""
    run = Path(model.run_path)
    root = Path(results_root) if results_root else run.parent
    prev = previous_good_run(run, root)
    if prev is None:
        return drift_mod.DriftResult(run_id=model.run_id, previous_run_id=None, results_root=str(root),
                                     rel_tol=rel_tol,
                                     reason=f"no previous good run of profile {model.profile_name!r} under {root} "
                                            "(an earlier run with manifest status 'passed')")
    previous = collect(prev, drift=False, redactor=redactor)
    return drift_mod.compare(model, previous, rel_tol=rel_tol, results_root=root)
