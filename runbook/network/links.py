"""The static checks of the fabric, read without traffic: link, speed, PCIe, addressing, default route,
rp_filter and MTU of every rail interface, then each rail's shared subnet and MTU and the unique addresses.

Check rows: ``net.link.<if>``, ``net.speed.<if>``, ``net.pcie.<if>``, ``net.addr.*``, ``net.route.<if>``,
``net.rp_filter.<if>``, ``net.mtu.*``. Link speed with ``EXPECT_LINK_GBPS=0`` and PCIe on a virtual interface
are N/A, never PASS.
"""
from __future__ import annotations

import ipaddress
import itertools

from ..checks import check, not_applicable
from ..facts import net as fnet
from .context import EVIDENCE_PREFIX, Context, Rail, iface_of, split_list


def static_checks(ctx: Context, rails: list[Rail]) -> None:
    """Every rail interface of every node, then every rail across its ends and the addresses cluster-wide."""
    expect_gbps = ctx.profile.expect_link_gbps
    mtu_want = ctx.profile.fabric_mtu
    for node in ctx.nodes:
        f = ctx.facts[node.name]
        ev = [f"{EVIDENCE_PREFIX}/{node.name}/ip_addr.json"]
        mine = [r for r in rails if node.name in r.ends]
        for rail in mine:
            end = rail.ends[node.name]
            iface, itf, eth = end.iface, iface_of(f, end.iface), f.ethtool.get(end.iface, fnet.Ethtool())
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
            if iface == (split_list(node.spec.fabric_if) or [""])[0]:     # the node's <NODE>_CX7_IF carries <NODE>_IP
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
            nets = [(r.ends[node.name].iface, n) for r in mine for n in iface_of(f, r.ends[node.name].iface).ipv4_networks]
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
            for ip in iface_of(ctx.facts[node.name], rail.ends[node.name].iface).ipv4_addresses:
                owners.setdefault(ip, []).append(f"{node.name}:{rail.ends[node.name].iface}")
    dups = {ip: o for ip, o in owners.items() if len({x.split(':')[0] for x in o}) > 1}
    ctx.add(check("net.addr.unique", not dups, node="cluster",
                  observed="; ".join(f"{ip} on {', '.join(o)}" for ip, o in dups.items()) or f"{len(owners)} distinct addresses",
                  expected="no address on two nodes", fix="give every node its own address on each rail"))
    for rail in rails:
        ends = list(rail.ends.values())
        bad = []
        for a, b in itertools.combinations(ends, 2):
            ia = iface_of(ctx.facts[a.node], a.iface)
            if b.ip and not any(ipaddress.ip_address(b.ip) in n for n in ia.ipv4_networks):
                bad.append(f"{b.node} {b.ip} not in {a.node} {a.iface} subnet(s) {', '.join(map(str, ia.ipv4_networks)) or 'none'}")
        ctx.add(check(f"net.addr.{rail.name}.subnet", not bad, node="cluster", observed="; ".join(bad) or "ends share a subnet",
                      expected="both ends of a rail in one subnet", fix="use the same /24 (or /30) on both ends of each cable"))
        mtus = {e.node: iface_of(ctx.facts[e.node], e.iface).mtu for e in ends}
        ctx.add(check(f"net.mtu.{rail.name}.match", len(set(mtus.values())) == 1, node="cluster",
                      observed=", ".join(f"{e.node} {e.iface}={mtus[e.node]}" for e in ends),
                      expected="equal MTU on both ends", data={"mtu": mtus},
                      fix="set the same MTU on both ends (a mismatch passes small pings but deadlocks collectives)"))


def _yn(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")
