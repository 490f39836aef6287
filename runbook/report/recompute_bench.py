"""Benchmark figures (step 07), recomputed from the request records beside ``result.json``.

The result file is the one the 07 sidecar names (``data…result``); ``requests.jsonl``/``chunks.jsonl``
beside it are re-read with :func:`runbook.benchmark.result.load_records` and reduced with the formulas of
:mod:`runbook.benchmark.metrics` (the same grouping as the bench runner: per-stream metrics over every OK
request of a case, per-trial metrics over the case's trials), then compared with ``result.json`` and set
beside the recipe's published figures (:func:`runbook.benchmark.report.results_table`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..benchmark import metrics
from ..benchmark.report import anchors_table, class_table, results_table
from ..benchmark.result import BenchResult, load_records
from ..benchmark.roofline_panel import panel_rows, rank_rows
from ..fit.roofline import Roofline
from .model import ReportFigure, ReportModel
from ..records import BenchRecord
from .runfiles import data_paths, find_sidecar, load_json, number, record_of, relative

__all__ = ["RECOMPUTED_METRICS", "BENCH_REL_TOL", "BENCH_TIME_ABS_TOL", "LOWER_IS_BETTER", "find_bench_result",
           "recompute_bench_figures", "bench", "bench_result", "bench_unit", "roofline", "data_of"]

RECOMPUTED_METRICS = ("ttft_s", "ttfr_s", "tokens_per_chunk", "decode_tok_s", "per_stream_decode_tok_s",
                      "max_gap_s", "aggregate_tok_s", "aggregate_span_tok_s", "aggregate_wall_tok_s",
                      "steady_coverage", "release_skew_s", "prefill_tok_s")
# requests.jsonl stores times relative to t0 rounded to 0.1 us; result.json was computed before rounding.
# Rates carry that as a relative error; a time figure (a difference of two stamps, e.g. a 50 us release
# skew) as an absolute one of up to 2 x 0.05 us.
BENCH_REL_TOL = 1e-3
BENCH_TIME_ABS_TOL = 2e-7
LOWER_IS_BETTER = ("ttft_s", "ttfr_s", "max_gap_s", "release_skew_s", "mean_queue_time_s", "client_cpu_pct")


def _is_result(obj: Any) -> bool:
    return isinstance(obj, dict) and str(obj.get("schema_version", "")).startswith("runbook.bench/")


def find_bench_result(run: Path, sidecars: dict[str, dict[str, Any]]) -> tuple[str, Path | None, dict | None]:
    """(07 step name, result.json path, parsed result) from the path the 07 sidecar records under a
    ``result`` key of its data (or a result embedded in the data itself: path None)."""
    name, sc = find_sidecar(sidecars, "bench")
    data = (sc or {}).get("data") or {}
    rec = record_of(sidecars, BenchRecord)       # a run made before records: the paths in its data
    for rel in ([rec.result] if rec is not None and rec.result else data_paths(data, "result")):
        p = run / rel
        obj = load_json(p) if p.is_file() else None
        if _is_result(obj):
            return name, p, obj
    for v in data.values():
        if _is_result(v):
            return name, None, v
    return name, None, None


def data_of(sidecars: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The 07 sidecar's data (``{}`` without one)."""
    _, sc = find_sidecar(sidecars, "bench")
    return (sc or {}).get("data") or {}


def recompute_bench_figures(out_dir: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """case name -> metric -> Spread dict, recomputed from ``requests.jsonl`` (+ ``chunks.jsonl``) with
    the formulas of :mod:`runbook.benchmark.metrics` (the same grouping as the bench runner: per-stream
    metrics over every OK request of the case, per-trial metrics over the case's trials)."""
    by_case: dict[str, list] = {}
    for r in load_records(out_dir):
        by_case.setdefault(r.case, []).append(r)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for case, rs in by_case.items():
        if case == "warmup":
            continue
        f: dict[str, dict[str, float]] = {}

        def put(key: str, vals: list[Any]) -> None:
            s = metrics.spread(vals)
            if s:
                f[key] = s.to_dict()
        f.update(metrics.request_spreads(rs, decode=case.startswith("decode")))
        trials: dict[int, list] = {}
        for r in sorted(rs, key=lambda r: (r.trial, r.stream)):
            trials.setdefault(r.trial, []).append(r)
        if case.startswith("decode"):
            aggs = [metrics.aggregate_figures(t) for _, t in sorted(trials.items())]
            for k in ("aggregate_tok_s", "aggregate_span_tok_s", "aggregate_wall_tok_s", "steady_coverage",
                      "release_skew_s"):
                put(k, [a.get(k) for a in aggs])
        elif case.startswith("prefill"):
            put("prefill_tok_s", [metrics.prefill_tok_s(t[0]) for _, t in sorted(trials.items())])
        out[case] = f
    return out


def bench(model: ReportModel, run: Path, sidecars: dict[str, dict[str, Any]]) -> None:
    name, path, obj = find_bench_result(run, sidecars)
    if obj is None:
        return
    recomputed: dict[str, dict[str, dict[str, float]]] = {}
    source = "(result.json only: no requests.jsonl)"
    if path is not None and (path.parent / "requests.jsonl").exists():
        recomputed = recompute_bench_figures(path.parent)
        source = relative(run, path.parent / "requests.jsonl") + (
            " + chunks.jsonl" if (path.parent / "chunks.jsonl").exists() else "")
    res_src = relative(run, path) if path is not None else f"steps/{name}.json"
    merged = json.loads(json.dumps(obj))      # result with the recomputed spreads in place of the recorded ones
    for case in merged.get("cases", []) or []:
        rc = recomputed.get(case.get("name"), {})
        for metric, rec in sorted((case.get("figures") or {}).items()):
            if not isinstance(rec, dict) or "median" not in rec:
                continue
            mine = rc.get(metric)
            if recomputed and metric in RECOMPUTED_METRICS:
                value, recorded, src, spread = (mine or {}).get("median"), number(rec.get("median")), source, mine
                if mine is not None:
                    case["figures"][metric] = mine
            else:   # server-side counters (/metrics deltas), client CPU: not derivable from the request records
                value, recorded, spread = number(rec.get("median")), None, rec
                src = res_src + (" (server /metrics counters)" if recomputed else "")
            lower = metric in LOWER_IS_BETTER
            model.figures.append(ReportFigure(
                key=f"{name}/{case.get('name')}/{metric}", step=name, label=metric, value=value,
                unit=bench_unit(metric), source=src, recorded=recorded,
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
        df = results_table(bench_result(merged), recipe=recipe)
        model.bench["table"] = json.loads(df.to_json(orient="records"))
    except Exception as exc:  # noqa: BLE001 - the comparison table is optional
        model.notes.append(f"bench: published comparison table unavailable ({type(exc).__name__}: {exc})")
    roofline(model, data_of(sidecars), merged, recipe)
    # the workload-class panel (never averaged into one figure) and every published anchor beside ours
    for key, build in (("classes", lambda: class_table(bench_result(merged))),
                       ("anchors", lambda: anchors_table(bench_result(merged), recipe=recipe))):
        try:
            model.bench[key] = json.loads(build().to_json(orient="records"))
        except Exception as exc:  # noqa: BLE001 - optional sections
            model.notes.append(f"bench: {key} table unavailable ({type(exc).__name__}: {exc})")


def roofline(model: ReportModel, data: dict[str, Any], merged: dict[str, Any], recipe: str) -> None:
    """The roofline panel recomputed from the recomputed result and the inputs 07 recorded (bytes per
    step, the slowest rank's bandwidth, the all-reduce latency); the memory-bandwidth probes per rank;
    the protocol reconciliation of the ``vllm bench serve`` cross-check."""
    if data.get("membw"):
        model.bench["membw"] = data["membw"]
    cross = data.get("vllm_cross_check") or {}
    if cross.get("reconciliation"):
        model.bench["reconciliation"] = {"case": cross.get("case"), "seed": cross.get("seed"),
                                         "rows": cross["reconciliation"]}
    roof = data.get("roofline") or {}
    if roof.get("error"):
        model.notes.append(f"bench: roofline panel unavailable ({roof['error']})")
        return
    if not roof.get("step"):
        return
    keys = ("tp", "pp", "context", "kv_dtype", "spec_k", "weights_per_rank", "kv_per_rank", "plain_bytes_per_rank",
            "verify_bytes_per_rank", "allreduces", "bandwidth", "bandwidth_note", "allreduce_s", "allreduce_note",
            "allreduce_measured", "comparable", "step")
    out = {k: roof.get(k) for k in keys}
    if roof.get("bandwidth"):
        try:
            out["rows"] = panel_rows(bench_result(merged), Roofline.from_dict(roof), bandwidth=float(roof["bandwidth"]),
                                     allreduce_s=float(roof.get("allreduce_s") or 0.0), recipe=recipe,
                                     comparable=bool(roof.get("comparable", True)))
        except Exception as exc:  # noqa: BLE001 - an optional section
            model.notes.append(f"bench: roofline rows unavailable ({type(exc).__name__}: {exc})")
        try:   # one row per rank: its own probe, the all-reduce across the TP group (any node count)
            out["rank_rows"] = rank_rows(Roofline.from_dict(roof), data.get("membw"),
                                         bandwidth=float(roof["bandwidth"]),
                                         allreduce_s=float(roof.get("allreduce_s") or 0.0), ranks=int(roof["tp"]),
                                         allreduce_measured=bool(roof.get("allreduce_measured")),
                                         pp=int(roof.get("pp") or 1))
        except Exception as exc:  # noqa: BLE001 - an optional section
            model.notes.append(f"bench: roofline per rank unavailable ({type(exc).__name__}: {exc})")
    model.bench["roofline"] = out


def bench_result(d: dict[str, Any]) -> BenchResult:
    """A fresh ``BenchResult`` of a result dict (deep-copied: the caller's dict stays as it is)."""
    return BenchResult.from_dict(json.loads(json.dumps(d)))


def bench_unit(metric: str) -> str:
    if metric.endswith("tok_s"):
        return "tok/s"
    if metric.endswith("_s"):
        return "s"
    if metric.endswith("pct"):
        return "%"
    return ""
