"""What the report tells a person to do now, and the headline's short reasons (pure: model in, text out).

* a run with a failure: the first failing row in step order (a FAIL check, else a step that failed or did
  not finish), its fix, and the command that resumes the run once it is fixed;
* a run without one: the comparison to look at (the drift from the previous good run, else the benchmark
  beside its published anchors, else the note that this run is the baseline for the next one).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..checks import first_fix
from .html_parts import clip
from .model import ReportModel, StepInfo

__all__ = ["NextStep", "what_next", "reasons", "headline_text", "resume_command", "REASONS_SHOWN"]

REASONS_SHOWN = 5      # the headline lists at most this many reasons; the rest are one click away
REASON_CHARS = 160


@dataclass
class NextStep:
    kind: str             # "fix" (something failed) | "compare" (nothing failed)
    title: str            # one line: what to do
    detail: str = ""      # where it comes from (step, check, node, observed vs expected)
    fix: str = ""         # the failing row's own fix text
    command: str = ""     # what to run after the fix ("" when there is nothing to run)
    anchor: str = ""      # the page's section to look at

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resume_command(model: ReportModel, start: str = "") -> str:
    """The command that continues this run (its passed steps are skipped), as ``runbook run`` prints it;
    ``start``: from that step on (``--from``), passed or not."""
    source = model.manifest.get("profile_source") or model.profile_name or "<profile>"
    return (f"python -m runbook run --profile {source}" + (f" --from {start}" if start else "")
            + f" --resume {model.run_id}" + (" --rehearse" if model.rehearsal else ""))


def _failed(s: StepInfo) -> bool:
    return s.ran and s.status not in ("passed", "not run", "")


def what_next(model: ReportModel) -> NextStep:
    """The first fix (:func:`runbook.checks.first_fix`: a node, server or fabric row outranks the rows it explains,
    else the first failing row in step order; a step that failed without a FAIL row counts there too), or
    (nothing failed) the comparison to look at."""
    ranked = first_fix((s.name, s.checks) for s in model.steps)
    if ranked is not None and ranked[1].cause:
        step = next(s for s in model.steps if s.name == ranked[0])
        return _fix_row(model, step, ranked[1])
    for s in model.steps:
        bad = next((c for c in s.checks if c.status == "FAIL"), None)
        if bad is not None:
            return _fix_row(model, s, bad)
        if _failed(s):
            error = s.error.strip() or (f"status {s.status}, no error recorded" + (
                "" if s.has_sidecar else " and no sidecar: the step did not finish"))
            return NextStep("fix", f"Fix {s.name} ({s.title}): the step {s.status or 'did not finish'}",
                            detail=error.splitlines()[0], fix=error, command=resume_command(model), anchor="steps")
    if model.other_servers:
        step, why = next(iter(model.other_servers.items()))
        return NextStep("fix", f"Re-run {step}: its evidence belongs to another server start", detail=why,
                        fix="; ".join(model.other_servers.values()), command=resume_command(model, step[:2]),
                        anchor="steps")
    d = model.drift
    if d is not None and d.previous_run_id:
        if d.items:
            return NextStep("compare", f"Compare with {d.previous_run_id}: {d.summary()}",
                            detail="the Drift section lists every figure and check that moved", anchor="drift")
        return NextStep("compare", f"Nothing failed and nothing moved from {d.previous_run_id}: compare the "
                        "benchmark with its published anchors", anchor="bench" if model.bench else "figures")
    anchors = [a for a in model.bench.get("anchors") or [] if a.get("ratio") is not None]
    if anchors:
        return NextStep("compare", f"Nothing failed: compare the benchmark with its published anchors "
                        f"({len(anchors)} matched, ratio = ours / published)", anchor="bench")
    reason = d.reason if d is not None and d.reason else "no drift computed"
    return NextStep("compare", f"Nothing failed: this run is the baseline the next run of profile "
                    f"{model.profile_name} is compared with", detail=reason,
                    anchor="bench" if model.bench else "figures")


def _fix_row(model: ReportModel, s: StepInfo, bad) -> NextStep:
    where = f"{s.name} · check “{bad.name}”" + (f" on {bad.node}" if bad.node else "")
    seen = "; ".join(x for x in (f"observed {bad.observed}" if bad.observed else "",
                                 f"expected {bad.expected}" if bad.expected else "") if x)
    return NextStep("fix", f"Fix {where}", detail=seen,
                    fix=bad.fix or "the check names no fix: read its evidence under the step's raw/ folder",
                    command=resume_command(model), anchor="matrix")


def headline_text(model: ReportModel) -> str:
    """The page's headline: the verdict, and whether the run itself passed."""
    v, failed = model.verdict, [s for s in model.steps if _failed(s)]
    word = (v.verdict if v is not None else "no verdict").capitalize()
    if failed:
        return f"{word}: the run failed at {failed[0].name} ({failed[0].title})"
    if model.status != "passed":
        return f"{word}: the run is {model.status}"
    if model.other_servers:
        return f"{word}: not a pass — {len(model.other_servers)} step(s) measured another server start"
    if v is not None and v.validated:
        return f"{word}: the run passed and meets every requirement"
    return f"{word}: the run passed, not validated" + (f" ({len(v.missing)} requirement(s) missing)" if v else "")


def reasons(model: ReportModel) -> list[tuple[str, str]]:
    """The headline's reasons as (shown text, full text): failed steps first, then the verdict's unmet
    requirements (all met: one line naming them), at most :data:`REASONS_SHOWN`, the rest counted."""
    out = []
    for s in model.steps:
        if _failed(s):
            fails = sum(1 for c in s.checks if c.status == "FAIL")
            text = (f"{s.name} {s.status}" + (f": {fails} check(s) FAIL" if fails else "")
                    + (f" — {s.error.strip().splitlines()[0]}" if s.error.strip() else ""))
            out.append(text)
    out += model.other_servers.values()
    v = model.verdict
    if v is not None:
        if v.validated:
            out.append(f"all {len(v.met)} requirements met: " + ", ".join(m.split(": ", 1)[0] for m in v.met))
        else:
            out += v.missing
    shown = [(clip(t, REASON_CHARS), t) for t in out[:REASONS_SHOWN]]
    if len(out) > REASONS_SHOWN:
        more = len(out) - REASONS_SHOWN
        shown.append((f"… and {more} more (Verdict requirements below)", "; ".join(out[REASONS_SHOWN:])))
    return shown
