"""Step 01_network: verify the fabric between the nodes, rail by rail, with evidence.

``runbook.network.run`` calls::

    net = verify_network(cluster, profile, raw_dir)     # net.checks, net.raw ({name: text}), net.record
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

from dataclasses import dataclass, field
from pathlib import Path

from ..checks import CheckList
from ..records import AllreducePoint, AllreduceSweep, FabricEnd, FabricRail, NetworkRecord
from ..site import SPARKS_SITE, Site
from .collectives import SWEEP_MAX_BYTES, nccl_checks, sweep_checks
from .context import Verification
from .ip_traffic import iperf_checks, ping_checks
from .links import static_checks
from .rails import build_rails, collect_base, collect_rail_facts, early_validation
from .rdma import GidPlan, gid_checks, rdma_checks
from .tools import tools_checks


@dataclass
class NetworkRun:
    """What one verification leaves: its rows, the raw tool texts and the record later steps read. Unpacks as
    ``checks, raw`` for the callers that only show rows."""
    checks: CheckList
    raw: dict[str, str]
    record: NetworkRecord = field(default_factory=lambda: NetworkRecord(gid_index={}))

    def __iter__(self):
        return iter((self.checks, self.raw))


def network_record(ctx: Verification, rails, gid: GidPlan | None) -> NetworkRecord:
    """Step 01's record from what it measured: the GID index per node, the rails, the collective figures (read
    from this step's own ``net.allreduce`` and ``net.nccl.busbw`` rows, which carry them)."""
    sweeps, nccl = [], None
    for c in ctx.checks:
        d = c.data or {}
        if c.name == "net.allreduce" and d.get("points"):
            pts = sorted((AllreducePoint(bytes=int(p["bytes"]), time_us=float(p["time_us"]),
                                         busbw_gbs=p.get("busbw_gbs")) for p in d["points"] if p.get("time_us")),
                         key=lambda p: p.bytes)
            if pts:
                sweeps.append(AllreduceSweep(node=c.node, backend=str(d.get("backend") or ""), points=tuple(pts)))
        elif c.name == "net.nccl.busbw" and isinstance(d.get("avg_busbw_gbs"), (int, float)):
            nccl = float(d["avg_busbw_gbs"])
    return NetworkRecord(
        gid_index=dict(gid.resolved) if gid else {},
        gid_common=gid.cluster.common if gid and gid.cluster else None,
        rails=tuple(FabricRail(index=r.index, ends=tuple(FabricEnd(node=e.node, iface=e.iface, ip=e.ip, hca=e.hca)
                                                         for e in r.ends.values())) for r in rails or ()),
        allreduce=tuple(sweeps), nccl_busbw_gbs=nccl)


def verify_network(cluster, profile, raw_dir: str | Path | None = None, *, traffic: bool = True,
                   sweep_python: str | None = None, nccl_tests_dir: str = "",
                   iperf_seconds: int = 3, sweep_max_bytes: int = SWEEP_MAX_BYTES,
                   min_sweep_busbw_gbs: float = 0.0, install_tools: bool = False,
                   site: Site = SPARKS_SITE) -> NetworkRun:
    """Run the network verification: its ``NetworkRun`` (rows, raw texts, record).

    ``raw`` maps a relative file name (``head/ip_addr.json``, ``iperf3_rail0_head_to_worker.json``,
    …) to the tool's text; when ``raw_dir`` is given the files are also written there. Checks
    reference them as ``raw/01_network/<name>``. ``traffic=False`` stops after the static checks.
    ``sweep_python`` is a python with torch on every node (default: derived from ``VLLM_BIN``).
    ``nccl_tests_dir`` pins where all_reduce_perf is (``~`` per node; default: ``CACHE_DIR/nccl-tests/build``
    then ``~/nccl-tests/build``). ``install_tools`` lets the step install missing perftest/OpenMPI/nccl-tests
    (``tools.py``); otherwise a missing tool FAILs ``net.tools`` with the commands. ``site``: where the
    hardware-only tools are the site's simulators (a rehearsal: their GID tables, nccl-tests, SIMULATED rows).
    """
    ctx = Verification(cluster, profile, raw_dir, site)
    collect_base(ctx)
    if not early_validation(ctx):
        return NetworkRun(ctx.checks, ctx.raw, network_record(ctx, None, None))
    rails = build_rails(ctx)
    if rails is None:
        return NetworkRun(ctx.checks, ctx.raw, network_record(ctx, None, None))
    collect_rail_facts(ctx, rails)
    static_checks(ctx, rails)
    gid = gid_checks(ctx)
    if traffic:
        ping_checks(ctx, rails)
        iperf_checks(ctx, rails, iperf_seconds)
        tools_checks(ctx, nccl_tests_dir, install_tools)
        rdma_checks(ctx, rails, gid)
        nccl_checks(ctx, gid)
        sweep_checks(ctx, rails, sweep_python, sweep_max_bytes, min_sweep_busbw_gbs)
    return NetworkRun(ctx.checks, ctx.raw, network_record(ctx, rails, gid))
