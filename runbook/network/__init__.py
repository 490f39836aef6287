"""Step 01 — network verification: link, MTU, addressing, GID, RDMA, NCCL and TCP bandwidth.

    runbook.network.run(step, traffic=True, iperf_seconds=3)   # -> the bandwidth figure

Check names → code: ``verify.py`` (one ``_<topic>_checks`` function per table section).
"""
from __future__ import annotations

from .verify import bandwidth_rows, plot_bandwidth, verify_network


def run(step, *, traffic: bool = True, iperf_seconds: int = 3):
    """Verify the fabric, archive every raw tool output, record the bandwidth rows; returns the plot."""
    checks, raw = verify_network(step.profile, step.cluster, traffic=traffic, iperf_seconds=iperf_seconds)
    step.add(checks)
    step.archive(raw)
    step.data["bandwidth"] = bandwidth_rows(checks)
    figure = plot_bandwidth(checks, step.profile)
    step.raw_dir.mkdir(parents=True, exist_ok=True)
    figure.savefig(step.raw_dir / "bandwidth.png", dpi=110, bbox_inches="tight")
    return figure
