"""The run report: one self-contained HTML page per run, every number recomputed from the run folder.

    model = collect(run_dir)                 # pure: reads manifest, sidecars, raw files; no notebook text
    html = render_html(model)                # pure: a string (plots embedded as data: URIs)
    path = write_report(run_dir)             # collect + render + results/<run>/report.html (atomic)
    write_index(results_root)                # results/index.html + results/index.json

Where the numbers come from (never from an executed notebook's text):

* check matrix      -- ``steps/<step>.json`` (every Check record of every step);
* network figures   -- re-parsed from ``raw/01_network/`` (iperf3 JSON, ping text, ib_write_bw/lat text,
  nccl-tests log, gloo sweep JSON) and compared with what the step recorded in its check ``data``;
* preflight figures -- ``steps/00_preflight.json`` facts (clock offsets, MemAvailable) re-derived;
* weights figures   -- hash rate re-derived from bytes/seconds in the 02 sidecar;
* Engram figures    -- ``raw/03_engram/{pack,check,probe}-<node>.json`` (the tools' own JSON);
* launch            -- ``raw/04_launch/rendered.json`` (per-rank commands) and the 04 sidecar's readiness;
* benchmark         -- recomputed from ``requests.jsonl``/``chunks.jsonl`` beside ``result.json`` with the
  same formulas as :mod:`runbook.bench.metrics`, compared with ``result.json``, placed beside the
  published figures of the recipe (:mod:`runbook.bench.report`).

Each recomputed figure keeps the value the step recorded; ``Figure.consistent`` says whether they agree
(to the recorded value's own rounding). A section whose step did not run says so; a section that cannot
be built is reported as a note, never as an exception (the report step must not fail on an optional gap).
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import json
import math
import re
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..checks import Status
from ..evidence import RESULTS_ROOT, RunDir, atomic_write, discover_steps, previous_good_run
from . import drift as drift_mod
from ..secrets import MASK, Redactor, default_redactor

__all__ = ["Figure", "CheckRow", "StepInfo", "ReportModel", "collect", "render_html", "write_report",
           "write_index", "index_entries", "headline", "report_checks", "resolve_run", "STEP_TITLES",
           "DEFAULT_REL_TOL"]

REPORT_NAME = "report.html"
DEFAULT_REL_TOL = drift_mod.DEFAULT_REL_TOL
STEP_TITLES = {
    "00_preflight": "Preflight", "01_network": "Network", "02_weights": "Weights", "03_engram": "Engram",
    "04_launch": "Launch", "05_smoke": "Smoke test", "06_vision_tools": "Vision and tools",
    "07_bench": "Benchmark", "08_report": "Report",
}
_SECRET_KEY = re.compile(r"(?i)(api_?key|secret|passw(or)?d|credential|authoriz|token(?!s\b|s_|izer))")


def secret_key(key: str) -> bool:
    """A key whose value is a secret (``*_TOKEN``, ``*API_KEY``, ``*SECRET*``, ...); ``*_TOKENS`` counts and
    ``TOKENIZER_*`` are not."""
    return bool(_SECRET_KEY.search(key or ""))


# ------------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------------

@dataclass
class Figure:
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


@dataclass
class ReportModel:
    run_id: str
    run_path: str
    generated: str
    manifest: dict[str, Any]
    profile: dict[str, Any]
    provenance: dict[str, Any]
    steps: list[StepInfo]
    figures: list[Figure] = field(default_factory=list)
    environment: dict[str, dict[str, Any]] = field(default_factory=dict)   # node|"cluster" -> facts
    launch: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)
    engram: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)      # sections that could not be built, and why
    drift: Any = None                                   # runbook.drift.DriftResult | None

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

    def figures_of(self, step_suffix: str) -> list[Figure]:
        return [f for f in self.figures if f.step == step_suffix or f.step.endswith("_" + step_suffix)]

    def figure(self, key: str) -> Figure | None:
        return next((f for f in self.figures if f.key == key), None)

    def inconsistent(self) -> list[Figure]:
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
                "headline": headline(self), "notes": self.notes,
                "drift": self.drift.to_dict() if self.drift is not None else None}


def rounding_rel_tol(x: Any) -> float | None:
    """Relative error a value carries from being stored rounded (half a unit of its last decimal), as a
    tolerance for figures recomputed from it (e.g. ``ops / seconds`` with ``seconds`` rounded to 1 ms)."""
    v = _num(x)
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


# ------------------------------------------------------------------------------------------------
# reading the run folder
# ------------------------------------------------------------------------------------------------

def resolve_run(run: str | Path, results_root: str | Path | None = None) -> Path:
    """A run id (under ``results_root``) or a path to a run folder."""
    p = Path(run)
    if (p / "manifest.json").exists():
        return p
    cand = Path(results_root or RESULTS_ROOT) / str(run)
    if (cand / "manifest.json").exists():
        return cand
    from ..errors import RunbookError
    raise RunbookError(f"no run {run!r}", observed=f"no manifest.json in {p} or {cand}",
                       fix="give a run id listed under results/ (or --results DIR), or a run folder path")


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rel(run: Path, path: Path) -> str:
    try:
        return str(path.relative_to(run))
    except ValueError:
        return str(path)


def _known_steps() -> list[str]:
    return sorted(set(discover_steps()) | set(STEP_TITLES))


def _title(name: str) -> str:
    return STEP_TITLES.get(name) or name.split("_", 1)[-1].replace("_", " ").capitalize()


def collect(run_dir: str | Path, *, results_root: str | Path | None = None, drift: bool = True,
            rel_tol: float = DEFAULT_REL_TOL, redactor: Redactor | None = None) -> ReportModel:
    """Build the report model from the files of one run folder (no notebook text is read).

    ``drift=True`` also compares with the previous good run of the same profile under
    ``results_root`` (default: the run folder's parent), see :mod:`runbook.drift`."""
    run = Path(run_dir)
    red = redactor or default_redactor()
    manifest = _load_json(run / "manifest.json") or {}
    profile = _mask_mapping(_load_json(run / "profile.json") or {}, red)
    prov = _load_json(run / "provenance.json") or {}
    sidecars: dict[str, dict[str, Any]] = {}
    for p in sorted((run / "steps").glob("*.json")):
        sc = _load_json(p)
        if isinstance(sc, dict):
            sidecars[p.stem] = sc
    m_steps = manifest.get("steps", {}) or {}
    names = sorted(set(_known_steps()) | set(m_steps) | set(sidecars))
    steps = []
    for name in names:
        entry, sc = m_steps.get(name) or {}, sidecars.get(name)
        ran = bool(entry) or sc is not None
        info = StepInfo(name=name, title=_title(name), ran=ran,
                        status=str(entry.get("status") or (sc or {}).get("status") or ("not run" if not ran else "")),
                        sidecar_status=str((sc or {}).get("status", "")), has_sidecar=sc is not None,
                        seconds=entry.get("seconds"), error=red.redact(str(entry.get("error") or "")))
        for rec in (sc or {}).get("checks", []) or []:
            info.checks.append(CheckRow(step=name, name=str(rec.get("name", "")), node=str(rec.get("node", "")),
                                        status=str(rec.get("status", "")), observed=str(rec.get("observed", "")),
                                        expected=str(rec.get("expected", "")), fix=str(rec.get("fix", "")),
                                        evidence=[str(e) for e in rec.get("evidence", []) or []]))
        cnt = {s.value: 0 for s in Status}
        for c in info.checks:
            cnt[c.status] = cnt.get(c.status, 0) + 1
        info.counts = cnt if info.checks else dict(entry.get("checks") or {})
        steps.append(info)
    model = ReportModel(run_id=str(manifest.get("run_id") or run.name), run_path=str(run),
                        generated=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                        manifest=manifest, profile=profile, provenance=prov, steps=steps)
    for builder in (_preflight, _network, _weights, _engram, _launch, _bench):
        try:
            builder(model, run, sidecars)
        except Exception as exc:  # noqa: BLE001 - an optional section never breaks the report
            model.notes.append(f"{builder.__name__.strip('_')}: section could not be built "
                               f"({type(exc).__name__}: {exc}); {_where(exc)}")
    if drift:
        try:
            model.drift = drift_for(model, results_root=results_root or run.parent, rel_tol=rel_tol, redactor=red)
        except Exception as exc:  # noqa: BLE001
            model.notes.append(f"drift: could not be computed ({type(exc).__name__}: {exc})")
    return model


def drift_for(model: ReportModel, *, results_root: str | Path | None = None, rel_tol: float = DEFAULT_REL_TOL,
              redactor: Redactor | None = None) -> "drift_mod.DriftResult":
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


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return f"at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""


def _mask_mapping(obj: Any, red: Redactor, key: str = "") -> Any:
    """Secret-looking keys get ``***`` (belt and braces: profile.json is already masked)."""
    if isinstance(obj, dict):
        return {k: _mask_mapping(v, red, str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_mask_mapping(v, red, key) for v in obj]
    if isinstance(obj, str):
        if obj and key and secret_key(key) and obj != MASK:
            return MASK
        return red.redact(obj)
    return obj


def _sidecar(sidecars: dict[str, dict[str, Any]], suffix: str) -> tuple[str, dict[str, Any] | None]:
    for name, sc in sidecars.items():
        if name == suffix or name.endswith("_" + suffix):
            return name, sc
    return "", None


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


# ------------------------------------------------------------------------------------------------
# section builders (each: model, run folder, sidecars -> figures / section data)
# ------------------------------------------------------------------------------------------------

def _preflight(model: ReportModel, run: Path, sidecars: dict[str, dict[str, Any]]) -> None:
    name, sc = _sidecar(sidecars, "preflight")
    if sc is None:
        return
    src = f"steps/{name}.json"
    data = sc.get("data", {}) or {}
    nodes = data.get("nodes", {}) or {}
    for node, facts in nodes.items():
        env = model.environment.setdefault(node, {})
        for k in ("os", "kernel", "machine", "docker", "driver", "image_id", "hostname"):
            if facts.get(k) is not None:
                env[k] = facts.get(k)
        if facts.get("gpus"):
            env["gpus"] = facts.get("gpus")
    recs = sc.get("checks", []) or []
    # clock offset: spread of the per-node offsets (first element of each pair), uncertainty = max RTT/2
    offs = data.get("clock_offsets_s") or {}
    good = {n: v for n, v in offs.items() if isinstance(v, (list, tuple)) and len(v) >= 2 and _num(v[0]) is not None}
    if len(good) >= 2:
        vals = [float(v[0]) for v in good.values()]
        rec = next((r for r in recs if r.get("name") == "clock offset between nodes"), {})
        model.figures.append(Figure(key=f"{name}/clock_offset_ms", step=name, label="clock offset between nodes",
                                    value=(max(vals) - min(vals)) * 1000, unit="ms", source=src,
                                    recorded=_num((rec.get("data") or {}).get("spread_ms")),
                                    threshold=_num(model.profile.get("MAX_CLOCK_OFFSET_MS")),
                                    higher_is_better=False, node="cluster", group="clock"))
    for r in recs:
        d = r.get("data") or {}
        if r.get("name") == "memory available" and r.get("node") in nodes:
            mem = _num(nodes[r["node"]].get("mem_available"))
            model.figures.append(Figure(key=f"{name}/mem_available_gib/{r['node']}", step=name,
                                        label="MemAvailable", node=r["node"],
                                        value=None if mem is None else mem / 2 ** 30, unit="GiB", source=src,
                                        recorded=None if _num(d.get("mem_available_bytes")) is None
                                        else _num(d["mem_available_bytes"]) / 2 ** 30,
                                        threshold=_num(d.get("need_gib")), group="memory"))


_IPERF = re.compile(r"iperf3_.*_client\.json$")
_IBBW = re.compile(r"ib_write_bw_.*_client\.txt$")
_IBLAT = re.compile(r"ib_write_lat_.*_client\.txt$")
_PING = re.compile(r"ping_.*\.txt$")


def _evidence(run: Path, rec: dict[str, Any], rx: re.Pattern) -> Path | None:
    for e in rec.get("evidence", []) or []:
        if rx.search(str(e)) and (run / e).exists():
            return run / e
    return None


def _network(model: ReportModel, run: Path, sidecars: dict[str, dict[str, Any]]) -> None:
    from ..facts import nccl as fn
    from ..facts import net as fnet
    from ..facts import rdma as fr
    name, sc = _sidecar(sidecars, "network")
    if sc is None:
        return
    totals: dict[str, list[Figure]] = {}
    for rec in sc.get("checks", []) or []:
        d = rec.get("data") or {}
        cname, node = str(rec.get("name", "")), str(rec.get("node", ""))
        kind = d.get("kind")
        if kind == "tcp":
            p = _evidence(run, rec, _IPERF)
            val = None
            if p is not None:
                val = fnet.parse_iperf3(_read_text(p) or "").receiver_gbps
            model.figures.append(Figure(key=f"{name}/{cname}", step=name, label=f"TCP {d.get('rail', '')} {d.get('direction', '')}",
                                        value=val, unit="Gb/s", source=_rel(run, p) if p else "(raw file missing)",
                                        recorded=_num(d.get("gbps")), threshold=_num(d.get("threshold_gbps")),
                                        node=node, group="tcp"))
        elif kind == "rdma":
            p = _evidence(run, rec, _IBBW)
            val = fr.parse_ib_write_bw(_read_text(p) or "").avg_gbps if p is not None else None
            fig = Figure(key=f"{name}/{cname}", step=name, label=f"RDMA {d.get('rail', '')} {d.get('direction', '')}",
                         value=val, unit="Gb/s", source=_rel(run, p) if p else "(raw file missing)",
                         recorded=_num(d.get("gbps")), threshold=_num(d.get("threshold_gbps")), node=node, group="rdma")
            model.figures.append(fig)
            totals.setdefault(str(d.get("direction", "")), []).append(fig)
            if d.get("gid_index") is not None:
                model.environment.setdefault(node, {}).setdefault("gid_index_used", d.get("gid_index"))
        elif kind == "rdma_total":
            parts = totals.get(str(d.get("direction", "")), [])
            val = sum(f.value for f in parts) if parts and all(f.value is not None for f in parts) else None
            model.figures.append(Figure(key=f"{name}/{cname}", step=name, label=f"RDMA total {d.get('direction', '')}",
                                        value=val, unit="Gb/s", source=", ".join(f.source for f in parts) or "(no rail figures)",
                                        recorded=_num(d.get("gbps")), threshold=_num(d.get("threshold_gbps")),
                                        node="cluster", group="rdma"))
        elif kind == "rdma_lat":
            p = _evidence(run, rec, _IBLAT)
            val = fr.parse_ib_write_lat(_read_text(p) or "").t_typical_us if p is not None else None
            model.figures.append(Figure(key=f"{name}/{cname}", step=name, label=f"RDMA latency {cname.split('.', 3)[-1]}",
                                        value=val, unit="us", source=_rel(run, p) if p else "(raw file missing)",
                                        recorded=_num(d.get("t_typical_us")), higher_is_better=False, node=node,
                                        group="latency"))
        elif kind == "allreduce":
            p = next((run / e for e in rec.get("evidence", []) or [] if (run / e).exists()), None)
            sw = fn.parse_allreduce_sweep(_read_text(p) or "") if p is not None else None
            rec_peak = max((_num(x.get("busbw_gbs")) or 0.0 for x in d.get("points", []) or []), default=None)
            model.figures.append(Figure(key=f"{name}/{cname}/{node}", step=name, label="gloo all-reduce peak busbw",
                                        value=sw.peak_busbw_gbs if sw else None, unit="GB/s",
                                        source=_rel(run, p) if p else "(raw file missing)", recorded=rec_peak,
                                        node=node, group="allreduce"))
        elif cname.startswith("net.ping.") and "rtt_avg_ms" in d:
            p = _evidence(run, rec, _PING)
            val = fnet.parse_ping(_read_text(p) or "").rtt_avg_ms if p is not None else None
            model.figures.append(Figure(key=f"{name}/{cname}", step=name, label=f"ping {cname.split('.', 2)[-1]}",
                                        value=val, unit="ms", source=_rel(run, p) if p else "(raw file missing)",
                                        recorded=_num(d.get("rtt_avg_ms")), threshold=_num(model.profile.get("MAX_RTT_MS")),
                                        higher_is_better=False, node=node, group="ping"))
        elif cname == "net.nccl.busbw":
            p = next((run / e for e in rec.get("evidence", []) or [] if (run / e).exists()), None)
            text = _read_text(p) or "" if p is not None else ""
            res = fn.parse_nccl_tests(text)
            log = fn.parse_nccl_log(text)
            if log.version:
                model.environment.setdefault("cluster", {})["nccl_version"] = log.version
            if log.transport:
                model.environment.setdefault("cluster", {})["nccl_transport"] = log.transport
            model.figures.append(Figure(key=f"{name}/{cname}", step=name, label="nccl-tests all_reduce avg busbw",
                                        value=res.avg_busbw_gbs, unit="GB/s",
                                        source=_rel(run, p) if p else "(raw file missing)",
                                        recorded=_num(d.get("avg_busbw_gbs")),
                                        threshold=_num(model.profile.get("MIN_NCCL_BUSBW_GBS")), node="cluster",
                                        group="nccl"))
        elif cname == "net.gid" and node and node != "cluster":
            idx = d.get("pinned", d.get("resolved"))
            if idx is not None:
                model.environment.setdefault(node, {})["gid_index"] = idx
        elif cname == "net.gid.plan":
            model.environment.setdefault("cluster", {})["gid_common"] = d.get("common")


def _weights(model: ReportModel, run: Path, sidecars: dict[str, dict[str, Any]]) -> None:
    name, sc = _sidecar(sidecars, "weights")
    if sc is None:
        return
    src = f"steps/{name}.json"
    data = sc.get("data", {}) or {}
    model.weights = {k: data.get(k) for k in ("repo", "revision", "files", "total_bytes", "layout", "mode")
                     if data.get(k) is not None}
    if data.get("revision"):
        model.environment.setdefault("cluster", {})["weights_revision"] = data.get("revision")
    for rec in sc.get("checks", []) or []:
        d = rec.get("data") or {}
        node = str(rec.get("node", ""))
        # a re-run that reused the manifest hashed nothing: no rate to show
        if rec.get("name") == "weights.verified" and _num(d.get("seconds")) and _num(d.get("bytes_hashed")):
            b = float(d["bytes_hashed"])
            model.figures.append(Figure(key=f"{name}/verify_gbps/{node}", step=name, label="sha256 verification rate",
                                        value=b / float(d["seconds"]) / 1e9, unit="GB/s", source=src,
                                        recorded=_num(d.get("gbps")), node=node, group="verify",
                                        rel_tol=rounding_rel_tol(d.get("seconds"))))
            model.figures.append(Figure(key=f"{name}/verified_bytes/{node}", step=name, label="bytes verified",
                                        value=b, unit="B", source=src,
                                        # all files re-hashed: must be the repo's size (a partial re-hash is not)
                                        recorded=(_num(data.get("total_bytes"))
                                                  if d.get("files_hashed") == data.get("files") else None),
                                        node=node, group="verify", higher_is_better=None))
        elif rec.get("name") in ("weights.rsync", "weights.share") and _num(d.get("seconds")):
            b = _num(d.get("bytes")) or 0.0
            model.figures.append(Figure(key=f"{name}/share_gbps/{node}", step=name, label=f"{rec.get('name')} rate",
                                        value=b / float(d["seconds"]) / 1e9, unit="GB/s", source=src, node=node,
                                        group="share"))
        elif rec.get("name") == "weights.parity":
            model.weights["parity_files"] = d.get("files")
            model.weights["parity_differences"] = len(d.get("differences") or [])
    hr = data.get("hash_rate") or {}
    for k, label in (("verifier", "hash rate (runbook verifier)"), ("sha256sum", "hash rate (sha256sum)")):
        secs = _num(hr.get(f"{k}_seconds"))
        if secs and _num(hr.get("bytes")):
            model.figures.append(Figure(key=f"{name}/hash_rate/{k}", step=name, label=label,
                                        value=float(hr["bytes"]) / secs / 1e9, unit="GB/s", source=src,
                                        recorded=_num(hr.get(f"{k}_gbps")), node="head", group="hash",
                                        rel_tol=rounding_rel_tol(secs)))


def _engram(model: ReportModel, run: Path, sidecars: dict[str, dict[str, Any]]) -> None:
    name, sc = _sidecar(sidecars, "engram")
    if sc is None:
        return
    summary = (sc.get("data") or {}).get("engram") or {}
    raw_dir = run / "raw" / name
    for p in sorted(raw_dir.glob("*.json")) if raw_dir.is_dir() else []:
        m = re.match(r"(pack|check|probe)-(.+)\.json$", p.name)
        if not m:
            continue
        tool, node = m.groups()
        obj = _load_json(p) or {}
        rec = summary.get(node, {}) or {}
        src = _rel(run, p)
        if tool == "pack" and obj:
            secs = _num(obj.get("seconds"))
            written = _num(obj.get("bytes_written"))
            val = (written / max(secs, 1e-9) / 1e6) if (secs is not None and written is not None) else None
            model.figures.append(Figure(key=f"{name}/pack_mb_s/{node}", step=name, label="pack write rate",
                                        value=val, unit="MB/s", source=src,
                                        recorded=_num((rec.get("pack") or {}).get("mb_s")), node=node, group="pack",
                                        rel_tol=rounding_rel_tol(secs)))
            rss = _num(obj.get("peak_rss_bytes"))
            if rss is not None:
                model.figures.append(Figure(key=f"{name}/pack_rss_mib/{node}", step=name, label="pack peak RSS",
                                            value=rss / 2 ** 20, unit="MiB", source=src,
                                            recorded=_num((rec.get("pack") or {}).get("peak_rss_mib")),
                                            higher_is_better=False, node=node, group="pack"))
        elif tool == "check" and obj:
            rows = sum(int(f.get("rows_checked") or 0) for f in obj.get("files", []) or [])
            ok = sum(1 for f in obj.get("files", []) or [] if f.get("ok"))
            recorded = sum(int(v.get("rows_checked") or 0) for v in ((rec.get("verify") or {}).get("files") or {}).values())
            model.figures.append(Figure(key=f"{name}/verify_rows/{node}", step=name,
                                        label=f"rows verified byte-identical ({ok}/{len(obj.get('files', []) or [])} files ok)",
                                        value=float(rows), unit="rows", source=src,
                                        recorded=float(recorded) if rec.get("verify") else None, node=node,
                                        group="verify", higher_is_better=None))
        elif tool == "probe" and obj:
            for r in obj.get("results", []) or []:
                qd = r.get("qd")
                ops, secs = _num(r.get("ops")), _num(r.get("seconds"))
                val = ops / max(secs, 1e-9) if (ops is not None and secs is not None) else _num(r.get("iops"))
                model.figures.append(Figure(key=f"{name}/probe_qd{qd}_iops/{node}", step=name,
                                            label=f"random read QD{qd} ({obj.get('mode', '')})", value=val,
                                            unit="IOPS", source=src,
                                            recorded=_num(((rec.get("probe") or {}).get(f"qd{qd}") or {}).get("iops")),
                                            node=node, group="probe", rel_tol=rounding_rel_tol(secs)))
                p99 = _num((r.get("lat_us") or {}).get("p99"))
                if p99 is not None:
                    model.figures.append(Figure(key=f"{name}/probe_qd{qd}_p99_us/{node}", step=name,
                                                label=f"random read QD{qd} p99 latency", value=p99, unit="us",
                                                source=src,
                                                recorded=_num(((rec.get("probe") or {}).get(f"qd{qd}") or {}).get("p99_us")),
                                                higher_is_better=False, node=node, group="probe"))
    model.engram = {"nodes": sorted(summary), "raw_files": sorted(_rel(run, p) for p in raw_dir.glob("*.json"))
                    if raw_dir.is_dir() else []}


def _launch(model: ReportModel, run: Path, sidecars: dict[str, dict[str, Any]]) -> None:
    name, sc = _sidecar(sidecars, "launch")
    raw_dir = run / "raw" / (name or "04_launch")
    plan = _load_json(raw_dir / "rendered.json") if raw_dir.is_dir() else None
    data = (sc or {}).get("data", {}) or {}
    launch = data.get("launch") if isinstance(data.get("launch"), dict) else data
    if plan is None and isinstance(data.get("plan"), dict):
        plan = data["plan"]
    if sc is None and plan is None:
        return
    red = default_redactor()
    ranks = []
    for r in (plan or {}).get("ranks", []) or []:
        display = r.get("display") or " ".join(r.get("docker_argv") or r.get("serve_argv") or [])
        env = {k: (MASK if secret_key(k) else v)
               for k, v in (r.get("env") or {}).items()}
        ranks.append({"node": r.get("node", ""), "rank": r.get("rank"), "headless": r.get("headless"),
                      "command": red.redact(display), "env": env, "secret_env": sorted(r.get("secret_env") or [])})
        model.environment.setdefault(str(r.get("node", "")), {})["command"] = red.redact(display)
    fp = (plan or {}).get("fingerprint") or launch.get("fingerprint")
    if fp:
        model.environment.setdefault("cluster", {})["fingerprint"] = fp
    ready = launch.get("readiness_s") or {}
    readiness = []
    recs = {str(r.get("name", "")): r for r in (sc or {}).get("checks", []) or []}
    for phase, secs in ready.items():
        rec = recs.get(f"ready: {phase.replace('_', ' ')}", {})
        readiness.append({"phase": phase, "seconds": _num(secs)})
        model.figures.append(Figure(key=f"{name}/ready/{phase}", step=name, label=f"ready: {phase.replace('_', ' ')}",
                                    value=_num(secs), unit="s from launch", source=f"steps/{name}.json",
                                    recorded=_num((rec.get("data") or {}).get("seconds")) if rec else None,
                                    threshold=_num(model.profile.get("READY_TIMEOUT")), higher_is_better=False,
                                    node="head", group="readiness"))
    startup = launch.get("startup_log") or {}
    for node, s in startup.items() if isinstance(startup, dict) else []:
        if isinstance(s, dict) and s.get("version"):
            model.environment.setdefault(node, {})["vllm_version"] = s.get("version")
    # NCCL version from any archived vLLM log of the step (printed by NCCL at init)
    for p in sorted(raw_dir.glob("*")) if raw_dir.is_dir() else []:
        if p.is_file() and p.suffix in (".log", ".txt") and p.stat().st_size < 50 << 20:
            m = re.search(r"NCCL version (\S+)", _read_text(p) or "")
            if m:
                model.environment.setdefault("cluster", {}).setdefault("nccl_version", m.group(1).rstrip(","))
    model.launch = {"step": name, "source": _rel(run, raw_dir / "rendered.json") if plan else "",
                    "runtime": (plan or {}).get("runtime") or launch.get("runtime"),
                    "recipe": (plan or {}).get("recipe"), "fingerprint": fp, "ranks": ranks,
                    "readiness": readiness, "reused": launch.get("reused"), "base_url": launch.get("base_url"),
                    "head_started_s": _num(launch.get("head_started_s")),
                    "first_token_latency_s": _num(launch.get("first_token_latency_s")),
                    "capacity": launch.get("capacity") or []}


# -- benchmark -------------------------------------------------------------------------------------

def _find_bench_result(run: Path, sidecars: dict[str, dict[str, Any]]) -> tuple[str, Path | None, dict | None]:
    name, sc = _sidecar(sidecars, "bench")
    roots = [run / "raw" / name] if name else []
    roots += [run / "raw"]
    for root in roots:
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("result.json")):
            obj = _load_json(p)
            if isinstance(obj, dict) and str(obj.get("schema_version", "")).startswith("runbook.bench/"):
                return name or p.relative_to(run / "raw").parts[0], p, obj
    for v in ((sc or {}).get("data") or {}).values():
        if isinstance(v, dict) and str(v.get("schema_version", "")).startswith("runbook.bench/"):
            return name, None, v
    return name, None, None


RECOMPUTED_METRICS = ("ttft_s", "ttfr_s", "tokens_per_chunk", "decode_tok_s", "per_stream_decode_tok_s",
                      "max_gap_s", "aggregate_tok_s", "aggregate_span_tok_s", "aggregate_wall_tok_s",
                      "steady_coverage", "release_skew_s", "prefill_tok_s")
# requests.jsonl stores times relative to t0 rounded to 0.1 us; result.json was computed before rounding.
# Rates carry that as a relative error; a time figure (a difference of two stamps, e.g. a 50 us release
# skew) as an absolute one of up to 2 x 0.05 us.
BENCH_REL_TOL = 1e-3
BENCH_TIME_ABS_TOL = 2e-7
LOWER_IS_BETTER = ("ttft_s", "ttfr_s", "max_gap_s", "release_skew_s", "mean_queue_time_s", "client_cpu_pct")


def recompute_bench_figures(out_dir: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """case name -> metric -> Spread dict, recomputed from ``requests.jsonl`` (+ ``chunks.jsonl``) with
    the formulas of :mod:`runbook.bench.metrics` (the same grouping as the bench runner: per-stream
    metrics over every OK request of the case, per-trial metrics over the case's trials)."""
    from ..bench import metrics as M
    from ..bench.result import load_records
    recs = load_records(out_dir)
    by_case: dict[str, list] = {}
    for r in recs:
        by_case.setdefault(r.case, []).append(r)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for case, rs in by_case.items():
        if case == "warmup":
            continue
        f: dict[str, dict[str, float]] = {}

        def put(key: str, vals: list[Any]) -> None:
            s = M.spread(vals)
            if s:
                f[key] = s.to_dict()
        f.update(M.request_spreads(rs, decode=case.startswith("decode")))
        trials: dict[int, list] = {}
        for r in sorted(rs, key=lambda r: (r.trial, r.stream)):
            trials.setdefault(r.trial, []).append(r)
        if case.startswith("decode"):
            aggs = [M.aggregate_figures(t) for _, t in sorted(trials.items())]
            for k in ("aggregate_tok_s", "aggregate_span_tok_s", "aggregate_wall_tok_s", "steady_coverage",
                      "release_skew_s"):
                put(k, [a.get(k) for a in aggs])
        elif case.startswith("prefill"):
            put("prefill_tok_s", [M.prefill_tok_s(t[0]) for _, t in sorted(trials.items())])
        out[case] = f
    return out


def _bench(model: ReportModel, run: Path, sidecars: dict[str, dict[str, Any]]) -> None:
    name, path, obj = _find_bench_result(run, sidecars)
    if obj is None:
        return
    recomputed: dict[str, dict[str, dict[str, float]]] = {}
    source = "(result.json only: no requests.jsonl)"
    if path is not None and (path.parent / "requests.jsonl").exists():
        recomputed = recompute_bench_figures(path.parent)
        source = _rel(run, path.parent / "requests.jsonl") + (
            " + chunks.jsonl" if (path.parent / "chunks.jsonl").exists() else "")
    res_src = _rel(run, path) if path is not None else f"steps/{name}.json"
    merged = json.loads(json.dumps(obj))      # result with the recomputed spreads in place of the recorded ones
    for case in merged.get("cases", []) or []:
        rc = recomputed.get(case.get("name"), {})
        for metric, rec in sorted((case.get("figures") or {}).items()):
            if not isinstance(rec, dict) or "median" not in rec:
                continue
            mine = rc.get(metric)
            if recomputed and metric in RECOMPUTED_METRICS:
                value, recorded, src, spread = (mine or {}).get("median"), _num(rec.get("median")), source, mine
                if mine is not None:
                    case["figures"][metric] = mine
            else:   # server-side counters (/metrics deltas), client CPU: not derivable from the request records
                value, recorded, spread = _num(rec.get("median")), None, rec
                src = res_src + (" (server /metrics counters)" if recomputed else "")
            lower = metric in LOWER_IS_BETTER
            model.figures.append(Figure(
                key=f"{name}/{case.get('name')}/{metric}", step=name, label=metric, value=value,
                unit=_bench_unit(metric), source=src, recorded=recorded,
                higher_is_better=(not lower) if (metric.endswith("tok_s") or lower) else None, node="head",
                spread={k: v for k, v in (spread or {}).items() if k != "median"} or None,
                group=str(case.get("name")), rel_tol=BENCH_REL_TOL,
                abs_tol=BENCH_TIME_ABS_TOL if metric.endswith("_s") and recorded is not None else 0.0))
    cfg = merged.get("config", {}) or {}
    recipe = cfg.get("recipe") or model.profile.get("RECIPE") or ""
    model.bench = {"step": name, "source": res_src, "raw": source, "status": obj.get("status"),
                   "model": obj.get("model"), "base_url": obj.get("base_url"), "recipe": recipe,
                   "config": {k: cfg.get(k) for k in ("endpoint", "prompt_tokens", "decode_tokens", "concurrency",
                                                     "prefill_tokens", "repeats", "soak_seconds") if k in cfg},
                   "cases": [{"name": c.get("name"), "kind": c.get("kind"), "concurrency": c.get("concurrency"),
                              "prompt_tokens": c.get("prompt_tokens"), "decode_tokens": c.get("decode_tokens"),
                              "status": c.get("status"), "failures": c.get("failures", []),
                              "warnings": c.get("warnings", [])} for c in merged.get("cases", []) or []],
                   "soak": obj.get("soak"), "result": merged}
    try:
        from ..bench.report import results_table
        df = results_table(_bench_result(merged), recipe=recipe)
        model.bench["table"] = json.loads(df.to_json(orient="records"))
    except Exception as exc:  # noqa: BLE001
        model.notes.append(f"bench: published comparison table unavailable ({type(exc).__name__}: {exc})")


def _bench_result(d: dict[str, Any]):
    from ..bench.result import BenchResult
    return BenchResult.from_dict(json.loads(json.dumps(d)))


def _bench_unit(metric: str) -> str:
    if metric.endswith("tok_s"):
        return "tok/s"
    if metric.endswith("_s"):
        return "s"
    if metric.endswith("pct"):
        return "%"
    return ""


# ------------------------------------------------------------------------------------------------
# headline figures (index, drift summary)
# ------------------------------------------------------------------------------------------------

def headline(model: ReportModel) -> dict[str, float | None]:
    def pick(pred: Callable[[Figure], bool], agg: Callable[[list[float]], float] = min) -> float | None:
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


# ------------------------------------------------------------------------------------------------
# checks for the 08_report step
# ------------------------------------------------------------------------------------------------

def report_checks(model: ReportModel, html_path: str | Path | None = None, index_path: str | Path | None = None):
    """The report step's checks: written and self-contained, figures agree, drift computed."""
    from ..checks import Check, check, not_applicable
    out = []
    if html_path is not None:
        p = Path(html_path)
        text = p.read_text() if p.exists() else ""
        ext = external_refs(text)
        out.append(check("report written", bool(text) and not ext, node="local",
                         observed=(f"{_rel(Path(model.run_path), p)}: {len(text) // 1024} KiB"
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
                         "; ".join(f"{f.key}: recomputed {_fmt(f.value)} != recorded {_fmt(f.recorded)} ({f.source})"
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
    if index_path is not None:
        ip = Path(index_path)
        out.append(check("results index written", ip.exists(), node="local", observed=str(ip),
                         expected="results/index.html and index.json"))
    return out


_EXT_RX = re.compile(r"""(?:src|href|url)\s*[=(]\s*["']?\s*(?:https?:)?//""", re.I)


def external_refs(text: str) -> list[str]:
    """Attributes that would load something from the network (src=/href=/url() to http(s) or //)."""
    return [text[max(0, m.start() - 20): m.end() + 40] for m in _EXT_RX.finditer(text or "")]


# ------------------------------------------------------------------------------------------------
# rendering
# ------------------------------------------------------------------------------------------------

_COLOURS = {"PASS": "#d4edda", "FAIL": "#f8d7da", "WARN": "#fff3cd", "N/A": "#e2e3e5", "NO-OP": "#d1ecf1", "SIMULATED": "#e8dff5",
            "passed": "#d4edda", "failed": "#f8d7da", "running": "#fff3cd", "not run": "#eeeeee"}

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222;font-size:14px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:32px}
h3{font-size:15px;margin-bottom:6px} table{border-collapse:collapse;margin:6px 0 12px;width:100%}
th,td{border:1px solid #d0d0d0;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.st{font-weight:600;text-align:center;white-space:nowrap} .muted{color:#777} .small{font-size:12px}
pre{background:#f7f7f7;border:1px solid #ddd;padding:8px;overflow-x:auto;font-size:12px;white-space:pre-wrap;word-break:break-all}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;margin-right:6px;font-weight:600}
.note{background:#fff8e1;border-left:4px solid #f0ad4e;padding:6px 10px;margin:6px 0}
.notrun{background:#f4f4f4;border-left:4px solid #aaa;padding:6px 10px;margin:6px 0;color:#555}
details>summary{cursor:pointer;font-weight:600;margin:4px 0} img{max-width:100%}
nav a{margin-right:10px} td.wrap{overflow-wrap:anywhere;min-width:8em}
"""


def _esc(x: Any, red: Redactor) -> str:
    return html.escape(red.redact(str(x)) if x is not None else "")


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and math.isfinite(v):
        s = f"{v:,.0f}" if abs(v) >= 10000 else f"{v:.4g}"
    else:
        s = str(v)
    return f"{s} {unit}".strip() if unit else s


def _status_cell(s: str) -> str:
    return f'<td class="st" style="background:{_COLOURS.get(s, "#fff")}">{html.escape(s)}</td>'


def _table(headers: list[str], rows: Iterable[list[str]], raw: bool = True) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(uri: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="{uri}">' if uri else ""


def _plot_network(figs: list[Figure]) -> str:
    rows = [f for f in figs if f.group in ("tcp", "rdma") and f.value is not None]
    if not rows:
        return ""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.2))
    xs = list(range(len(rows)))
    ok = ["tab:green" if (f.threshold is None or f.value >= f.threshold) else "tab:red" for f in rows]
    ax.bar(xs, [f.value for f in rows], color=ok)
    for x, f in zip(xs, rows):
        if f.threshold:
            ax.hlines(f.threshold, x - 0.4, x + 0.4, colors="black", linestyles="dashed")
        ax.text(x, f.value, f"{f.value:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, [f.label.replace(" ", "\n", 1) for f in rows], fontsize=7)
    ax.set_ylabel("Gb/s")
    ax.set_title("Fabric bandwidth, recomputed from raw iperf3 / ib_write_bw output (dashed: threshold)", fontsize=9)
    return _png(fig)


def _plot_readiness(readiness: list[dict[str, Any]]) -> str:
    rows = [r for r in readiness if r.get("seconds") is not None]
    if not rows:
        return ""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 1.8))
    ax.barh([r["phase"] for r in rows], [r["seconds"] for r in rows], color="tab:blue")
    for i, r in enumerate(rows):
        ax.text(r["seconds"], i, f" {r['seconds']:.1f} s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from launch")
    return _png(fig)


def _plot_bench(model: ReportModel) -> str:
    if not model.bench.get("result"):
        return ""
    import matplotlib
    matplotlib.use("Agg", force=False)
    from ..bench.report import plot_comparison
    fig = plot_comparison(_bench_result(model.bench["result"]), recipe=model.bench.get("recipe") or None)
    return _png(fig)


def render_html(model: ReportModel, *, redactor: Redactor | None = None, plots: bool = True) -> str:
    """The report page (pure function of the model; plots rendered here and embedded as data: URIs)."""
    red = redactor or default_redactor()
    e = lambda x: _esc(x, red)  # noqa: E731
    parts: list[str] = []
    counts = model.counts()
    st = model.status
    parts.append(f"<h1>Run report · {e(model.run_id)}</h1>")
    prov = model.provenance or {}
    git = prov.get("git") or {}
    parts.append(
        f'<p><span class="badge" style="background:{_COLOURS.get(st, "#eee")}">run {e(st)}</span>'
        + "".join(f'<span class="badge" style="background:{_COLOURS.get(k, "#eee")}">{e(k)} {v}</span>'
                  for k, v in counts.items() if v)
        + f'</p><p class="small muted">profile <b>{e(model.profile_name)}</b> (recipe {e(model.profile.get("RECIPE", "?"))}, '
          f'{e(model.manifest.get("profile_source", ""))}) · created {e(model.manifest.get("created", "?"))} · '
          f'mode {e(model.manifest.get("mode", "?"))}{" · DRY RUN" if model.manifest.get("dry_run") else ""} · '
          f'git {e((git.get("sha") or "?")[:12])}{" (dirty)" if git.get("dirty") else ""} · report generated '
          f'{e(model.generated)} from the files of {e(model.run_path)}; every number below is recomputed from '
          f'the run folder (sidecars, raw tool output, JSONL), none is copied from notebook text.</p>')
    nav = [("steps", "Steps"), ("matrix", "Checks"), ("drift", "Drift"), ("network", "Network"),
           ("weights", "Weights"), ("engram", "Engram"), ("launch", "Launch"), ("bench", "Benchmark"),
           ("figures", "All figures"), ("profile", "Profile"), ("provenance", "Provenance")]
    parts.append("<nav>" + "".join(f'<a href="#{a}">{t}</a>' for a, t in nav) + "</nav>")
    for n in model.notes:
        parts.append(f'<div class="note">{e(n)}</div>')

    # steps overview
    parts.append('<h2 id="steps">Steps</h2>')
    rows = []
    for s in model.steps:
        c = s.counts or {}
        rows.append([f"<td>{e(s.name)}</td>", f"<td>{e(s.title)}</td>", _status_cell(s.status or "?"),
                     f'<td class="num">{_fmt(s.seconds, "s")}</td>',
                     "<td>" + " ".join(f"{e(k)}&nbsp;{v}" for k, v in c.items() if v) + "</td>",
                     f'<td class="small">{e(s.error)}</td>'])
    parts.append(_table(["step", "title", "status", "duration", "checks", "error"], rows))

    # check matrix
    parts.append('<h2 id="matrix">Check matrix</h2><p class="small muted">Every check of every step, '
                 'from <code>steps/&lt;step&gt;.json</code>.</p>')
    for s in model.steps:
        if not s.ran:
            continue
        if not s.checks:
            parts.append(f'<h3>{e(s.name)} · {e(s.title)}</h3><div class="notrun">'
                         + ("no sidecar: the step did not finish (see its error above)" if not s.has_sidecar
                            else "the step recorded no checks") + "</div>")
            continue
        summary = ", ".join(f"{k} {v}" for k, v in s.counts.items() if v)
        rows = [[f"<td>{e(c.name)}</td>", f"<td>{e(c.node)}</td>", _status_cell(c.status),
                 f"<td>{e(c.observed)}</td>", f"<td>{e(c.expected)}</td>", f'<td class="small">{e(c.fix)}</td>']
                for c in s.checks]
        parts.append(f"<details open><summary>{e(s.name)} · {e(s.title)} — {e(summary)}</summary>"
                     + _table(["check", "node", "status", "observed", "expected", "fix"], rows) + "</details>")
    not_run = [s.name for s in model.steps if not s.ran]
    if not_run:
        parts.append(f'<div class="notrun">Not run in this run: {e(", ".join(not_run))}</div>')

    parts.append('<h2 id="drift">Drift from the previous good run</h2>')
    parts.append(_render_drift(model, e))

    def not_ran(suffix: str) -> str:
        s = model.step(suffix)
        if s is None or not s.ran:
            return f'<div class="notrun">Step {e(s.name if s else suffix)} did not run in this run.</div>'
        return ""

    def fig_rows(figs: list[Figure]) -> list[list[str]]:
        out = []
        for f in figs:
            ok = f.consistent
            mark = "–" if ok is None else ("yes" if ok else "NO")
            thr = _fmt(f.threshold) if f.threshold is not None else ""
            out.append([f"<td>{e(f.label)}</td>", f"<td>{e(f.node)}</td>", f'<td class="num">{_fmt(f.value, f.unit)}</td>',
                        f'<td class="num">{thr}</td>', f'<td class="num">{_fmt(f.recorded)}</td>',
                        _status_cell("PASS" if ok else "FAIL") if ok is not None else f"<td>{mark}</td>",
                        f'<td class="small">{e(f.source)}</td>'])
        return out
    fig_head = ["figure", "node", "recomputed", "threshold", "recorded by step", "agrees", "recomputed from"]

    # network
    parts.append('<h2 id="network">Network</h2>')
    parts.append(not_ran("network"))
    net = model.figures_of("network")
    if net:
        if plots:
            parts.append(_img(_plot_network(net), "bandwidth"))
        parts.append(_table(fig_head, fig_rows(net)))
    elif model.step("network") and model.step("network").ran:
        parts.append('<p class="muted">No bandwidth or latency figures in the 01 evidence.</p>')
    env_rows = []
    for node, facts in sorted(model.environment.items()):
        for k, v in sorted(facts.items()):
            if k == "command":
                continue
            env_rows.append([f"<td>{e(node)}</td>", f"<td>{e(k)}</td>", f"<td>{e(v)}</td>"])
    if env_rows:
        parts.append("<h3>Node facts used for drift (00 / 01 / 04 sidecars)</h3>")
        parts.append(_table(["node", "fact", "value"], env_rows))

    # weights
    parts.append('<h2 id="weights">Weights</h2>')
    parts.append(not_ran("weights"))
    if model.weights:
        parts.append("<p>" + " · ".join(f"{e(k)} <b>{e(v)}</b>" for k, v in model.weights.items()) + "</p>")
    wf = model.figures_of("weights")
    if wf:
        parts.append(_table(fig_head, fig_rows(wf)))

    # engram
    parts.append('<h2 id="engram">Engram</h2>')
    parts.append(not_ran("engram"))
    ef = model.figures_of("engram")
    if ef:
        parts.append(_table(fig_head, fig_rows(ef)))
    elif model.step("engram") and model.step("engram").ran:
        parts.append('<p class="muted">No Engram tool output archived (disabled on this profile, or the step '
                     'stopped before packing; see its checks).</p>')

    # launch
    parts.append('<h2 id="launch">Launch</h2>')
    parts.append(not_ran("launch"))
    L = model.launch
    if L:
        parts.append(f'<p>runtime <b>{e(L.get("runtime"))}</b> · recipe {e(L.get("recipe"))} · fingerprint '
                     f'<code>{e((L.get("fingerprint") or "")[:16])}</code> · API {e(L.get("base_url"))}'
                     f'{" · reused a running server" if L.get("reused") else ""}</p>')
        for r in sorted(L.get("ranks", []), key=lambda r: -(r.get("rank") or 0)):
            parts.append(f"<h3>rank {e(r.get('rank'))} on {e(r.get('node'))}"
                         f"{' (headless)' if r.get('headless') else ''}</h3><pre>{e(r.get('command'))}</pre>")
        if not L.get("ranks"):
            parts.append('<p class="muted">No rendered commands archived (raw/04_launch/rendered.json missing).</p>')
        rf = [f for f in model.figures_of("launch") if f.group == "readiness"]
        if rf:
            parts.append("<h3>Readiness (seconds from launch of the worker rank)</h3>")
            if plots:
                parts.append(_img(_plot_readiness(L.get("readiness", [])), "readiness"))
            parts.append(_table(fig_head, fig_rows(rf)))
        if L.get("capacity"):
            cap = L["capacity"]
            keys = sorted({k for row in cap for k in row})
            parts.append("<h3>Capacity</h3>" + _table(keys, [[f"<td>{e(row.get(k))}</td>" for k in keys] for row in cap]))

    # bench
    parts.append('<h2 id="bench">Benchmark</h2>')
    parts.append(not_ran("bench"))
    B = model.bench
    if B:
        parts.append(f'<p>{e(B.get("model"))} @ {e(B.get("base_url"))} · status {e(B.get("status"))} · recipe '
                     f'{e(B.get("recipe"))} · config {e(json.dumps(B.get("config")))}<br><span class="small muted">'
                     f'figures recomputed from {e(B.get("raw"))}; recorded values from {e(B.get("source"))}</span></p>')
        if plots:
            try:
                parts.append(_img(_plot_bench(model), "benchmark vs published"))
            except Exception as exc:  # noqa: BLE001
                parts.append(f'<div class="note">bench plot failed: {e(exc)}</div>')
        table = B.get("table") or []
        if table:
            rows = []
            for r in table:
                rows.append([f"<td>{e(r.get('case'))}</td>", _status_cell(r.get("status") or "") if r.get("status") else "<td></td>",
                             f"<td>{e(r.get('label'))}</td>", f'<td class="num">{_fmt(r.get("median"))}</td>',
                             f'<td class="num">{_fmt(r.get("min"))} … {_fmt(r.get("max"))}</td>',
                             f'<td class="num">{e(r.get("n"))}</td>', f'<td class="num">{_fmt(r.get("published"))}</td>',
                             f'<td class="small">{e(r.get("published_conditions"))}<br><i>{e(r.get("published_source"))}</i></td>'])
            parts.append(_table(["case", "status", "metric", "median", "min … max", "n", "published", "published conditions / source"], rows))
        issues = [(c["name"], "FAIL", m) for c in B.get("cases", []) for m in c.get("failures", [])]
        issues += [(c["name"], "WARN", m) for c in B.get("cases", []) for m in c.get("warnings", [])]
        if issues:
            parts.append(_table(["case", "", "message"], [[f"<td>{e(a)}</td>", _status_cell(b), f"<td>{e(c)}</td>"]
                                                          for a, b, c in issues]))
        bf = model.figures_of("bench")
        if bf:
            parts.append("<details><summary>Recomputation of every benchmark figure</summary>"
                         + _table(["case / metric", "recomputed median", "min … max", "n", "recorded (result.json)", "agrees", "from"],
                                  [[f"<td>{e(f.group)} / {e(f.label)}</td>", f'<td class="num">{_fmt(f.value, f.unit)}</td>',
                                    f'<td class="num">{_fmt((f.spread or {}).get("min"))} … {_fmt((f.spread or {}).get("max"))}</td>',
                                    f'<td class="num">{e((f.spread or {}).get("n", ""))}</td>',
                                    f'<td class="num">{_fmt(f.recorded)}</td>',
                                    (_status_cell("PASS" if f.consistent else "FAIL") if f.consistent is not None else "<td>–</td>"),
                                    f'<td class="small">{e(f.source)}</td>'] for f in bf]) + "</details>")

    # other steps (smoke, vision/tools, ...): their checks are in the matrix
    for suffix in ("smoke", "vision_tools"):
        s = model.step(suffix)
        if s is not None and not s.ran:
            parts.append(f'<div class="notrun">Step {e(s.name)} ({e(s.title)}) did not run in this run.</div>')

    # all figures
    parts.append('<h2 id="figures">All figures and their recomputation</h2>')
    bad = model.inconsistent()
    if bad:
        parts.append(f'<div class="note">{len(bad)} figure(s) disagree with what their step recorded: '
                     f'{e(", ".join(f.key for f in bad))}</div>')
    other = [f for f in model.figures if not f.step.endswith("bench")]
    parts.append(_table(["key"] + fig_head[1:], [[f"<td class='small'>{e(f.key)}</td>"] + fig_rows([f])[0][1:] for f in other])
                 if other else '<p class="muted">No figures.</p>')

    # profile
    parts.append('<h2 id="profile">Profile</h2><p class="small muted">profile.json of the run (secrets masked).</p>')
    prows = [[f"<td>{e(k)}</td>", f"<td>{e(json.dumps(v) if not isinstance(v, str) else v)}</td>"]
             for k, v in model.profile.items()]
    parts.append("<details><summary>all keys</summary>" + _table(["key", "value"], prows) + "</details>")

    # provenance
    parts.append('<h2 id="provenance">Provenance</h2>')
    pk = prov.get("packages") or {}
    parts.append(_table(["item", "value"], [[f"<td>{e(k)}</td>", f"<td>{e(v)}</td>"] for k, v in (
        [("git", json.dumps(git)), ("python", prov.get("python")), ("host", json.dumps(prov.get("host")))]
        + [(f"package {k}", v) for k, v in pk.items()])]))

    body = "\n".join(p for p in parts if p)
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Run report {e(model.run_id)}</title><style>{_CSS}</style></head><body>{body}"
            f"<p class=\"small muted\">spark-runbook report · {e(model.generated)}</p></body></html>\n")
    return red.redact(page)


def _render_drift(model: ReportModel, e: Callable[[Any], str]) -> str:
    d = model.drift
    if d is None:
        return '<div class="notrun">Drift was not computed.</div>'
    if d.previous_run_id is None:
        return f'<div class="notrun">{e(d.reason or "no previous good run")}</div>'
    out = [f'<p>Compared with <b>{e(d.previous_run_id)}</b> (the latest earlier run of profile '
           f'{e(model.profile_name)} whose manifest status is <i>passed</i>). Figures: moved when outside the '
           f'benchmark spread (min…max of both runs do not overlap) or, without a spread, when they change by more '
           f'than {d.rel_tol:.0%}. {e(d.summary())}.</p>']
    if d.not_compared:
        out.append(f'<p class="small muted">Not compared (step ran in only one of the two runs): '
                   f'{e(", ".join(d.not_compared))}</p>')
    if not d.items:
        out.append('<p>No drift.</p>')
        return "".join(out)
    rows = []
    for it in d.items:
        colour = {"worse": "FAIL", "better": "PASS", "changed": "WARN"}.get(it.direction, "WARN")
        rows.append([f"<td>{e(it.kind)}</td>", f"<td>{e(it.key)}</td>", f'<td class="wrap">{e(it.previous)}</td>',
                     f'<td class="wrap">{e(it.current)}</td>', _status_cell(colour).replace(f">{colour}<", f">{e(it.direction)}<"),
                     f'<td class="small">{e(it.detail)}</td>'])
    out.append(_table(["kind", "what", f"previous ({d.previous_run_id})", "this run", "", "detail"], rows))
    return "".join(out)


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------

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


def index_entries(results_root: str | Path, redactor: Redactor | None = None) -> list[dict[str, Any]]:
    root = Path(results_root)
    out = []
    for m in sorted(root.glob("*/manifest.json")):
        run = m.parent
        man = _load_json(m) or {}
        entry = {"run_id": man.get("run_id") or run.name, "profile": man.get("profile"), "status": man.get("status"),
                 "created": man.get("created"), "mode": man.get("mode"), "dry_run": man.get("dry_run"),
                 "steps": {k: v.get("status") for k, v in (man.get("steps") or {}).items()},
                 "report": f"{run.name}/{REPORT_NAME}" if (run / REPORT_NAME).exists() else None}
        try:
            model = collect(run, drift=False, redactor=redactor)
            entry["headline"] = headline(model)
            entry["checks"] = model.counts()
        except Exception as exc:  # noqa: BLE001
            entry["headline"], entry["error"] = {}, f"{type(exc).__name__}: {exc}"
        out.append(entry)
    out.sort(key=lambda x: (str(x.get("created") or ""), x["run_id"]), reverse=True)
    return out


def write_index(results_root: str | Path, redactor: Redactor | None = None) -> tuple[Path, Path]:
    """``results/index.json`` and ``results/index.html``: every run, newest first, with headline figures."""
    root = Path(results_root)
    red = redactor or default_redactor()
    entries = index_entries(root, red)
    gen = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    jpath = atomic_write(root / "index.json", red.redact(json.dumps({"generated": gen, "runs": entries}, indent=1,
                                                                       default=str)) + "\n")
    keys = list(headline_keys())
    e = lambda x: _esc(x, red)  # noqa: E731
    rows = []
    for en in entries:
        link = f'<a href="{html.escape(en["report"])}">{e(en["run_id"])}</a>' if en.get("report") else e(en["run_id"])
        hl = en.get("headline") or {}
        rows.append([f"<td>{link}</td>", f"<td>{e(en.get('profile'))}</td>", _status_cell(str(en.get("status"))),
                     f"<td class='small'>{e(en.get('created'))}</td>",
                     f"<td class='small'>{e(', '.join(en.get('steps') or {}))}</td>"]
                    + [f'<td class="num">{_fmt(hl.get(k))}</td>' for k in keys])
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Runs</title><style>{_CSS}</style>"
            f"</head><body><h1>Runs under {e(root)}</h1><p class='small muted'>generated {e(gen)} · "
            f"headline figures recomputed from each run's files</p>"
            + _table(["run", "profile", "status", "created", "steps"] + keys, rows) + "</body></html>\n")
    hpath = atomic_write(root / "index.html", red.redact(page))
    return hpath, jpath


def headline_keys() -> tuple[str, ...]:
    return ("tcp_gbps_min", "rdma_total_gbps_min", "nccl_busbw_gbs", "weights_verify_gbps", "ready_first_token_s",
            "decode_tok_s_c1", "aggregate_tok_s_max", "prefill_tok_s_max")
