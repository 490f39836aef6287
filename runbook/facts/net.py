"""Network facts: read-only commands and *pure* parsers (text in, typed value out).

Each fact is a command builder (a string the remote layer runs with ``node.read``) and a parser
that never touches a node. Parsers are tolerant of the variations the real tools print and
return ``None``/empty values rather than raising on output they do not recognise; the step
(``runbook.network``) decides what a missing value means.

Covered tools: ``ip -j addr|link|route``, ``ethtool IF``, ``sysctl rp_filter``, PCIe link sysfs,
``ping -M do``, ``iperf3 -J``, and a generic ``path<TAB>value`` sysfs dump.
"""
from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------- ip -j


IP_ADDR_CMD = "ip -j addr show"
IP_LINK_CMD = "ip -j link show"
IP_ROUTE_CMD = "ip -j route show"


@dataclass
class Interface:
    """One netdev as ``ip -j addr show`` reports it."""
    name: str
    ifindex: int = 0
    state: str = "UNKNOWN"          # operstate: UP, DOWN, LOWERLAYERDOWN, UNKNOWN
    flags: list[str] = field(default_factory=list)
    mtu: int = 0
    mac: str = ""
    link_type: str = ""
    ipv4: list[str] = field(default_factory=list)   # "169.254.77.1/24"
    ipv6: list[str] = field(default_factory=list)   # "fe80::1/64"

    @property
    def up(self) -> bool:
        """Administratively up with carrier (UP + LOWER_UP), or operstate UP."""
        return self.state == "UP" or ("UP" in self.flags and "LOWER_UP" in self.flags
                                      and self.state not in ("DOWN", "LOWERLAYERDOWN"))

    @property
    def ipv4_addresses(self) -> list[str]:
        """Bare addresses without prefix length."""
        return [a.split("/")[0] for a in self.ipv4]

    @property
    def ipv4_networks(self) -> list[ipaddress.IPv4Network]:
        return [ipaddress.ip_interface(a).network for a in self.ipv4]


def parse_ip_addr(text: str) -> dict[str, Interface]:
    """Parse ``ip -j addr show`` (iproute2 JSON) into ``{ifname: Interface}``.

    Sample (iproute2 6.1, one line, shortened)::

        [{"ifindex":3,"link":"peer0","ifname":"enp1s0f0np0","flags":["BROADCAST","MULTICAST",
          "UP","LOWER_UP"],"mtu":9000,"qdisc":"noqueue","operstate":"UP","group":"default",
          "txqlen":1000,"link_type":"ether","address":"76:f0:9b:3d:c4:73",
          "addr_info":[{"family":"inet","local":"169.254.77.1","prefixlen":24,"scope":"global",
          "label":"enp1s0f0np0",...},{"family":"inet6","local":"fe80::74f0:9bff:fe3d:c473",
          "prefixlen":64,"scope":"link",...}]}]

    ``ip -j link show`` has the same shape without ``addr_info``, so this parser reads both.
    """
    data = _json_list(text)
    out: dict[str, Interface] = {}
    for item in data:
        if not isinstance(item, dict) or "ifname" not in item:
            continue
        iface = Interface(
            name=str(item["ifname"]),
            ifindex=int(item.get("ifindex", 0) or 0),
            state=str(item.get("operstate", "UNKNOWN")),
            flags=[str(f) for f in item.get("flags", [])],
            mtu=int(item.get("mtu", 0) or 0),
            mac=str(item.get("address", "")),
            link_type=str(item.get("link_type", "")),
        )
        for addr in item.get("addr_info", []) or []:
            local = addr.get("local")
            if not local:
                continue
            cidr = f"{local}/{addr.get('prefixlen', 32 if addr.get('family') == 'inet' else 128)}"
            if addr.get("family") == "inet":
                iface.ipv4.append(cidr)
            elif addr.get("family") == "inet6":
                iface.ipv6.append(cidr)
        out[iface.name] = iface
    return out


parse_ip_link = parse_ip_addr


@dataclass
class Route:
    dst: str                   # "default" or "169.254.77.0/24"
    dev: str = ""
    gateway: str = ""
    prefsrc: str = ""
    protocol: str = ""
    metric: int | None = None

    @property
    def is_default(self) -> bool:
        return self.dst in ("default", "0.0.0.0/0")


def parse_ip_route(text: str) -> list[Route]:
    """Parse ``ip -j route show`` into routes.

    Sample::

        [{"dst":"default","gateway":"10.77.0.1","dev":"eth0","flags":[]},
         {"dst":"169.254.77.0/24","dev":"enp1s0f0np0","protocol":"kernel","scope":"link",
          "prefsrc":"169.254.77.1","flags":[]}]
    """
    out = []
    for item in _json_list(text):
        if not isinstance(item, dict) or "dst" not in item:
            continue
        out.append(Route(dst=str(item["dst"]), dev=str(item.get("dev", "")),
                         gateway=str(item.get("gateway", "")), prefsrc=str(item.get("prefsrc", "")),
                         protocol=str(item.get("protocol", "")),
                         metric=item.get("metric")))
    return out


def default_routes(routes: Iterable[Route], dev: str | None = None) -> list[Route]:
    """Default routes, optionally only those leaving through ``dev``."""
    return [r for r in routes if r.is_default and (dev is None or r.dev == dev)]


def _json_list(text: str) -> list[Any]:
    text = (text or "").strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return []
    return data if isinstance(data, list) else []


# --------------------------------------------------------------------------- ethtool


def ethtool_cmd(iface: str) -> str:
    return f"ethtool {shlex.quote(iface)}"


@dataclass
class Ethtool:
    iface: str = ""
    speed_mbps: int | None = None     # None when "Unknown!" (no carrier) or not printed
    duplex: str = ""
    link_detected: bool | None = None
    port: str = ""

    @property
    def speed_gbps(self) -> float | None:
        return None if self.speed_mbps is None else self.speed_mbps / 1000.0


def parse_ethtool(text: str) -> Ethtool:
    """Parse ``ethtool IF`` (settings). Sample (lab veth, ethtool 6.1)::

        Settings for enp1s0f0np0:
                Supported ports: [  ]
                ...
                Speed: 10000Mb/s
                Duplex: Full
                Auto-negotiation: off
                Port: Twisted Pair
                ...
                Link detected: yes

    A 200G ConnectX-7 port prints ``Speed: 200000Mb/s`` and ``Port: Direct Attach Copper``;
    a port without carrier prints ``Speed: Unknown!`` and ``Link detected: no``.
    """
    out = Ethtool()
    m = re.search(r"^Settings for (\S+?):", text or "", re.MULTILINE)
    if m:
        out.iface = m.group(1)
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        value = value.strip()
        if key == "Speed":
            sm = re.match(r"(\d+)\s*Mb/s", value)
            out.speed_mbps = int(sm.group(1)) if sm else None
        elif key == "Duplex":
            out.duplex = value
        elif key == "Port":
            out.port = value
        elif key == "Link detected":
            out.link_detected = value.lower() == "yes"
    return out


# --------------------------------------------------------------------------- rp_filter


def rp_filter_cmd(ifaces: Iterable[str]) -> str:
    keys = ["net.ipv4.conf.all.rp_filter"] + [f"net.ipv4.conf.{i}.rp_filter" for i in ifaces]
    # sysctl stops at nothing: a missing key prints an error to stderr and continues.
    return "sysctl " + " ".join(shlex.quote(k) for k in keys)


def parse_rp_filter(text: str) -> dict[str, int]:
    """Parse ``sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.IF.rp_filter`` into
    ``{"all": 0, "IF": 2}``. Sample::

        net.ipv4.conf.all.rp_filter = 0
        net.ipv4.conf.enp1s0f0np0.rp_filter = 2

    The kernel applies ``max(all, IF)``; see :func:`effective_rp_filter`.
    """
    out: dict[str, int] = {}
    for m in re.finditer(r"^net\.ipv4\.conf\.(.+)\.rp_filter\s*=\s*(\d+)\s*$", text or "", re.MULTILINE):
        out[m.group(1)] = int(m.group(2))
    return out


def effective_rp_filter(values: dict[str, int], iface: str) -> int | None:
    if iface not in values and "all" not in values:
        return None
    return max(values.get("all", 0), values.get(iface, 0))


# --------------------------------------------------------------------------- sysfs dump


def sysfs_dump_cmd(patterns: Iterable[str]) -> str:
    """One command that prints ``path<TAB>value`` for every readable, non-empty file under the
    given paths/globs (files or directories). Unreadable entries (EINVAL on unused GID slots)
    and missing paths are silently skipped; the command always exits 0.

    ``grep -r -H . P`` prints ``path:value``; sysfs class paths contain no ``:``, so the first
    ``:`` is the separator and ``sed`` turns it into a TAB.
    """
    pats = " ".join(patterns)   # globs must stay unquoted so the remote shell expands them
    return f"grep -r -H . {pats} 2>/dev/null | sed 's/:/\\t/'; true"


def parse_sysfs_dump(text: str) -> dict[str, str]:
    """Parse ``path<TAB>value`` lines (also accepts raw ``grep -H`` ``path:value``).

    Sample::

        /sys/class/infiniband/rocep1s0f0/ports/1/gids/3\t0000:0000:0000:0000:0000:ffff:c0a8:6401
        /sys/class/infiniband/rocep1s0f0/ports/1/gid_attrs/types/3\tRoCE v2
        /sys/class/infiniband/rocep1s0f0/ports/1/gid_attrs/ndevs/3\tenp1s0f0np0
    """
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.startswith("/"):
            continue
        if "\t" in line:
            path, value = line.split("\t", 1)
        elif ":" in line:
            path, value = line.split(":", 1)
        else:
            continue
        out[path.strip()] = value.strip()
    return out


# --------------------------------------------------------------------------- PCIe link

PCIE_ATTRS = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")


def pcie_cmd(ifaces: Iterable[str]) -> str:
    paths = [f"/sys/class/net/{i}/device/{a}" for i in ifaces for a in PCIE_ATTRS]
    return sysfs_dump_cmd(paths)


@dataclass
class PcieLink:
    iface: str
    speed_gts: float | None = None      # current, GT/s (32.0 = Gen5)
    width: int | None = None            # current lanes
    max_speed_gts: float | None = None
    max_width: int | None = None

    @property
    def present(self) -> bool:
        return self.speed_gts is not None or self.width is not None

    @property
    def gen(self) -> int | None:
        return {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}.get(self.speed_gts or -1.0)

    def describe(self) -> str:
        if not self.present:
            return "no PCIe device (virtual interface)"
        gen = f"Gen{self.gen} " if self.gen else ""
        return f"{gen}x{self.width} ({self.speed_gts} GT/s; max {self.max_speed_gts} GT/s x{self.max_width})"


def parse_pcie(text: str) -> dict[str, PcieLink]:
    """Parse :func:`pcie_cmd` output into ``{iface: PcieLink}``. Sample (DGX Spark CX-7 twin)::

        /sys/class/net/enp1s0f0np0/device/current_link_speed\t32.0 GT/s PCIe
        /sys/class/net/enp1s0f0np0/device/current_link_width\t4
        /sys/class/net/enp1s0f0np0/device/max_link_speed\t32.0 GT/s PCIe
        /sys/class/net/enp1s0f0np0/device/max_link_width\t4

    A veth has no ``device`` directory, so it yields no entry.
    """
    out: dict[str, PcieLink] = {}
    for path, value in parse_sysfs_dump(text).items():
        m = re.match(r"/sys/class/net/([^/]+)/device/(\w+)$", path)
        if not m or m.group(2) not in PCIE_ATTRS:
            continue
        link = out.setdefault(m.group(1), PcieLink(iface=m.group(1)))
        attr = m.group(2)
        if attr.endswith("speed"):
            sm = re.match(r"([\d.]+)\s*GT/s", value)
            speed = float(sm.group(1)) if sm else None
            if attr.startswith("current"):
                link.speed_gts = speed
            else:
                link.max_speed_gts = speed
        else:
            width = int(value) if value.isdigit() else None
            if attr.startswith("current"):
                link.width = width
            else:
                link.max_width = width
    return out


# --------------------------------------------------------------------------- pair paths


@dataclass(frozen=True)
class PairPath:
    """The fabric path between two nodes: one IPv4 subnet with an interface of each on it (a rail)."""
    net: ipaddress.IPv4Network
    iface: str          # this node's interface on ``net``
    ip: str             # this node's address there
    peer_iface: str
    peer_ip: str        # the address to reach the peer at over ``iface``


def fabric_ends(given: Iterable[str], ifaces: dict[str, Interface], declared: dict[str, str] | None = None
                ) -> dict[str, list[str]]:
    """``{iface: ["ip/prefix", ...]}`` of the interfaces a node is given (``<NODE>_CX7_IF``, then the netdevs of
    its ``<NODE>_CX7_IB`` HCAs), in that order: the addresses ``ip -j addr`` shows, a ``declared`` address
    (iface -> bare IPv4, the profile's ``<NODE>_IP`` as a /24 when not shown) first, so a profile's own address
    is the one chosen where both are on the path."""
    out: dict[str, list[str]] = {}
    for name in given:
        if not name or name in out:
            continue
        shown = list(ifaces[name].ipv4) if name in ifaces else []
        mine = (declared or {}).get(name, "")
        if mine and not any(a.split("/")[0] == mine for a in shown):
            shown.insert(0, f"{mine}/24")
        elif mine:
            shown.sort(key=lambda a: a.split("/")[0] != mine)
        out[name] = shown
    return out


def node_fabric_ends(spec, ifaces: dict[str, Interface] | None = None, hca_netdevs: dict[str, str] | None = None
                     ) -> dict[str, list[str]]:
    """:func:`fabric_ends` of a profile node (``NodeSpec``): its ``<NODE>_CX7_IF`` list, then the netdevs of its
    ``<NODE>_CX7_IB`` HCAs (``hca_netdevs``, from ``ibdev2netdev``), with ``<NODE>_IP`` declared on the first
    interface. Without ``ifaces`` (nothing read yet) only the profile's own address is known."""
    given = [i.strip() for i in str(spec.fabric_if or "").split(",") if i.strip()]
    given += [(hca_netdevs or {})[h] for h in spec.ib_devs if h in (hca_netdevs or {})]
    declared = {given[0]: str(spec.fabric_ip)} if given and spec.fabric_ip else None
    return fabric_ends(given, ifaces or {}, declared)


def pair_path(mine: dict[str, list[str]], theirs: dict[str, list[str]]) -> PairPath | None:
    """The path two nodes' traffic takes over the fabric, from :func:`fabric_ends` of each: a subnet both have an
    interface on, this node's first given interface that has one (two nodes: ``<NODE>_CX7_IF`` to the peer's
    ``<NODE>_IP``; on the TP=3 triangle of point-to-point cables the one cable between them), None when they
    share none (a worker given only its head-facing port has no path to the other worker, though the cable
    exists)."""
    found: list[PairPath] = []
    for iface, addrs in mine.items():
        for addr in addrs:
            here = ipaddress.ip_interface(addr)
            for peer_iface, peer_addrs in theirs.items():
                there = next((a for a in peer_addrs if ipaddress.ip_address(a.split("/")[0]) in here.network), "")
                if there:
                    found.append(PairPath(here.network, iface, str(here.ip), peer_iface, there.split("/")[0]))
    if not found:
        return None
    return min(found, key=lambda p: (list(mine).index(p.iface), p.net.network_address, p.net.prefixlen,
                                     list(theirs).index(p.peer_iface)))


# --------------------------------------------------------------------------- ping


def ping_cmd(dest: str, *, size: int, count: int = 5, iface: str = "", interval: float = 0.2,
             deadline_s: int = 10) -> str:
    """DF-set ping of ``size`` payload bytes (MTU-28 for IPv4), bound to ``iface``."""
    bind = f" -I {shlex.quote(iface)}" if iface else ""
    return (f"ping -M do -s {int(size)} -c {int(count)} -i {interval} -W 2 -w {int(deadline_s)}"
            f"{bind} {shlex.quote(dest)}")


@dataclass
class Ping:
    transmitted: int = 0
    received: int = 0
    errors: int = 0
    loss_pct: float = 100.0
    rtt_min_ms: float | None = None
    rtt_avg_ms: float | None = None
    rtt_max_ms: float | None = None
    rtt_mdev_ms: float | None = None
    error: str = ""                 # e.g. "local error: message too long, mtu=1500"
    local_mtu: int | None = None    # from "message too long, mtu=N"

    @property
    def ok(self) -> bool:
        return self.transmitted > 0 and self.received == self.transmitted


def parse_ping(text: str) -> Ping:
    """Parse iputils ``ping`` output. Samples::

        PING 127.0.0.1 (127.0.0.1) 8972(9000) bytes of data.
        8980 bytes from 127.0.0.1: icmp_seq=1 ttl=64 time=0.069 ms
        --- 127.0.0.1 ping statistics ---
        3 packets transmitted, 3 received, 0% packet loss, time 407ms
        rtt min/avg/max/mdev = 0.050/0.058/0.069/0.007 ms

        ping: local error: message too long, mtu=9000
        2 packets transmitted, 0 received, +2 errors, 100% packet loss, time 1022ms
    """
    out = Ping()
    text = text or ""
    m = re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received"
                  r"(?:, \+(\d+) errors)?.*?, ([\d.]+)% packet loss", text)
    if m:
        out.transmitted, out.received = int(m.group(1)), int(m.group(2))
        out.errors = int(m.group(3) or 0)
        out.loss_pct = float(m.group(4))
    m = re.search(r"(?:rtt|round-trip) min/avg/max(?:/mdev)? = ([\d.]+)/([\d.]+)/([\d.]+)(?:/([\d.]+))? ms",
                  text)
    if m:
        out.rtt_min_ms, out.rtt_avg_ms, out.rtt_max_ms = (float(m.group(i)) for i in (1, 2, 3))
        out.rtt_mdev_ms = float(m.group(4)) if m.group(4) else None
    m = re.search(r"^ping: (.+)$", text, re.MULTILINE)
    if m:
        out.error = m.group(1).strip()
    else:
        m = re.search(r"From \S+ icmp_seq=\d+ (.+)$", text, re.MULTILINE)
        if m:
            out.error = m.group(1).strip()
    m = re.search(r"message too long, mtu=(\d+)", text)
    if m:
        out.local_mtu = int(m.group(1))
    return out


# --------------------------------------------------------------------------- iperf3


def iperf3_server_cmd(bind_ip: str, port: int, timeout_s: int = 30) -> str:
    """One-shot server (``-1``), bounded by ``timeout`` so nothing is left on the node."""
    return f"timeout {int(timeout_s)} iperf3 -s -1 -B {shlex.quote(bind_ip)} -p {int(port)} -J"


def iperf3_client_cmd(server_ip: str, port: int, *, bind_ip: str = "", seconds: int = 3,
                      parallel: int = 1, retries: int = 10) -> str:
    """Client in JSON mode; retries while the server is not yet listening (race with the
    server start). Prints the last JSON document."""
    bind = f" -B {shlex.quote(bind_ip)}" if bind_ip else ""
    par = f" -P {int(parallel)}" if parallel > 1 else ""
    client = (f"timeout {int(seconds) + 15} iperf3 -c {shlex.quote(server_ip)}{bind} -p {int(port)}"
              f" -t {int(seconds)}{par} -J --connect-timeout 2000")
    return (f"i=0; while :; do out=$({client}); rc=$?; i=$((i+1)); "
            f"case \"$out\" in *'Connection refused'*) [ $i -lt {int(retries)} ] && sleep 0.5 && continue;; esac; "
            f"break; done; printf '%s\\n' \"$out\"; exit $rc")


@dataclass
class Iperf3:
    sender_bps: float | None = None
    receiver_bps: float | None = None
    seconds: float | None = None
    retransmits: int | None = None
    reverse: bool = False
    streams: int = 0
    local: str = ""
    remote: str = ""
    error: str = ""

    @property
    def receiver_gbps(self) -> float | None:
        return None if self.receiver_bps is None else self.receiver_bps / 1e9

    @property
    def sender_gbps(self) -> float | None:
        return None if self.sender_bps is None else self.sender_bps / 1e9


def parse_iperf3(text: str) -> Iperf3:
    """Parse ``iperf3 -J`` (client or server) output. Sample (iperf 3.12, shortened)::

        {"start": {"connected": [{"local_host": "127.0.0.1", "remote_host": "127.0.0.1", ...}],
                   "test_start": {"protocol": "TCP", "num_streams": 1, "reverse": 0, ...}},
         "intervals": [...],
         "end": {"sum_sent": {"seconds": 1.0002, "bits_per_second": 11634606642.2,
                              "retransmits": 0, "sender": true},
                 "sum_received": {"seconds": 1.0003, "bits_per_second": 11578842108.8}}}

    On failure iperf3 still prints JSON with ``"error": "unable to connect to server: ..."``.
    """
    out = Iperf3()
    data = _last_json_object(text)
    if data is None:
        out.error = "no iperf3 JSON in output"
        return out
    out.error = str(data.get("error", "") or "")
    start = data.get("start", {}) or {}
    ts = start.get("test_start", {}) or {}
    out.reverse = bool(ts.get("reverse", 0))
    out.streams = int(ts.get("num_streams", 0) or 0)
    conn = (start.get("connected") or [{}])[0] or {}
    out.local, out.remote = str(conn.get("local_host", "")), str(conn.get("remote_host", ""))
    end = data.get("end", {}) or {}
    sent, recv = end.get("sum_sent") or {}, end.get("sum_received") or {}
    if "bits_per_second" in sent:
        out.sender_bps = float(sent["bits_per_second"])
        out.retransmits = sent.get("retransmits")
        out.seconds = float(sent.get("seconds", 0) or 0) or None
    if "bits_per_second" in recv:
        out.receiver_bps = float(recv["bits_per_second"])
    return out


def _last_json_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in ``text`` (iperf3 retries may print several)."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        data = json.loads(text)
        return data if isinstance(data, dict) else None
    except json.JSONDecodeError:
        pass
    dec = json.JSONDecoder()
    found, i = None, 0
    while True:
        j = text.find("{", i)
        if j < 0:
            return found
        try:
            obj, end = dec.raw_decode(text, j)
        except json.JSONDecodeError:
            i = j + 1
            continue
        if isinstance(obj, dict):
            found = obj
        i = end
