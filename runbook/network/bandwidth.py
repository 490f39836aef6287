"""The bandwidth figures of 01_network: the TCP and RDMA measurements per rail and direction as plain rows
(``step.data["bandwidth"]``) and their bar chart with each threshold.
"""
from __future__ import annotations

from typing import Any


def bandwidth_rows(checks) -> list[dict[str, Any]]:
    """The bandwidth measurements (TCP and RDMA, per rail and direction) as plain rows."""
    rows = []
    for c in checks:
        d = c.data or {}
        if d.get("kind") in ("tcp", "rdma") and d.get("gbps") is not None:
            rows.append({"kind": d["kind"], "rail": d.get("rail", ""), "direction": d.get("direction", ""),
                         "gbps": float(d["gbps"]), "threshold_gbps": float(d.get("threshold_gbps") or 0),
                         "status": c.status.value})
    return rows


def plot_bandwidth(checks, profile=None, ax=None):
    """Bar chart: measured Gb/s per rail and direction (TCP and RDMA), with each threshold as a
    dashed line. Returns the matplotlib Figure (empty-state text when nothing was measured)."""
    if ax is None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 3.5))
    else:
        fig = ax.figure
    rows = bandwidth_rows(checks)
    if not rows:
        ax.text(0.5, 0.5, "no bandwidth measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    colors = {"PASS": "tab:green", "WARN": "tab:orange", "FAIL": "tab:red", "SIMULATED": "tab:purple"}
    labels = [f"{r['kind'].upper()} {r['rail']}\n{r['direction']}" for r in rows]
    xs = list(range(len(rows)))
    ax.bar(xs, [r["gbps"] for r in rows], color=[colors.get(r["status"], "tab:gray") for r in rows])
    for x, r in zip(xs, rows):
        if r["threshold_gbps"]:
            ax.hlines(r["threshold_gbps"], x - 0.4, x + 0.4, colors="black", linestyles="dashed")
        ax.text(x, r["gbps"], f"{r['gbps']:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("Gb/s")
    ax.set_title("Fabric bandwidth per rail and direction (dashed: threshold)")
    return fig
