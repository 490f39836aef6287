"""Step 01_network: verify the fabric between the nodes, rail by rail, with evidence.

``runbook.network.run`` calls::

    checks, raw = verify_network(profile, cluster, raw_dir)     # raw: {name: text}
    fig = plot_bandwidth(checks, profile)                       # bandwidth.py

This module holds the order; each check row is computed in the module of its family (``rails.py``,
``links.py``, ``rdma.py``, ``ip_traffic.py``, ``tools.py``, ``collectives.py``).

Order: collect facts (ip addr/route, ibdev2netdev, GID dump) -> early validation (every
configured fabric interface / HCA exists; nothing else runs if not) -> static checks per node
and per rail (link, speed, PCIe, addressing, routes, rp_filter, MTU, GID) -> traffic (DF ping,
iperf3, ib_write_bw/lat, nccl-tests, gloo all-reduce sweep). Probes go through ``node.read``
with bounded timeouts; servers are one-shot (``iperf3 -s -1``, perftest) under ``timeout``.
Checks that cannot apply to the profile (RDMA on the lab, NCCL without GPU, link speed with
``EXPECT_LINK_GBPS=0``) are N/A, never PASS.

Rehearsal (``REHEARSAL=1``): the recipe's RDMA/GPU rows run against the simulators of ``runbook.lab.sim``
(GID tables from its simulated sysfs, perftest, nccl-tests' all_reduce_perf), which check every invocation on
the node that receives it; their passing rows say SIMULATED, never PASS. ping, iperf3, ethtool, ip, the gloo
sweep and OpenMPI's mpirun (which starts the all_reduce_perf ranks on their nodes) stay real.
"""
from __future__ import annotations

from pathlib import Path

from ..checks import CheckList
from .collectives import SWEEP_MAX_BYTES, nccl_checks, sweep_checks
from .context import Verification
from .ip_traffic import iperf_checks, ping_checks
from .links import static_checks
from .rails import build_rails, collect_base, collect_rail_facts, early_validation
from .rdma import gid_checks, rdma_checks
from .tools import tools_checks


def verify_network(profile, cluster, raw_dir: str | Path | None = None, *, traffic: bool = True,
                   sweep_python: str | None = None, nccl_tests_dir: str = "",
                   iperf_seconds: int = 3, sweep_max_bytes: int = SWEEP_MAX_BYTES,
                   min_sweep_busbw_gbs: float = 0.0, install_tools: bool = False) -> tuple[CheckList, dict[str, str]]:
    """Run the network verification and return ``(checks, raw)``.

    ``raw`` maps a relative file name (``head/ip_addr.json``, ``iperf3_rail0_head_to_worker.json``,
    …) to the tool's text; when ``raw_dir`` is given the files are also written there. Checks
    reference them as ``raw/01_network/<name>``. ``traffic=False`` stops after the static checks.
    ``sweep_python`` is a python with torch on every node (default: derived from ``VLLM_BIN``).
    ``nccl_tests_dir`` pins where all_reduce_perf is (``~`` per node; default: ``CACHE_DIR/nccl-tests/build``
    then ``~/nccl-tests/build``). ``install_tools`` lets the step install missing perftest/OpenMPI/nccl-tests
    (``tools.py``); otherwise a missing tool FAILs ``net.tools`` with the commands.
    """
    ctx = Verification(profile, cluster, raw_dir)
    collect_base(ctx)
    if not early_validation(ctx):
        return ctx.checks, ctx.raw
    rails = build_rails(ctx)
    if rails is None:
        return ctx.checks, ctx.raw
    collect_rail_facts(ctx, rails)
    static_checks(ctx, rails)
    gid = gid_checks(ctx)
    if not traffic:
        return ctx.checks, ctx.raw
    ping_checks(ctx, rails)
    iperf_checks(ctx, rails, iperf_seconds)
    tools_checks(ctx, nccl_tests_dir, install_tools)
    rdma_checks(ctx, rails, gid)
    nccl_checks(ctx, gid)
    sweep_checks(ctx, rails, sweep_python, sweep_max_bytes, min_sweep_busbw_gbs)
    return ctx.checks, ctx.raw
