"""RDMA facts: ``ibdev2netdev``, the RoCE GID tables in sysfs, ``ib_write_bw``/``ib_write_lat``,
and the GID resolver (pure).

GID rules (mirroring the DSpark launcher's resolver, seeds §B.9, and NCCL's own choice):
a usable GID for HCA member *m* on a node is an index *g* of an ACTIVE Ethernet port with
``gid_attrs/types/g == "RoCE v2"`` whose value is IPv4-mapped (``…:ffff:<hex IPv4>``) and whose
IPv4 is the node's match IP or any IPv4 on the member's own netdev (``gid_attrs/ndevs/g``).
Members on one node must share an index (NCCL takes one ``NCCL_IB_GID_INDEX`` per process): the
node's index is the lowest index in the intersection, preferring an index that carries the match
IP. Across nodes, one common index lets every rank use the same value; otherwise each rank needs
its own (per-rank ``NCCL_IB_GID_INDEX``). An all-zero or absent entry is never usable.
"""
from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from .net import IP_ADDR_CMD, node_fabric_ends, parse_ip_addr, parse_sysfs_dump, sysfs_dump_cmd

# --------------------------------------------------------------------------- ibdev2netdev

IBDEV2NETDEV_CMD = "ibdev2netdev"


@dataclass
class HcaPort:
    hca: str
    port: int
    netdev: str
    up: bool


def parse_ibdev2netdev(text: str) -> list[HcaPort]:
    """Parse ``ibdev2netdev`` (rdma-core/MLNX). Sample (DGX Spark, one cable in port 0)::

        rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)
        rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)
        roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Up)
        roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Down)
    """
    out = []
    for m in re.finditer(r"^(\S+) port (\d+) ==> (\S+) \((\w+)\)\s*$", text or "", re.MULTILINE):
        out.append(HcaPort(hca=m.group(1), port=int(m.group(2)), netdev=m.group(3),
                           up=m.group(4).lower() == "up"))
    return out


# --------------------------------------------------------------------------- GID tables

SYSFS = "/sys"
GID_GLOBS = (
    "/class/infiniband/*/ports/*/gids",
    "/class/infiniband/*/ports/*/gid_attrs/types",
    "/class/infiniband/*/ports/*/gid_attrs/ndevs",
    "/class/infiniband/*/ports/*/state",
    "/class/infiniband/*/ports/*/link_layer",
)


def gid_dump_cmd(root: str = SYSFS) -> str:
    """The GID-table dump under ``root`` (``/sys`` on a node; a rehearsal reads its simulated tree)."""
    root = root.rstrip("/")
    return sysfs_dump_cmd(root + g for g in GID_GLOBS)


GID_DUMP_CMD = gid_dump_cmd()
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass
class GidEntry:
    index: int
    gid: str = ""
    type: str = ""        # "RoCE v2", "IB/RoCE v1", "" when the slot is unused
    ndev: str = ""

    @property
    def zero(self) -> bool:
        return not self.gid or set(self.gid.replace(":", "")) <= {"0"}

    @property
    def ipv4(self) -> str | None:
        """The IPv4 of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None."""
        if self.zero:
            return None
        try:
            mapped = ipaddress.IPv6Address(self.gid).ipv4_mapped
        except ValueError:
            return None
        return str(mapped) if mapped else None

    @property
    def roce_v2(self) -> bool:
        return self.type.strip().lower() == "roce v2"


@dataclass
class GidPort:
    hca: str
    port: int
    state: str = ""          # "4: ACTIVE"
    link_layer: str = ""     # "Ethernet"
    entries: dict[int, GidEntry] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return "ACTIVE" in self.state.upper() if self.state else True

    def entry(self, index: int) -> GidEntry:
        return self.entries.get(index, GidEntry(index=index))

    def populated(self) -> list[GidEntry]:
        return [e for _, e in sorted(self.entries.items()) if not e.zero]

    def describe(self, indices: Iterable[int] | None = None) -> str:
        """``3=RoCE v2 ::ffff:192.168.100.1 (enp1s0f0np0)`` for each populated (or given) index."""
        items = [self.entry(i) for i in indices] if indices is not None else self.populated()
        parts = []
        for e in items:
            if e.zero:
                parts.append(f"{e.index}=<all-zero>")
                continue
            val = f"::ffff:{e.ipv4}" if e.ipv4 else _short_v6(e.gid)
            parts.append(f"{e.index}={e.type or '?'} {val}" + (f" ({e.ndev})" if e.ndev else ""))
        return "; ".join(parts) or "<no populated GIDs>"


def parse_gid_dump(text: str, root: str = SYSFS) -> dict[str, GidPort]:
    """Parse :func:`gid_dump_cmd` output (paths under ``root``) into ``{"hca" or "hca:port": GidPort}`` (key is the HCA
    name for port 1, ``hca:port`` otherwise). Sample (DGX Spark, rocep1s0f0, shortened)::

        /sys/class/infiniband/rocep1s0f0/ports/1/state\t4: ACTIVE
        /sys/class/infiniband/rocep1s0f0/ports/1/link_layer\tEthernet
        /sys/class/infiniband/rocep1s0f0/ports/1/gids/0\tfe80:0000:0000:0000:7ec2:55ff:fe12:3401
        /sys/class/infiniband/rocep1s0f0/ports/1/gids/3\t0000:0000:0000:0000:0000:ffff:c0a8:6401
        /sys/class/infiniband/rocep1s0f0/ports/1/gids/4\t0000:0000:0000:0000:0000:0000:0000:0000
        /sys/class/infiniband/rocep1s0f0/ports/1/gid_attrs/types/0\tIB/RoCE v1
        /sys/class/infiniband/rocep1s0f0/ports/1/gid_attrs/types/3\tRoCE v2
        /sys/class/infiniband/rocep1s0f0/ports/1/gid_attrs/ndevs/3\tenp1s0f0np0

    Unused slots read as all-zero GIDs and their ``types``/``ndevs`` fail with EINVAL (absent
    from the dump).
    """
    ports: dict[str, GidPort] = {}
    for path, value in parse_sysfs_dump(text).items():
        m = re.match(re.escape(root.rstrip("/")) + r"/class/infiniband/([^/]+)/ports/(\d+)/(gids/(\d+)"
                     r"|gid_attrs/(types|ndevs)/(\d+)|state|link_layer)$", path)
        if not m:
            continue
        hca, port = m.group(1), int(m.group(2))
        key = hca if port == 1 else f"{hca}:{port}"
        gp = ports.setdefault(key, GidPort(hca=hca, port=port))
        if m.group(4) is not None:
            idx = int(m.group(4))
            gp.entries.setdefault(idx, GidEntry(index=idx)).gid = value.lower()
        elif m.group(5) is not None:
            idx = int(m.group(6))
            entry = gp.entries.setdefault(idx, GidEntry(index=idx))
            if m.group(5) == "types":
                entry.type = value
            else:
                entry.ndev = value
        elif m.group(3) == "state":
            gp.state = value
        else:
            gp.link_layer = value
    return ports


def _short_v6(gid: str) -> str:
    try:
        return str(ipaddress.IPv6Address(gid))
    except ValueError:
        return gid


# --------------------------------------------------------------------------- resolver


@dataclass
class MemberGids:
    """The usable RoCE v2 IPv4 GID indices of one HCA member on one node."""
    hca: str
    netdev: str
    ipv4s: list[str]
    usable: dict[int, str] = field(default_factory=dict)    # index -> ipv4 in the GID
    found: bool = True                                       # HCA present in sysfs
    active: bool = True
    table: str = ""                                          # describe() for messages


@dataclass
class NodeGid:
    """The GID index one node should use for all its members (``index`` None = unresolved)."""
    node: str
    index: int | None
    via: str = ""                                 # "match IP 192.168.100.1" | "netdev IPv4"
    members: list[MemberGids] = field(default_factory=list)
    problem: str = ""                             # why unresolved

    @property
    def usable_common(self) -> set[int]:
        sets = [set(m.usable) for m in self.members]
        return set.intersection(*sets) if sets else set()


def resolve_node_gid(node: str, ports: dict[str, GidPort], hcas: list[str],
                     netdev_ipv4: dict[str, list[str]], hca_netdev: dict[str, str],
                     match_ip: str = "") -> NodeGid:
    """Resolve one node's GID index for ``hcas`` (the node's NCCL_IB_HCA members).

    ``netdev_ipv4`` maps netdev -> its IPv4 addresses (from ``ip -j addr``), ``hca_netdev`` maps
    HCA -> netdev (from ``ibdev2netdev``; the GID's own ``ndevs`` entry is used when present).
    """
    members = []
    for hca in hcas:
        port = ports.get(hca)
        netdev = hca_netdev.get(hca, "")
        ips = list(netdev_ipv4.get(netdev, []))
        if port is None:
            members.append(MemberGids(hca=hca, netdev=netdev, ipv4s=ips, found=False))
            continue
        mem = MemberGids(hca=hca, netdev=netdev, ipv4s=ips, active=port.active,
                         table=port.describe())
        for idx, e in sorted(port.entries.items()):
            if not e.roce_v2 or e.ipv4 is None:
                continue
            own_ips = set(ips) | set(netdev_ipv4.get(e.ndev, []))
            if e.ipv4 == match_ip or e.ipv4 in own_ips:
                mem.usable[idx] = e.ipv4
        members.append(mem)
    res = NodeGid(node=node, index=None, members=members)
    missing = [m.hca for m in members if not m.found]
    if missing:
        res.problem = f"HCA(s) {', '.join(missing)} not in /sys/class/infiniband"
        return res
    inactive = [m.hca for m in members if not m.active]
    if inactive:
        res.problem = f"HCA port(s) not ACTIVE: {', '.join(inactive)}"
        return res
    empty = [m for m in members if not m.usable]
    if empty:
        res.problem = "; ".join(
            f"{m.hca} ({m.netdev or '?'}, IPv4 {', '.join(m.ipv4s) or 'none'}) has no RoCE v2 "
            f"IPv4-mapped GID [{m.table}]" for m in empty)
        return res
    common = res.usable_common
    if not common:
        res.problem = ("members share no RoCE v2 IPv4 GID index: " + "; ".join(
            f"{m.hca} usable {sorted(m.usable)}" for m in members))
        return res
    match_hits = sorted(i for i in common if match_ip and any(m.usable[i] == match_ip for m in members))
    if match_hits:
        res.index, res.via = match_hits[0], f"match IP {match_ip}"
    else:
        res.index, res.via = min(common), "netdev IPv4"
    return res


@dataclass
class ClusterGid:
    common: int | None                    # one index valid on every node, else None
    per_node: dict[str, int | None]       # each node's own choice
    problem: str = ""

    @property
    def resolved(self) -> bool:
        return all(v is not None for v in self.per_node.values())


def resolve_cluster_gid(nodes: list[NodeGid]) -> ClusterGid:
    """Combine node choices: the lowest index usable on every member of every node, if any."""
    per_node = {n.node: n.index for n in nodes}
    unresolved = [n for n in nodes if n.index is None]
    if unresolved:
        return ClusterGid(common=None, per_node=per_node,
                          problem="; ".join(f"{n.node}: {n.problem}" for n in unresolved))
    sets = [n.usable_common for n in nodes]
    common = set.intersection(*sets) if sets else set()
    if not common:
        return ClusterGid(common=None, per_node=per_node)
    # prefer the index the nodes chose themselves when they agree
    chosen = {n.index for n in nodes}
    pick = next(iter(chosen)) if len(chosen) == 1 and next(iter(chosen)) in common else min(common)
    return ClusterGid(common=pick, per_node=per_node)


def check_pinned_gid(pin: int, node: NodeGid, ports: dict[str, GidPort]) -> str:
    """'' when the pinned index is a usable RoCE v2 IPv4 GID on every member, else the reason."""
    bad = []
    for m in node.members:
        if pin in m.usable:
            continue
        port = ports.get(m.hca)
        shown = port.describe([pin]) if port else "HCA absent"
        bad.append(f"{m.hca}: index {pin} is {shown}")
    return "; ".join(bad)


# --------------------------------------------------------------------------- perftest


def ib_write_bw_cmd(hca: str, port: int, *, server_ip: str = "", gid_index: int | None = None,
                    qps: int = 4, size: int = 1 << 20, seconds: int = 5, timeout_s: int = 30) -> str:
    """``ib_write_bw`` server (no ``server_ip``) or client. Bounded by ``timeout``; the client
    retries while the server is not yet listening."""
    gid = f" -x {int(gid_index)}" if gid_index is not None else ""
    base = (f"timeout {int(timeout_s)} ib_write_bw -d {shlex.quote(hca)} -i 1 -p {int(port)} -F"
            f" --report_gbits -q {int(qps)} -s {int(size)} -D {int(seconds)}{gid}")
    if not server_ip:
        return base
    return _retry_client(f"{base} {shlex.quote(server_ip)}")


def ib_write_lat_cmd(hca: str, port: int, *, server_ip: str = "", gid_index: int | None = None,
                     iters: int = 5000, timeout_s: int = 30) -> str:
    gid = f" -x {int(gid_index)}" if gid_index is not None else ""
    base = (f"timeout {int(timeout_s)} ib_write_lat -d {shlex.quote(hca)} -i 1 -p {int(port)} -F"
            f" -s 2 -n {int(iters)}{gid}")
    if not server_ip:
        return base
    return _retry_client(f"{base} {shlex.quote(server_ip)}")


def _retry_client(cmd: str, retries: int = 10) -> str:
    return (f"i=0; while :; do out=$({cmd} 2>&1); rc=$?; i=$((i+1)); "
            f"case \"$out\" in *\"Couldn't connect\"*|*'Connection refused'*) "
            f"[ $i -lt {retries} ] && sleep 0.5 && continue;; esac; break; done; "
            f"printf '%s\\n' \"$out\"; exit $rc")


@dataclass
class PerftestHeader:
    test: str = ""
    device: str = ""
    qps: int | None = None
    mtu: int | None = None
    link_type: str = ""
    gid_index: int | None = None


@dataclass
class WriteBw:
    header: PerftestHeader = field(default_factory=PerftestHeader)
    bytes: int | None = None
    iterations: int | None = None
    peak_gbps: float | None = None
    avg_gbps: float | None = None
    msg_rate_mpps: float | None = None
    error: str = ""


@dataclass
class WriteLat:
    header: PerftestHeader = field(default_factory=PerftestHeader)
    bytes: int | None = None
    iterations: int | None = None
    t_min_us: float | None = None
    t_max_us: float | None = None
    t_typical_us: float | None = None
    t_avg_us: float | None = None
    t_stdev_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None
    error: str = ""


def _parse_header(text: str) -> PerftestHeader:
    h = PerftestHeader()
    m = re.search(r"^\s+(RDMA_\w+ \w+ Test)\s*$", text, re.MULTILINE)
    if m:
        h.test = m.group(1)
    m = re.search(r"Device\s*:\s*(\S+)", text)
    if m:
        h.device = m.group(1)
    m = re.search(r"Number of qps\s*:\s*(\d+)", text)
    if m:
        h.qps = int(m.group(1))
    m = re.search(r"^\s*Mtu\s*:\s*(\d+)\[B\]", text, re.MULTILINE)
    if m:
        h.mtu = int(m.group(1))
    m = re.search(r"Link type\s*:\s*(\w+)", text)
    if m:
        h.link_type = m.group(1)
    m = re.search(r"GID index\s*:\s*(\d+)", text)
    if m:
        h.gid_index = int(m.group(1))
    return h


def _perftest_error(text: str) -> str:
    for pat in (r"(Couldn't connect to [^\n]+)", r"(Unable to find the Infiniband/RoCE device[^\n]*)",
                r"(IB device \S+ not found[^\n]*)", r"(Failed to modify QP[^\n]*)",
                r"(Couldn't [^\n]+)", r"(Unable to [^\n]+)", r"(command not found)"):
        m = re.search(pat, text)
        if m:
            return m.group(1).strip()
    return "no result line in ib_write output"


def parse_ib_write_bw(text: str) -> WriteBw:
    """Parse ``ib_write_bw --report_gbits`` (client or server side). Sample (perftest 24.x)::

        ---------------------------------------------------------------------------------------
                            RDMA_Write BW Test
         Dual-port       : OFF		Device         : rocep1s0f0
         Number of qps   : 1		Transport type : IB
         ...
         Mtu             : 4096[B]
         Link type       : Ethernet
         GID index       : 3
        ...
         #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
         65536      5000             92.61              92.57  		   0.176563
        ---------------------------------------------------------------------------------------
    """
    text = text or ""
    out = WriteBw(header=_parse_header(text))
    m = re.search(r"^\s*#bytes\s+#iterations\s+BW peak\[(\w+)/sec\].*$\n\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)"
                  r"(?:\s+([\d.]+))?", text, re.MULTILINE)
    if not m:
        out.error = _perftest_error(text)
        return out
    scale = 1.0 if m.group(1) == "Gb" else (8 / 1000.0 if m.group(1) == "MB" else 1.0)
    out.bytes, out.iterations = int(m.group(2)), int(m.group(3))
    out.peak_gbps, out.avg_gbps = float(m.group(4)) * scale, float(m.group(5)) * scale
    out.msg_rate_mpps = float(m.group(6)) if m.group(6) else None
    return out


def parse_ib_write_lat(text: str) -> WriteLat:
    """Parse ``ib_write_lat`` output. Sample (perftest 24.x)::

                            RDMA_Write Latency Test
         ...
         #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
         2       5000          1.42           3.90         1.47                1.49             0.05            1.57                    1.93
    """
    text = text or ""
    out = WriteLat(header=_parse_header(text))
    m = re.search(r"^\s*#bytes\s+#iterations\s+t_min.*$\n\s*(\d+)\s+(\d+)((?:\s+[\d.]+){5,7})", text, re.MULTILINE)
    if not m:
        out.error = _perftest_error(text)
        return out
    out.bytes, out.iterations = int(m.group(1)), int(m.group(2))
    vals = [float(v) for v in m.group(3).split()]
    out.t_min_us, out.t_max_us, out.t_typical_us, out.t_avg_us, out.t_stdev_us = vals[:5]
    if len(vals) >= 7:
        out.p99_us, out.p999_us = vals[5], vals[6]
    return out


def read_fabric(node, timeout: float = 15) -> tuple[dict, dict[str, list[str]]]:
    """One node's interfaces (``ip -j addr``) and its given fabric interfaces with their addresses
    (:func:`runbook.facts.net.node_fabric_ends`; ``ibdev2netdev`` read only when the node lists HCAs): what a pair's
    path (:func:`runbook.facts.net.pair_path`) is computed from, for the health and diagnose pings."""
    ifaces = parse_ip_addr(node.read(IP_ADDR_CMD, timeout=timeout).stdout)
    ports = parse_ibdev2netdev(node.read(IBDEV2NETDEV_CMD, timeout=timeout).stdout) if node.spec.ib_devs else []
    return ifaces, node_fabric_ends(node.spec, ifaces, {p.hca: p.netdev for p in ports})
