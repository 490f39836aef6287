"""N network-namespace "nodes" on one switch: a Linux bridge with jumbo frames, one veth per node.

    sw = Switch(prefix="fn4", subnet="10.78.0")        # names and addresses are parameters
    up(sw, 4)                                          # idempotent; up(sw, 5) later adds node 5, the others stay
    checks = pair_checks(sw, 4)                        # N(N-1)/2 DF pings at the MTU, plus each port's MTU
    down(sw)                                           # every namespace and link of this prefix, whatever made them

Topology (``prefix`` fn4, ``subnet`` 10.78.0, four nodes)::

    root netns: fn4sw0 (bridge, MTU 9000) 10.78.0.1/24
        fn4-p1 (switch port) <-> fn4-n1:enp1s0f0np0 10.78.0.11/24 MTU 9000
        fn4-p2               <-> fn4-n2:enp1s0f0np0 10.78.0.12/24
        ...

This is the four-Spark switch of issue 39 (every node's CX-7 port on one L2 segment), not the embedded lab
(``runbook.lab.netlab``: nl-* namespaces on 10.77.0.0/24, two or three nodes, sshd per node); the two never
share a name or a subnet (``up`` refuses a subnet another link already has). A node here is a bare network
namespace: commands run in it with ``ip netns exec <netns> ...`` (:func:`node_argv`). Nodes have no default
route, so nothing started in them can reach past the bridge. Needs root.

A switch port or a node's NIC left at a smaller MTU than the switch's is named by :func:`pair_checks`: every
pair through it fails its DF ping, and the port's own MTU row says which end is short (``port_mtu`` /
``node_mtu`` in :func:`up` make such a node on purpose, for the test).
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..checks import Check, check
from ..errors import LabError, RemoteError
from ..remote import CommandResult
from .netlab.host import link_exists, netns_exists, netns_pids, run_local

NODE_PORT = "enp1s0f0np0"      # a Spark's CX-7 port name, as the lab's fabric uses it
HOST_OCTET = 1                 # the bridge's address on the subnet (the "laptop")
FIRST_NODE_OCTET = 11          # node k is .(10 + k)
MAX_NODES = 16
IP_HEADERS = 28                # IPv4 20 + ICMP 8: the largest DF ping payload is MTU - 28
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,7}$")


@dataclass(frozen=True)
class Switch:
    """Names and addresses of one switch and its nodes (nothing is created by making one)."""

    prefix: str                 # netns <prefix>-n<k>, bridge <prefix>sw0, switch port <prefix>-p<k>
    subnet: str                 # first three octets of a /24, e.g. "10.78.0"
    mtu: int = 9000
    port_name: str = NODE_PORT  # the node's interface name inside its namespace

    def __post_init__(self):
        if not _PREFIX_RE.match(self.prefix or ""):
            raise LabError(f"switch prefix {self.prefix!r} is not usable", observed=repr(self.prefix),
                           expected="2-8 characters, lowercase letters and digits, starting with a letter "
                                    "(interface names are at most 15 characters)", fix="pass e.g. prefix='fn4'")
        if self.prefix.startswith("nl"):
            raise LabError(f"switch prefix {self.prefix!r} would collide with the embedded lab's nl-* names",
                           observed=self.prefix, expected="a prefix not starting with 'nl'", fix="pass e.g. 'fn4'")
        try:
            net = ipaddress.ip_network(f"{self.subnet}.0/24")
        except ValueError:
            raise LabError(f"switch subnet {self.subnet!r} is not the first three octets of an IPv4 /24",
                           observed=repr(self.subnet), expected="e.g. '10.78.0'", fix="pass subnet='10.78.0'") from None
        if not net.is_private:
            raise LabError(f"switch subnet {net} is not private", observed=str(net),
                           expected="an RFC 1918 range (traffic must stay on this machine)", fix="pass subnet='10.78.0'")
        if not 1280 <= self.mtu <= 9216:
            raise LabError(f"switch MTU {self.mtu} is out of range", observed=str(self.mtu),
                           expected="1280-9216", fix="pass mtu=9000")

    @property
    def bridge(self) -> str:
        return f"{self.prefix}sw0"

    @property
    def host_ip(self) -> str:
        return f"{self.subnet}.{HOST_OCTET}"

    def netns(self, k: int) -> str:
        return f"{self.prefix}-n{k}"

    def port(self, k: int) -> str:
        """The switch port of node k: the veth end on the bridge, in the root namespace."""
        return f"{self.prefix}-p{k}"

    def node_ip(self, k: int) -> str:
        return f"{self.subnet}.{FIRST_NODE_OCTET - 1 + k}"


def node_argv(sw: Switch, k: int, argv: list[str]) -> list[str]:
    """argv that runs ``argv`` inside node k's network namespace (``ip`` execs it: the pid is the command's)."""
    return ["ip", "netns", "exec", sw.netns(k), *argv]


class NetnsNode:
    """Runs shell commands in node k's namespace as ``remote.Node`` runs them on a node (``read``: a fact, never
    raises on a non-zero exit; ``run``: raises ``RemoteError`` unless ``warn``), for code written against the
    remote layer (e.g. ``launch.ray_cluster``) on a switch's bare nodes, which have no sshd."""

    def __init__(self, sw: Switch, k: int, name: str, *, home: str = "", spec=None):
        self.sw, self.k, self.name, self.home = sw, k, name, home     # home: the node's $HOME ("" = this host's)
        self.spec = spec        # the profile's NodeSpec of this node (remote.Cluster orders its nodes by rank)
        self.dry_run = False

    def _execute(self, command: str, timeout: float) -> CommandResult:
        t0 = time.monotonic()
        env = ["env", f"HOME={self.home}"] if self.home else []
        proc = run_local(node_argv(self.sw, self.k, [*env, "sh", "-c", command]), timeout=timeout, check=False,
                         node=self.name)
        return CommandResult(self.name, command, proc.returncode, proc.stdout, proc.stderr,
                             round(time.monotonic() - t0, 3))

    def read(self, command: str, *, timeout: float = 60) -> CommandResult:
        return self._execute(command, timeout)

    def run(self, command: str, *, timeout: float = 120, warn: bool = False) -> CommandResult:
        res = self._execute(command, timeout)
        if not res.ok and not warn:
            raise RemoteError(f"command failed on {self.name} (exit {res.exit_code})", node=self.name,
                              observed=(res.stderr or res.stdout)[-500:], expected="exit 0")
        return res


def _check_count(nodes: int) -> None:
    if not 2 <= nodes <= MAX_NODES:
        raise LabError(f"a switch of {nodes} nodes is not supported", observed=str(nodes),
                       expected=f"2-{MAX_NODES} nodes", fix="pass nodes between 2 and 16")


def _subnet_owner(sw: Switch) -> str | None:
    """The root-netns link other than our bridge that already has an address on the subnet, if any."""
    res = run_local(["ip", "-j", "-4", "addr", "show"], timeout=10)
    net = ipaddress.ip_network(f"{sw.subnet}.0/24")
    for link in json.loads(res.stdout or "[]"):
        for a in link.get("addr_info", []):
            if link["ifname"] != sw.bridge and ipaddress.ip_address(a["local"]) in net:
                return link["ifname"]
    return None


def _ns_links(ns: str) -> dict[str, dict]:
    res = run_local(["ip", "-j", "-n", ns, "link", "show"], timeout=10, check=False)
    try:
        return {l["ifname"]: l for l in json.loads(res.stdout or "[]")} if res.returncode == 0 else {}
    except ValueError:
        return {}


def up(sw: Switch, nodes: int, *, node_mtu: dict[int, int] | None = None,
       port_mtu: dict[int, int] | None = None, carrier_timeout: float = 15.0) -> list[str]:
    """Bring up the bridge and nodes 1..``nodes`` (namespaces returned). Idempotent: what exists is kept (a running
    node's namespace and processes stay), what is missing is made, addresses and MTUs are set again.
    ``node_mtu`` / ``port_mtu``: {k: mtu} for a node NIC / switch port deliberately left smaller (tests)."""
    _check_count(nodes)
    node_mtu, port_mtu = dict(node_mtu or {}), dict(port_mtu or {})
    for name, table in (("node_mtu", node_mtu), ("port_mtu", port_mtu)):
        bad = {k: v for k, v in table.items() if not 1 <= k <= nodes or not 576 <= v <= sw.mtu}
        if bad:
            raise LabError(f"{name} {bad} names a node outside 1..{nodes} or an MTU outside 576..{sw.mtu}",
                           observed=str(bad), expected=f"node 1..{nodes}, MTU 576..{sw.mtu}", fix=f"fix {name}")
    owner = _subnet_owner(sw)
    if owner:
        raise LabError(f"subnet {sw.subnet}.0/24 is already on {owner}", observed=f"{owner} has an address there",
                       expected=f"the subnet free, or only on {sw.bridge}",
                       fix="pick another subnet (the embedded lab uses 10.77.0.0/24), or take that link down")
    root = []
    if not link_exists(sw.bridge):
        root.append(f"link add {sw.bridge} mtu {sw.mtu} type bridge")
    root += [f"link set {sw.bridge} mtu {sw.mtu}", f"addr replace {sw.host_ip}/24 dev {sw.bridge}",
             f"link set {sw.bridge} up"]
    for k in range(1, nodes + 1):
        if not netns_exists(sw.netns(k)):
            root.append(f"netns add {sw.netns(k)}")
    run_local(["ip", "-batch", "-"], input="\n".join(root) + "\n", timeout=30,
              what=f"creating switch {sw.bridge} and its namespaces", fix=f"run switchlab.down for {sw.prefix!r}")
    for k in range(1, nodes + 1):
        cmds = []
        if not link_exists(sw.port(k)):
            if sw.port_name in _ns_links(sw.netns(k)):   # half a cable left over: its far end went with a bridge
                run_local(["ip", "-n", sw.netns(k), "link", "del", sw.port_name], timeout=10, check=False)
            cmds.append(f"link add {sw.port(k)} mtu {sw.mtu} type veth peer name {sw.port_name} "
                        f"mtu {sw.mtu} netns {sw.netns(k)}")
        cmds += [f"link set {sw.port(k)} mtu {port_mtu.get(k, sw.mtu)}",
                 f"link set {sw.port(k)} master {sw.bridge} up"]
        run_local(["ip", "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30, node=sw.netns(k),
                  what=f"plugging node {k} into {sw.bridge}", fix=f"run switchlab.down for {sw.prefix!r}")
        ncmds = ["link set lo up", f"link set {sw.port_name} mtu {node_mtu.get(k, sw.mtu)}",
                 f"addr replace {sw.node_ip(k)}/24 dev {sw.port_name}", f"link set {sw.port_name} up"]
        run_local(["ip", "-n", sw.netns(k), "-batch", "-"], input="\n".join(ncmds) + "\n", timeout=30,
                  node=sw.netns(k), what=f"addressing {sw.port_name} in {sw.netns(k)}")
    _wait_carrier(sw, nodes, carrier_timeout)
    return [sw.netns(k) for k in range(1, nodes + 1)]


def _wait_carrier(sw: Switch, nodes: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        down_ = [f"{sw.netns(k)}:{sw.port_name}" for k in range(1, nodes + 1)
                 if _ns_links(sw.netns(k)).get(sw.port_name, {}).get("operstate") != "UP"]
        if not down_:
            return
        if time.monotonic() > deadline:
            raise LabError("switch links did not reach carrier state UP", observed=", ".join(down_),
                           expected="state UP on every node port", fix=f"switchlab.down then up for {sw.prefix!r}")
        time.sleep(0.05)


def existing_nodes(sw: Switch) -> list[int]:
    """Node numbers whose namespace exists now (from /run/netns)."""
    found = []
    for p in Path("/run/netns").glob(f"{sw.prefix}-n*") if Path("/run/netns").is_dir() else []:
        tail = p.name[len(sw.prefix) + 2:]
        if tail.isdigit():
            found.append(int(tail))
    return sorted(found)


def kill_processes(sw: Switch, timeout: float = 10.0) -> list[int]:
    """SIGTERM, then after ``timeout`` s SIGKILL, every process in this switch's node namespaces (by pid: only what
    runs in our own namespaces, never by name); returns the pids found. Raises if any survives."""
    nodes = existing_nodes(sw)
    found: set[int] = set()
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        pids = [p for k in nodes for p in netns_pids(sw.netns(k))]
        if not pids:
            break
        found |= set(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        end = time.monotonic() + wait
        while any(netns_pids(sw.netns(k)) for k in nodes) and time.monotonic() < end:
            time.sleep(0.2)
    left = [p for k in nodes for p in netns_pids(sw.netns(k))]
    if left:
        raise LabError(f"processes in the {sw.prefix} namespaces survived SIGKILL", observed=str(left),
                       expected="none", fix=f"kill -9 {' '.join(map(str, left))}")
    return sorted(found)


def down(sw: Switch, kill_timeout: float = 10.0) -> list[str]:
    """Remove every node namespace of ``sw.prefix`` (killing what runs in them first: only processes in our own
    namespaces), every switch port and the bridge. Idempotent; returns what was removed."""
    removed: list[str] = []
    nodes = existing_nodes(sw)
    kill_processes(sw, kill_timeout)
    cmds = [f"netns del {sw.netns(k)}" for k in nodes]
    if cmds:   # a namespace takes its veth end, and so the switch port, with it
        run_local(["ip", "-force", "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30, check=False)
        removed += [sw.netns(k) for k in nodes]
    deadline = time.monotonic() + 3
    ports = [f"{sw.prefix}-p{k}" for k in range(1, MAX_NODES + 1)]
    while any(link_exists(p) for p in ports) and time.monotonic() < deadline:
        time.sleep(0.05)
    links = [p for p in ports if link_exists(p)] + ([sw.bridge] if link_exists(sw.bridge) else [])
    if links:
        run_local(["ip", "-force", "-batch", "-"], input="".join(f"link del {l}\n" for l in links),
                  timeout=30, check=False)
        removed += links
    still = [n for n in removed if netns_exists(n) or link_exists(n)]
    if still:
        raise LabError(f"switch {sw.bridge} teardown left {still}", observed=str(still), expected="nothing",
                       fix="ip netns del / ip link del them by hand")
    return removed


def _mtu(ns: str | None, ifname: str) -> int | None:
    links = _ns_links(ns) if ns else {ifname: _root_link(ifname)}
    return (links.get(ifname) or {}).get("mtu")


def _root_link(ifname: str) -> dict:
    res = run_local(["ip", "-j", "link", "show", "dev", ifname], timeout=10, check=False)
    try:
        return json.loads(res.stdout or "[]")[0] if res.returncode == 0 else {}
    except (ValueError, IndexError):
        return {}


def _ping(sw: Switch, a: int, b: int, count: int, wait: float) -> tuple[bool, str]:
    payload = sw.mtu - IP_HEADERS
    res = run_local(node_argv(sw, a, ["ping", "-n", "-q", "-c", str(count), "-W", str(wait), "-M", "do",
                                      "-s", str(payload), sw.node_ip(b)]),
                    timeout=count * wait + 10, check=False)
    out = (res.stdout + res.stderr).strip().splitlines()
    summary = next((l for l in out if "packet loss" in l), out[-1] if out else f"rc={res.returncode}")
    err = next((l for l in out if "message too long" in l), "")
    return res.returncode == 0, "; ".join(x for x in (err, summary) if x)


def pair_checks(sw: Switch, nodes: int, *, count: int = 1, wait: float = 1.0) -> list[Check]:
    """One ``switch.mtu.n<k>`` row per node (its NIC's and its switch port's MTU against the switch's) and one
    ``switch.path.n<a>-n<b>`` row per pair (DF ping of MTU-28 bytes from a to b, N(N-1)/2 rows). A failing pair
    names the node(s) whose port is short, when there is one."""
    _check_count(nodes)
    rows: list[Check] = []
    short: dict[int, str] = {}
    for k in range(1, nodes + 1):
        nic, port = _mtu(sw.netns(k), sw.port_name), _mtu(None, sw.port(k))
        bad = [f"{where} {name} MTU {m}" for where, name, m in
               (("node NIC", f"{sw.netns(k)}:{sw.port_name}", nic), ("switch port", sw.port(k), port))
               if m != sw.mtu]
        if bad:
            short[k] = ", ".join(bad)
        rows.append(check(f"switch.mtu.n{k}", not bad, node=sw.netns(k),
                          observed=f"NIC {nic}, switch port {port}", expected=f"{sw.mtu} on both",
                          fix=f"set MTU {sw.mtu} on {short.get(k, '')}".strip()))
    pairs = [(a, b) for a in range(1, nodes + 1) for b in range(a + 1, nodes + 1)]
    with ThreadPoolExecutor(max_workers=min(8, len(pairs))) as pool:
        results = list(pool.map(lambda p: _ping(sw, p[0], p[1], count, wait), pairs))
    for (a, b), (ok, out) in zip(pairs, results):
        culprits = [f"n{k}: {short[k]}" for k in (a, b) if k in short]
        fix = (f"jumbo frames do not pass: {'; '.join(culprits)}" if culprits
               else "no short MTU seen on either end: check the bridge (ip -d link) and the nodes' addresses")
        rows.append(check(f"switch.path.n{a}-n{b}", ok, node=f"{sw.netns(a)}->{sw.netns(b)}", observed=out,
                          expected=f"DF ping of {sw.mtu - IP_HEADERS} bytes answered", fix=fix,
                          data={"a": a, "b": b, "short": [k for k in (a, b) if k in short]}))
    return rows


def failing_nodes(rows: list[Check]) -> list[int]:
    """Nodes named as short by a failing path row (sorted)."""
    return sorted({k for r in rows if r.failed and r.name.startswith("switch.path.") for k in r.data.get("short", [])})
