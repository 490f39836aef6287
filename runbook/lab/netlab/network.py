"""The lab's network plumbing: network namespaces, the management bridge and veths, the fabric's point-to-point
links between named ports or the switch (one bridge, each node's first port on it), guard routes and addresses (see
the topology in ``runbook/lab/netlab/__init__.py``). ``recable`` changes the fabric under running nodes (2 -> 3 -> 4
nodes: cable, triangle, switch; on the switch a node joins without touching the others)."""
from __future__ import annotations

import json
import time

from runbook.errors import LabError

from .host import link_exists, run_local
from .spec import (BRIDGE, BRIDGE_IP, FABRIC_MTU, GUARD_ROUTES, MGMT_IF, PORTS, SWITCH, SWITCH_NET, SWITCH_PORT,
                   LabNode, all_addresses, links)


def _netns(name: str) -> str:
    return f"nl-{name}"


def switch_port(name: str) -> str:
    """The switch port of node ``name``: the root end of the veth whose node end is its first CX-7 port."""
    return f"nl-s-{name}"


def _link_cmds(specs: list[LabNode], nodes: int, topology: str) -> list[str]:
    """The fabric of ``specs`` in the ``nodes``-node ``topology``. Cables: one veth per cable, its two ends created
    directly in the two nodes' namespaces under the port names. Switch: each node's first port is a veth whose
    root end (``nl-s-<node>``, MTU 9000) is a port of the bridge :data:`SWITCH`. A port of ``specs`` nothing reaches
    is a veth whose other end stays DOWN in the root netns (``nl-u-<node>-<k>``): the port is there with no carrier
    and no address, an empty QSFP cage."""
    cabling = links(nodes, topology)
    names = {n.name for n in specs}
    cmds = [f"link add {pa} mtu {FABRIC_MTU} netns {_netns(na)} type veth peer name {pb} mtu {FABRIC_MTU} "
            f"netns {_netns(nb)}" for (na, pa), (nb, pb) in (link.ends() for link in cabling)
            if na in names or nb in names]
    for n in specs:
        if topology == "switch":
            cabled = {SWITCH_PORT}
            cmds += [f"link add {switch_port(n.name)} mtu {FABRIC_MTU} type veth peer name {SWITCH_PORT} "
                     f"mtu {FABRIC_MTU} netns {n.netns}", f"link set {switch_port(n.name)} master {SWITCH} up"]
        else:
            cabled = {port for (node, port) in (end for link in cabling for end in link.ends()) if node == n.name}
        cmds += [f"link add nl-u-{n.name}-{k} mtu {FABRIC_MTU} type veth peer name {port} mtu {FABRIC_MTU} "
                 f"netns {n.netns}" for k, port in enumerate(PORTS) if port not in cabled]
    return cmds


def _switch_cmds(topology: str) -> list[str]:
    """The switch itself (a bridge with MTU 9000 and no address: the host is not on the fabric) when the
    topology has one and it is not there yet."""
    if topology != "switch" or link_exists(SWITCH):
        return []
    return [f"link add {SWITCH} mtu {FABRIC_MTU} type bridge", f"link set {SWITCH} up"]


def _address_ports(specs: list[LabNode]) -> None:
    """Address every cabled port of ``specs``' nodes (``<net>.<rank + 1>/24``, MTU 9000) and bring it up."""
    for n in specs:
        cmds = []
        for port, ip in n.ports:
            cmds += [f"addr replace {ip}/24 dev {port}", f"link set {port} up"]
        if cmds:
            run_local(["ip", "-n", n.netns, "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30,
                      node=n.alias, what=f"addressing the fabric ports in {n.netns}")


def _add_nodes(specs: list[LabNode]) -> list[str]:
    """Commands for the namespaces and management veths (``enP7s7`` inside, on the bridge outside) of ``specs``."""
    cmds = [f"netns add {n.netns}" for n in specs]
    for n in specs:
        cmds += [f"link add {n.mgmt_veth} type veth peer name {MGMT_IF} netns {n.netns}",
                 f"link set {n.mgmt_veth} master {BRIDGE} up"]
    return cmds


def _address_mgmt(specs: list[LabNode]) -> None:
    for n in specs:
        ncmds = ["link set lo up", f"addr add {n.mgmt_ip}/24 dev {MGMT_IF}", f"link set {MGMT_IF} up"]
        run_local(["ip", "-n", n.netns, "-batch", "-"], input="\n".join(ncmds) + "\n", timeout=30,
                  node=n.alias, what=f"configuring addresses in {n.netns}")


def create_network(specs: list[LabNode], topology: str) -> None:
    """Guard routes, the management bridge, one netns per node with its veths, the fabric (cables or the switch),
    and the addresses."""
    cmds = [f"route replace unreachable {r}" for r in GUARD_ROUTES]
    cmds += [f"link add {BRIDGE} type bridge", f"addr add {BRIDGE_IP}/24 dev {BRIDGE}", f"link set {BRIDGE} up"]
    cmds += _add_nodes(specs) + _switch_cmds(topology) + _link_cmds(specs, len(specs), topology)
    run_local(["ip", "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30,
              what="creating the lab network (root netns)", fix="run `down` to clear leftovers, then `up` again")
    _address_mgmt(specs)
    _address_ports(specs)


def recable(kept: list[LabNode], added: list[LabNode], nodes: int, topology: str, old_topology: str) -> None:
    """Re-cable running nodes for the ``nodes``-node ``topology``. From one switch to a larger or smaller one the
    kept nodes stay plugged in as they are: the ``added`` nodes get their namespace, management veth and switch
    port (a node that left took its switch port with its namespace). Otherwise the fabric ports of ``kept`` are
    unplugged (their veths deleted, the old switch too; nothing else of those nodes changes: namespace, management
    address, processes), ``added`` nodes get their namespace and management veth, then the new cables or switch
    go in and are addressed."""
    rewire = kept
    if topology == "switch" and old_topology == "switch":
        rewire = []
    for n in rewire:
        cmds = [f"link del {port}" for port in PORTS if port in link_states(n.netns)]
        if cmds:   # deleting one end of a veth deletes its peer in the other node (or on the switch) too
            run_local(["ip", "-n", n.netns, "-force", "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30,
                      check=False, node=n.alias, what=f"unplugging the fabric ports of {n.netns}")
    deadline = time.monotonic() + 5          # a removed node's namespace takes its cables' far ends with it, later
    while any(p in link_states(n.netns) for n in rewire for p in PORTS):
        if time.monotonic() > deadline:
            left = [f"{n.netns}:{p}" for n in rewire for p in PORTS if p in link_states(n.netns)]
            raise LabError("the old fabric cables did not go away", observed=", ".join(left),
                           expected="no fabric port left before re-cabling", fix="run `down`, then `up` again")
        time.sleep(0.05)
    cmds = [f"route replace unreachable {r}" for r in GUARD_ROUTES] + _add_nodes(added)
    if old_topology == "switch" and topology != "switch" and link_exists(SWITCH):
        cmds.append(f"link del {SWITCH}")
    cmds += _switch_cmds(topology) + _link_cmds(rewire + added, nodes, topology)
    run_local(["ip", "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30,
              what=f"cabling the {nodes}-node lab ({topology})", fix="run `down`, then `up` again")
    _address_mgmt(added)
    _address_ports(rewire + added)
    # a node that left a moment ago and joins again has new MACs: the host and the kept nodes forget the old ones
    # (a REACHABLE neighbour entry would send its first packets, sshd's banner among them, nowhere for up to 45 s)
    addrs = [a for n in added for a in (n.mgmt_ip, *all_addresses(n.name))]
    for ns in [None, *(n.netns for n in kept)]:
        if addrs:
            run_local(["ip", *(["-n", ns] if ns else []), "-batch", "-"], check=False, timeout=30,
                      input="".join(f"neigh flush to {a}\n" for a in addrs), what="forgetting the old neighbours")


def link_states(ns: str | None) -> dict[str, dict]:
    """ifname -> ``ip -j link`` record in netns ``ns`` (None: the root netns); {} when ip fails."""
    argv = ["ip", "-j"] + (["-n", ns] if ns else []) + ["link", "show"]
    res = run_local(argv, timeout=10, check=False)
    if res.returncode != 0:
        return {}
    try:
        return {l["ifname"]: l for l in json.loads(res.stdout or "[]")}
    except ValueError:
        return {}


def wait_carrier(specs: list[LabNode], timeout: float = 15) -> None:
    """Wait until every lab link, in the nodes and the root netns, is operstate UP."""
    want: dict[str | None, list[str]] = {n.netns: [MGMT_IF, *(p for p, _ in n.ports)] for n in specs}
    want[None] = [BRIDGE] + [n.mgmt_veth for n in specs]
    if any(port == SWITCH_PORT and ip.startswith(SWITCH_NET + ".") for n in specs for port, ip in n.ports):
        want[None] += [SWITCH] + [switch_port(n.name) for n in specs]
    deadline = time.monotonic() + timeout
    while True:
        down_links = []
        for ns, ifs in want.items():
            states = link_states(ns)
            for i in ifs:
                if states.get(i, {}).get("operstate") != "UP":
                    down_links.append(f"{ns or 'root'}:{i}={states.get(i, {}).get('operstate', 'absent')}")
        if not down_links:
            return
        if time.monotonic() > deadline:
            raise LabError("lab links did not reach carrier state UP", observed=", ".join(down_links),
                           expected="state UP on every lab link", fix="run `down` then `up`; check `ip -br link`")
        time.sleep(0.05)
