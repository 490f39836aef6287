"""Tables and plots placing a run beside the published figures of its recipe and the previous run.

Published figures live in ``published.json`` (with their conditions and the source's own formula);
each names the ``comparable_metric`` of ``BenchResult`` whose definition is closest.
"""
from __future__ import annotations

import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any

from .result import BenchResult, CaseResult

#: (metric, label) rows of the results table, per case kind
ROWS = {
    "decode": [("decode_tok_s", "per-stream decode tok/s"), ("aggregate_tok_s", "aggregate tok/s (steady window)"),
               ("aggregate_span_tok_s", "aggregate tok/s (first..last token span)"),
               ("aggregate_wall_tok_s", "aggregate tok/s (wall, incl. TTFT)"),
               ("ttft_s", "TTFT s"), ("ttfr_s", "time to first chunk s"), ("tokens_per_chunk", "tokens/chunk"),
               ("spec_mean_acceptance_length", "spec acceptance length")],
    "prefill": [("prefill_tok_s", "prefill tok/s (prompt/TTFT)"),
                ("server_prefill_tok_s", "prefill tok/s (server /metrics)"), ("ttft_s", "TTFT s")],
}


def load_published(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    if path:
        return json.loads(Path(path).read_text())
    return json.loads(resources.files(__package__).joinpath("published.json").read_text())


def _as_result(x: BenchResult | str | os.PathLike[str] | None) -> BenchResult | None:
    if x is None or isinstance(x, BenchResult):
        return x
    return BenchResult.load(x)


def _match_case(result: BenchResult | None, kind: str, c: int | None, p: int | None) -> CaseResult | None:
    if result is None:
        return None
    cands = [k for k in result.cases if k.kind == kind and (c is None or k.concurrency == c)]
    if kind == "prefill" and p:
        cands = [k for k in cands if abs(k.prompt_tokens - p) <= 0.15 * p]
    if not cands:
        return None
    if p:
        cands.sort(key=lambda k: abs(k.prompt_tokens - p))
    return cands[0]


def _prev_case(prev: BenchResult | None, case: CaseResult) -> CaseResult | None:
    if prev is None:
        return None
    return prev.case(case.name) or _match_case(prev, case.kind, case.concurrency,
                                              case.prompt_tokens if case.kind == "prefill" else None)


def results_table(result: BenchResult | str | os.PathLike[str], *, previous: Any = None,
                  recipe: str | None = None, published: dict[str, Any] | None = None):
    """One row per (case, metric): median, min, max, IQR, n, the previous run's median and the change,
    plus published rows of the recipe that match the case (kind, concurrency, prompt size +-15 % for
    prefill) with their conditions. Published figures with no matching case get their own rows
    (``case`` = "(not measured)")."""
    import pandas as pd
    res = _as_result(result)
    assert res is not None
    prev = _as_result(previous)
    recipe = recipe if recipe is not None else res.config.get("recipe", "")
    pub = [f for f in (published or load_published())["figures"] if f["recipe"] == recipe] if recipe else []
    used: set[int] = set()
    rows = []
    for case in res.cases:
        pc = _prev_case(prev, case)
        for metric, label in ROWS.get(case.kind, []):
            fig = case.figures.get(metric)
            if not fig:
                continue
            pv = pc.median(metric) if pc else None
            row = {"case": case.name, "status": case.status, "metric": metric, "label": label,
                   "concurrency": case.concurrency, "prompt_tokens": case.prompt_tokens,
                   "median": fig["median"], "min": fig["min"], "max": fig["max"], "iqr": fig.get("iqr"),
                   "n": fig["n"], "previous": pv,
                   "change_pct": (100.0 * (fig["median"] / pv - 1.0)) if pv else None,
                   "published": None, "published_conditions": "", "published_source": ""}
            matches = _matches(pub, case, metric)
            for j, i in enumerate(matches):
                f = pub[i]
                used.add(i)
                r2 = row if j == 0 else dict(row)
                r2.update(published=f["value"], published_conditions=_cond(f), published_source=f["source"])
                if j > 0:
                    rows.append(r2)
            rows.append(row)
    for i, f in enumerate(pub):
        if i not in used:
            rows.append({"case": "(not measured)", "status": "", "metric": f["comparable_metric"], "label": f["metric"],
                         "concurrency": f["concurrency"], "prompt_tokens": f["prompt_tokens"], "median": None,
                         "min": None, "max": None, "iqr": None, "n": 0, "previous": None, "change_pct": None,
                         "published": f["value"],
                         "published_conditions": _cond(f),
                         "published_source": f["source"]})
    return pd.DataFrame(rows)


def _pts(res: BenchResult | None, kind: str, metric: str, x: str) -> tuple[list, list, list, list]:
    xs, ys, lo, hi = [], [], [], []
    if res is None:
        return xs, ys, lo, hi
    for c in res.cases:
        f = c.figures.get(metric)
        if c.kind == kind and f:
            xs.append(getattr(c, x)); ys.append(f["median"]); lo.append(f["median"] - f["min"]); hi.append(f["max"] - f["median"])
    return xs, ys, lo, hi


def plot_comparison(result: BenchResult | str | os.PathLike[str], *, previous: Any = None,
                    recipe: str | None = None, published: dict[str, Any] | None = None,
                    path: str | os.PathLike[str] | None = None):
    """Three panels: decode tok/s vs concurrency (per-stream and aggregate), TTFT vs concurrency,
    prefill tok/s vs prompt tokens. Run = solid with min..max error bars; previous run = dashed;
    published figures of the recipe = hollow markers (labelled with their source's definition in
    the table, not here). Returns the matplotlib Figure; saves it to ``path`` when given."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    res = _as_result(result)
    assert res is not None
    prev = _as_result(previous)
    recipe = recipe if recipe is not None else res.config.get("recipe", "")
    pub = [f for f in (published or load_published())["figures"] if f["recipe"] == recipe] if recipe else []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    title = f"{res.model} @ {res.base_url} run {res.run_id}" + (f" vs published {recipe}" if pub else "")
    fig.suptitle(title, fontsize=10)
    ax = axes[0]
    for metric, color, lab in (("decode_tok_s", "C0", "per-stream"), ("aggregate_tok_s", "C1", "aggregate")):
        xs, ys, lo, hi = _pts(res, "decode", metric, "concurrency")
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], color=color, marker="o", capsize=3, label=f"run {lab}")
        xs, ys, _, _ = _pts(prev, "decode", metric, "concurrency")
        if xs:
            ax.plot(xs, ys, color=color, ls="--", marker=".", label=f"previous {lab}")
    for f in pub:
        if f["metric"] in ("decode_tok_s", "per_stream_decode_tok_s", "aggregate_tok_s") and (f["decode_tokens"] or 0) > 8:
            color = "C1" if f["metric"] == "aggregate_tok_s" else "C0"
            ax.plot([f["concurrency"]], [f["value"]], marker="s", mfc="none", color=color, ls="none")
    if pub:
        ax.plot([], [], marker="s", mfc="none", color="gray", ls="none", label=f"published ({recipe})")
    ax.set_xlabel("concurrent streams"); ax.set_ylabel("tok/s"); ax.set_title("decode"); ax.legend(fontsize=7)
    ax = axes[1]
    xs, ys, lo, hi = _pts(res, "decode", "ttft_s", "concurrency")
    if xs:
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label="run")
    xs, ys, _, _ = _pts(prev, "decode", "ttft_s", "concurrency")
    if xs:
        ax.plot(xs, ys, ls="--", marker=".", label="previous")
    pp = [f for f in pub if f["metric"] == "ttft_s" and (f["decode_tokens"] or 0) > 8]
    if pp:
        ax.plot([f["concurrency"] for f in pp], [f["value"] for f in pp], marker="s", mfc="none", ls="none",
                color="gray", label=f"published ({recipe}, various ISL)")
    ax.set_yscale("log"); ax.set_xlabel("concurrent streams"); ax.set_ylabel("s"); ax.set_title("TTFT (decode cases)")
    ax.legend(fontsize=7)
    ax = axes[2]
    for metric, lab, color in (("prefill_tok_s", "client prompt/TTFT", "C0"), ("server_prefill_tok_s", "server /metrics", "C2")):
        xs, ys, lo, hi = _pts(res, "prefill", metric, "prompt_tokens")
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=color, label=f"run {lab}")
        xs, ys, _, _ = _pts(prev, "prefill", metric, "prompt_tokens")
        if xs:
            ax.plot(xs, ys, ls="--", marker=".", color=color, label=f"previous {lab}")
    pp = [f for f in pub if f["metric"] == "prefill_tok_s" and f["concurrency"] == 1]
    if pp:
        ax.plot([f["prompt_tokens"] for f in pp], [f["value"] for f in pp], marker="s", mfc="none", ls="none",
                color="gray", label=f"published ({recipe})")
    ax.set_xscale("log"); ax.set_xlabel("prompt tokens"); ax.set_ylabel("tok/s"); ax.set_title("prefill (C=1)")
    ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.13, top=0.88, wspace=0.25)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    return fig


def render_text(result: BenchResult | str | os.PathLike[str], *, previous: Any = None,
                recipe: str | None = None) -> str:
    """A plain-text summary: one line per case with its headline figures and its status."""
    res = _as_result(result)
    assert res is not None
    lines = [f"bench {res.run_id}  {res.model} @ {res.base_url}  status {res.status}"]

    def fmt(c: CaseResult, m: str, unit: str = "") -> str:
        f = c.figures.get(m)
        if not f:
            return f"{m}=n/a"
        return f"{m}={f['median']:.4g}{unit} [{f['min']:.4g}..{f['max']:.4g}]"

    for c in res.cases:
        if c.kind == "decode":
            body = ", ".join(fmt(c, m) for m in ("decode_tok_s", "aggregate_tok_s", "ttft_s"))
        else:
            body = ", ".join(fmt(c, m) for m in ("prefill_tok_s", "server_prefill_tok_s", "ttft_s"))
        lines.append(f"  {c.status:4} {c.name:28} {body}")
        for msg in c.failures:
            lines.append(f"       FAIL: {msg}")
        for msg in c.warnings:
            lines.append(f"       warn: {msg}")
    if res.soak:
        s = res.soak
        lines.append(f"  {s['status']:4} soak {s['seconds']} s, {s['windows_n']} windows, {s['requests']} requests")
        for msg in s.get("failures", []):
            lines.append(f"       FAIL: {msg}")
    return "\n".join(lines)


def write_report(result: BenchResult, out_dir: str | os.PathLike[str], *, previous: Any = None,
                 recipe: str | None = None, plot: bool = True) -> dict[str, str]:
    """Write ``table.csv``, ``summary.txt`` and (unless ``plot=False``) ``comparison.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = results_table(result, previous=previous, recipe=recipe)
    df.to_csv(out / "table.csv", index=False)
    (out / "summary.txt").write_text(render_text(result, previous=previous, recipe=recipe) + "\n")
    paths = {"table": str(out / "table.csv"), "summary": str(out / "summary.txt")}
    if not plot:
        return paths
    fig = plot_comparison(result, previous=previous, recipe=recipe, path=out / "comparison.png")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return {**paths, "plot": str(out / "comparison.png")}


def _cond(f: dict[str, Any]) -> str:
    return (f"{f['conditions']}; variant {f.get('variant', 'default')}; ISL {f['prompt_tokens'] or '?'}; "
            f"OSL {f['decode_tokens'] or '?'}; definition: {f['definition']}")


def _matches(pub: list[dict[str, Any]], case: CaseResult, metric: str) -> list[int]:
    """Indices of published figures comparable with ``metric`` of ``case``: same kind and concurrency;
    prefill within +-15 % prompt size; decode: per (source, variant) only the prompt size nearest to
    the case's (log distance; a figure without a stated ISL always matches)."""
    cands: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for i, f in enumerate(pub):
        cm = f["comparable_metric"]
        if cm != metric and not (metric == "decode_tok_s" and cm == "per_stream_decode_tok_s"):
            continue
        kind = _pub_kind(f)
        if kind != case.kind or (f["concurrency"] or 1) != case.concurrency:
            continue
        p = f["prompt_tokens"]
        if kind == "prefill" and abs(p - case.prompt_tokens) > 0.15 * p:
            continue
        dist = abs(math.log(p / case.prompt_tokens)) if (p and case.prompt_tokens) else 0.0
        cands.setdefault((f["source"], f.get("variant", "default")), []).append((dist, i))
    out: list[int] = []
    for group in cands.values():
        best = min(d for d, _ in group)
        out += [i for d, i in group if d == best]
    return sorted(out)


def _pub_kind(f: dict[str, Any]) -> str:
    """A published figure compares with our prefill cases (C=1, max_tokens=1) or decode cases."""
    if f["metric"] == "prefill_tok_s" or (f["metric"] == "ttft_s" and (f["decode_tokens"] or 0) <= 8):
        return "prefill"
    return "decode"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
