"""The lab's network plumbing: network namespaces, veth pairs, the management and fabric bridges, guard
routes and addresses (see the topology in ``runbook/lab/netlab/__init__.py``)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from runbook.errors import LabError

from .host import run_local
from .spec import BRIDGE, BRIDGE_IP, FABRIC_BRIDGE, FABRIC_IF, FABRIC_MTU, GUARD_ROUTES, LabNode


def _fabric_veth(node: LabNode) -> str:   # root-netns end of a node's fabric veth (3-node topology)
    return f"nl-f-{node.name}"


def create_network(specs: list[LabNode]) -> None:
    """Guard routes, the management bridge, one netns per node with its veths, the fabric, and the addresses."""
    three = len(specs) == 3
    cmds = [f"route replace unreachable {r}" for r in GUARD_ROUTES]
    cmds += [f"link add {BRIDGE} type bridge", f"addr add {BRIDGE_IP}/24 dev {BRIDGE}", f"link set {BRIDGE} up"]
    if three:
        cmds += [f"link add {FABRIC_BRIDGE} mtu {FABRIC_MTU} type bridge"]
    cmds += [f"netns add {n.netns}" for n in specs]
    for n in specs:
        cmds += [f"link add {n.mgmt_veth} type veth peer name eth0 netns {n.netns}",
                 f"link set {n.mgmt_veth} master {BRIDGE} up"]
    if three:
        for n in specs:
            cmds += [f"link add {_fabric_veth(n)} mtu {FABRIC_MTU} type veth peer name {FABRIC_IF} "
                     f"mtu {FABRIC_MTU} netns {n.netns}",
                     f"link set {_fabric_veth(n)} master {FABRIC_BRIDGE} up"]
    else:
        a, b = specs
        cmds += [f"link add {FABRIC_IF} mtu {FABRIC_MTU} netns {a.netns} type veth peer name {FABRIC_IF} "
                 f"mtu {FABRIC_MTU} netns {b.netns}"]
    run_local(["ip", "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30,
              what="creating the lab network (root netns)", fix="run `down` to clear leftovers, then `up` again")
    if three:
        # the fabric bridge carries no address at all (not even IPv6 link-local) and comes up last
        Path(f"/proc/sys/net/ipv6/conf/{FABRIC_BRIDGE}/disable_ipv6").write_text("1\n")
        run_local(["ip", "link", "set", FABRIC_BRIDGE, "up"], timeout=10)
    for n in specs:
        ncmds = ["link set lo up", f"addr add {n.mgmt_ip}/24 dev eth0", "link set eth0 up",
                 f"link set {FABRIC_IF} mtu {FABRIC_MTU}", f"addr add {n.fabric_ip}/24 dev {FABRIC_IF}",
                 f"link set {FABRIC_IF} up"]
        run_local(["ip", "-n", n.netns, "-batch", "-"], input="\n".join(ncmds) + "\n", timeout=30,
                  node=n.alias, what=f"configuring addresses in {n.netns}")


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
    want: dict[str | None, list[str]] = {n.netns: ["eth0", FABRIC_IF] for n in specs}
    want[None] = [BRIDGE] + [n.mgmt_veth for n in specs]
    if len(specs) == 3:
        want[None] += [FABRIC_BRIDGE] + [_fabric_veth(n) for n in specs]
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
