"""Captured network facts (tests/unit/facts/net) and the canned lab node rules built from them, shared by the
network step and the rehearsal simulator tests; plus readers for what those steps return and render."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from support.doubles import res

__all__ = ["FIX", "fx", "lab_addr", "lab_node_addr", "lab_node_rules", "lab_addresses", "ping_result", "lab_rules", "by",
           "mpirun_apps", "iof_tagged", "mpirun_tagged"]

FIX = Path(__file__).resolve().parents[1] / "unit" / "facts" / "net"


def fx(name: str) -> str:
    return (FIX / name).read_text()


def lab_addr(ip_last: int, *, mtu=9000, state="UP") -> str:
    """The lab's ``ip -j addr show`` with this node's fabric address (169.254.77.<ip_last>), MTU and state."""
    data = json.loads(fx("ip_addr_lab.json"))
    for item in data:
        if item["ifname"] == "enp1s0f0np0":
            item["mtu"] = mtu
            item["operstate"] = state
            if state != "UP":
                item["flags"] = ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"]
            for a in item["addr_info"]:
                if a["family"] == "inet":
                    a["local"] = f"169.254.77.{ip_last}"
    return json.dumps(data)


def lab_node_addr(name: str, nodes: int = 2) -> str:
    """The lab's ``ip -j addr show`` of node ``name`` in the ``nodes``-node lab (runbook.lab.netlab.spec: both CX-7
    ports as cabled there, each with its address on its cable's /24, and the LAN port enP7s7), from the captured
    lab output's fabric interface."""
    import copy
    from runbook.lab.netlab.spec import MGMT_IF, MGMT_PREFIX, NODE_NAMES, PORTS, node_specs
    spec = next(n for n in node_specs(nodes) if n.name == name)
    data = json.loads(fx("ip_addr_lab.json"))
    template = next(item for item in data if item["ifname"] == "enp1s0f0np0")
    out = [item for item in data if item["ifname"] != "enp1s0f0np0"]
    cabled = dict(spec.ports)
    ports = [*spec.ports, *((p, "") for p in PORTS if p not in cabled),
             (MGMT_IF, f"{MGMT_PREFIX}.{11 + NODE_NAMES.index(name)}")]
    for k, (port, ip) in enumerate(ports):
        item = copy.deepcopy(template)
        item["ifname"], item["ifindex"] = port, 10 + k
        item["mtu"] = 9000 if port != MGMT_IF else 1500
        item["addr_info"] = [dict(a, local=ip, label=port) if a["family"] == "inet" else a for a in item["addr_info"]
                             if ip or a["family"] != "inet"]
        if not ip:            # a port no cable reaches: DOWN, no address (the lab's dummy netdev)
            item["operstate"], item["flags"], item["addr_info"] = "DOWN", ["BROADCAST", "NOARP"], []
        out.append(item)
    return json.dumps(out)


def lab_addresses(name: str, nodes: int = 2) -> list[str]:
    """Every fabric address of node ``name`` in the ``nodes``-node lab."""
    from runbook.lab.netlab.spec import node_specs
    return [ip for port, ip in next(n for n in node_specs(nodes) if n.name == name).ports]


def lab_node_rules(name: str, nodes: int = 2, *, ping=None) -> list:
    """:func:`lab_rules` for node ``name`` of the two-port lab (:func:`lab_node_addr`)."""
    rules = lab_rules(0, ping=ping or ping_result)
    rules[0] = (r"^ip -j addr show$", res(0, lab_node_addr(name, nodes)))
    rules[2] = (r"^ethtool enp1s0f[01]np[01]$", res(0, fx("ethtool_veth.txt")))
    return rules


def ping_result(cmd):
    return res(0, fx("ping_ok.txt"))


def lab_rules(ip_last, *, mtu=9000, state="UP", ethtool=None, ping=ping_result):
    """FakeNode rules answering 01_network's lab probes (veth fabric, iperf3) from the captured lab output."""
    eth = ethtool or fx("ethtool_veth.txt")
    return [
        (r"^ip -j addr show$", res(0, lab_addr(ip_last, mtu=mtu, state=state))),
        (r"^ip -j route show$", res(0, fx("ip_route_lab.json"))),
        (r"^ethtool enp1s0f0np0$", res(0, eth)),
        (r"^grep -r -H \. /sys/class/net/", res(0, "")),
        (r"^sysctl net\.ipv4\.conf\.all\.rp_filter", res(0, fx("rp_filter_lab.txt"))),
        (r"^ping -M do -s 8972 ", ping),
        (r"iperf3 -s -1 -B ", res(0, fx("iperf3_server.json"))),
        (r"iperf3 -c ", res(0, fx("iperf3_client.json"))),
    ]


def by(checks, name, node=None):
    """The one check called ``name`` (on ``node``); fails naming what there is when it is missing."""
    found = [c for c in checks if c.name == name and (node is None or c.node == node)]
    assert found, f"no check {name}@{node}: {[(c.name, c.node) for c in checks]}"
    return found[0]


def mpirun_apps(cmd: str) -> list[dict]:
    """The app contexts of a rendered mpirun: host, -x environment and binary of each rank."""
    argv = shlex.split(cmd.replace(" 2>&1", ""))
    argv = argv[argv.index("mpirun") + 1:]
    apps, cur = [], None
    while argv:
        a = argv.pop(0)
        if a == "-np":
            cur = {"env": {}, "host": "", "binary": ""}
            apps.append(cur)
            argv.pop(0)
        elif cur is None:
            continue
        elif a == "-H":
            cur["host"] = argv.pop(0).split(":")[0]
        elif a == "-x":
            k, _, v = argv.pop(0).partition("=")
            cur["env"][k] = v
        elif a == ":":
            cur = None
        elif not cur["binary"]:
            cur["binary"] = a
    return apps


def iof_tagged(chunks: list[tuple[int, str]]) -> str:
    """What ``mpirun --tag-output`` prints for these reads of the ranks' stdout ((rank, bytes read), in the order
    mpirun got them): OpenMPI 4.1's orte_iof_base_write_output puts ``[1,rank]<stdout>:`` before every chunk and
    after every newline inside it, and adds no newline of its own (a chunk that ends mid-line runs on into the
    next chunk, whoever's it is -- as 4.1.4 printed it here for ranks writing ``abc``, then ``def\\n``:
    ``[1,0]<stdout>:abc[1,1]<stdout>:abc[1,0]<stdout>:def``)."""
    out = []
    for rank, data in chunks:
        if not data:
            raise AssertionError(f"rank {rank}: OpenMPI forwards no empty read")
        tag = f"[1,{rank}]<stdout>:"
        body = data[:-1].replace("\n", "\n" + tag) + data[-1]
        out.append(tag + body)
    return "".join(out)


def mpirun_tagged(text: str, hosts: tuple[str, ...] = ("spark-head", "spark-worker")) -> str:
    """``text`` as ``mpirun --tag-output`` prints it, one read per line: a line that starts with ``<host>:`` of
    ``hosts[k]`` (NCCL's ``<host>:<pid>:<tid>`` lines, nccl-tests' ``<host>: Test ... failure``) is rank k's, any
    other line rank 0's (nccl-tests prints its header and table from rank 0)."""
    lines = text.splitlines(keepends=True)
    if not lines:
        raise AssertionError("mpirun_tagged: no output to tag")
    return iof_tagged([(next((k for k, h in enumerate(hosts) if l.startswith(f"{h}:")), 0), l) for l in lines])
