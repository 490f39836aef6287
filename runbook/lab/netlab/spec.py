"""What the lab is: its names, addresses and image, the :class:`LabNode` / :class:`LabInfo` a caller
gets, and the state file ``up`` records in the lab dir."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from runbook.errors import LabError

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_LAB_DIR = REPO_ROOT / ".lab"
NODEINIT = Path(__file__).parent.parent / "nodeinit.sh"   # runbook/lab/nodeinit.sh

# rank order: head, worker, then worker2 .. worker7 (at most 8 nodes, HELPERS/issue 39)
NODE_NAMES = ("head", "worker", *(f"worker{k}" for k in range(2, 8)))
BRIDGE = "nlbr0"
BRIDGE_IP = "10.77.0.1"
MGMT_PREFIX = "10.77.0"
FABRIC_BRIDGE = "nlfab0"     # the one bridge every node's port joined before the point-to-point links (teardown only)
FABRIC_MTU = 9000
# A Spark's two CX-7 ports (QSFP 0 and 1; their HCAs are rocep1s0f0 / rocep1s0f1) and its LAN port (seed B's TP3
# bootstrap interface, TP3_BOOTSTRAP_IFNAME's default): every lab node has them under these names.
PORTS = ("enp1s0f0np0", "enp1s0f1np1")
MGMT_IF = "enP7s7"


@dataclass(frozen=True)
class Link:
    """One cable between two nodes' ports; its own /24 (``net``), a node's address there is ``.<rank + 1>``."""
    a: tuple[str, str]     # (node name, port)
    b: tuple[str, str]
    net: str               # "169.254.77" -> 169.254.77.0/24

    def ends(self) -> tuple[tuple[str, str], tuple[str, str]]:
        return self.a, self.b


# The cabling per node count, each cable its own /24 (no shared fabric bridge: a node reaches a peer only over the
# port cabled to it, as on Sparks); a port no cable reaches is there, DOWN and without an address, as on a Spark.
# Two nodes: one cable, the port pair every shipped 2-node profile names (exl3-v41, dspark-v4, lab: head
# enp1s0f1np1 <-> worker enp1s0f0np0). Three nodes: seed B's TP3 triangle (docs/tp3.md; its 10.0.22/10.0.23.0/24
# become 169.254.22/23 here): head enp1s0f0np0 <-> worker enp1s0f0np0, head enp1s0f1np1 <-> worker2 enp1s0f1np1,
# and worker enp1s0f1np1 <-> worker2 enp1s0f0np0 (the ring's third side, which only both-port HCAs reach).
LINKS: dict[str, tuple[Link, ...]] = {
    "cable": (Link(("head", PORTS[1]), ("worker", PORTS[0]), "169.254.77"),),
    "triangle": (Link(("head", PORTS[0]), ("worker", PORTS[0]), "169.254.22"),
                 Link(("head", PORTS[1]), ("worker2", PORTS[1]), "169.254.23"),
                 Link(("worker", PORTS[1]), ("worker2", PORTS[0]), "169.254.24")),
}
# The switch (issue 39, 3 to 8 nodes): one Linux bridge with MTU 9000 stands for the switch; every node's first
# CX-7 port is cabled to its own switch port (a veth whose root end ``nl-s-<node>`` is a port of the bridge, MTU
# 9000 too: a port left at 1500 drops jumbo frames silently, as a switch port does), on one /24, the node at
# ``.<rank + 1>``. The second port stays uncabled. Nothing routes beyond that /24 (the nodes have no default route).
SWITCH = "nlsw0"
SWITCH_NET = "169.254.30"
SWITCH_PORT = PORTS[0]
TOPOLOGIES = ("cable", "triangle", "switch")
FABRIC_NETS = (*dict.fromkeys(link.net for links in LINKS.values() for link in links), SWITCH_NET)
GUARD_ROUTES = ("10.77.0.0/16", *(f"{net}.0/24" for net in FABRIC_NETS))
IMAGE = "spark-runbook/lab-runtime:1"
# the lab's registry (Debian's docker-registry): on the management bridge's host address, plain HTTP, which the
# nodes' dockerd are told is an insecure registry; a rehearsal's IMAGE gets this host instead of the recipe's
REGISTRY_PORT = 5077
REGISTRY = f"{BRIDGE_IP}:{REGISTRY_PORT}"
REGISTRY_BINARY = "docker-registry"
# the lab's apt proxy (runbook.lab.netlab.forward_proxy, started by aptproxy.py): on the same host address, the only
# way a node reaches the Debian archive (the hosts of this machine's apt sources); each node's apt is told so by a
# node-private apt.conf.d file (nodeinit.sh writes it into the node's /etc overlay). 3142: apt-cacher-ng's port.
APT_PROXY_PORT = 3142
APT_PROXY = f"{BRIDGE_IP}:{APT_PROXY_PORT}"
APT_PROXY_CONF = "/etc/apt/apt.conf.d/99spark-runbook-lab-proxy"
APT_PROXY_HEADER = "X-Spark-Runbook-Lab-Proxy"     # in the proxy's answer to `GET /` (aptproxy.answers asks)
# Each node's own package state: overlays over this machine's /usr, /etc and /var (the lower layers) with the node's
# writes in <node dir>/overlay/<usr|etc|var>/upper, mounted by nodeinit.sh in the node's mount namespace before
# its node-private bind mounts. A node removes or installs a Debian package (dpkg's database, /usr, conffiles,
# alternatives, triggers, apt's lists and cache, logs) without touching this machine or another node; `down`
# removes the upper layers, so every `up` starts the nodes from this machine's files again. A package this machine
# installs while the nodes run shows in them (a change under an overlay's lower layer; the kernel does not promise
# it for a path a node changed itself): `down` and `up` give them a consistent view again.
OVERLAYS = ("/usr", "/etc", "/var")
OVERLAY_DIR = "overlay"
# directories a node starts with empty (opaque in its upper layer): this machine's apt archive cache holds the .debs
# of its own installs (here, every lab package), which would let a node "install" without downloading anything
OVERLAY_EMPTY = ("/var/cache/apt/archives",)
STATE_FILE = "lab.json"
MARKER = Path("/run/spark-runbook-lab.json")   # which lab_dir owns the (machine-wide) nl-* names
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The lab's non-root operator on every node (a rehearsal logs in as it with `run --rehearse --ssh-user spark`):
# its own home, its SSH key authorised, the docker group, and exactly the sudoers drop-in the runbook prescribes.
OPERATOR = "spark"
OPERATOR_UID = 2626        # uid = gid; above the host's system and login ranges, files in the lab dir show it
# host paths each node binds its own copy over (files.py writes them, nodeinit.sh binds them): the users and
# groups (the operator exists only inside the nodes), its home, its sudo rules and the kernel NFS export files
NODE_PRIVATE = {"etc/passwd": "/etc/passwd", "etc/group": "/etc/group", "etc/sudoers.d": "/etc/sudoers.d",
                "etc/exports.d": "/etc/exports.d", "users": "/home", "nfs": "/var/lib/nfs"}

Log = Callable[[str], None]


@dataclass(frozen=True)
class LabNode:
    """One lab node: ``name`` is the runbook's node name, ``alias`` the ssh_config alias/hostname."""
    name: str          # head / worker / worker2 .. worker7
    alias: str         # spark-head / spark-worker / spark-worker2 ..
    rank: int
    netns: str         # nl-head
    mgmt_ip: str       # 10.77.0.11 (on enP7s7)
    fabric_if: str     # the port facing the head (the head's: facing the worker), e.g. enp1s0f1np1
    fabric_ip: str     # its address, e.g. 169.254.77.1
    mgmt_veth: str     # root-netns end of the management veth (nl-m-head)
    ports: tuple = ()  # ((port, address), ...) of every cabled port, fabric_if first


@dataclass
class LabInfo:
    lab_dir: Path
    ssh_config: Path
    key: Path
    known_hosts: Path
    nodes: list[LabNode]
    timings: dict[str, float] = field(default_factory=dict)
    image: str = IMAGE
    image_ids: dict[str, str] = field(default_factory=dict)   # node name -> image ID
    reused: bool = False          # True: a healthy running lab was found and returned as is
    restarted: dict[str, str] = field(default_factory=dict)   # node -> what `up` started again in place (health.repairs)

    @property
    def image_id_identical(self) -> bool:
        ids = set(self.image_ids.values())
        return len(ids) == 1 and "" not in ids

    def node(self, name: str) -> LabNode:
        for n in self.nodes:
            if name in (n.name, n.alias, n.netns):
                return n
        raise KeyError(name)

    @property
    def head(self) -> LabNode:
        return self.nodes[0]

    def ssh_argv(self, target: str, command: str | None = None) -> list[str]:
        """argv for OpenSSH to a node alias (or a lab IP) using the lab's config."""
        argv = ["ssh", "-F", str(self.ssh_config), target]
        return argv + [command] if command is not None else argv

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("lab_dir", "ssh_config", "key", "known_hosts"):
            d[k] = str(d[k])
        d["image_id_identical"] = self.image_id_identical
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LabInfo":
        return cls(lab_dir=Path(d["lab_dir"]), ssh_config=Path(d["ssh_config"]), key=Path(d["key"]),
                   known_hosts=Path(d["known_hosts"]),
                   nodes=[LabNode(**{**n, "ports": tuple(tuple(p) for p in n.get("ports", ()))}) for n in d["nodes"]],
                   timings=dict(d.get("timings", {})), image=d.get("image", IMAGE),
                   image_ids=dict(d.get("image_ids", {})), reused=bool(d.get("reused", False)),
                   restarted=dict(d.get("restarted", {})))


def default_topology(nodes: int) -> str:
    """The lab's cabling when the profile names none: a cable for 2 nodes, the triangle for 3, else the switch."""
    return {2: "cable", 3: "triangle"}.get(nodes, "switch")


def check_shape(nodes: int, topology: str) -> None:
    """LabError unless the lab can wire ``nodes`` nodes as ``topology``: 2 to 8 nodes; a cable joins 2, the triangle
    3, the switch 3 to 8."""
    fits = {"cable": (2,), "triangle": (3,), "switch": tuple(range(3, len(NODE_NAMES) + 1))}
    if topology not in fits:
        raise LabError("the lab cannot wire this topology", observed=f"topology={topology!r}",
                       expected=" | ".join(TOPOLOGIES),
                       fix="name the nodes' fabric addresses as one of the lab's cablings (env/lab*.env)")
    if nodes not in fits[topology]:
        raise LabError(f"the lab's {topology} takes {' or '.join(map(str, fits[topology][:1]))}"
                       f"{'' if len(fits[topology]) == 1 else f' to {fits[topology][-1]}'} nodes",
                       observed=f"nodes={nodes}, topology={topology}",
                       expected=f"{fits[topology][0]}..{fits[topology][-1]} nodes" if len(fits[topology]) > 1
                       else f"{fits[topology][0]} nodes",
                       fix="name 2 to 8 nodes in the profile (HEAD_SSH, WORKER_SSH, WORKER2_SSH .. WORKER7_SSH): "
                           "2 on a cable, 3 on the triangle or a switch, 4 to 8 on a switch")


def links(nodes: int, topology: str | None = None) -> tuple[Link, ...]:
    """The point-to-point cables of the ``nodes``-node lab (:data:`LINKS`; none on the switch)."""
    topology = topology or default_topology(nodes)
    check_shape(nodes, topology)
    return LINKS.get(topology, ())


def port_ip(link: Link, node: str) -> str:
    """``node``'s address on ``link``: ``<net>.<rank + 1>`` (head .1, worker .2, worker2 .3)."""
    return f"{link.net}.{NODE_NAMES.index(node) + 1}"


def switch_ip(node: str) -> str:
    """``node``'s address on the switch: ``169.254.30.<rank + 1>``."""
    return f"{SWITCH_NET}.{NODE_NAMES.index(node) + 1}"


def node_ports(nodes: int, name: str, topology: str | None = None) -> list[tuple[str, str]]:
    """(port, address) of every cabled port of node ``name`` in the ``nodes``-node lab, the port toward the head
    first (the head's: toward the worker; of two such cables the first in :data:`LINKS`); on the switch the one
    switch port."""
    topology = topology or default_topology(nodes)
    if topology == "switch":
        check_shape(nodes, topology)
        return [(SWITCH_PORT, switch_ip(name))]
    peer = "worker" if name == "head" else "head"
    out = []
    for k, link in enumerate(links(nodes, topology)):
        for (node, port), (other, _) in (link.ends(), link.ends()[::-1]):
            if node == name:
                out.append((other != peer, k, port, port_ip(link, name)))
    return [(port, ip) for *_, port, ip in sorted(out)]


def peer_address(nodes: int, src: str, dst: str, topology: str | None = None) -> str:
    """``dst``'s address on the cable (or the switch) from ``src`` ('' when none joins them)."""
    topology = topology or default_topology(nodes)
    if topology == "switch":
        return switch_ip(dst)
    for link in links(nodes, topology):
        names = {link.a[0], link.b[0]}
        if names == {src, dst}:
            return port_ip(link, dst)
    return ""


def node_specs(nodes: int = 2, topology: str | None = None) -> list[LabNode]:
    topology = topology or default_topology(nodes)
    check_shape(nodes, topology)
    out = []
    for i, name in enumerate(NODE_NAMES[:nodes]):
        ports = node_ports(nodes, name, topology)
        out.append(LabNode(name=name, alias=f"spark-{name}", rank=i, netns=f"nl-{name}",
                           mgmt_ip=f"{MGMT_PREFIX}.{11 + i}", fabric_if=ports[0][0], fabric_ip=ports[0][1],
                           mgmt_veth=f"nl-m-{name}", ports=tuple(ports)))
    return out


def all_addresses(name: str) -> list[str]:
    """Every fabric address node ``name`` has in any lab, the switch's included (host keys are pinned for all of
    them, so a node joining or leaving re-cables without new known_hosts)."""
    return list(dict.fromkeys([*(port_ip(link, name) for links_ in LINKS.values() for link in links_
                                 if name in (link.a[0], link.b[0])), switch_ip(name)]))


def read_state(lab_dir: Path) -> dict | None:
    """What the last ``up`` recorded in ``<lab_dir>/lab.json`` (node count, PIDs, LabInfo), or None."""
    try:
        return json.loads((lab_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def state_topology(state: dict) -> str:
    """The topology a state file records (a lab from before the switch recorded only its node count)."""
    return state.get("topology") or default_topology(state["node_count"])


def write_state(lab_dir: Path, state: dict) -> None:
    tmp = lab_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(lab_dir / STATE_FILE)

