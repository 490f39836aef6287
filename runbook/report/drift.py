"""Run-to-run drift: this run against the previous GOOD run of the same profile.

    prev = evidence.previous_good_run(run_dir, results_root)  # manifest status "passed", same profile, earlier
    result = compare(current_model, previous_model, rel_tol=0.2)
    result.items                                              # DriftItem(kind, key, previous, current, direction, detail)

What counts as drift:

* ``status``      -- a check (step, name, node) whose status changed (e.g. PASS -> WARN), or that exists in
  only one of the two runs of a step both ran;
* ``figure``      -- a recomputed figure that moved beyond its spread: benchmark figures carry min..max of
  their repeats, and move when the two ranges do not overlap; any other figure (or a spread of a single
  value) moves when it changes by more than ``rel_tol`` (default 20 %, relative to the previous value);
* ``environment`` -- a changed node fact: OS, kernel, driver, docker, runtime image digest, GID index,
  NCCL library version, vLLM version, weights revision, the launch fingerprint or a rank's rendered command.

Only steps that ran in both runs are compared; the others are listed in ``not_compared``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


__all__ = ["DriftItem", "DriftResult", "compare", "ENV_FACTS", "DEFAULT_REL_TOL"]

DEFAULT_REL_TOL = 0.20
ENV_FACTS = ("os", "kernel", "machine", "driver", "docker", "image_id", "gid_index", "gid_index_used", "gid_common",
             "nccl_version", "nccl_transport", "vllm_version", "weights_revision", "fingerprint", "command",
             # each rank's build, read by 04 before the launch (launch/identity.py)
             "image_layers", "python", "vllm_build", "vllm_tree", "torch", "nccl_build", "driver_cuda", "recipe_files")
_STATUS_RANK = {"PASS": 0, "NO-OP": 0, "SIMULATED": 1, "N/A": 1, "WARN": 2, "FAIL": 3}


@dataclass
class DriftItem:
    kind: str               # status | figure | environment
    key: str
    previous: Any
    current: Any
    direction: str = "changed"   # worse | better | changed
    detail: str = ""


@dataclass
class DriftResult:
    run_id: str
    previous_run_id: str | None
    results_root: str = ""
    rel_tol: float = DEFAULT_REL_TOL
    reason: str = ""                        # why there is no comparison
    items: list[DriftItem] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)
    compared_figures: int = 0
    compared_checks: int = 0

    def of_kind(self, kind: str) -> list[DriftItem]:
        return [i for i in self.items if i.kind == kind]

    @property
    def significant(self) -> bool:
        """Anything a human should look at: a status change, a moved figure, a changed environment."""
        return bool(self.items)

    def summary(self) -> str:
        if self.previous_run_id is None:
            return self.reason or "no previous good run"
        s = self.of_kind("status")
        f = self.of_kind("figure")
        e = self.of_kind("environment")
        worse = sum(1 for i in f if i.direction == "worse")
        return (f"{len(s)} check status change(s) of {self.compared_checks} compared, "
                f"{len(f)} figure(s) moved of {self.compared_figures} compared ({worse} worse), "
                f"{len(e)} environment change(s)")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = self.summary()
        return d


# ------------------------------------------------------------------------------------------------

def _moved(cur, prev, rel_tol: float) -> tuple[bool, str]:
    """Did figure ``cur`` move from ``prev``? (bench spread when both carry one of >= 2 values)."""
    cs, ps = cur.spread or {}, prev.spread or {}
    if (cs.get("n") or 0) >= 2 and (ps.get("n") or 0) >= 2 and None not in (cs.get("min"), cs.get("max"),
                                                                            ps.get("min"), ps.get("max")):
        apart = cs["min"] > ps["max"] or cs["max"] < ps["min"]
        return apart, (f"ranges {ps['min']:.4g}..{ps['max']:.4g} -> {cs['min']:.4g}..{cs['max']:.4g}"
                       + (" do not overlap" if apart else " overlap"))
    if prev.value == 0:
        return cur.value != 0, "previous value 0"
    change = (cur.value - prev.value) / abs(prev.value)
    return abs(change) > rel_tol, f"{change:+.1%} (tolerance ±{rel_tol:.0%})"


def compare(current, previous, *, rel_tol: float = DEFAULT_REL_TOL, results_root: str | Path = "") -> DriftResult:
    """Compare two :class:`runbook.report.ReportModel`s (``previous`` = the earlier good run)."""
    out = DriftResult(run_id=current.run_id, previous_run_id=previous.run_id, results_root=str(results_root),
                      rel_tol=rel_tol)
    ran_cur = {s.name for s in current.steps if s.has_sidecar}
    ran_prev = {s.name for s in previous.steps if s.has_sidecar}
    both = ran_cur & ran_prev
    out.not_compared = sorted((ran_cur | ran_prev) - both)

    # checks
    def index(model) -> dict[tuple[str, str, str], str]:
        idx: dict[tuple[str, str, str], str] = {}
        for c in model.checks:
            if c.step in both:
                key = (c.step, c.name, c.node)
                # a name repeated on one node (rare): keep the worst status
                if key not in idx or _STATUS_RANK.get(c.status, 0) > _STATUS_RANK.get(idx[key], 0):
                    idx[key] = c.status
        return idx
    cur_c, prev_c = index(current), index(previous)
    out.compared_checks = len(set(cur_c) & set(prev_c))
    absent: dict[tuple[str, str], list[str]] = {}
    for key in sorted(set(cur_c) | set(prev_c)):
        a, b = prev_c.get(key), cur_c.get(key)
        if a == b:
            continue
        label = f"{key[0]}: {key[1]} @ {key[2] or 'local'}"
        if a is None or b is None:
            absent.setdefault((key[0], "this run" if a is None else "the previous run"), []).append(
                f"{key[1]} @ {key[2] or 'local'}")
            continue
        ra, rb = _STATUS_RANK.get(a, 0), _STATUS_RANK.get(b, 0)
        out.items.append(DriftItem("status", label, a, b, "worse" if rb > ra else "better" if rb < ra else "changed"))
    for (step, where), names in sorted(absent.items()):
        out.items.append(DriftItem("status", f"{step}: {len(names)} check(s) only in {where}",
                                   "(absent)" if where == "this run" else "present",
                                   "present" if where == "this run" else "(absent)", "changed",
                                   ", ".join(names[:8]) + (" …" if len(names) > 8 else "")))

    # figures
    prev_f = {f.key: f for f in previous.figures if f.step in both and f.value is not None}
    for f in current.figures:
        p = prev_f.get(f.key)
        if p is None or f.value is None or f.step not in both:
            continue
        out.compared_figures += 1
        moved, detail = _moved(f, p, rel_tol)
        if not moved:
            continue
        if f.higher_is_better is None or f.value == p.value:
            direction = "changed"
        else:
            direction = "better" if (f.value > p.value) == bool(f.higher_is_better) else "worse"
        unit = f" {f.unit}" if f.unit else ""
        out.items.append(DriftItem("figure", f"{f.key}" + (f" @ {f.node}" if f.node and f.node not in f.key else ""),
                                   f"{p.value:.4g}{unit}", f"{f.value:.4g}{unit}", direction, detail))

    # environment (node facts from the 00/01/04 sidecars)
    for node in sorted(set(current.environment) & set(previous.environment)):
        a_env, b_env = previous.environment[node], current.environment[node]
        for fact in ENV_FACTS:
            a, b = a_env.get(fact), b_env.get(fact)
            if a is None or b is None or a == b:
                continue
            detail = "rendered command of this rank changed" if fact == "command" else ""
            if fact == "command":
                detail += ": " + _diff_words(str(a), str(b))
            out.items.append(DriftItem("environment", f"{node}: {fact}", a, b, "changed", detail))
    return out


def _diff_words(a: str, b: str, limit: int = 6) -> str:
    wa, wb = a.split(), b.split()
    gone = [w for w in wa if w not in wb][:limit]
    new = [w for w in wb if w not in wa][:limit]
    return f"removed {' '.join(gone) or '-'}; added {' '.join(new) or '-'}"
