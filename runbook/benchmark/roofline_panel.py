"""The roofline panel: per workload class and thinking mode, the measured ms per step and accepted tokens per step beside the ceiling that the bytes per step and the measured bandwidth allow, measured/ceiling as one number, and the published figures of the same conditions.

tok/s = accepted tokens per step x steps per second. Accepted tokens per step is vLLM's mean
acceptance length of the case (``1 + Δaccepted / Δdrafts`` from ``/metrics``; 1 without speculative
decoding), so ms per step = 1000 x tokens per step / decode tok/s. The ceiling of a case
(``runbook.fit.roofline``) is computed at its own context (prompt + half the decode) with the slowest
rank's measured bandwidth and the all-reduce latency: plain (one token per step) and at the measured
acceptance (a verify step of k + 1 tokens yielding that many). measured/ceiling compares the case with
the ceiling of its own mode (at the acceptance when speculative decoding ran).
"""
from __future__ import annotations

from typing import Any

from ..fit.roofline import Roofline, allreduce_s as allreduce_at
from ..records import NetworkRecord
from .report import case_class, load_published, run_nodes
from .result import BenchResult, CaseResult

__all__ = ["allreduce_latency", "slowest_bandwidth", "panel_rows", "rank_rows", "plot_roofline", "PANEL_COLUMNS",
           "RANK_COLUMNS"]

PANEL_COLUMNS = ("class", "thinking", "case", "context", "decode_tok_s", "tokens_per_step", "ms_per_step",
                 "steps", "drafts", "accepted", "ceiling_plain_tok_s", "ceiling_tok_s", "ceiling_ms_per_step",
                 "measured_over_ceiling", "published")


def allreduce_latency(network: NetworkRecord | None) -> tuple[float | None, str]:
    """The all-reduce latency 01_network measured (its record): the gloo sweep's smallest message, slowest node
    (seconds, note); (None, why) without one."""
    best: tuple[float, int, str] | None = None
    for sweep in (network.allreduce if network is not None else ()):
        p = min(sweep.points, key=lambda p: p.bytes)
        t = p.time_us * 1e-6
        if best is None or t > best[0]:
            best = (t, p.bytes, sweep.node)
    if best is None:
        return None, ("01_network did not run in this run" if network is None
                      else "no all-reduce sweep in 01_network")
    return best[0], (f"01_network all-reduce sweep: {best[0] * 1e6:.0f} us at {best[1]} bytes "
                     f"(slowest node {best[2]})")


def slowest_bandwidth(membw: dict[str, Any] | None, phase: str = "before") -> tuple[float | None, str]:
    """The slowest rank's measured bandwidth (bytes/s, note) in ``phase`` (the ceiling binds on it)."""
    by_node = ((membw or {}).get(phase) or {})
    ok = {n: r for n, r in by_node.items() if isinstance(r, dict) and r.get("gbs") and not r.get("error")}
    if not ok:
        return None, f"no memory-bandwidth probe {phase} the bench"
    node, r = min(ok.items(), key=lambda kv: kv[1]["gbs"])
    return float(r["gbs"]) * 1e9, f"{r.get('label', 'memory bandwidth')}: {r['gbs']:.1f} GB/s ({node}, slowest rank {phase} the bench)"


RANK_COLUMNS = ("rank", "node", "bandwidth_gbs", "bytes_per_rank", "verify_bytes_per_rank", "read_ms", "verify_read_ms",
                "ranks", "allreduce_us", "allreduces", "collectives_ms", "step_ms", "tok_s", "binds")


def rank_rows(roofline: Roofline, membw: dict[str, Any] | None, *, bandwidth: float, allreduce_s: float,
              ranks: int, allreduce_measured: bool, phase: str = "before", pp: int = 1) -> list[dict[str, Any]]:
    """One row per rank: its own measured bandwidth (``membw[phase]``; ``bandwidth`` where it has none), the
    bytes it reads per plain and per verify step (1/TP of each sharded part of its stage's 1/PP of the layers, the
    KV of those layers whole), its read time, and the all-reduce at ``ranks`` (the TP group's) ranks: 01_network's
    sweep already ran across every node (``allreduce_measured``), else the 2-rank figure x log2 N (a tree;
    ``fit.roofline.allreduce_s``).

    Pipeline stages (``pp`` > 1; rank = stage x TP + tp_rank, vLLM's order): each row says its ``stage`` and
    ``tp_rank``; ``stage_ms`` is the rank's own stage (its read and its stage's all-reduces), ``step_ms`` a token's
    step were every stage as fast as this rank (PP x stage + PP - 1 hand-offs: the bubble at one stream).
    ``binds``: the slowest rank of each stage, whose stage time is that stage's."""
    if bandwidth <= 0 or ranks < 1 or pp < 1:
        raise ValueError("bandwidth must be > 0, ranks and pp >= 1")
    by_node = ((membw or {}).get(phase) or {})
    ok = {n: float(r["gbs"]) * 1e9 for n, r in by_node.items() if isinstance(r, dict) and r.get("gbs") and not r.get("error")}
    names = list(ok) or [f"rank {i}" for i in range(ranks * pp)]
    ar = allreduce_s if (allreduce_measured or ranks <= 2) else allreduce_at(ranks, 0, two_rank_s=allreduce_s)
    n_ar = roofline.ceiling(bandwidth, 0.0).allreduces          # every stage's: a token passes them all
    hop = ar if pp > 1 else 0.0                                   # one hand-off: at most one 2-rank exchange
    plain, verify = roofline.plain_bytes(), roofline.verify_bytes()
    rows = []
    for i, node in enumerate(names):
        bw = ok.get(node, bandwidth)
        stage_s = plain / bw + n_ar / pp * ar
        step_s = pp * stage_s + (pp - 1) * hop
        rows.append({"rank": i, "node": node, "stage": i // ranks, "tp_rank": i % ranks, "pp": pp,
                     "bandwidth_gbs": bw / 1e9, "bytes_per_rank": plain,
                     "verify_bytes_per_rank": verify, "read_ms": plain / bw * 1e3, "verify_read_ms": verify / bw * 1e3,
                     "ranks": ranks, "allreduce_us": ar * 1e6, "allreduces": n_ar // pp if pp > 1 else n_ar,
                     "collectives_ms": n_ar / pp * ar * 1e3, "stage_ms": stage_s * 1e3, "hops_ms": (pp - 1) * hop * 1e3,
                     "step_ms": step_s * 1e3, "tok_s": 1 / step_s, "binds": False})
    for stage in {r["stage"] for r in rows}:
        max((r for r in rows if r["stage"] == stage), key=lambda r: r["step_ms"])["binds"] = True
    return rows


def _published(pub: dict[str, Any], recipe: str, workload: str, thinking: str, nodes: int = 2) -> list[dict[str, Any]]:
    """Single-stream decode figures of the recipe, class and thinking, measured on ``nodes`` Sparks."""
    out = []
    for f in pub.get("figures", []):
        if recipe not in (f.get("recipes") or [f.get("recipe")]) or f.get("nodes", 2) != nodes:
            continue
        if f.get("comparable_metric", f.get("metric")) != "decode_tok_s" or f.get("concurrency") != 1:
            continue
        if f.get("workload") != workload or f.get("thinking") not in (thinking, "unknown"):
            continue
        out.append(f)
    return out


def _counter(case: CaseResult, name: str) -> float | None:
    c = (case.server or {}).get("counters") or {}
    v = c.get(name)
    return float(v) if isinstance(v, (int, float)) else None


def panel_rows(result: BenchResult, roofline: Roofline, *, bandwidth: float, allreduce_s: float,
               recipe: str = "", comparable: bool = True) -> list[dict[str, Any]]:
    """One row per class case (and the run's single-stream decode case): PANEL_COLUMNS.
    ``comparable`` False (the lab's tiny model) leaves the published column empty."""
    if bandwidth <= 0:
        raise ValueError("bandwidth must be > 0")
    pub = load_published() if comparable and recipe else {"figures": []}
    rows = []
    for case in result.cases:
        if not (case.kind == "class" or (case.kind == "decode" and case.concurrency == 1)):
            continue
        rate = case.median("decode_tok_s")
        wl, th = case_class(result, case)
        acc_len = case.median("spec_mean_acceptance_length")
        tokens_per_step = acc_len if acc_len else (1.0 if not roofline.spec_k else None)
        context = int(case.prompt_tokens + case.decode_tokens / 2)
        r = Roofline(roofline.step, roofline.config, roofline.tp, context, roofline.kv_dtype, roofline.spec_k,
                     roofline.pp)
        plain = r.ceiling(bandwidth, allreduce_s)
        mode = r.ceiling(bandwidth, allreduce_s, acceptance_length=tokens_per_step) if tokens_per_step else None
        figs = _published(pub, recipe, wl, th, run_nodes(result))
        rows.append({
            "class": wl, "thinking": th, "case": case.name, "context": context, "decode_tok_s": rate,
            "tokens_per_step": tokens_per_step,
            "ms_per_step": (1000.0 * tokens_per_step / rate) if rate and tokens_per_step else None,
            "steps": _counter(case, "vllm:spec_decode_num_drafts_total"),
            "drafts": _counter(case, "vllm:spec_decode_num_draft_tokens_total"),
            "accepted": _counter(case, "vllm:spec_decode_num_accepted_tokens_total"),
            "ceiling_plain_tok_s": plain.tok_s,
            "ceiling_tok_s": mode.tok_s if mode else None,
            "ceiling_ms_per_step": mode.step_s * 1e3 if mode else None,
            "measured_over_ceiling": (rate / mode.tok_s) if rate and mode else None,
            "published": "; ".join(f"{f['value']:g} tok/s ({f.get('kind')}"
                                   + (f", engine {f['engine']}" if f.get("engine") not in (None, "vllm") else "")
                                   + f": {f.get('conditions', '')[:60]})" for f in figs),
            "published_over_ceiling": [f["value"] / mode.tok_s for f in figs] if mode else [],
        })
    return rows


def plot_roofline(rows: list[dict[str, Any]], *, title: str = "", path=None):
    """Horizontal bars of measured/ceiling per class and thinking mode (1.0 = the hardware's limit);
    diamonds: published figures of the same class over the same ceiling. Returns the figure."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    shown = [r for r in rows if r.get("measured_over_ceiling") is not None]
    fig, ax = plt.subplots(figsize=(9, 0.5 * max(3, len(shown)) + 1.2))
    ys = list(range(len(shown)))
    right = max([1.25] + [r["measured_over_ceiling"] * 1.05 for r in shown]
                + [p * 1.05 for r in shown for p in r.get("published_over_ceiling") or []])
    for y, r in zip(ys, shown):
        v = r["measured_over_ceiling"]
        colour = "tab:green" if v >= 0.7 else ("tab:orange" if v >= 0.4 else "tab:red")
        ax.barh(y, v, color=colour, height=0.6)
        for p in r.get("published_over_ceiling") or []:
            ax.plot(p, y, marker="D", color="black", markersize=4, alpha=0.6)
        ax.text(right * 1.01, y, f"{r['decode_tok_s']:.1f} of {r['ceiling_tok_s']:.1f} tok/s ({v:.0%}); "
                                 f"{r['ms_per_step']:.1f} ms/step x {r['tokens_per_step']:.2f} tok",
                va="center", fontsize=7)
    ax.axvline(1.0, color="black", linestyle="dashed", linewidth=1)
    ax.set_yticks(ys, [f"{r['class']} / thinking {r['thinking']}" for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, right)
    ax.set_xlabel("measured / ceiling (dashed: the bandwidth limit; diamonds: published figures, same class)")
    ax.set_title(title or "Decode against its roofline, per workload class", fontsize=9)
    if path is not None:
        fig.savefig(path, dpi=90, bbox_inches="tight")
    return fig
