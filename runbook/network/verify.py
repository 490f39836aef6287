"""Step 01_network: verify the fabric between the nodes, rail by rail, with evidence.

The notebook calls::

    checks, raw = verify_network(profile, cluster, raw_dir)     # raw: {name: text}
    fig = plot_bandwidth(checks, profile)

Order: collect facts (ip addr/route, ibdev2netdev, GID dump) -> early validation (every
configured fabric interface / HCA exists; nothing else runs if not) -> static checks per node
and per rail (link, speed, PCIe, addressing, routes, rp_filter, MTU, GID) -> traffic (DF ping,
iperf3, ib_write_bw/lat, nccl-tests, gloo all-reduce sweep). Probes go through ``node.read``
with bounded timeouts; servers are one-shot (``iperf3 -s -1``, perftest) under ``timeout``.
Checks that cannot apply to the profile (RDMA on the lab, NCCL without GPU, link speed with
``EXPECT_LINK_GBPS=0``) are N/A, never PASS.

Rehearsal (``REHEARSAL=1``): the recipe's RDMA/GPU rows run against the simulators of ``runbook.lab.sim``
(GID tables from its simulated sysfs, perftest, mpirun + nccl-tests), which check every invocation on the
node that receives it; their passing rows say SIMULATED, never PASS. ping, iperf3, ethtool, ip and the gloo
sweep stay real.
"""
from __future__ import annotations

import ipaddress
import itertools
import posixpath
import re
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable, simulated
from ..facts import nccl as fn
from ..facts import net as fnet
from ..facts import rdma as fr
from ..lab import sim
from . import tools

STEP = "01_network"
EVIDENCE_PREFIX = f"raw/{STEP}"
IPERF_BASE_PORT = 5301
PERFTEST_BASE_PORT = 18515
SWEEP_PORT = 29531
MAX_RDMA_LAT_US = 5.0         # warn-only: healthy CX-7 RoCE write latency is ~1.5 us
SWEEP_MAX_BYTES = 16 << 20


# --------------------------------------------------------------------------- helpers


@dataclass
class _Result:
    """Stand-in for a CommandResult when ``node.read`` raised (timeout, lost connection)."""
    exit_code: int = 255
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _read(node, cmd: str, timeout: float):
    try:
        return node.read(cmd, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a probe failure becomes a check, not a crash
        return _Result(255, "", f"{type(exc).__name__}: {exc}")


def _p(profile, name: str, default: Any = None) -> Any:
    value = getattr(profile, name, default)
    return default if value is None else value


def _split(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def _pin(value: Any) -> int | None:
    if value is None:
        return None
    text = str(value).strip().lower()
    return int(text) if text.isdigit() else None


def _text(res) -> str:
    return (res.stdout or "") + (("\n" + res.stderr) if getattr(res, "stderr", "") else "")


@dataclass
class RailEnd:
    node: str
    iface: str
    ip: str = ""            # the IPv4 used for traffic on this rail
    hca: str = ""


@dataclass
class Rail:
    index: int
    ends: dict[str, RailEnd] = field(default_factory=dict)   # node name -> end

    @property
    def name(self) -> str:
        return f"rail{self.index}"


@dataclass
class NodeFacts:
    ifaces: dict[str, fnet.Interface] = field(default_factory=dict)
    routes: list[fnet.Route] = field(default_factory=list)
    hca_ports: list[fr.HcaPort] = field(default_factory=list)
    gids: dict[str, fr.GidPort] = field(default_factory=dict)
    ethtool: dict[str, fnet.Ethtool] = field(default_factory=dict)
    pcie: dict[str, fnet.PcieLink] = field(default_factory=dict)
    rp: dict[str, int] = field(default_factory=dict)
    error: str = ""

    @property
    def hca_netdev(self) -> dict[str, str]:
        return {p.hca: p.netdev for p in self.hca_ports}

    @property
    def netdev_ipv4(self) -> dict[str, list[str]]:
        return {n: i.ipv4_addresses for n, i in self.ifaces.items()}


class _Ctx:
    def __init__(self, profile, cluster, raw_dir):
        self.profile = profile
        self.cluster = cluster
        self.nodes = list(cluster.nodes)
        self.raw: dict[str, str] = {}
        self.raw_dir = Path(raw_dir) if raw_dir else None
        self.checks = CheckList()
        self.facts: dict[str, NodeFacts] = {}
        self.expect_rdma = bool(_p(profile, "expect_rdma", False))
        self.expect_gpu = bool(_p(profile, "expect_gpu", False))
        self.timeout = float(_p(profile, "command_timeout", 30) or 30)
        self.rehearsal = bool(_p(profile, "rehearsal", False))
        self.sysfs = sim.SYSFS_ROOT if self.rehearsal else fr.SYSFS
        self.nccl_dirs: dict[str, str] = {}        # node -> nccl-tests build dir (from the tools probe)

    def save(self, name: str, text: str) -> str:
        self.raw[name] = text
        if self.raw_dir is not None:
            path = self.raw_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return f"{EVIDENCE_PREFIX}/{name}"

    def add(self, c: Check) -> Check:
        self.checks.append(c)
        return c

    def add_hw(self, c: Check, why: str) -> Check:
        """A row read from a hardware-only tool: in a rehearsal a passing row says SIMULATED (with why); a WARN
        or FAIL keeps its status and gains the note (its value came from a simulator too)."""
        if self.rehearsal and c.status is not Status.NA:
            if c.status in (Status.WARN, Status.FAIL):
                c.observed = f"{c.observed} [simulated: {why}]"
            else:
                c = simulated(c, why)
        return self.add(c)


SIM_GID = (f"GID tables of the rehearsal's simulated Spark ({sim.SYSFS_ROOT}): the RoCE v2 ::ffff:<lab fabric IPv4> "
           "GID at the profile's index")
SIM_RDMA = ("ib_write_bw/ib_write_lat simulators checked -d, -x and the server address on both nodes and did "
            "perftest's TCP exchange over the lab fabric; the figure is a published DGX Spark one (manifest.json)")
SIM_NCCL = ("mpirun + all_reduce_perf simulators started every rank on its own node over ssh and checked its "
            "NCCL_SOCKET_IFNAME, NCCL_IB_HCA and NCCL_IB_GID_INDEX there; busbw is the published figure for the "
            "HCAs used (manifest.json)")
SIM_TOOLS = f"the rehearsal's simulators ({sim.SIM_DIR}, runbook.lab.sim) stand in for perftest and nccl-tests"


# --------------------------------------------------------------------------- public API


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
    ctx = _Ctx(profile, cluster, raw_dir)
    _collect_base(ctx)
    if not _early_validation(ctx):
        return ctx.checks, ctx.raw
    rails = _build_rails(ctx)
    if rails is None:
        return ctx.checks, ctx.raw
    _collect_rail_facts(ctx, rails)
    _static_checks(ctx, rails)
    gid = _gid_checks(ctx)
    if not traffic:
        return ctx.checks, ctx.raw
    _ping_checks(ctx, rails)
    _iperf_checks(ctx, rails, iperf_seconds)
    _tools_checks(ctx, nccl_tests_dir, install_tools)
    _rdma_checks(ctx, rails, gid)
    _nccl_checks(ctx, gid)
    _sweep_checks(ctx, rails, sweep_python, sweep_max_bytes, min_sweep_busbw_gbs)
    return ctx.checks, ctx.raw


# --------------------------------------------------------------------------- facts


def _collect_base(ctx: _Ctx) -> None:
    def probe(node):
        out = NodeFacts()
        r = _read(node, fnet.IP_ADDR_CMD, ctx.timeout)
        ctx.save(f"{node.name}/ip_addr.json", _text(r))
        out.ifaces = fnet.parse_ip_addr(r.stdout)
        if not r.ok or not out.ifaces:
            out.error = f"`{fnet.IP_ADDR_CMD}` failed (rc {r.exit_code}): {(r.stderr or r.stdout).strip()[:200]}"
        r = _read(node, fnet.IP_ROUTE_CMD, ctx.timeout)
        ctx.save(f"{node.name}/ip_route.json", _text(r))
        out.routes = fnet.parse_ip_route(r.stdout)
        if ctx.expect_rdma or _split(node.spec.ib_devs):
            r = _read(node, fr.IBDEV2NETDEV_CMD, ctx.timeout)
            ctx.save(f"{node.name}/ibdev2netdev.txt", _text(r))
            out.hca_ports = fr.parse_ibdev2netdev(r.stdout)
        if ctx.expect_rdma:
            r = _read(node, fr.gid_dump_cmd(ctx.sysfs), ctx.timeout)
            ctx.save(f"{node.name}/gids.tsv", r.stdout or "")
            out.gids = fr.parse_gid_dump(r.stdout, root=ctx.sysfs)
        return out

    for name, value in ctx.cluster.each(probe).items():
        ctx.facts[name] = value if isinstance(value, NodeFacts) else NodeFacts(error=str(value))


def _early_validation(ctx: _Ctx) -> bool:
    """Every configured fabric IF (and HCA, when RDMA is expected) exists. Named, before traffic."""
    ok = True
    for node in ctx.nodes:
        f = ctx.facts[node.name]
        if f.error:
            ctx.add(check("net.facts", False, node=node.name, observed=f.error,
                          expected="ip -j addr answers", fix="check the node is reachable and has iproute2"))
            ok = False
            continue
        wanted = _split(node.spec.fabric_if)
        missing = [i for i in wanted if i not in f.ifaces]
        existing = ", ".join(sorted(f.ifaces)) or "none"
        if not wanted:
            ctx.add(check("net.fabric_if", False, node=node.name, observed="no fabric interface in profile",
                          expected="<NODE>_CX7_IF set", fix=f"set {node.name.upper()}_CX7_IF to one of: {existing}"))
            ok = False
        elif missing:
            ctx.add(check("net.fabric_if", False, node=node.name,
                          observed=f"{', '.join(missing)} does not exist on {node.name}; interfaces: {existing}",
                          expected=f"{', '.join(wanted)} present",
                          fix=f"set {node.name.upper()}_CX7_IF to the CX-7 netdev on this node "
                              f"(see `ibdev2netdev`; Spark names: enp1s0f0np0, enp1s0f1np1, enP2p1s0f0np0, enP2p1s0f1np1)"))
            ok = False
        else:
            ctx.add(check("net.fabric_if", True, node=node.name, observed=", ".join(wanted) + " present",
                          expected=", ".join(wanted) + " present"))
        if ctx.expect_rdma:
            hcas = _split(node.spec.ib_devs)
            known = {p.hca for p in f.hca_ports} | {g.hca for g in f.gids.values()}
            gone = [h for h in hcas if h not in known]
            if not hcas:
                ctx.add(check("net.hca", False, node=node.name, observed="no HCA in profile",
                              expected="<NODE>_CX7_IB lists the RoCE HCAs",
                              fix=f"set {node.name.upper()}_CX7_IB from `ibdev2netdev` (both twins, e.g. rocep1s0f0,roceP2p1s0f0)"))
                ok = False
            elif gone:
                ctx.add(check("net.hca", False, node=node.name,
                              observed=f"{', '.join(gone)} not found; HCAs: {', '.join(sorted(known)) or 'none'}",
                              expected=f"{', '.join(hcas)} present",
                              fix=f"fix {node.name.upper()}_CX7_IB (see `ibdev2netdev`); install rdma-core if none are listed"))
                ok = False
    return ok


def _build_rails(ctx: _Ctx) -> list[Rail] | None:
    per_node: dict[str, list[RailEnd]] = {}
    for node in ctx.nodes:
        f = ctx.facts[node.name]
        ifs = _split(node.spec.fabric_if)
        netdev_hca = {p.netdev: p.hca for p in f.hca_ports}
        for hca in _split(node.spec.ib_devs) if ctx.expect_rdma else []:
            dev = f.hca_netdev.get(hca)
            if dev and dev not in ifs:
                ifs.append(dev)
        ends = []
        for k, iface in enumerate(ifs):
            addrs = f.ifaces[iface].ipv4_addresses if iface in f.ifaces else []
            ip = str(node.spec.fabric_ip) if k == 0 else (addrs[0] if addrs else "")
            ends.append(RailEnd(node=node.name, iface=iface, ip=ip, hca=netdev_hca.get(iface, "")))
        per_node[node.name] = ends
    counts = {n: len(e) for n, e in per_node.items()}
    if len(set(counts.values())) > 1 and len(per_node) > 2:
        return _subnet_rails(ctx, per_node)
    if len(set(counts.values())) > 1:
        ctx.add(check("net.rails", False, node="cluster",
                      observed="; ".join(f"{n}: {', '.join(e.iface for e in per_node[n])}" for n in counts),
                      expected="the same number of rails on every node",
                      fix="list the same twins in every node's <NODE>_CX7_IB (same physical port on both nodes)"))
        return None
    rails = []
    for k in range(next(iter(counts.values()), 0)):
        rails.append(Rail(index=k, ends={n: per_node[n][k] for n in per_node}))
    return rails


def _subnet_rails(ctx: _Ctx, per_node: dict[str, list[RailEnd]]) -> list[Rail] | None:
    """Three or more nodes whose rail counts differ (seed B TP3: the head has one CX port per worker, each
    link its own /24): a rail is one IPv4 subnet and joins the nodes with an interface in it. Traffic then
    runs per pair on the rails both ends share; a pair without one (worker<->worker2 in a head-centred
    star) is reported N/A (its traffic crosses BOOTSTRAP_IF / the head)."""
    by_net: dict[str, dict[str, RailEnd]] = {}
    for name, ends in per_node.items():
        for end in ends:
            for net in _iface(ctx.facts[name], end.iface).ipv4_networks:
                ip = next((a for a in _iface(ctx.facts[name], end.iface).ipv4_addresses
                           if ipaddress.ip_address(a) in net), end.ip)
                by_net.setdefault(str(net), {}).setdefault(name, RailEnd(name, end.iface, ip, end.hca))
    shared = sorted(((ipaddress.ip_network(net), ends) for net, ends in by_net.items() if len(ends) >= 2),
                    key=lambda kv: (kv[0].network_address, kv[0].prefixlen))
    rails = [Rail(index=k, ends=ends) for k, (_, ends) in enumerate(shared)]
    lonely = [n for n in per_node if not any(n in r.ends for r in rails)]
    desc = "; ".join(f"rail{r.index}: " + ", ".join(f"{e.node} {e.iface} {e.ip}" for e in r.ends.values())
                     for r in rails)
    ctx.add(check("net.rails", not lonely and bool(rails), node="cluster",
                  observed=(f"per-subnet rails: {desc}" if not lonely else
                            f"{', '.join(lonely)} share no fabric subnet with any other node; rails: {desc or 'none'}"),
                  expected="every node on at least one rail (a subnet shared with another node)",
                  fix="give both ends of each cable addresses in one /24 (seed B TP3: 10.0.22.0/24 head<->worker, "
                      "10.0.23.0/24 head<->worker2) and list the facing HCAs in <NODE>_CX7_IB"))
    if lonely or not rails:
        return None
    for a, b in _pairs(ctx):
        if not any(a.name in r.ends and b.name in r.ends for r in rails):
            ctx.add(not_applicable(f"net.path.{a.name}-{b.name}",
                                   "no direct fabric rail between these nodes (head-centred links, seed B TP3); "
                                   "their socket traffic uses BOOTSTRAP_IF", node="cluster"))
    return rails


def _pairs_on(ctx: _Ctx, rail: Rail, both_ways: bool = True):
    """The node pairs (a, b) that are both ends of ``rail``."""
    pairs = _both_ways(ctx) if both_ways else _pairs(ctx)
    return [(a, b) for a, b in pairs if a.name in rail.ends and b.name in rail.ends]


def _collect_rail_facts(ctx: _Ctx, rails: list[Rail]) -> None:
    def probe(node):
        f = ctx.facts[node.name]
        ifs = [r.ends[node.name].iface for r in rails if node.name in r.ends]
        for iface in ifs:
            r = _read(node, fnet.ethtool_cmd(iface), ctx.timeout)
            ctx.save(f"{node.name}/ethtool_{iface}.txt", _text(r))
            f.ethtool[iface] = fnet.parse_ethtool(r.stdout)
        r = _read(node, fnet.pcie_cmd(ifs), ctx.timeout)
        ctx.save(f"{node.name}/pcie.tsv", r.stdout or "")
        f.pcie = fnet.parse_pcie(r.stdout)
        r = _read(node, fnet.rp_filter_cmd(ifs), ctx.timeout)
        ctx.save(f"{node.name}/rp_filter.txt", _text(r))
        f.rp = fnet.parse_rp_filter(r.stdout)

    for name, value in ctx.cluster.each(probe).items():
        if isinstance(value, Exception):
            ctx.facts[name].error = str(value)


# --------------------------------------------------------------------------- static checks


def _static_checks(ctx: _Ctx, rails: list[Rail]) -> None:
    expect_gbps = int(_p(ctx.profile, "expect_link_gbps", 0) or 0)
    mtu_want = int(_p(ctx.profile, "fabric_mtu", 9000) or 9000)
    for node in ctx.nodes:
        f = ctx.facts[node.name]
        ev = [f"{EVIDENCE_PREFIX}/{node.name}/ip_addr.json"]
        mine = [r for r in rails if node.name in r.ends]
        for rail in mine:
            end = rail.ends[node.name]
            iface, itf, eth = end.iface, _iface(f, end.iface), f.ethtool.get(end.iface, fnet.Ethtool())
            # link up
            detected = eth.link_detected
            up = itf.up and detected is not False
            ctx.add(check(f"net.link.{iface}", up, node=node.name,
                          observed=f"{iface}: state {itf.state}, link detected {_yn(detected)}",
                          expected=f"{iface}: state UP, link detected yes",
                          fix=f"on {node.name}: `ip link set {iface} up`; check the cable is in the same "
                              f"physical port on both nodes and `ibdev2netdev` shows (Up)",
                          evidence=ev + [f"{EVIDENCE_PREFIX}/{node.name}/ethtool_{iface}.txt"],
                          data={"rail": rail.index, "iface": iface}))
            # speed
            if expect_gbps <= 0:
                ctx.add(not_applicable(f"net.speed.{iface}", "not applicable on this profile (EXPECT_LINK_GBPS=0); "
                                       f"ethtool reports {eth.speed_mbps or '?'} Mb/s", node=node.name))
            else:
                got = eth.speed_gbps
                ctx.add(check(f"net.speed.{iface}", got is not None and got >= expect_gbps, node=node.name,
                              observed=f"{iface}: {eth.speed_mbps or 'unknown'} Mb/s", expected=f">= {expect_gbps * 1000} Mb/s",
                              fix="bad cable/transceiver or autonegotiation: reseat the QSFP cable, check `ethtool` on both ends",
                              data={"speed_mbps": eth.speed_mbps}))
            # PCIe
            pl = f.pcie.get(iface)
            if pl is None or not pl.present:
                if ctx.rehearsal:
                    ctx.add(not_applicable(f"net.pcie.{iface}", "not applicable in a rehearsal (the lab's fabric is a "
                                           "veth: no PCIe device to read)", node=node.name))
                elif ctx.expect_rdma:
                    ctx.add(check(f"net.pcie.{iface}", False, node=node.name, warn_only=True,
                                  observed=f"{iface}: no PCIe link attributes in sysfs", expected="Gen5 x4 per twin",
                                  fix=f"read /sys/class/net/{iface}/device/current_link_width by hand"))
                else:
                    ctx.add(not_applicable(f"net.pcie.{iface}", "not applicable on this profile (virtual interface, no PCIe device)",
                                           node=node.name))
            else:
                full = (pl.width == pl.max_width or pl.max_width is None) and (pl.speed_gts == pl.max_speed_gts or pl.max_speed_gts is None)
                ctx.add(check(f"net.pcie.{iface}", full, node=node.name, observed=f"{iface}: {pl.describe()}",
                              expected="negotiated width and speed = maximum (Spark CX-7 twin: Gen5 x4)",
                              fix="pre-2026-04 BIOS wires the 2nd controller at x2: update firmware (`fwupdmgr update`), then cold boot",
                              data={"width": pl.width, "speed_gts": pl.speed_gts}))
            # addressing: exactly one IPv4
            v4 = itf.ipv4
            ctx.add(check(f"net.addr.{iface}", len(v4) == 1, node=node.name,
                          observed=f"{iface}: {', '.join(v4) or 'no IPv4'}", expected=f"{iface}: exactly one IPv4",
                          fix=f"give {iface} one static IPv4 (netplan/nmcli, dhcp4: no, link-local: [])", evidence=ev))
            if iface == (_split(node.spec.fabric_if) or [""])[0]:     # the node's <NODE>_CX7_IF carries <NODE>_IP
                want = str(node.spec.fabric_ip)
                ctx.add(check("net.addr.profile_ip", want in itf.ipv4_addresses, node=node.name,
                              observed=f"{iface}: {', '.join(itf.ipv4_addresses) or 'no IPv4'}",
                              expected=f"{want} on {iface}",
                              fix=f"set {node.name.upper()}_IP to the address of {iface}, or configure {want} on it", evidence=ev))
            # default route
            bad = fnet.default_routes(f.routes, iface)
            ctx.add(check(f"net.route.{iface}", not bad, node=node.name,
                          observed=f"default via {bad[0].gateway or '?'} dev {iface}" if bad else f"no default route on {iface}",
                          expected=f"no default route on {iface}",
                          fix=f"remove the gateway/default route from {iface} (netplan: no routes/gateway4 on the fabric)",
                          evidence=[f"{EVIDENCE_PREFIX}/{node.name}/ip_route.json"]))
            # rp_filter
            eff = fnet.effective_rp_filter(f.rp, iface)
            if eff is None:
                ctx.add(check(f"net.rp_filter.{iface}", False, node=node.name, warn_only=True,
                              observed="rp_filter not readable", expected="0 or 2 (loose)", fix="run `sysctl net.ipv4.conf.all.rp_filter`"))
            else:
                strict_bad = eff == 1
                ctx.add(check(f"net.rp_filter.{iface}", not strict_bad, node=node.name, warn_only=len(mine) == 1,
                              observed=f"effective rp_filter {eff} (all={f.rp.get('all', '?')}, {iface}={f.rp.get(iface, '?')})",
                              expected="0 or 2 (loose)",
                              fix=f"sysctl -w net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.{iface}.rp_filter=2 (persist in /etc/sysctl.d)"))
            # MTU vs profile
            ctx.add(check(f"net.mtu.{iface}", itf.mtu == mtu_want, node=node.name,
                          observed=f"{iface}: mtu {itf.mtu}", expected=f"mtu {mtu_want} (FABRIC_MTU)",
                          fix=f"set mtu {mtu_want} on {iface} on {node.name} (netplan `mtu:` / nmcli 802-3-ethernet.mtu) and re-apply",
                          evidence=ev))
        # twins in distinct subnets
        if len(mine) > 1:
            nets = [(r.ends[node.name].iface, n) for r in mine for n in _iface(f, r.ends[node.name].iface).ipv4_networks]
            clash = [(a, b) for (a, na), (b, nb) in itertools.combinations(nets, 2) if na.overlaps(nb)]
            ctx.add(check("net.addr.twin_subnets", not clash, node=node.name,
                          observed="; ".join(f"{a} and {b} share a subnet" for a, b in clash) or
                          ", ".join(f"{i}={n}" for i, n in nets),
                          expected="each twin in its own subnet",
                          fix="put each twin in a different /24 (same subnet causes routing ambiguity and NCCL failures)"))
        else:
            ctx.add(not_applicable("net.addr.twin_subnets", "not applicable on this profile (one rail)", node=node.name))
    # cluster-wide addressing
    owners: dict[str, list[str]] = {}
    for node in ctx.nodes:
        for rail in (r for r in rails if node.name in r.ends):
            for ip in _iface(ctx.facts[node.name], rail.ends[node.name].iface).ipv4_addresses:
                owners.setdefault(ip, []).append(f"{node.name}:{rail.ends[node.name].iface}")
    dups = {ip: o for ip, o in owners.items() if len({x.split(':')[0] for x in o}) > 1}
    ctx.add(check("net.addr.unique", not dups, node="cluster",
                  observed="; ".join(f"{ip} on {', '.join(o)}" for ip, o in dups.items()) or f"{len(owners)} distinct addresses",
                  expected="no address on two nodes", fix="give every node its own address on each rail"))
    for rail in rails:
        ends = list(rail.ends.values())
        bad = []
        for a, b in itertools.combinations(ends, 2):
            ia = _iface(ctx.facts[a.node], a.iface)
            if b.ip and not any(ipaddress.ip_address(b.ip) in n for n in ia.ipv4_networks):
                bad.append(f"{b.node} {b.ip} not in {a.node} {a.iface} subnet(s) {', '.join(map(str, ia.ipv4_networks)) or 'none'}")
        ctx.add(check(f"net.addr.{rail.name}.subnet", not bad, node="cluster", observed="; ".join(bad) or "ends share a subnet",
                      expected="both ends of a rail in one subnet", fix="use the same /24 (or /30) on both ends of each cable"))
        mtus = {e.node: _iface(ctx.facts[e.node], e.iface).mtu for e in ends}
        ctx.add(check(f"net.mtu.{rail.name}.match", len(set(mtus.values())) == 1, node="cluster",
                      observed=", ".join(f"{e.node} {e.iface}={mtus[e.node]}" for e in ends),
                      expected="equal MTU on both ends", data={"mtu": mtus},
                      fix="set the same MTU on both ends (a mismatch passes small pings but deadlocks collectives)"))


def _iface(f: NodeFacts, name: str) -> fnet.Interface:
    return f.ifaces.get(name) or fnet.Interface(name=name, state="ABSENT")


def _yn(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


# --------------------------------------------------------------------------- GID


@dataclass
class GidPlan:
    cluster: fr.ClusterGid | None = None
    per_node: dict[str, int | None] = field(default_factory=dict)   # what each rank should use


def _gid_checks(ctx: _Ctx) -> GidPlan:
    plan = GidPlan()
    if not ctx.expect_rdma:
        ctx.add(not_applicable("net.gid", "not applicable on this profile (EXPECT_RDMA=0)", node="cluster"))
        return plan
    resolved = []
    for node in ctx.nodes:
        f = ctx.facts[node.name]
        ng = fr.resolve_node_gid(node.name, f.gids, _split(node.spec.ib_devs), f.netdev_ipv4, f.hca_netdev,
                                 match_ip=str(node.spec.fabric_ip))
        resolved.append(ng)
        ev = [f"{EVIDENCE_PREFIX}/{node.name}/gids.tsv"]
        pin = _pin(getattr(node.spec, "gid", None))
        if ng.index is None:
            ctx.add_hw(check("net.gid", False, node=node.name, observed=ng.problem, expected="a RoCE v2 ::ffff:<IPv4> GID shared by the node's HCAs",
                          fix="give each HCA's netdev its IPv4 (netplan re-apply), check the port is ACTIVE; "
                              "the HCAs in NCCL_IB_HCA must expose the IPv4 GID at the same index", evidence=ev), SIM_GID)
            plan.per_node[node.name] = pin
        elif pin is not None:
            why = fr.check_pinned_gid(pin, ng, f.gids)
            ctx.add_hw(check("net.gid", not why, node=node.name, observed=why or f"pinned {pin} = RoCE v2 IPv4 on {', '.join(m.hca for m in ng.members)}",
                          expected=f"{node.name.upper()}_GID={pin} is a RoCE v2 ::ffff:<IPv4> GID",
                          fix=f"set {node.name.upper()}_GID={ng.index} (resolved via {ng.via}) or auto",
                          evidence=ev, data={"pinned": pin, "resolved": ng.index}), SIM_GID)
            plan.per_node[node.name] = pin if not why else ng.index
        else:
            ctx.add_hw(check("net.gid", True, node=node.name, observed=f"index {ng.index} (via {ng.via})",
                             expected="a RoCE v2 ::ffff:<IPv4> GID", evidence=ev, data={"resolved": ng.index}), SIM_GID)
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
                         data={"common": cg.common, "per_node": cg.per_node}), SIM_GID)
    return plan


# --------------------------------------------------------------------------- traffic


def _pairs(ctx: _Ctx):
    return list(itertools.combinations(ctx.nodes, 2))


def _both_ways(ctx: _Ctx):
    for a, b in _pairs(ctx):
        yield a, b
        yield b, a


def _concurrently(calls: list[Callable[[], Any]]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=max(1, len(calls))) as pool:
        futures = [pool.submit(c) for c in calls]
        return [f.result() for f in futures]


def _ping_checks(ctx: _Ctx, rails: list[Rail]) -> None:
    mtu = int(_p(ctx.profile, "fabric_mtu", 9000) or 9000)
    max_rtt = float(_p(ctx.profile, "max_rtt_ms", 1.0) or 1.0)
    size = mtu - 28
    for rail in rails:
        for a, b in _pairs_on(ctx, rail):
            src, dst = rail.ends[a.name], rail.ends[b.name]
            name = f"ping_{rail.name}_{a.name}_to_{b.name}.txt"
            r = _read(a, fnet.ping_cmd(dst.ip, size=size, count=5, iface=src.iface), ctx.timeout)
            ev = [ctx.save(name, _text(r))]
            p = fnet.parse_ping(_text(r))
            label = f"net.ping.{rail.name}.{a.name}->{b.name}"
            if not p.ok:
                hint = (f"local MTU is {p.local_mtu}: set {mtu} on {src.iface}" if p.local_mtu else
                        f"check link, addresses and MTU {mtu} on both ends (the peer drops oversize frames silently)")
                ctx.add(check(label, False, node=a.name,
                              observed=f"{src.iface} -> {dst.ip}: {p.received}/{p.transmitted} received"
                                       + (f", {p.error}" if p.error else ""),
                              expected=f"{size}-byte DF ping (MTU {mtu}) answered", fix=hint, evidence=ev,
                              data={"loss_pct": p.loss_pct}))
                continue
            slow = p.rtt_avg_ms is not None and p.rtt_avg_ms > max_rtt
            ctx.add(check(label, not slow, node=a.name, warn_only=True,
                          observed=f"{src.iface} -> {dst.ip}: {size} B DF, 0% loss, rtt avg {p.rtt_avg_ms} ms (max {p.rtt_max_ms})",
                          expected=f"0% loss, rtt avg <= {max_rtt} ms (MAX_RTT_MS)",
                          fix="unexplained high RTT: treat as a blocker (degraded link state seen after NM churn; cold boot both nodes)",
                          evidence=ev, data={"rtt_avg_ms": p.rtt_avg_ms, "rtt_max_ms": p.rtt_max_ms}))


def _iperf_checks(ctx: _Ctx, rails: list[Rail], seconds: int) -> None:
    min_gbps = float(_p(ctx.profile, "min_tcp_gbps", 0) or 0)
    port = IPERF_BASE_PORT
    for rail in rails:
        for a, b in _pairs_on(ctx, rail):   # a sends (client), b receives (server)
            src, dst = rail.ends[a.name], rail.ends[b.name]
            port += 1
            tmo = seconds + 30
            srv_cmd = fnet.iperf3_server_cmd(dst.ip, port, timeout_s=seconds + 25)
            cli_cmd = fnet.iperf3_client_cmd(dst.ip, port, bind_ip=src.ip, seconds=seconds)
            srv, cli = _concurrently([lambda b=b, c=srv_cmd, t=tmo: _read(b, c, t),
                                       lambda a=a, c=cli_cmd, t=tmo: _read(a, c, t)])
            base = f"iperf3_{rail.name}_{a.name}_to_{b.name}"
            ev = [ctx.save(f"{base}_client.json", cli.stdout or cli.stderr or ""),
                  ctx.save(f"{base}_server.json", srv.stdout or srv.stderr or "")]
            res = fnet.parse_iperf3(cli.stdout)
            gbps = res.receiver_gbps
            label = f"net.tcp.{rail.name}.{a.name}->{b.name}"
            data = {"kind": "tcp", "rail": rail.name, "direction": f"{a.name}->{b.name}", "gbps": gbps,
                    "threshold_gbps": min_gbps, "sender_gbps": res.sender_gbps}
            if gbps is None:
                ctx.add(check(label, False, node=a.name, observed=f"iperf3 failed: {res.error}" + (f" ({(cli.stderr or '').strip()[:200]})" if cli.stderr else ""),
                              expected=f">= {min_gbps} Gb/s", evidence=ev, data=data,
                              fix=f"install iperf3 on both nodes; check nothing else listens on port {port} and the fabric IPs answer ping"))
                continue
            ctx.add(check(label, gbps >= min_gbps, node=a.name,
                          observed=f"{src.iface} {src.ip} -> {dst.ip}: {gbps:.2f} Gb/s received", expected=f">= {min_gbps} Gb/s (MIN_TCP_GBPS)",
                          fix="TCP below threshold: check MTU, socket buffers, CPU load, and a degraded link (cold boot)",
                          evidence=ev, data=data))


def _rdma_checks(ctx: _Ctx, rails: list[Rail], gid: GidPlan) -> None:
    if not ctx.expect_rdma:
        ctx.add(not_applicable("net.rdma.bw", "not applicable on this profile (EXPECT_RDMA=0)", node="cluster"))
        ctx.add(not_applicable("net.rdma.lat", "not applicable on this profile (EXPECT_RDMA=0)", node="cluster"))
        return
    per_rail = float(_p(ctx.profile, "min_rdma_gbps_rail", 90) or 90)
    total_min = float(_p(ctx.profile, "min_rdma_gbps_total", 180) or 180)
    degraded = float(_p(ctx.profile, "degraded_gbps", 25) or 25)
    expect_link = int(_p(ctx.profile, "expect_link_gbps", 0) or 0)
    for a, b in _both_ways(ctx):   # a = client (writer), b = server
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
            calls += [lambda b=b, s=scmd: _read(b, s, 60), lambda a=a, c=ccmd: _read(a, c, 60)]
            meta.append((rail, src, dst))
        results = _concurrently(calls) if calls else []
        total = 0.0
        for k, (rail, src, dst) in enumerate(meta):
            srv, cli = results[2 * k], results[2 * k + 1]
            base = f"ib_write_bw_{rail.name}_{a.name}_to_{b.name}"
            ev = [ctx.save(f"{base}_client.txt", _text(cli)), ctx.save(f"{base}_server.txt", _text(srv))]
            bw = fr.parse_ib_write_bw(_text(cli))
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
    for a, b in _pairs(ctx):
        for rail in rails:
            if a.name not in rail.ends or b.name not in rail.ends:
                continue
            src, dst = rail.ends[a.name], rail.ends[b.name]
            if not src.hca or not dst.hca:
                continue
            port = PERFTEST_BASE_PORT + 100 + rail.index
            scmd = fr.ib_write_lat_cmd(dst.hca, port, gid_index=gid.per_node.get(b.name), timeout_s=45)
            ccmd = fr.ib_write_lat_cmd(src.hca, port, server_ip=dst.ip, gid_index=gid.per_node.get(a.name), timeout_s=30)
            srv, cli = _concurrently([lambda b=b, c=scmd: _read(b, c, 60), lambda a=a, c=ccmd: _read(a, c, 60)])
            base = f"ib_write_lat_{rail.name}_{a.name}_to_{b.name}"
            ev = [ctx.save(f"{base}_client.txt", _text(cli)), ctx.save(f"{base}_server.txt", _text(srv))]
            lat = fr.parse_ib_write_lat(_text(cli))
            label = f"net.rdma.lat.{rail.name}.{a.name}->{b.name}"
            if lat.t_typical_us is None:
                ctx.add_hw(check(label, False, node=a.name, observed=f"{src.hca} -> {dst.ip}: {lat.error}", expected="a latency result",
                              fix="install perftest; check GID index and port state", evidence=ev), SIM_RDMA)
                continue
            ctx.add_hw(check(label, lat.t_typical_us <= MAX_RDMA_LAT_US, node=a.name, warn_only=True,
                          observed=f"t_typical {lat.t_typical_us} us (p99 {lat.p99_us})", expected=f"<= {MAX_RDMA_LAT_US} us (healthy ~1.5 us)",
                          fix="high RDMA latency: check for a degraded link (cold boot) or a busy host", evidence=ev,
                          data={"kind": "rdma_lat", "t_typical_us": lat.t_typical_us, "p99_us": lat.p99_us}), SIM_RDMA)


@dataclass
class NcclRank:
    """One nccl-tests rank, rendered with ITS node's values (recipe A: head enp1s0f1np1/rocep1s0f1,
    worker enp1s0f0np0/rocep1s0f0 -- the head's values on the worker name an interface it does not have)."""
    node: str
    host: str                  # mpirun -H: the node's fabric address
    socket_if: str             # NCCL_SOCKET_IFNAME (BOOTSTRAP_IF when set, else the node's fabric netdev)
    hcas: list[str]            # NCCL_IB_HCA: the node's <NODE>_CX7_IB
    gid_index: int | None      # NCCL_IB_GID_INDEX resolved/pinned for this node
    tests_dir: str             # this node's nccl-tests build directory


def nccl_tests_cmd(ranks: list[NcclRank], *, mpi_include: list[str], test: str = "all_reduce_perf",
                   timeout_s: int = 180, as_root: bool = False) -> str:
    """mpirun MPMD, one app context (rank) per node, each with its own NCCL env and binary path; OpenMPI's TCP
    traffic restricted to ``mpi_include`` (the ranks' socket subnets, CIDR: valid on every node)."""
    apps = []
    for r in ranks:
        env = ["NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET", f"NCCL_SOCKET_IFNAME={r.socket_if}",
               f"NCCL_IB_HCA={','.join(r.hcas)}", "NCCL_IB_DISABLE=0"]
        if r.gid_index is not None:
            env.append(f"NCCL_IB_GID_INDEX={r.gid_index}")
        xs = " ".join(f"-x {shlex.quote(e)}" for e in env) + " -x LD_LIBRARY_PATH"
        binary = shlex.quote(posixpath.join(r.tests_dir, test))
        apps.append(f"-np 1 -H {r.host}:1 {xs} {binary} -b 8M -e 128M -f 2 -g 1")
    include = shlex.quote(",".join(mpi_include))
    root = " --allow-run-as-root" if as_root else ""
    return (f"timeout {timeout_s} mpirun{root} --mca plm_rsh_agent 'ssh -o BatchMode=yes' --mca btl self,tcp "
            f"--mca btl_tcp_if_include {include} --mca oob_tcp_if_include {include} " + " : ".join(apps) + " 2>&1")


def nccl_ranks(ctx: _Ctx, gid: GidPlan) -> tuple[list[NcclRank], list[str]]:
    """Each node's rank and the subnets of the ranks' socket interfaces (for OpenMPI's if_include)."""
    ranks, nets = [], []
    for node in ctx.nodes:
        sock = getattr(node.spec, "socket_if", "") or (_split(node.spec.fabric_if) or [""])[0]
        ranks.append(NcclRank(node=node.name, host=str(node.spec.fabric_ip), socket_if=sock,
                              hcas=_split(node.spec.ib_devs), gid_index=gid.per_node.get(node.name),
                              tests_dir=ctx.nccl_dirs.get(node.name) or "nccl-tests/build"))
        nets += [str(n) for n in _iface(ctx.facts[node.name], sock).ipv4_networks]
    return ranks, list(dict.fromkeys(nets)) or list(dict.fromkeys(r.socket_if for r in ranks))


_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)", re.MULTILINE)


def rank_logs(text: str, nodes) -> dict[str, str]:
    """NCCL's log lines of each node's rank (``<host>:<pid>:<tid> [..] NCCL ...``), the host read from
    nccl-tests' ``#  Rank k ... on <host>`` line; '' for a rank that printed none."""
    hosts = {int(k): h for k, h in _RANK_LINE.findall(text or "")}
    out = {}
    for k, node in enumerate(nodes):
        h = hosts.get(k)
        out[node.name] = "\n".join(l for l in (text or "").splitlines() if h and l.startswith(f"{h}:"))
    return out


def _nccl_checks(ctx: _Ctx, gid: GidPlan) -> None:
    if not ctx.expect_gpu:
        ctx.add(not_applicable("net.nccl", "not applicable on this profile (EXPECT_GPU=0)", node="cluster"))
        return
    if not ctx.expect_rdma:
        ctx.add(not_applicable("net.nccl", "not applicable on this profile (EXPECT_RDMA=0: no NET/IB to test)", node="cluster"))
        return
    head = ctx.nodes[0]
    ranks, include = nccl_ranks(ctx, gid)
    cmd = nccl_tests_cmd(ranks, mpi_include=include, as_root=_is_root(head))
    r = _read(head, cmd, 240)
    text = _text(r)
    ev = [ctx.save("nccl_all_reduce_perf.txt", text)]
    res = fn.parse_nccl_tests(text)
    per_rank = {name: fn.parse_nccl_log(log) for name, log in rank_logs(text, ctx.nodes).items()}
    min_bus = float(_p(ctx.profile, "min_nccl_busbw_gbs", 21.875) or 21.875)
    if res.avg_busbw_gbs is None:
        ctx.add_hw(check("net.nccl.busbw", False, node="cluster", observed=f"nccl-tests: {res.error}", expected=f">= {min_bus} GB/s",
                         fix="see net.tools for nccl-tests on every node; the log's NCCL WARN / Test NCCL failure lines name the rank",
                         evidence=ev), SIM_NCCL)
    else:
        ctx.add_hw(check("net.nccl.busbw", res.avg_busbw_gbs >= min_bus and not res.wrong, node="cluster",
                         observed=f"avg busbw {res.avg_busbw_gbs} GB/s (max {res.max_busbw_gbs}), #wrong {'>0' if res.wrong else '0'}",
                         expected=f">= {min_bus} GB/s (MIN_NCCL_BUSBW_GBS), no wrong results",
                         fix="use both twins in NCCL_IB_HCA, MTU 9000, the release NCCL build", evidence=ev,
                         data={"avg_busbw_gbs": res.avg_busbw_gbs, "rows": [vars(x) for x in res.rows]}), SIM_NCCL)
    seen = {n: (log.transport or "not seen") for n, log in per_rank.items()}
    ctx.add_hw(check("net.nccl.transport", all(t == "IB" for t in seen.values()), node="cluster",
                     observed="; ".join(f"{n}: {t} ({', '.join(per_rank[n].via) or 'no channels'})" for n, t in seen.items()),
                     expected="NET/IB on every rank (not NET/Socket; GDRDMA is not supported on Spark)",
                     fix="NCCL fell back to TCP: pass /dev/infiniband, IPC_LOCK and memlock=-1 to the container; NCCL_IB_DISABLE must be 0; "
                         "NET/IB : No device found means NCCL_IB_HCA names no ACTIVE HCA of that node",
                     evidence=ev), SIM_NCCL)
    for rank in ranks:
        log = per_rank[rank.node]
        used = set(log.hca_names)
        missing = [h for h in rank.hcas if h not in used]
        ctx.add_hw(check("net.nccl.hcas", bool(used) and not missing, node=rank.node,
                         observed=f"NET/IB using {', '.join(log.hcas) or 'none'} (NCCL_IB_HCA={','.join(rank.hcas)})",
                         expected=f"all of {', '.join(rank.hcas)} (this node's {rank.node.upper()}_CX7_IB)",
                         fix=f"set {rank.node.upper()}_CX7_IB to the ACTIVE HCAs of {rank.node} (ibdev2netdev; both twins of the "
                             "cabled port for full bandwidth)", evidence=ev), SIM_NCCL)


def _is_root(node) -> bool:
    try:
        return tools.node_user(node).is_root
    except Exception:  # noqa: BLE001 - unknown user: render without the flag; mpirun then says why
        return False


def _tools_checks(ctx: _Ctx, tests_dir: str, install: bool) -> None:
    """perftest / mpirun / nccl-tests present on every node (installed when allowed), before any traffic."""
    need_perftest = ctx.expect_rdma
    need_nccl = ctx.expect_rdma and ctx.expect_gpu
    if not (need_perftest or need_nccl):
        return

    def one(node):
        t = tools.locate(node, ctx.profile, rehearsal_dir=sim.NCCL_TESTS_DIR if ctx.rehearsal else "",
                         tests_dir=tests_dir)
        ctx.nccl_dirs[node.name] = t.nccl_dir or (t.candidates[0] if t.candidates else "")
        return tools.tools_check(node, t, need_perftest=need_perftest, need_nccl=need_nccl, install=install,
                                 rehearsal=ctx.rehearsal)

    for name, value in ctx.cluster.each(one).items():
        if isinstance(value, Exception):
            value = check("net.tools", False, node=name, observed=f"probe failed: {str(value).splitlines()[0][:200]}",
                          expected="perftest and nccl-tests located", fix="check the node is reachable")
        ctx.add_hw(value, SIM_TOOLS)


def sweep_python_from(profile) -> str | None:
    """The python next to VLLM_BIN (``…/bin/vllm`` -> ``…/bin/python``), or VLLM_BIN if it is python."""
    vb = str(_p(profile, "vllm_bin", "") or "").strip()
    if not vb:
        return None
    first = shlex.split(vb)[0]
    if "/" in first and not first.startswith(("/", "~")) and hasattr(profile, "resolve_path"):
        first = str(profile.resolve_path(first))   # repo-relative (the lab's nodes share the repo)
    if re.search(r"python[\d.]*$", first):
        return first
    if first.endswith("/vllm"):
        return first[: -len("vllm")] + "python"
    return None


def sweep_cmd(python: str, *, rank: int, world_size: int, master: str, iface: str,
              port: int = SWEEP_PORT, max_bytes: int = SWEEP_MAX_BYTES, timeout_s: int = 120) -> str:
    script = fn.SWEEP_SCRIPT.read_text()
    args = (f"--rank {rank} --world-size {world_size} --master-addr {shlex.quote(master)} --master-port {port} "
            f"--iface {shlex.quote(iface)} --max-bytes {min(int(max_bytes), 64 << 20)} --timeout 60")
    return f"timeout {timeout_s} {python} - {args} <<'RUNBOOK_SWEEP_EOF'\n{script}\nRUNBOOK_SWEEP_EOF"


def _sweep_checks(ctx: _Ctx, rails: list[Rail], python: str | None, max_bytes: int, min_busbw: float) -> None:
    python = python or sweep_python_from(ctx.profile)
    if not python:
        ctx.add(not_applicable("net.allreduce", "not applicable on this profile (no python with torch: VLLM_BIN unset; pass sweep_python)",
                               node="cluster"))
        return
    rail = rails[0]
    ranks = {n.name: k for k, n in enumerate(ctx.nodes)}
    if all(n.name in rail.ends for n in ctx.nodes):
        master = rail.ends[ctx.nodes[0].name].ip
        ifaces = {n.name: rail.ends[n.name].iface for n in ctx.nodes}
    else:       # no rail joins every node (per-subnet rails): the all-reduce runs where vLLM's Gloo does
        master = str(getattr(ctx.profile, "master_addr", "") or ctx.nodes[0].spec.fabric_ip)
        ifaces = {n.name: getattr(n.spec, "socket_if", "") or _split(n.spec.fabric_if)[0] for n in ctx.nodes}

    def run(node):
        cmd = sweep_cmd(python, rank=ranks[node.name], world_size=len(ctx.nodes), master=master,
                        iface=ifaces[node.name], max_bytes=max_bytes)
        return _read(node, cmd, 150)

    outs = ctx.cluster.each(run)
    for node in ctx.nodes:
        r = outs[node.name]
        r = r if not isinstance(r, Exception) else _Result(255, "", str(r))
        ev = [ctx.save(f"allreduce_sweep_{node.name}.json", _text(r))]
        sw = fn.parse_allreduce_sweep(r.stdout)
        if sw.error or not sw.points:
            ctx.add(check("net.allreduce", False, node=node.name, observed=f"sweep failed: {sw.error or 'no results'}",
                          expected="gloo all-reduce 1 KiB..16 MiB completes", evidence=ev,
                          fix=f"check {python} has torch, port {SWEEP_PORT} is free, and GLOO_SOCKET_IFNAME={ifaces[node.name]} reaches {master}"))
            continue
        peak = sw.peak_busbw_gbs or 0.0
        last = sw.points[-1]
        ok = bool(sw.correct) and peak >= min_busbw
        ctx.add(check("net.allreduce", ok, node=node.name,
                      observed=f"gloo busbw {last.busbw_gbs * 8:.2f} Gb/s at {last.bytes >> 10} KiB, peak {peak * 8:.2f} Gb/s, correct={sw.correct}",
                      expected="results correct" + (f", peak busbw >= {min_busbw} GB/s" if min_busbw else ""),
                      fix="wrong all-reduce results or low bandwidth over the fabric: check the IF, MTU and firewall",
                      evidence=ev, data={"kind": "allreduce", "points": [vars(p) for p in sw.points], "backend": sw.backend}))


# --------------------------------------------------------------------------- plot


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
