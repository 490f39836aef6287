"""The report's plots, as ``data:image/png;base64,…`` URIs (the page loads nothing from outside).

Each figure is closed once encoded, so a notebook kernel never shows it a second time.
"""
from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib.pyplot as plt

from ..bench.report import plot_comparison
from ..bench import roofline_panel
from .model import Figure, ReportModel
from .recompute_bench import bench_result

__all__ = ["png_uri", "plot_network", "plot_readiness", "plot_bench", "plot_roofline"]


def png_uri(fig) -> str:
    """Encode and close a matplotlib figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def plot_network(figs: list[Figure]) -> str:
    """TCP and RDMA bandwidth per rail and direction, each bar against its threshold ("" when none)."""
    rows = [f for f in figs if f.group in ("tcp", "rdma") and f.value is not None]
    if not rows:
        return ""
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
    return png_uri(fig)


def plot_readiness(readiness: list[dict[str, Any]]) -> str:
    """Seconds from launch to each readiness phase ("" when none was reached)."""
    rows = [r for r in readiness if r.get("seconds") is not None]
    if not rows:
        return ""
    fig, ax = plt.subplots(figsize=(7, 1.8))
    ax.barh([r["phase"] for r in rows], [r["seconds"] for r in rows], color="tab:blue")
    for i, r in enumerate(rows):
        ax.text(r["seconds"], i, f" {r['seconds']:.1f} s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from launch")
    return png_uri(fig)


def plot_memory(profile: dict[str, list[list[float]]]) -> str:
    """MemAvailable on every node while the server started (the peak use is the lowest point)."""
    if not any(profile.values()):
        return ""
    fig, ax = plt.subplots(figsize=(7, 2.2))
    for node, samples in sorted(profile.items()):
        if samples:
            ax.plot([s[0] for s in samples], [s[1] / 2**30 for s in samples], marker=".", label=node)
            t_low, low = min(samples, key=lambda s: s[1])
            ax.annotate(f"{low / 2**30:.1f} GiB", (t_low, low / 2**30), fontsize=7)
    ax.set_xlabel("seconds from launch")
    ax.set_ylabel("MemAvailable (GiB)")
    ax.legend(fontsize=7)
    return png_uri(fig)


def plot_bench(model: ReportModel) -> str:
    """The bench's comparison plot (runbook.bench.report) of the recomputed result ("" without a bench)."""
    if not model.bench.get("result"):
        return ""
    fig = plot_comparison(bench_result(model.bench["result"]), recipe=model.bench.get("recipe") or None)
    return png_uri(fig)


def plot_roofline(model: ReportModel) -> str:
    """Measured/ceiling per workload class and thinking mode ("" without a roofline panel)."""
    roof = model.bench.get("roofline") or {}
    rows = [r for r in roof.get("rows") or [] if r.get("measured_over_ceiling") is not None]
    if not rows:
        return ""
    bw = (roof.get("bandwidth") or 0) / 1e9
    title = (f"Decode against its roofline: {(roof.get('plain_bytes_per_rank') or 0) / 1e6:,.1f} MB per step per rank "
             f"at {bw:.1f} GB/s (slowest rank)")
    return png_uri(roofline_panel.plot_roofline(rows, title=title))
