"""What the runbook can see of the server and the fabric right now, as check rows: used when a step ended
in an exception (the runner writes these into the step's sidecar, so the table says *why*), and by the
serving watchdog.

    rows = explain(cluster, profile)    # server answers? each rank running? fabric link up and pingable?
"""
from __future__ import annotations

from ..checks import Check, check
from ..errors import RunbookError
from ..facts import net
from ..remote import Cluster
from ..secrets import load_secrets
from ..serve.server_info import ApiClient, ServerInfo
from .ranks import rank_state
from ..serve.endpoint import base_url


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
                                                f"{profile.source}`; restart with 04_launch (action='restart')"))
    states = cluster.each(lambda node: rank_state(node, profile))
    alive, dead = [], []
    leftovers: dict[str, str] = {}       # node -> its vLLM processes left without their server
    for name, st in states.items():
        if isinstance(st, Exception):
            rows.append(check("rank running", False, node=name, observed=f"cannot read: {str(st)[:200]}",
                              expected="the rank 04_launch started", fix="check the node is reachable (ssh)"))
            continue
        (alive if st.running else dead).append(name)
        if not st.running and st.processes:     # its main process died, children (EngineCore, TP workers) did not
            leftovers[name] = (f"{len(st.processes)} vLLM process(es) without their server: "
                               f"{', '.join(p.split()[0] for p in st.processes[:6])}")
        rows.append(check("rank running", st.running, node=name, observed=st.describe(),
                          expected="the rank 04_launch started",
                          fix=f"read its log: python -m runbook logs {name} --profile {profile.source}"))
        if st.stopped:          # alive to kill -0 and ps, but it will never answer a collective
            rows.append(check("rank not frozen", False, node=name,
                              observed=f"{len(st.stopped)} vLLM process(es) stopped (state T): "
                                       f"{', '.join(st.stopped[:4])}",
                              expected="no rank process stopped",
                              fix=f"resume them (kill -CONT <pid>) if you stopped them; otherwise restart both ranks "
                                  f"together: {stop_hint(profile)}, then 04_launch"))
    if leftovers or (alive and (dead or health.status != 200)):
        held = alive + [f"{name} ({what})" for name, what in leftovers.items()]
        rows.append(check("no orphaned ranks", False, node=",".join([*alive, *leftovers]),
                          observed=f"still running on {', '.join(held)} while "
                                   + (f"{', '.join(dead)} is gone" if dead else "the API does not answer"),
                          expected="every rank serving, or none left running",
                          fix=f"stop what remains: {stop_hint(profile)}"))
    return rows


def fabric_rows(cluster: Cluster, profile) -> list[Check]:
    """Each node's fabric interface state and a short ping to every peer over it (both ways)."""
    rows = []
    nodes = list(cluster)
    for node in nodes:
        iface = node.spec.fabric_if.split(",")[0]
        addrs = net.parse_ip_addr(node.read(f"ip -j addr show dev {iface}", timeout=10).stdout)
        link = addrs.get(iface)
        rows.append(check("fabric link up", link is not None and link.up, node=node.name,
                          observed=f"{iface} {link.state if link else 'missing'}", expected=f"{iface} UP",
                          fix=f"bring the link up on {node.name} (ip link set {iface} up; check the cable and the "
                              f"other end) and rerun the step"))
        for peer in nodes:
            if peer is node or not peer.spec.fabric_ip:
                continue
            res = node.read(net.ping_cmd(peer.spec.fabric_ip, size=56, count=2, iface=iface, deadline_s=4),
                            timeout=15)
            ping = net.parse_ping(res.stdout + res.stderr)
            rows.append(check(f"fabric ping {node.name}→{peer.name}", ping.ok, node=node.name,
                              observed=f"{ping.received}/{ping.transmitted} replies" + (f" ({ping.error})"
                                                                                         if ping.error else ""),
                              expected="every reply", fix="the fabric between these nodes is broken: check both "
                                                          "links (ip -br link), the cable, and the addresses"))
    return rows


def explain(cluster: Cluster, profile) -> list[Check]:
    return server_rows(cluster, profile) + fabric_rows(cluster, profile)
