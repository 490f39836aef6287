"""The report model: what one run folder says, as plain data (no file access, no HTML).

``ReportFigure`` is one recomputed number beside the value its step recorded; ``StepInfo``/``CheckRow`` the
steps and their check records; ``Verdict`` validated or candidate (:mod:`.verdict`); ``ReportModel`` the
whole run (figures, node facts, section data, notes, drift, verdict). ``headline`` picks the few figures
the results index shows per run.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..checks import Status
from ..records import STEPS
from .runfiles import number

__all__ = ["ReportFigure", "CheckRow", "StepInfo", "Verdict", "ReportModel", "STEP_TITLES", "VALIDATED", "CANDIDATE",
           "close", "rounding_rel_tol", "headline", "headline_keys", "step_title"]

STEP_TITLES = {s.id: s.title for s in STEPS}        # runbook.records: the one table of steps


def step_title(name: str) -> str:
    return STEP_TITLES.get(name) or name.split("_", 1)[-1].replace("_", " ").capitalize()


@dataclass
class ReportFigure:
    """One number of the report, recomputed from a file of the run folder."""
    key: str                         # stable across runs (drift matches on it): "<step>/<what>"
    step: str
    label: str
    value: float | None              # recomputed
    unit: str = ""
    source: str = ""                 # run-relative file(s) it was recomputed from
    recorded: float | None = None    # what the step itself wrote (sidecar / result.json); None = nothing to compare
    threshold: float | None = None
    higher_is_better: bool | None = True
    node: str = ""
    spread: dict[str, float] | None = None    # bench: min/max/q1/q3/n of the recomputed values
    group: str = ""                  # sub-table of the section (e.g. "tcp", "rdma", case name)
    rel_tol: float | None = None     # agreement tolerance when the raw file is coarser than the recorded value
    abs_tol: float = 0.0             # the same, absolute (e.g. a difference of two timestamps stored rounded)

    @property
    def consistent(self) -> bool | None:
        """Recomputed == recorded (to the recorded value's rounding); None when nothing was recorded."""
        if self.recorded is None:
            return None
        if self.value is None:
            return False
        # Both errors add up: the raw input's rounding (rel_tol) and the recorded value's own rounding.
        extra = (self.rel_tol * max(abs(self.value), abs(self.recorded)) if self.rel_tol else 0.0) + self.abs_tol
        return close(self.value, self.recorded, extra_tol=extra)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["consistent"] = self.consistent
        return d


@dataclass
class CheckRow:
    step: str
    name: str
    node: str
    status: str
    observed: str = ""
    expected: str = ""
    fix: str = ""
    evidence: list[str] = field(default_factory=list)
    cause: str = ""                   # what the row is evidence of (runbook.checks.CAUSES), ranks the first fix


@dataclass
class StepInfo:
    name: str
    title: str
    ran: bool                         # a manifest entry or a sidecar exists
    status: str = ""                  # manifest status (passed | failed | running) or "not run"
    sidecar_status: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float | None = None
    error: str = ""
    has_sidecar: bool = False
    checks: list[CheckRow] = field(default_factory=list)


VALIDATED, CANDIDATE = "validated", "candidate"


@dataclass
class Verdict:
    """``validated`` only when every requirement of :mod:`runbook.report.verdict` is met; ``candidate``
    with one reason per unmet requirement otherwise."""
    verdict: str
    missing: list[str] = field(default_factory=list)   # "<requirement>: <what is missing>"
    met: list[str] = field(default_factory=list)       # "<requirement>: <the evidence>"

    @property
    def validated(self) -> bool:
        return self.verdict == VALIDATED

    def line(self) -> str:
        """One line: ``validated`` or ``candidate — missing: a; b``."""
        return VALIDATED if self.validated else f"{CANDIDATE} — missing: " + "; ".join(self.missing)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReportModel:
    run_id: str
    run_path: str
    generated: str
    manifest: dict[str, Any]
    profile: dict[str, Any]
    provenance: dict[str, Any]
    steps: list[StepInfo]
    figures: list[ReportFigure] = field(default_factory=list)
    environment: dict[str, dict[str, Any]] = field(default_factory=dict)   # node|"cluster" -> facts
    launch: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)
    engram: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)
    rehearsal: dict[str, Any] = field(default_factory=dict)   # rehearsal.json of a rehearsal ({} otherwise)
    notes: list[str] = field(default_factory=list)      # sections that could not be built, and why
    drift: Any = None                                   # runbook.report.drift.DriftResult | None
    verdict: Verdict | None = None                      # validated | candidate (None: not computed)
    other_servers: dict[str, str] = field(default_factory=dict)   # step -> why: 05-07 measured on another server start

    # -- convenience ------------------------------------------------------------------------------
    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))

    @property
    def profile_name(self) -> str:
        return str(self.manifest.get("profile") or self.profile.get("PROFILE_NAME") or "")

    def step(self, suffix: str) -> StepInfo | None:
        return next((s for s in self.steps if s.name == suffix or s.name.endswith("_" + suffix)), None)

    @property
    def checks(self) -> list[CheckRow]:
        return [c for s in self.steps for c in s.checks]

    def figures_of(self, step_suffix: str) -> list[ReportFigure]:
        return [f for f in self.figures if f.step == step_suffix or f.step.endswith("_" + step_suffix)]

    def figure(self, key: str) -> ReportFigure | None:
        return next((f for f in self.figures if f.key == key), None)

    def inconsistent(self) -> list[ReportFigure]:
        return [f for f in self.figures if f.consistent is False]

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Status}
        for c in self.checks:
            out[c.status] = out.get(c.status, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "profile": self.profile_name, "status": self.status,
                "generated": self.generated, "counts": self.counts(),
                "steps": [{k: v for k, v in asdict(s).items() if k != "checks"} for s in self.steps],
                "figures": [f.to_dict() for f in self.figures], "environment": self.environment,
                "headline": headline(self), "notes": self.notes, "rehearsal": self.rehearsal,
                "drift": self.drift.to_dict() if self.drift is not None else None,
                "verdict": self.verdict.to_dict() if self.verdict is not None else None}


def rounding_rel_tol(x: Any) -> float | None:
    """Relative error a value carries from being stored rounded (half a unit of its last decimal), as a
    tolerance for figures recomputed from it (e.g. ``ops / seconds`` with ``seconds`` rounded to 1 ms)."""
    v = number(x)
    if not v:
        return None
    text = repr(float(x))
    if "e" in text or "." not in text:
        return None
    decimals = len(text.split(".", 1)[1])
    return 0.5 * 10 ** (-decimals) / abs(v) * 1.01 if decimals < 12 else None


def close(a: float, b: float, extra_tol: float = 0.0) -> bool:
    """``a`` equals the recorded ``b`` within ``b``'s own rounding (half a unit of its last decimal), plus
    ``extra_tol`` (absolute) for rounding carried by the inputs ``a`` was recomputed from."""
    if a is None or b is None:
        return False
    a, b = float(a), float(b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    text = repr(b)
    if "e" in text or "E" in text:
        tol = 1e-9 * abs(b)
    else:
        decimals = len(text.split(".", 1)[1]) if "." in text else 0
        tol = 0.5 * 10 ** (-decimals) if decimals < 12 else 0.0
    return abs(a - b) <= max(tol * 1.0001, 1e-9 * max(abs(a), abs(b)), 1e-12) + extra_tol


def headline_keys() -> tuple[str, ...]:
    return ("tcp_gbps_min", "rdma_total_gbps_min", "nccl_busbw_gbs", "weights_verify_gbps", "ready_first_token_s",
            "decode_tok_s_c1", "aggregate_tok_s_max", "prefill_tok_s_max")


def headline(model: ReportModel) -> dict[str, float | None]:
    """The figures the results index shows per run (None when the run has none of that kind)."""
    def pick(pred: Callable[[ReportFigure], bool], agg: Callable[[list[float]], float] = min) -> float | None:
        vals = [f.value for f in model.figures if f.value is not None and pred(f)]
        return round(agg(vals), 4) if vals else None
    return {
        "tcp_gbps_min": pick(lambda f: f.group == "tcp"),
        "rdma_total_gbps_min": pick(lambda f: f.group == "rdma" and "total" in f.key),
        "nccl_busbw_gbs": pick(lambda f: f.group == "nccl"),
        "weights_verify_gbps": pick(lambda f: "verify_gbps" in f.key),
        "ready_first_token_s": pick(lambda f: f.key.endswith("/ready/first_token")),
        "decode_tok_s_c1": pick(lambda f: f.step.endswith("bench") and "-c1-" in f.group and f.label == "decode_tok_s"),
        "aggregate_tok_s_max": pick(lambda f: f.step.endswith("bench") and f.label == "aggregate_tok_s", max),
        "prefill_tok_s_max": pick(lambda f: f.step.endswith("bench") and f.label == "prefill_tok_s", max),
    }
