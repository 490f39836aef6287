"""The cluster's nodes in rank order (head, worker, worker2 ... worker7), each a :class:`NodeSpec` derived from
the profile's per-node keys: what the remote layer connects to and which addresses a rank binds; and the fabric's
:func:`topology`.

Every node has the same keys, ``<NODE>_<SUFFIX>`` for each of :data:`NODE_KEY_SUFFIXES` (``HEAD_SSH``,
``WORKER_IP``, ``WORKER5_CX7_IF`` ...). The head and the worker are always there; node ``worker<k>`` is there when
``WORKER<k>_SSH`` is set, numbered without gaps.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

#: at most this many nodes (rank 0 .. 7): the profile has keys for these and no more
MAX_NODES = 8
#: node names by rank: rank 0 the head, rank 1 the worker, rank k >= 2 worker<k>
NODE_NAMES: tuple[str, ...] = ("head", "worker", *(f"worker{k}" for k in range(2, MAX_NODES)))
#: the keys every node has, ``<NODE>_<SUFFIX>`` (the profile declares them in this order, each for every node)
NODE_KEY_SUFFIXES = ("SSH", "IP", "CX7_IF", "CX7_IB", "GID", "BOOTSTRAP_IP")
#: the prefix length of a fabric address: the profile holds bare IPv4 addresses, which the recipes and the review's
#: declared addresses (review.declared_addresses) put on a /24 per cable (or per switch)
CABLE_PREFIX = 24
TOPOLOGIES = ("cable", "triangle", "switch", "ring")


def node_key(name: str, suffix: str) -> str:
    """The profile key of one node's setting: ``node_key("worker3", "IP") == "WORKER3_IP"``."""
    return f"{name.upper()}_{suffix}"


def node_keys(suffix: str) -> tuple[str, ...]:
    """That setting's key for every possible node, in rank order (HEAD_..., WORKER_..., WORKER2_... WORKER7_...)."""
    return tuple(node_key(n, suffix) for n in NODE_NAMES)


def configured_count(ssh_targets) -> int:
    """The node count: the head and the worker, then one per ``WORKER<k>_SSH`` set, counted up to the first empty
    one (a later one set after a gap is refused by the rules, not counted).

    >>> configured_count(["a", "b", "", ""]), configured_count(["a", "b", "c", "d", "", "e"])
    (2, 4)
    """
    n = 2
    targets = list(ssh_targets)
    while n < len(targets) and targets[n]:
        n += 1
    return n


def topology(count: int, fabric_ips) -> str:
    """The fabric's shape, from the node count and the nodes' fabric addresses (``<NODE>_IP``): ``cable`` (2
    nodes), ``switch`` (3+ nodes, every fabric IP on one /24: one L2 segment), ``triangle`` (3 nodes otherwise:
    the QSFP triangle of TP=3, a /24 per cable) and ``ring`` (4+ nodes not on one /24: the switchless ring, which
    needs a patched NCCL -- rendered and planned, never run; see rules.ring_conflicts).

    >>> topology(2, ["10.0.0.1", "10.0.1.2"])
    'cable'
    >>> topology(3, ["10.0.22.1", "10.0.22.2", "10.0.23.2"]), topology(3, ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    ('triangle', 'switch')
    >>> topology(4, ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]), topology(4, ["10.0.0.1", "10.0.0.2", "10.0.1.3", "10.0.1.4"])
    ('switch', 'ring')
    """
    if count <= 2:
        return "cable"
    ips = list(fabric_ips)[:count]
    nets = set()
    for ip in ips:
        try:
            nets.add(ipaddress.ip_network(f"{ip}/{CABLE_PREFIX}", strict=False))
        except ValueError:
            nets.add(ip)                  # empty or not an address: not on the others' segment
    if len(ips) == count and len(nets) == 1:
        return "switch"
    return "triangle" if count == 3 else "ring"


@dataclass(frozen=True)
class NodeSpec:
    """One node of the cluster, in rank order."""
    name: str                       # NODE_NAMES[rank]: "head", "worker", "worker2" ... "worker7"
    rank: int
    ssh: str
    fabric_ip: str
    fabric_if: str
    ib_devs: list[str] = field(default_factory=list)
    gid: str | int = "auto"
    bootstrap_ip: str = ""          # address on BOOTSTRAP_IF ("" = none: the fabric carries the bootstrap)
    bootstrap_if: str = ""          # BOOTSTRAP_IF ("" = fabric_if)

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def host_ip(self) -> str:
        """VLLM_HOST_IP of this rank: its BOOTSTRAP_IF address when set, else its fabric address."""
        return self.bootstrap_ip or self.fabric_ip

    @property
    def socket_if(self) -> str:
        """NCCL/GLOO/TP_SOCKET_IFNAME of this rank: BOOTSTRAP_IF when set, else its fabric netdev."""
        return self.bootstrap_if or self.fabric_if


def node_specs(p) -> list[NodeSpec]:
    """The nodes of the profile ``p`` ordered by rank: head, worker, then worker2 ... up to ``p.node_count``."""
    bif = p.bootstrap_if
    out = []
    for rank, name in enumerate(NODE_NAMES[:p.node_count]):
        def v(suffix: str):
            return p.value(node_key(name, suffix))
        out.append(NodeSpec(name, rank, v("SSH"), v("IP"), v("CX7_IF"), list(v("CX7_IB")), v("GID"),
                            v("BOOTSTRAP_IP") if bif else "", bif))
    return out


def rank_gid_index(profile, pinned, resolved: int | None) -> int | None:
    """The NCCL_IB_GID_INDEX a rank gets (None: unset): a pinned ``<NODE>_GID`` as is; ``auto`` is the index
    step 01 resolved from sysfs, except under seed B, whose ``NCCL_IB_GID_AUTO=1`` leaves the variable unset so
    NCCL picks the RoCE v2 GID per HCA. Step 01's nccl-tests use this same rule (what 01 proves is what the
    ranks run)."""
    if isinstance(pinned, int):
        return pinned
    return None if profile.recipe == "dspark-v4" else resolved


def ssh_user(p, spec: NodeSpec) -> str:
    """The user a node is logged in as, as far as the profile says: ``user@`` of its ``*_SSH``; root on the lab
    (its alias logs in as root, remote.ssh_argv); "" when an alias leaves it to the ssh config."""
    if "@" in spec.ssh:
        return spec.ssh.split("@", 1)[0]
    return "root" if p.is_lab else ""


def node_home(p, spec: NodeSpec) -> str:
    """The node's home as validation knows it: /root for root, /home/<user> for another user, "" when the user
    is unknown (an ssh alias). The steps expand ``~`` with the home the node itself reports (remote.expand_home)."""
    user = ssh_user(p, spec)
    return "/root" if user == "root" else f"/home/{user}" if user else ""


def resolve_on(path: str, home: str) -> str:
    """A normalised node path as it lands on a node with that home, for comparing two paths: ``~/x`` ->
    ``<home>/x``. With the home unknown, ``/home/<user>/x`` is taken as ``~/x`` (the home of the SSH user is
    where a profile means when it spells it out), so ``~/x`` and ``/home/spark/x`` still compare equal."""
    if not path:
        return ""
    if path == "~" or path.startswith("~/"):
        return home + path[1:] if home else path
    if not home:
        parts = path.split("/")
        if len(parts) >= 3 and parts[1] == "home" and parts[2]:
            return "~" + path[len("/home/" + parts[2]):]
    return path


def absent_node_keys(count: int) -> tuple[str, ...]:
    """The per-node keys of the nodes a ``count``-node profile does not have (rank >= count): a profile file may
    leave them out (the shipped two- and three-node files do not list WORKER3_* ... WORKER7_*).

    >>> absent_node_keys(7)
    ('WORKER7_SSH', 'WORKER7_IP', 'WORKER7_CX7_IF', 'WORKER7_CX7_IB', 'WORKER7_GID', 'WORKER7_BOOTSTRAP_IP')
    """
    return tuple(node_key(name, suffix) for name in NODE_NAMES[count:] for suffix in NODE_KEY_SUFFIXES)
