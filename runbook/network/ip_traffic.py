"""IP traffic over every rail: a don't-fragment ping at the fabric MTU and iperf3's TCP bandwidth, both
directions. Servers are one-shot (``iperf3 -s -1``) under ``timeout``; these stay real in a rehearsal.

Check rows: ``net.ping.<rail>.<a>-><b>``, ``net.switch.<rail>`` (a rail of three or more nodes: a switch; names the
node whose switch port drops jumbo frames), ``net.tcp.<rail>.<a>-><b>``, ``net.tcp_pairs.<rail>`` (a rail of three or
more nodes: names the slow or missing pair among the per-pair iperf3 results).
"""
from __future__ import annotations

from ..checks import Check, check
from ..facts import net as fnet
from .context import Verification, Rail, concurrently, iface_of, pairs_on, read, text_of

IPERF_BASE_PORT = 5301
SLOW_PAIR_FRACTION = 0.5      # a pair below half the fastest pair's TCP rate is named slow


def tcp_pairs_check(rail_name: str, results: dict[tuple[str, str], float | None], min_gbps: float) -> Check:
    """``net.tcp_pairs.<rail>`` from the per-direction iperf3 results of one rail ({(sender, receiver): Gb/s
    received, None when iperf3 gave no figure}): every pair of nodes is named when a direction of it is missing,
    below MIN_TCP_GBPS (FAIL) or below SLOW_PAIR_FRACTION x the fastest direction measured on the rail (WARN: on a
    switch every pair should see the same path, so one slow pair is one port, cable or transceiver)."""
    got = {k: v for k, v in results.items() if v is not None}
    fastest = max(got.values(), default=0.0)
    floor = SLOW_PAIR_FRACTION * fastest
    missing = [f"{a}->{b}" for (a, b), v in results.items() if v is None]
    below = [f"{a}->{b} {v:.2f}" for (a, b), v in got.items() if v < min_gbps]
    slow = [f"{a}->{b} {v:.2f}" for (a, b), v in got.items() if min_gbps <= v < floor]
    pairs = len({frozenset(k) for k in results})
    expected = (f"every pair both ways >= {min_gbps} Gb/s (MIN_TCP_GBPS) and >= {SLOW_PAIR_FRACTION:g} x the fastest "
                "pair")
    data = {"gbps": {f"{a}->{b}": v for (a, b), v in results.items()}, "fastest_gbps": fastest,
            "slow_floor_gbps": floor, "threshold_gbps": min_gbps, "missing": missing,
            "below_min": below, "slow": slow}
    if not got:
        return check(f"net.tcp_pairs.{rail_name}", False, node="cluster",
                     observed=f"no iperf3 figure for any of the {len(results)} directions of {pairs} pairs",
                     expected=expected, data=data, cause="fabric",
                     fix="see the net.tcp rows: iperf3 on every node, the fabric addresses answer ping")
    lo = min(got, key=got.get)
    spread = (f"{len(got)} directions of {pairs} pairs measured: {min(got.values()):.2f}-{fastest:.2f} Gb/s "
              f"(slowest {lo[0]}->{lo[1]})")
    if missing or below:
        named = (["no figure: " + ", ".join(missing)] if missing else []) + \
                ([f"below MIN_TCP_GBPS={min_gbps}: " + ", ".join(below) + " Gb/s"] if below else [])
        return check(f"net.tcp_pairs.{rail_name}", False, node="cluster",
                     observed=f"{spread}; " + "; ".join(named), expected=expected, data=data, cause="fabric",
                     fix="check the named pair's ports, cables and switch ports (ip -s link: errors, drops), and the "
                         "MTU on both ends; a pair with no figure: iperf3 on both nodes and a path between them")
    if slow:
        return check(f"net.tcp_pairs.{rail_name}", False, node="cluster", warn_only=True,
                     observed=f"{spread}; below {SLOW_PAIR_FRACTION:g} x the fastest ({floor:.2f} Gb/s): "
                              + ", ".join(slow) + " Gb/s",
                     expected=expected, data=data,
                     fix="a slow pair on a switch is one end's port, cable or transceiver, or a busy node: rerun "
                         "01_network; if the same pair stays slow, check its ports (ethtool -S, ip -s link) and "
                         "the switch port counters")
    return check(f"net.tcp_pairs.{rail_name}", True, node="cluster", observed=spread, expected=expected, data=data)


def short_ends(names: list[str], answered: dict[tuple[str, str], bool]) -> list[str] | None:
    """On a switch (one subnet, three or more nodes), the nodes whose every DF ping, to or from them, was lost
    while some pair without them got through: the short end is that node's port (its NIC or its switch port:
    a port left at 1500 drops the frame silently, so the sender sees plain loss). [] when nothing is lost or no
    node is in every lost pair; None when no pair got through (the switch itself, or every port)."""
    if all(answered.values()):
        return []
    if not any(answered.values()):
        return None
    return [n for n in names if all(not ok for (a, b), ok in answered.items() if n in (a, b))]


def switch_checks(ctx: Verification, rail: Rail, answered: dict[tuple[str, str], bool], size: int) -> None:
    """``net.switch.<rail>``: on a rail of three or more nodes, every pair answers DF pings of ``size`` bytes;
    a node whose every pair fails is named, with its switch port as the fix when its NIC has the MTU. A failing
    row that names the short end is the fabric cause of the lost pings, TCP and collectives (the first fix)."""
    mtu = ctx.profile.fabric_mtu
    names = list(rail.ends)
    pairs = len(names) * (len(names) - 1) // 2
    short = short_ends(names, answered)
    nic = {n: iface_of(ctx.facts[n], rail.ends[n].iface).mtu for n in names}
    if all(answered.values()):
        ctx.add(check(f"net.switch.{rail.name}", True, node="cluster",
                      observed=f"{pairs} pairs of {len(names)} nodes answer {size}-byte DF pings both ways",
                      expected=f"every pair through the switch at MTU {mtu}"))
        return
    if short is None:
        ctx.add(check(f"net.switch.{rail.name}", False, node="cluster",
                      observed=f"no pair of {len(names)} nodes answers a {size}-byte DF ping",
                      expected=f"every pair through the switch at MTU {mtu}",
                      fix=f"set MTU {mtu} (jumbo frames) on the switch and on every port the nodes use; check the "
                          "switch ports' VLAN and link state", data={"short": sorted(names)}, cause="fabric"))
        return
    lost = sum(1 for ok in answered.values() if not ok)
    where = "; ".join(f"{n} {rail.ends[n].iface}: " + (f"NIC MTU {nic[n]}" if nic[n] != mtu else
                                                       f"NIC MTU {nic[n]}, so its switch port drops {size}-byte frames")
                      for n in short) or "no single node"
    ctx.add(check(f"net.switch.{rail.name}", False, node="cluster",
                  observed=f"{lost} of {len(answered)} DF pings lost; every one to or from {', '.join(short) or '?'} "
                           f"({where})" if short else f"{lost} of {len(answered)} DF pings lost, no node in all of them",
                  expected=f"every pair through the switch at MTU {mtu}",
                  fix=("; ".join(f"set MTU {mtu} on {n}'s {rail.ends[n].iface}" if nic[n] != mtu else
                                 f"set MTU {mtu} on the switch port {n}'s {rail.ends[n].iface} is plugged into "
                                 "(a switch port left at 1500 drops jumbo frames silently)" for n in short)
                       or "see the failing net.ping rows: check the cables and the switch's ports of those pairs"),
                  data={"short": short}, cause="fabric" if short else ""))


def ping_checks(ctx: Verification, rails: list[Rail]) -> None:
    """A full-MTU don't-fragment ping over every rail, both directions; on a rail of three or more nodes (a switch)
    also ``net.switch.<rail>`` (:func:`switch_checks`)."""
    mtu = ctx.profile.fabric_mtu
    max_rtt = ctx.profile.max_rtt_ms
    size = mtu - 28
    for rail in rails:
        answered: dict[tuple[str, str], bool] = {}
        for a, b in pairs_on(ctx, rail):
            src, dst = rail.ends[a.name], rail.ends[b.name]
            name = f"ping_{rail.name}_{a.name}_to_{b.name}.txt"
            r = read(a, fnet.ping_cmd(dst.ip, size=size, count=5, iface=src.iface), ctx.timeout)
            ev = [ctx.save(name, text_of(r))]
            p = fnet.parse_ping(text_of(r))
            answered[(a.name, b.name)] = p.ok
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
        if len(rail.ends) >= 3:
            switch_checks(ctx, rail, answered, size)


def iperf_checks(ctx: Verification, rails: list[Rail], seconds: int) -> None:
    """iperf3 over every rail, both directions, the client bound to the rail's address."""
    min_gbps = ctx.profile.min_tcp_gbps
    port = IPERF_BASE_PORT
    for rail in rails:
        results: dict[tuple[str, str], float | None] = {}
        for a, b in pairs_on(ctx, rail):   # a sends (client), b receives (server)
            src, dst = rail.ends[a.name], rail.ends[b.name]
            port += 1
            tmo = seconds + 30
            srv_cmd = fnet.iperf3_server_cmd(dst.ip, port, timeout_s=seconds + 25)
            cli_cmd = fnet.iperf3_client_cmd(dst.ip, port, bind_ip=src.ip, seconds=seconds)
            srv, cli = concurrently([lambda b=b, c=srv_cmd, t=tmo: read(b, c, t),
                                       lambda a=a, c=cli_cmd, t=tmo: read(a, c, t)])
            base = f"iperf3_{rail.name}_{a.name}_to_{b.name}"
            ev = [ctx.save(f"{base}_client.json", cli.stdout or cli.stderr or ""),
                  ctx.save(f"{base}_server.json", srv.stdout or srv.stderr or "")]
            res = fnet.parse_iperf3(cli.stdout)
            gbps = res.receiver_gbps
            results[(a.name, b.name)] = gbps
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
        if len(rail.ends) >= 3 and results:
            ctx.add(tcp_pairs_check(rail.name, results, min_gbps))
