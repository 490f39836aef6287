"""What the runbook can see of the server and the fabric right now, as check rows: used when a step ended
in an exception (the runner writes these into the step's sidecar, so the table says *why*), and by the
serving watchdog.

    rows = explain(cluster, profile)    # server answers? each rank running? fabric link up and pingable?
"""
from __future__ import annotations

from ..checks import Check, check, not_applicable
from ..errors import RunbookError
from ..facts import net, rdma
from ..remote import Cluster, operator_ssh
from ..secrets import load_secrets
from .server_info import ApiClient, ServerInfo
from ..facts.ranks import rank_state
from .endpoint import base_url


def stop_hint(profile) -> str:
    return f"python -m runbook stop --profile {profile.source}"


def server_rows(cluster: Cluster, profile) -> list[Check]:
    """/health of the API, and each rank's state; ranks left running without a serving head are named with
    the command that stops them."""
    rows = []
    try:
        server = ServerInfo(base_url(profile), profile.served_model_name, api_key=load_secrets().api_key)
        with ApiClient(server, timeout=5) as api:
            health = api.get("/health")
        status, error = health.status, health.error
    except RunbookError as exc:         # the SSH forward to a loopback-bound API could not open
        status, error = None, exc.what
    rows.append(check("server answers /health", status == 200, node="head",
                      observed=f"HTTP {status}" if status is not None else error[:200],
                      expected="HTTP 200", fix=f"the API is gone: read `python -m runbook logs --profile "
                                                f"{profile.source}`; restart with 04_launch (action='restart')",
                      cause="server"))
    states = cluster.each(lambda node: rank_state(node, profile))
    alive, dead = [], []
    leftovers: dict[str, str] = {}       # node -> its vLLM processes left without their server
    for name, st in states.items():
        if isinstance(st, Exception):
            rows.append(check("rank running", False, node=name, observed=f"cannot read: {str(st)[:200]}",
                              expected="the rank 04_launch started", fix="check the node is reachable (ssh)",
                              cause="node"))
            continue
        (alive if st.running else dead).append(name)
        if not st.running and st.processes:     # its main process died, children (EngineCore, TP workers) did not
            leftovers[name] = (f"{len(st.processes)} vLLM process(es) without their server: "
                               f"{', '.join(p.split()[0] for p in st.processes[:6])}")
        rows.append(check("rank running", st.running, node=name, observed=st.describe(),
                          expected="the rank 04_launch started",
                          fix=f"read its log: python -m runbook logs {name} --profile {profile.source}",
                          cause="server"))
        if st.stopped:          # alive to kill -0 and ps, but it will never answer a collective
            rows.append(check("rank not frozen", False, node=name,
                              observed=f"{len(st.stopped)} vLLM process(es) stopped (state T): "
                                       f"{', '.join(st.stopped[:4])}",
                              expected="no rank process stopped",
                              fix=f"something stopped them (SIGSTOP, Ctrl-Z, or a debugger: a non-zero TracerPid in "
                                  f"/proc/<pid>/status names it); if that was not meant, continue them: "
                                  f"{operator_ssh(profile, name)} kill -CONT "
                                  f"{' '.join(p.split()[0] for p in st.stopped)}; otherwise restart every rank "
                                  f"together: {stop_hint(profile)}, then 04_launch", cause="server"))
    if leftovers or (alive and (dead or health.status != 200)):
        held = alive + [f"{name} ({what})" for name, what in leftovers.items()]
        rows.append(check("no orphaned ranks", False, node=",".join([*alive, *leftovers]),
                          observed=f"still running on {', '.join(held)} while "
                                   + (f"{', '.join(dead)} is gone" if dead else "the API does not answer"),
                          expected="every rank serving, or none left running",
                          fix=f"stop what remains: {stop_hint(profile)}", cause="server"))
    return rows


def fabric_rows(cluster: Cluster, profile) -> list[Check]:
    """Each node's fabric interface state and a short ping to every peer over the path the two share (both
    ways): the subnet of one of the node's given interfaces (``<NODE>_CX7_IF``, its HCAs' netdevs) the peer has
    an address on (:func:`runbook.facts.net.pair_path`, the rails of 01_network): two nodes, the peer's
    ``<NODE>_IP``; on the TP=3 triangle two workers reach each other over their own cable, not at a head-facing
    address."""
    rows = []
    nodes = list(cluster)
    addrs, ends = {}, {}
    for node in nodes:          # every node's interfaces first: a pair's path needs both ends
        addrs[node.name], ends[node.name] = rdma.read_fabric(node, timeout=10)
    for node in nodes:
        iface = node.spec.fabric_if.split(",")[0]
        link = addrs[node.name].get(iface)
        rows.append(check("fabric link up", link is not None and link.up, node=node.name,
                          observed=f"{iface} {link.state if link else 'missing'}", expected=f"{iface} UP",
                          fix=f"bring the link up on {node.name} (ip link set {iface} up; check the cable and the "
                              f"other end) and rerun the step", cause="fabric"))
        for peer in nodes:
            if peer is node or not peer.spec.fabric_ip:
                continue
            name = f"fabric ping {node.name}→{peer.name}"
            path = net.pair_path(ends[node.name], ends[peer.name])
            if path is None:
                rows.append(_no_path_row(name, node, peer, ends, profile))
                continue
            res = node.read(net.ping_cmd(path.peer_ip, size=56, count=2, iface=path.iface, deadline_s=4),
                            timeout=15)
            ping = net.parse_ping(res.stdout + res.stderr)
            rows.append(check(name, ping.ok, node=node.name,
                              observed=f"{ping.received}/{ping.transmitted} replies from {path.peer_ip} over "
                                       f"{path.iface}" + (f" ({ping.error})" if ping.error else ""),
                              expected="every reply", fix="the fabric between these nodes is broken: check both "
                                                          "links (ip -br link), the cable, and the addresses",
                              cause="fabric"))
    return rows


def _no_path_row(name: str, node, peer, ends: dict, profile) -> Check:
    """No given interface of ``node`` shares a subnet with one of ``peer``'s: without RDMA their rank traffic
    crosses BOOTSTRAP_IF (N/A, as 01_network's ``net.path``); otherwise a FAIL naming what each is given."""
    given = "; ".join(f"{n.name}: {', '.join(ends[n.name]) or 'none'}" for n in (node, peer))
    if profile.bootstrap_if and not profile.expect_rdma:
        return not_applicable(name, f"no fabric subnet shared over the interfaces given ({given}); no RDMA "
                                    f"expected: their traffic uses BOOTSTRAP_IF={profile.bootstrap_if}",
                              node=node.name)
    return check(name, False, node=node.name,
                 observed=f"no fabric subnet shared by {node.name} and {peer.name} over the interfaces given ({given})",
                 expected=f"a fabric path {node.name}<->{peer.name}",
                 fix=f"give both nodes the CX-7 port of the cable between them: list its HCA in "
                     f"{node.name.upper()}_CX7_IB and {peer.name.upper()}_CX7_IB (TP=3: both CX ports on every node)", cause="fabric")


def explain(cluster: Cluster, profile) -> list[Check]:
    return server_rows(cluster, profile) + fabric_rows(cluster, profile)
