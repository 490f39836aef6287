"""RDMA over the fabric: the RoCE GID each rank uses, and perftest's bandwidth and latency per rail.

Check rows: ``net.gid``, ``net.gid.plan``, ``net.rdma.bw.<rail>.<a>-><b>``, ``net.rdma.bw.total.<a>-><b>``,
``net.rdma.lat.<rail>.<a>-><b>``; N/A when ``EXPECT_RDMA=0``. In a rehearsal the GID tables and perftest are
the simulators of ``runbook.lab.sim`` and passing rows say SIMULATED.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..checks import Check, Status, check, not_applicable
from ..facts import rdma as fr
from .context import (EVIDENCE_PREFIX, Verification, Rail, both_ways, concurrently, pairs, read, split_list,
                      text_of)

PERFTEST_BASE_PORT = 18515
MAX_RDMA_LAT_US = 5.0         # warn-only: healthy CX-7 RoCE write latency is ~1.5 us

def sim_gid(ctx: Verification) -> str:
    """Why a GID row of a rehearsal says SIMULATED: the tables it read are the simulated Spark's."""
    return (f"GID tables of the rehearsal's simulated Spark ({ctx.sysfs}): the RoCE v2 ::ffff:<lab fabric IPv4> "
            "GID at the profile's index")
SIM_RDMA = ("ib_write_bw/ib_write_lat simulators checked -d, -x and the server address on both nodes and did "
            "perftest's TCP exchange over the lab fabric; the figure is a published DGX Spark one (manifest.json)")


def _pin(value: Any) -> int | None:
    if value is None:
        return None
    text = str(value).strip().lower()
    return int(text) if text.isdigit() else None


@dataclass
class GidPlan:
    """The GID index each rank uses (perftest's ``-x``, NCCL_IB_GID_INDEX), from the ``net.gid`` rows."""
    cluster: fr.ClusterGid | None = None
    per_node: dict[str, int | None] = field(default_factory=dict)   # what each rank should use
    resolved: dict[str, int] = field(default_factory=dict)          # the index resolved from sysfs, per node


def gid_checks(ctx: Verification) -> GidPlan:
    """Each node's RoCE v2 IPv4 GID (resolved, or the pinned ``<NODE>_GID`` checked), then one plan for all."""
    plan = GidPlan()
    if not ctx.expect_rdma:
        ctx.add(not_applicable("net.gid", "not applicable on this profile (EXPECT_RDMA=0)", node="cluster"))
        return plan
    resolved = []
    for node in ctx.nodes:
        f = ctx.facts[node.name]
        ng = fr.resolve_node_gid(node.name, f.gids, split_list(node.spec.ib_devs), f.netdev_ipv4, f.hca_netdev,
                                 match_ip=str(node.spec.fabric_ip))
        resolved.append(ng)
        if ng.index is not None:
            plan.resolved[node.name] = ng.index
        ev = [f"{EVIDENCE_PREFIX}/{node.name}/gids.tsv"]
        pin = _pin(node.spec.gid)
        if ng.index is None:
            ctx.add_hw(check("net.gid", False, node=node.name, observed=ng.problem, expected="a RoCE v2 ::ffff:<IPv4> GID shared by the node's HCAs",
                          fix="give each HCA's netdev its IPv4 (netplan re-apply), check the port is ACTIVE; "
                              "the HCAs in NCCL_IB_HCA must expose the IPv4 GID at the same index", evidence=ev), sim_gid(ctx))
            plan.per_node[node.name] = pin
        elif pin is not None:
            why = fr.check_pinned_gid(pin, ng, f.gids)
            ctx.add_hw(check("net.gid", not why, node=node.name, observed=why or f"pinned {pin} = RoCE v2 IPv4 on {', '.join(m.hca for m in ng.members)}",
                          expected=f"{node.name.upper()}_GID={pin} is a RoCE v2 ::ffff:<IPv4> GID",
                          fix=f"set {node.name.upper()}_GID={ng.index} (resolved via {ng.via}) or auto",
                          evidence=ev, data={"pinned": pin, "resolved": ng.index}), sim_gid(ctx))
            plan.per_node[node.name] = pin if not why else ng.index
        else:
            ctx.add_hw(check("net.gid", True, node=node.name, observed=f"index {ng.index} (via {ng.via})",
                             expected="a RoCE v2 ::ffff:<IPv4> GID", evidence=ev, data={"resolved": ng.index}), sim_gid(ctx))
            plan.per_node[node.name] = ng.index
    plan.cluster = fr.resolve_cluster_gid(resolved)
    cg = plan.cluster
    if cg.resolved:
        if cg.common is not None:
            obs = f"common index {cg.common} (NCCL_IB_GID_INDEX={cg.common} on every rank)"
        else:
            obs = "no common index; per-rank " + ", ".join(f"{n}={i}" for n, i in cg.per_node.items())
        ctx.add_hw(Check(name="net.gid.plan", node="cluster", status=Status.PASS if cg.common is not None else Status.WARN,
                         observed=obs, expected="one index valid on every node",
                         fix="" if cg.common is not None else "set per-node <NODE>_GID (the launcher passes NCCL_IB_GID_INDEX per rank)",
                         data={"common": cg.common, "per_node": cg.per_node}), sim_gid(ctx))
    return plan


def rdma_checks(ctx: Verification, rails: list[Rail], gid: GidPlan) -> None:
    """ib_write_bw per rail and direction (all rails of a pair at once, then their total), ib_write_lat per rail."""
    if not ctx.expect_rdma:
        ctx.add(not_applicable("net.rdma.bw", "not applicable on this profile (EXPECT_RDMA=0)", node="cluster"))
        ctx.add(not_applicable("net.rdma.lat", "not applicable on this profile (EXPECT_RDMA=0)", node="cluster"))
        return
    per_rail = ctx.profile.min_rdma_gbps_rail
    total_min = ctx.profile.min_rdma_gbps_total
    degraded = ctx.profile.degraded_gbps
    expect_link = ctx.profile.expect_link_gbps
    for a, b in both_ways(ctx):   # a = client (writer), b = server
        calls, meta = [], []
        for rail in rails:
            if a.name not in rail.ends or b.name not in rail.ends:
                continue
            src, dst = rail.ends[a.name], rail.ends[b.name]
            port = PERFTEST_BASE_PORT + rail.index
            if not src.hca or not dst.hca:
                continue
            scmd = fr.ib_write_bw_cmd(dst.hca, port, gid_index=gid.per_node.get(b.name), timeout_s=45)
            ccmd = fr.ib_write_bw_cmd(src.hca, port, server_ip=dst.ip, gid_index=gid.per_node.get(a.name), timeout_s=30)
            calls += [lambda b=b, s=scmd: read(b, s, 60), lambda a=a, c=ccmd: read(a, c, 60)]
            meta.append((rail, src, dst))
        results = concurrently(calls) if calls else []
        total = 0.0
        for k, (rail, src, dst) in enumerate(meta):
            srv, cli = results[2 * k], results[2 * k + 1]
            base = f"ib_write_bw_{rail.name}_{a.name}_to_{b.name}"
            ev = [ctx.save(f"{base}_client.txt", text_of(cli)), ctx.save(f"{base}_server.txt", text_of(srv))]
            bw = fr.parse_ib_write_bw(text_of(cli))
            label = f"net.rdma.bw.{rail.name}.{a.name}->{b.name}"
            data = {"kind": "rdma", "rail": rail.name, "direction": f"{a.name}->{b.name}", "gbps": bw.avg_gbps,
                    "threshold_gbps": per_rail, "degraded_gbps": degraded, "gid_index": bw.header.gid_index,
                    "mtu": bw.header.mtu}
            if bw.avg_gbps is None:
                ctx.add_hw(check(label, False, node=a.name, observed=f"{src.hca} -> {dst.hca}@{dst.ip}: {bw.error}",
                              expected=f">= {per_rail} Gb/s", evidence=ev, data=data,
                              fix="install perftest on both nodes; check the GID index (NCCL_IB_GID_INDEX) and that the port is ACTIVE"), SIM_RDMA)
                continue
            total += bw.avg_gbps
            obs = f"{src.hca} -> {dst.hca}@{dst.ip}: {bw.avg_gbps:.2f} Gb/s (GID {bw.header.gid_index}, MTU {bw.header.mtu})"
            if bw.avg_gbps < degraded:
                link = f"link reports {expect_link}G yet " if expect_link else ""
                ctx.add_hw(check(label, False, node=a.name, observed=obs, expected=f">= {per_rail} Gb/s; below {degraded} Gb/s is the degraded-init signature",
                              fix=f"degraded ConnectX-7 initialisation ({link}RDMA at {bw.avg_gbps:.1f} Gb/s): cold boot both nodes "
                                  "(power off, not reboot), then re-run; do not continue", evidence=ev, data=data), SIM_RDMA)
            else:
                ctx.add_hw(check(label, bw.avg_gbps >= per_rail, node=a.name, observed=obs, expected=f">= {per_rail} Gb/s (MIN_RDMA_GBPS_RAIL)",
                              fix="check PCIe width (x4 per twin), MTU 9000 on both ends, and that nothing else loads the link",
                              evidence=ev, data=data), SIM_RDMA)
        if meta:
            ctx.add_hw(check(f"net.rdma.bw.total.{a.name}->{b.name}", total >= total_min, node="cluster",
                          observed=f"{total:.2f} Gb/s over {len(meta)} rail(s) concurrently", expected=f">= {total_min} Gb/s (MIN_RDMA_GBPS_TOTAL)",
                          fix="full 200G needs both twins: list both HCAs in <NODE>_CX7_IB with IPs in separate subnets",
                          data={"kind": "rdma_total", "direction": f"{a.name}->{b.name}", "gbps": total, "threshold_gbps": total_min}), SIM_RDMA)
    # latency: one direction per rail is enough (it is a round trip)
    for a, b in pairs(ctx):
        for rail in rails:
            if a.name not in rail.ends or b.name not in rail.ends:
                continue
            src, dst = rail.ends[a.name], rail.ends[b.name]
            if not src.hca or not dst.hca:
                continue
            port = PERFTEST_BASE_PORT + 100 + rail.index
            scmd = fr.ib_write_lat_cmd(dst.hca, port, gid_index=gid.per_node.get(b.name), timeout_s=45)
            ccmd = fr.ib_write_lat_cmd(src.hca, port, server_ip=dst.ip, gid_index=gid.per_node.get(a.name), timeout_s=30)
            srv, cli = concurrently([lambda b=b, c=scmd: read(b, c, 60), lambda a=a, c=ccmd: read(a, c, 60)])
            base = f"ib_write_lat_{rail.name}_{a.name}_to_{b.name}"
            ev = [ctx.save(f"{base}_client.txt", text_of(cli)), ctx.save(f"{base}_server.txt", text_of(srv))]
            lat = fr.parse_ib_write_lat(text_of(cli))
            label = f"net.rdma.lat.{rail.name}.{a.name}->{b.name}"
            if lat.t_typical_us is None:
                ctx.add_hw(check(label, False, node=a.name, observed=f"{src.hca} -> {dst.ip}: {lat.error}", expected="a latency result",
                              fix="install perftest; check GID index and port state", evidence=ev), SIM_RDMA)
                continue
            ctx.add_hw(check(label, lat.t_typical_us <= MAX_RDMA_LAT_US, node=a.name, warn_only=True,
                          observed=f"t_typical {lat.t_typical_us} us (p99 {lat.p99_us})", expected=f"<= {MAX_RDMA_LAT_US} us (healthy ~1.5 us)",
                          fix="high RDMA latency: check for a degraded link (cold boot) or a busy host", evidence=ev,
                          data={"kind": "rdma_lat", "t_typical_us": lat.t_typical_us, "p99_us": lat.p99_us}), SIM_RDMA)
