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

from ..evidence import write_redacted
from .result import BenchResult, CaseResult

#: (metric, label) rows of the results table, per case kind
ROWS = {
    "decode": [("decode_tok_s", "per-stream decode tok/s"), ("aggregate_tok_s", "aggregate tok/s (steady window)"),
               ("aggregate_span_tok_s", "aggregate tok/s (first..last token span)"),
               ("aggregate_wall_tok_s", "aggregate tok/s (wall, incl. TTFT)"),
               ("ttft_s", "TTFT s"), ("ttfr_s", "time to first chunk s"), ("tokens_per_chunk", "tokens/chunk"),
               ("spec_mean_acceptance_length", "spec acceptance length")],
    "class": [("decode_tok_s", "decode tok/s"), ("ttft_s", "TTFT s"), ("ttfa_s", "time to first answer s"),
              ("tokens_per_chunk", "tokens/chunk"), ("spec_acceptance_rate", "spec acceptance rate"),
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


def case_class(result: BenchResult, case: CaseResult | None = None) -> tuple[str, str]:
    """(workload class, thinking) a case was measured under: the case's own (class panel), else the
    run's config; results from before workload classes are ``filler``."""
    cfg = result.config or {}
    wl = (case.workload if case is not None and case.workload else "") or cfg.get("workload") or "filler"
    th = (case.thinking if case is not None and case.thinking else "") or thinking_of(cfg)
    return wl, th


def thinking_of(cfg: dict[str, Any]) -> str:
    """off | on | unknown (server default) from a config's chat_template_kwargs."""
    if cfg.get("endpoint", "completions") != "chat":
        return "off"                  # completions: no chat template, so no thinking block is opened
    kw = cfg.get("chat_template_kwargs") or {}
    vals = [kw[k] for k in ("thinking", "enable_thinking") if k in kw]
    if vals:
        return "on" if any(vals) else "off"
    return "unknown"


def _applicable(published: dict[str, Any] | None, recipe: str) -> list[dict[str, Any]]:
    figs = (published or load_published())["figures"]
    return [f for f in figs if recipe in f.get("recipes", [f.get("recipe")])] if recipe else []


def results_table(result: BenchResult | str | os.PathLike[str], *, previous: Any = None,
                  recipe: str | None = None, published: dict[str, Any] | None = None):
    """One row per (case, metric): median, min, max, IQR, n, the previous run's median and the change,
    plus the published figures (seeds' and independent, ``published.json``) that match the case --
    same kind and concurrency; prefill within +-15 % prompt size; decode of the same workload class
    and thinking (a source that does not state thinking matches, flagged) -- each with its
    conditions and ``ratio`` = ours / published. Published figures that match no case get rows of
    their own (``case`` = "(no matching case)"), never dropped."""
    import pandas as pd
    res = _as_result(result)
    assert res is not None
    prev = _as_result(previous)
    recipe = recipe if recipe is not None else res.config.get("recipe", "")
    pub = _applicable(published, recipe)
    used: set[int] = set()
    rows = []
    for case in res.cases:
        pc = _prev_case(prev, case)
        wl, th = case_class(res, case)
        for metric, label in ROWS.get(case.kind, []):
            fig = case.figures.get(metric)
            if not fig:
                continue
            pv = pc.median(metric) if pc else None
            row = {"case": case.name, "status": case.status, "metric": metric, "label": label,
                   "workload": wl, "thinking": th,
                   "concurrency": case.concurrency, "prompt_tokens": case.prompt_tokens,
                   "median": fig["median"], "min": fig["min"], "max": fig["max"], "iqr": fig.get("iqr"),
                   "n": fig["n"], "previous": pv,
                   "change_pct": (100.0 * (fig["median"] / pv - 1.0)) if pv else None,
                   **_pub_cols(None, None)}
            matches = _matches(pub, case, metric, wl, th, nodes=run_nodes(res))
            for j, i in enumerate(matches):
                used.add(i)
                r2 = row if j == 0 else dict(row)
                r2.update(_pub_cols(pub[i], fig["median"], th))
                if j > 0:
                    rows.append(r2)
            rows.append(row)
    for i, f in enumerate(pub):
        if i not in used:
            rows.append({"case": "(no matching case)", "status": "", "metric": f["comparable_metric"],
                         "label": f["metric"], "workload": f.get("workload", ""), "thinking": f.get("thinking", ""),
                         "concurrency": f["concurrency"], "prompt_tokens": f["prompt_tokens"], "median": None,
                         "min": None, "max": None, "iqr": None, "n": 0, "previous": None, "change_pct": None,
                         **_pub_cols(f, None)})
    return pd.DataFrame(rows)


def _pub_cols(f: dict[str, Any] | None, ours: float | None, thinking: str = "") -> dict[str, Any]:
    if f is None:
        return {"published": None, "ratio": None, "published_kind": "", "published_workload": "",
                "published_thinking": "", "published_conditions": "", "published_source": "", "match": ""}
    note = ""
    if ours is not None:
        note = f"same class ({f.get('workload')})" if _pub_kind(f) == "decode" else "same prompt size (+-15 %)"
        if f.get("thinking") == "unknown" and thinking != "unknown":
            note += "; source does not state thinking"
        if f.get("nodes", 2) != 2:
            note += f"; {f['nodes']} nodes"
        if f.get("engine") not in (None, "vllm", "unknown"):
            note += f"; engine {f['engine']}, not vLLM: a target, not like for like"
    return {"published": f["value"], "ratio": (ours / f["value"]) if (ours is not None and f["value"]) else None,
            "published_kind": f.get("kind", "seed"), "published_workload": f.get("workload", ""),
            "published_thinking": f.get("thinking", ""), "published_conditions": _cond(f),
            "published_source": f["source"], "match": note}


def anchors_table(result: BenchResult | str | os.PathLike[str], *, recipe: str | None = None,
                  published: dict[str, Any] | None = None):
    """Every published figure of the run's recipe (seeds' tables and the independent two-Spark
    measurements), one row each with its source, conditions, workload class and thinking, beside
    our median of the matching case and the ratio (None where no case matches: another class, size
    or concurrency). A lab run lists the independent anchors with no ratio: its tiny CPU model is
    not comparable."""
    import pandas as pd
    res = _as_result(result)
    assert res is not None
    recipe = recipe if recipe is not None else res.config.get("recipe", "")
    lab = recipe == "lab"
    figs = ([f for f in (published or load_published())["figures"] if f.get("kind") == "independent"] if lab
            else _applicable(published, recipe))
    found: dict[int, tuple[CaseResult, float]] = {}
    if not lab:
        for case in res.cases:
            wl, th = case_class(res, case)
            for metric, _ in ROWS.get(case.kind, []):
                fig = case.figures.get(metric)
                if fig:
                    for i in _matches(figs, case, metric, wl, th, nodes=run_nodes(res)):
                        found.setdefault(i, (case, fig["median"]))
    rows = []
    for i, f in enumerate(figs):
        case, ours = found.get(i, (None, None))
        cols = _pub_cols(f, ours, case_class(res, case)[1] if case else "")
        rows.append({"source": f["source"], "kind": f.get("kind", "seed"), "metric": f["comparable_metric"],
                     "workload": f.get("workload", ""), "thinking": f.get("thinking", ""),
                     "concurrency": f["concurrency"], "prompt_tokens": f["prompt_tokens"],
                     "decode_tokens": f["decode_tokens"], "published": f["value"], "range": f.get("range"),
                     "ours": ours, "ours_case": case.name if case else "", "ratio": cols["ratio"],
                     "match": cols["match"] or ("lab: tiny CPU model, not comparable" if lab else "no matching case"),
                     "conditions": _cond(f)})
    return pd.DataFrame(rows)


def class_table(result: BenchResult | str | os.PathLike[str]):
    """The workload-class panel: one row per class x thinking (never averaged into one figure) with
    decode tok/s, TTFT, time to first answer, tokens per chunk and, where /metrics exposes them, the
    speculative acceptance rate and length of that case alone (counter deltas), plus the reasoning
    tax (time to first answer with thinking on minus off, same class)."""
    import pandas as pd
    res = _as_result(result)
    assert res is not None
    rows = []
    for c in res.cases:
        if c.kind != "class":
            continue
        row = {"class": c.workload, "thinking": c.thinking, "case": c.name, "status": c.status,
               "concurrency": c.concurrency, "prompt_tokens": c.prompt_tokens, "decode_tokens": c.decode_tokens}
        for metric, _ in ROWS["class"]:
            row[metric] = c.median(metric)
        rows.append(row)
    df = pd.DataFrame(rows)
    if not df.empty:
        off = {r["class"]: r["ttfa_s"] for r in rows if r["thinking"] == "off"}
        df["reasoning_tax_s"] = [(r["ttfa_s"] - off[r["class"]]) if (r["thinking"] == "on" and r["ttfa_s"] is not None
                                  and off.get(r["class"]) is not None) else None for r in rows]
    return df


def _pts(res: BenchResult | None, kind: str, metric: str, x: str) -> tuple[list, list, list, list]:
    xs, ys, lo, hi = [], [], [], []
    if res is None:
        return xs, ys, lo, hi
    for c in res.cases:
        f = c.figures.get(metric)
        if c.kind == kind and f:
            xs.append(getattr(c, x)); ys.append(f["median"]); lo.append(f["median"] - f["min"]); hi.append(f["max"] - f["median"])
    return xs, ys, lo, hi


def _matched_points(res: BenchResult, pub: list[dict[str, Any]], kind: str, metrics: tuple[str, ...],
                    x: str) -> list[tuple[float, float, float, dict[str, Any]]]:
    """(x, published value, ratio ours/published, figure) for each published figure matching a case."""
    out, seen = [], set()
    for c in res.cases:
        if c.kind != kind:
            continue
        wl, th = case_class(res, c)
        for m in metrics:
            f = c.figures.get(m)
            if not f:
                continue
            for i in _matches(pub, c, m, wl, th, nodes=run_nodes(res)):
                if i not in seen and pub[i]["value"]:
                    seen.add(i)
                    out.append((getattr(c, x), pub[i]["value"], f["median"] / pub[i]["value"], pub[i]))
    return out


def _plot_published(ax, pts, color_of) -> None:
    """Seeds' figures = hollow squares, independent ones = hollow diamonds, each labelled with ours/published."""
    for x, v, ratio, f in pts:
        ax.plot([x], [v], marker="s" if f.get("kind", "seed") == "seed" else "D", mfc="none", ls="none",
                color=color_of(f))
        ax.annotate(f"x{ratio:.2f}", (x, v), textcoords="offset points", xytext=(4, 3), fontsize=6,
                    color=color_of(f))


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _plot_classes(ax, res: BenchResult, classes: list[CaseResult], pub: list[dict[str, Any]]) -> None:
    """Decode tok/s per workload class, thinking off and on side by side (min..max bars), with the
    acceptance rate written on each bar and the matching published figures of that class."""
    names = list(dict.fromkeys(c.workload for c in classes))
    width = 0.38
    for j, th in enumerate(("off", "on")):
        for i, wl in enumerate(names):
            c = next((k for k in classes if k.workload == wl and k.thinking == th), None)
            f = c.figures.get("decode_tok_s") if c else None
            if not f:
                continue
            x = i + (j - 0.5) * width
            ax.bar([x], [f["median"]], width, color="C0" if th == "off" else "C3",
                   yerr=[[f["median"] - f["min"]], [f["max"] - f["median"]]], capsize=2,
                   label=f"thinking {th}" if i == 0 else None)
            acc = c.median("spec_acceptance_rate")
            if acc is not None:
                ax.annotate(f"acc {acc:.0%}", (x, f["median"]), textcoords="offset points", xytext=(0, 2),
                            ha="center", fontsize=6)
            for k in _matches(pub, c, "decode_tok_s", *case_class(res, c), nodes=run_nodes(res)):
                ax.plot([x], [pub[k]["value"]], marker="s" if pub[k].get("kind", "seed") == "seed" else "D",
                        mfc="none", color="gray")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("tok/s"); ax.set_title(f"decode by workload class (C={classes[0].concurrency})")
    _legend(ax)


def plot_comparison(result: BenchResult | str | os.PathLike[str], *, previous: Any = None,
                    recipe: str | None = None, published: dict[str, Any] | None = None,
                    path: str | os.PathLike[str] | None = None):
    """Three panels: decode tok/s vs concurrency (per-stream and aggregate), TTFT vs concurrency,
    prefill tok/s vs prompt tokens. Run = solid with min..max error bars; previous run = dashed;
    published figures that match a case (same class, thinking, concurrency; prefill by size) =
    hollow markers (squares: the seeds', diamonds: independent), each labelled x<ours/published>;
    their conditions and sources are in :func:`results_table` / :func:`anchors_table`. Returns the
    matplotlib Figure; saves it to ``path`` when given."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    res = _as_result(result)
    assert res is not None
    prev = _as_result(previous)
    recipe = recipe if recipe is not None else res.config.get("recipe", "")
    pub = _applicable(published, recipe)
    wl, th = case_class(res)
    classes = [c for c in res.cases if c.kind == "class"]
    fig, axes = plt.subplots(1, 4 if classes else 3, figsize=(20 if classes else 15, 4.2))
    title = (f"{res.model} @ {res.base_url} run {res.run_id} ({wl}, thinking {th})"
             + (f" vs published ({recipe})" if pub else ""))
    fig.suptitle(title, fontsize=10)
    ax = axes[0]
    for metric, color, lab in (("decode_tok_s", "C0", "per-stream"), ("aggregate_tok_s", "C1", "aggregate")):
        xs, ys, lo, hi = _pts(res, "decode", metric, "concurrency")
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], color=color, marker="o", capsize=3, label=f"run {lab}")
        xs, ys, _, _ = _pts(prev, "decode", metric, "concurrency")
        if xs:
            ax.plot(xs, ys, color=color, ls="--", marker=".", label=f"previous {lab}")
    pts = _matched_points(res, pub, "decode", ("decode_tok_s", "aggregate_tok_s", "aggregate_span_tok_s",
                                               "aggregate_wall_tok_s"), "concurrency")
    _plot_published(ax, pts, lambda f: "C0" if f["comparable_metric"] in ("decode_tok_s", "per_stream_decode_tok_s")
                    else "C1")
    if pts:
        ax.plot([], [], marker="s", mfc="none", color="gray", ls="none", label="published (seed)")
        ax.plot([], [], marker="D", mfc="none", color="gray", ls="none", label="published (independent)")
    ax.set_xlabel("concurrent streams"); ax.set_ylabel("tok/s"); ax.set_title(f"decode ({wl})"); _legend(ax)
    ax = axes[1]
    xs, ys, lo, hi = _pts(res, "decode", "ttft_s", "concurrency")
    if xs:
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label="run")
    xs, ys, _, _ = _pts(prev, "decode", "ttft_s", "concurrency")
    if xs:
        ax.plot(xs, ys, ls="--", marker=".", label="previous")
    pts = _matched_points(res, pub, "decode", ("ttft_s",), "concurrency")
    _plot_published(ax, pts, lambda f: "gray")
    ax.set_yscale("log"); ax.set_xlabel("concurrent streams"); ax.set_ylabel("s"); ax.set_title("TTFT (decode cases)")
    _legend(ax)
    ax = axes[2]
    for metric, lab, color in (("prefill_tok_s", "client prompt/TTFT", "C0"), ("server_prefill_tok_s", "server /metrics", "C2")):
        xs, ys, lo, hi = _pts(res, "prefill", metric, "prompt_tokens")
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=color, label=f"run {lab}")
        xs, ys, _, _ = _pts(prev, "prefill", metric, "prompt_tokens")
        if xs:
            ax.plot(xs, ys, ls="--", marker=".", color=color, label=f"previous {lab}")
    pts = _matched_points(res, pub, "prefill", ("prefill_tok_s",), "prompt_tokens")
    _plot_published(ax, pts, lambda f: "gray")
    ax.set_xscale("log"); ax.set_xlabel("prompt tokens"); ax.set_ylabel("tok/s"); ax.set_title("prefill (C=1)")
    _legend(ax)
    if classes:
        _plot_classes(axes[3], res, classes, pub)
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
        elif c.kind == "class":
            body = ", ".join(fmt(c, m) for m in ("decode_tok_s", "ttft_s", "ttfa_s", "spec_acceptance_rate"))
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
    """Write ``table.csv``, ``anchors.csv``, ``classes.csv``, ``summary.txt`` and (unless ``plot=False``)
    ``comparison.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = results_table(result, previous=previous, recipe=recipe)
    write_redacted(out / "table.csv", df.to_csv(index=False))
    write_redacted(out / "anchors.csv", anchors_table(result, recipe=recipe).to_csv(index=False))
    write_redacted(out / "classes.csv", class_table(result).to_csv(index=False))
    write_redacted(out / "summary.txt", render_text(result, previous=previous, recipe=recipe) + "\n")
    paths = {"table": str(out / "table.csv"), "anchors": str(out / "anchors.csv"),
             "classes": str(out / "classes.csv"), "summary": str(out / "summary.txt")}
    if not plot:
        return paths
    fig = plot_comparison(result, previous=previous, recipe=recipe, path=out / "comparison.png")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return {**paths, "plot": str(out / "comparison.png")}


def _cond(f: dict[str, Any]) -> str:
    rng = f" (range {f['range'][0]:g}-{f['range'][1]:g})" if f.get("range") else ""
    engine = f"; engine {f['engine']}" if f.get("engine") else ""
    return (f"{f.get('kind', 'seed')}: {f['conditions']}; {f.get('nodes', 2)} nodes{engine}; "
            f"class {f.get('workload', '?')}, thinking "
            f"{f.get('thinking', '?')}; variant {f.get('variant', 'default')}; ISL {f['prompt_tokens'] or '?'}; "
            f"OSL {f['decode_tokens'] or '?'}; definition: {f['definition']}{rng}")


#: a published figure counts as reproduced when our median reaches this share of it (a rate: tok/s). The runbook's
#: own line: the sources publish one batch or a median of three, and a GB10 slow state alone moves a cell by up
#: to 1.5x (field-reports-2026-12.md §2 #7), so "within 10 %" is as close as their figures allow.
MATCH_FLOOR = 0.9


def reproduced(result: BenchResult | str | os.PathLike[str], *, nodes: int, recipe: str | None = None,
               published: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every published rate figure of ``nodes`` Sparks (the recipe's, any engine) that a case of ``result``
    matches (:func:`_matches`), with ours, the ratio ours/published and whether it is reproduced
    (ratio >= :data:`MATCH_FLOOR`); best ratio first."""
    res = _as_result(result)
    assert res is not None
    recipe = recipe if recipe is not None else res.config.get("recipe", "")
    figs = [f for f in _applicable(published, recipe) if f.get("nodes", 2) == nodes and f.get("unit") == "tok/s"]
    out = []
    for case in res.cases:
        wl, th = case_class(res, case)
        for metric, _ in ROWS.get(case.kind, []):
            fig = case.figures.get(metric)
            if not fig:
                continue
            for i in _matches(figs, case, metric, wl, th, nodes=nodes):
                f = figs[i]
                ratio = fig["median"] / f["value"] if f["value"] else 0.0
                out.append({"figure": f, "case": case.name, "metric": metric, "ours": fig["median"],
                            "ratio": ratio, "reproduced": ratio >= MATCH_FLOOR})
    return sorted(out, key=lambda m: -m["ratio"])


def run_nodes(res: BenchResult) -> int:
    """The Sparks the measured server ran on (``config.nodes``; a result from before the field: 2)."""
    return int(res.config.get("nodes") or 2)


def _matches(pub: list[dict[str, Any]], case: CaseResult, metric: str, workload: str = "filler",
             thinking: str = "unknown", *, nodes: int = 2) -> list[int]:
    """Indices of published figures comparable with ``metric`` of ``case``: same kind and concurrency;
    prefill within +-15 % prompt size (any text: prefill speed does not depend on it); decode of the
    same workload class and thinking (a figure or run with thinking unknown matches) and, per
    (source, variant, conditions), only the prompt size nearest to the case's (log distance; a figure
    without a stated ISL always matches). Figures of another node count than the run's ``nodes`` are never
    matched."""
    cands: dict[tuple[str, str, str], list[tuple[float, int]]] = {}
    for i, f in enumerate(pub):
        cm = f["comparable_metric"]
        if cm != metric and not (metric == "decode_tok_s" and cm == "per_stream_decode_tok_s"):
            continue
        kind = _pub_kind(f)
        case_kind = "decode" if case.kind == "class" else case.kind
        if kind != case_kind or (f["concurrency"] or 1) != case.concurrency or f.get("nodes", 2) != nodes:
            continue
        p = f["prompt_tokens"]
        if kind == "prefill":
            if not p or abs(p - case.prompt_tokens) > 0.15 * p:
                continue
        else:
            if f.get("workload", "unknown") != workload:
                continue
            ft = f.get("thinking", "unknown")
            if "unknown" not in (ft, thinking) and ft != thinking:
                continue
        dist = abs(math.log(p / case.prompt_tokens)) if (p and case.prompt_tokens) else 0.0
        cands.setdefault((f["source"], f.get("variant", "default"), f["conditions"]), []).append((dist, i))
    out: list[int] = []
    for group in cands.values():
        best = min(d for d, _ in group)
        out += [i for d, i in group if d == best]
    return sorted(out)


def _pub_kind(f: dict[str, Any]) -> str:
    """A published figure compares with our prefill cases (C=1, max_tokens=1) or decode cases."""
    if f["metric"] == "prefill_tok_s" or (f["metric"] == "ttft_s" and f["decode_tokens"] is not None
                                          and f["decode_tokens"] <= 8):
        return "prefill"
    return "decode"
