"""Which fabric each node has and how the nodes pair up into rails: the base facts, the early validation, the
rails, and each rail interface's ethtool / PCIe / rp_filter facts.

Base facts: ip addr/route, ibdev2netdev, the GID dump. Early validation: every configured fabric interface /
HCA exists; nothing else runs if not.

Check rows: ``net.facts``, ``net.fabric_if``, ``net.hca``, ``net.rails``, ``net.path.<a>-<b>``.
"""
from __future__ import annotations

import ipaddress

from ..checks import check, not_applicable
from ..facts import net as fnet
from ..facts import rdma as fr
from .context import Verification, NetFacts, Rail, RailEnd, iface_of, pairs, read, split_list, text_of


def collect_base(ctx: Verification) -> None:
    """ip addr/route on every node; with RDMA also ibdev2netdev and the GID tables."""
    def probe(node):
        out = NetFacts()
        r = read(node, fnet.IP_ADDR_CMD, ctx.timeout)
        ctx.save(f"{node.name}/ip_addr.json", text_of(r))
        out.ifaces = fnet.parse_ip_addr(r.stdout)
        if not r.ok or not out.ifaces:
            out.error = f"`{fnet.IP_ADDR_CMD}` failed (rc {r.exit_code}): {(r.stderr or r.stdout).strip()[:200]}"
        r = read(node, fnet.IP_ROUTE_CMD, ctx.timeout)
        ctx.save(f"{node.name}/ip_route.json", text_of(r))
        out.routes = fnet.parse_ip_route(r.stdout)
        if ctx.expect_rdma or split_list(node.spec.ib_devs):
            r = read(node, fr.IBDEV2NETDEV_CMD, ctx.timeout)
            ctx.save(f"{node.name}/ibdev2netdev.txt", text_of(r))
            out.hca_ports = fr.parse_ibdev2netdev(r.stdout)
        if ctx.expect_rdma:
            r = read(node, fr.gid_dump_cmd(ctx.sysfs), ctx.timeout)
            ctx.save(f"{node.name}/gids.tsv", r.stdout or "")
            out.gids = fr.parse_gid_dump(r.stdout, root=ctx.sysfs)
        return out

    for name, value in ctx.cluster.each(probe).items():
        ctx.facts[name] = value if isinstance(value, NetFacts) else NetFacts(error=str(value))


def early_validation(ctx: Verification) -> bool:
    """Every configured fabric IF (and HCA, when RDMA is expected) exists. Named, before traffic."""
    ok = True
    for node in ctx.nodes:
        f = ctx.facts[node.name]
        if f.error:
            ctx.add(check("net.facts", False, node=node.name, observed=f.error,
                          expected="ip -j addr answers", fix="check the node is reachable and has iproute2"))
            ok = False
            continue
        wanted = split_list(node.spec.fabric_if)
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
            hcas = split_list(node.spec.ib_devs)
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


def build_rails(ctx: Verification) -> list[Rail] | None:
    """Rail k joins every node's k-th fabric interface (``<NODE>_CX7_IF``, then the netdevs of the further
    HCAs); three or more nodes with unequal counts pair per subnet instead; None (after a FAIL row) when the
    nodes cannot be paired."""
    per_node: dict[str, list[RailEnd]] = {}
    for node in ctx.nodes:
        f = ctx.facts[node.name]
        ifs = split_list(node.spec.fabric_if)
        listed = split_list(node.spec.ib_devs)
        netdev_hca: dict[str, str] = {}
        for p in sorted(f.hca_ports, key=lambda p: p.hca not in listed):    # a listed HCA names its netdev's end
            netdev_hca.setdefault(p.netdev, p.hca)
        for hca in listed if ctx.expect_rdma else []:
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
    if len(per_node) > 2 and (len(set(counts.values())) > 1 or not _positional_rails_share_subnets(ctx, per_node)):
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


def _positional_rails_share_subnets(ctx: Verification, per_node: dict[str, list[RailEnd]]) -> bool:
    """Every node's k-th interface is in one IPv4 subnet with every other node's k-th (a switch, the lab's
    bridge); False for point-to-point cables where each link is its own /24 (the TP=3 triangle)."""
    width = min(len(e) for e in per_node.values())
    for k in range(width):
        nets = [set(iface_of(ctx.facts[n], per_node[n][k].iface).ipv4_networks) for n in per_node]
        if not set.intersection(*nets):
            return False
    return True


def _subnet_rails(ctx: Verification, per_node: dict[str, list[RailEnd]]) -> list[Rail] | None:
    """Three or more nodes cabled point to point (seed B TP3: two CX ports per Spark, each link its own /24,
    or a head-centred star): a rail is one IPv4 subnet and joins the nodes with an interface in it. Traffic
    then runs per pair on the rails both ends share. A pair without one (two workers of the triangle when one
    has only its head-facing port) FAILs ``net.path.<a>-<b>`` with EXPECT_RDMA=1: NCCL's ranks talk to every
    other rank over RoCE and time out in QP RTR (recipe B gives every node both CX ports on its TP=3 path);
    without RDMA their socket traffic crosses BOOTSTRAP_IF and the row is N/A."""
    by_net: dict[str, dict[str, RailEnd]] = {}
    for name, ends in per_node.items():
        for end in ends:
            for net in iface_of(ctx.facts[name], end.iface).ipv4_networks:
                ip = next((a for a in iface_of(ctx.facts[name], end.iface).ipv4_addresses
                           if ipaddress.ip_address(a) in net), end.ip)
                by_net.setdefault(str(net), {}).setdefault(name, RailEnd(name, end.iface, ip, end.hca))
    shared = sorted(((ipaddress.ip_network(net), ends) for net, ends in by_net.items() if len(ends) >= 2),
                    key=lambda kv: (kv[0].network_address, kv[0].prefixlen))
    rails = [Rail(index=k, ends=ends) for k, (_, ends) in enumerate(shared)]
    lonely = [n for n in per_node if not any(n in r.ends for r in rails)]
    desc = "; ".join(f"rail{r.index}: " + ", ".join(f"{e.node} {e.iface} {e.ip}" for e in r.ends.values())
                     for r in rails)
    if lonely and rails and not ctx.expect_rdma and ctx.profile.bootstrap_if:
        # no RDMA: the fabric carries no rank traffic, which crosses BOOTSTRAP_IF; the pairs' rows below say N/A
        for name in lonely:
            ctx.add(not_applicable(f"net.rails.{name}", f"{name} shares no fabric subnet with another node over the "
                                   f"interfaces it is given ({', '.join(e.iface for e in per_node[name])}); no RDMA "
                                   f"expected: its rank traffic uses BOOTSTRAP_IF={ctx.profile.bootstrap_if}",
                                   node=name))
        lonely = []
    ctx.add(check("net.rails", not lonely and bool(rails), node="cluster",
                  observed=(f"per-subnet rails: {desc}" if not lonely else
                            f"{', '.join(lonely)} share no fabric subnet with any other node; rails: {desc or 'none'}"),
                  expected="every node on at least one rail (a subnet shared with another node)",
                  fix="give both ends of each cable addresses in one /24 (seed B TP3: 10.0.22.0/24 head<->worker, "
                      "10.0.23.0/24 head<->worker2 on the TP=3 triangle) and list the facing HCAs in <NODE>_CX7_IB"))
    if lonely or not rails:
        return None
    given = {n: fnet.fabric_ends([e.iface for e in ends], ctx.facts[n].ifaces) for n, ends in per_node.items()}
    for a, b in pairs(ctx):
        if fnet.pair_path(given[a.name], given[b.name]):
            continue
        if not ctx.expect_rdma:
            ctx.add(not_applicable(f"net.path.{a.name}-{b.name}",
                                   "no direct fabric rail between these nodes and no RDMA expected: their "
                                   "socket traffic uses BOOTSTRAP_IF", node="cluster"))
            continue
        missing = missing_ends(ctx, per_node, a.name, b.name) + missing_ends(ctx, per_node, b.name, a.name)
        given = "; ".join(f"{n.name} is given {', '.join(f'{e.iface}' + (f' ({e.hca})' if e.hca else '') for e in per_node[n.name])}"
                          for n in (a, b))
        if missing:
            observed = (f"{a.name} and {b.name} share no fabric subnet over the interfaces and HCAs they are given ({given}): "
                        + "; ".join(m for m, _ in missing))
            fix = ("; ".join(f for _, f in missing) + " (recipe B TP=3: NCCL_IB_HCA=rocep1s0f0,rocep1s0f1 on every "
                   "node; a rank with only its head-facing port times out in QP RTR)")
        else:
            observed = f"no fabric subnet shared by {a.name} and {b.name} ({given}), and no cable joins them; rails: {desc}"
            fix = (f"cable {a.name}'s and {b.name}'s free CX-7 ports to each other on their own /24 and list "
                   f"both CX ports in {a.name.upper()}_CX7_IB and {b.name.upper()}_CX7_IB (recipe B TP=3: "
                   "NCCL_IB_HCA=rocep1s0f0,rocep1s0f1 on every node; one facing port times out in QP RTR)")
        ctx.add(check(f"net.path.{a.name}-{b.name}", False, node="cluster", observed=observed,
                      expected=f"a RoCE link {a.name}<->{b.name}: NCCL connects every rank pair over RDMA", fix=fix,
                      data={"pair": [a.name, b.name], "missing": [m for m, _ in missing]}))
    return rails


def missing_ends(ctx: Verification, per_node: dict[str, list[RailEnd]], name: str, peer: str) -> list[tuple[str, str]]:
    """The interfaces ``name`` has but is not given that sit on a subnet of an interface ``peer`` is given: the
    cable between them exists, the profile leaves it out. (what is missing, the fix) per interface."""
    f = ctx.facts[name]
    given = {e.iface for e in per_node[name]}
    peer_nets = {n: e for e in per_node[peer] for n in iface_of(ctx.facts[peer], e.iface).ipv4_networks}
    hcas = {p.netdev: p.hca for p in f.hca_ports}
    out = []
    for iface, itf in sorted(f.ifaces.items()):
        if iface in given or iface == ctx.profile.bootstrap_if:
            continue
        for net in itf.ipv4_networks:
            if net in peer_nets:
                hca = hcas.get(iface, "")
                end = peer_nets[net]
                out.append((f"{name}'s {iface}{f' ({hca})' if hca else ''} is cabled to {peer}'s {end.iface} on {net}, "
                            f"but {name} is not given it",
                            f"add {hca or iface} to {name.upper()}_CX7_IB" + (f" (the HCA of {iface})" if hca else "")))
    return out


def collect_rail_facts(ctx: Verification, rails: list[Rail]) -> None:
    """ethtool, PCIe link and rp_filter of every interface that is on a rail."""
    def probe(node):
        f = ctx.facts[node.name]
        ifs = [r.ends[node.name].iface for r in rails if node.name in r.ends]
        for iface in ifs:
            r = read(node, fnet.ethtool_cmd(iface), ctx.timeout)
            ctx.save(f"{node.name}/ethtool_{iface}.txt", text_of(r))
            f.ethtool[iface] = fnet.parse_ethtool(r.stdout)
        r = read(node, fnet.pcie_cmd(ifs), ctx.timeout)
        ctx.save(f"{node.name}/pcie.tsv", r.stdout or "")
        f.pcie = fnet.parse_pcie(r.stdout)
        r = read(node, fnet.rp_filter_cmd(ifs), ctx.timeout)
        ctx.save(f"{node.name}/rp_filter.txt", text_of(r))
        f.rp = fnet.parse_rp_filter(r.stdout)

    for name, value in ctx.cluster.each(probe).items():
        if isinstance(value, Exception):
            ctx.facts[name].error = str(value)
