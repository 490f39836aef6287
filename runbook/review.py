"""The offline review (``python -m runbook render``): every command each step would run on every node, in order,
with no SSH and no lab, secrets masked.

    text = review("env/exl3-v41.env", home="/home/spark")     # the steps' commands, node by node
    print(text)

It is the steps' own code in a dry run, on :class:`runbook.remote.OfflineNode` s: a change is recorded, not run;
a read is answered only from declared facts (each node's $HOME) and otherwise recorded as a command the step
would read with, and answered "unknown". Nothing connects: an OfflineNode raises before any socket opens. A
step that cannot go on without a real answer says where it stopped, and the review goes on with the next step.
Steps 05-07 send HTTP requests to the server (none in a dry run); 08 runs no command. The evidence of the dry run
goes to a scratch folder that is removed afterwards.
"""
from __future__ import annotations

import contextlib
import io
import posixpath
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from . import bench, engram, launch, network, preflight, weights
from .evidence import RunDir
from .profile import load_profile
from .remote import Cluster, CommandLog
from .secrets import redactor_from_env
from .step import Step
from .facts.node_paths import USER_CMD

__all__ = ["STEPS", "review"]

# the steps that run commands on the nodes, in run order, with the entry each notebook calls
STEPS: list[tuple[str, Callable]] = [
    ("00_preflight", preflight.run),
    ("01_network", network.run),
    ("02_weights", weights.run),              # download, verify, the worker's copy or the NFS share
    ("03_engram", engram.run),
    ("04_launch", launch.run),                # checkout, image, self-checks, start (the rendered serve per rank)
    ("07_bench", bench.run),
]


def review(profile_path: str | Path, *, home: str = "", overrides: dict[str, str] | None = None) -> str:
    """Every command of every step on every node, grouped by step, in the order the steps issue them."""
    profile = load_profile(profile_path, overrides=overrides)
    homes = {n.name: home or _default_home(n.ssh) for n in profile.nodes}
    # the facts the review declares: each node's home (and the user it implies) and its fabric as the profile
    # describes it (netdevs, addresses, HCAs, a RoCE v2 GID at index 3); every other read is unknown
    facts = {spec.name: {'printf %s "$HOME"': homes[spec.name],
                         USER_CMD: f"{homes[spec.name]}\n1000\n{posixpath.basename(homes[spec.name]) or 'root'}\n",
                         **declared_network_facts(profile, spec)}
             for spec in profile.nodes}
    redactor = redactor_from_env()
    log = CommandLog(None, redactor)
    scratch = Path(tempfile.mkdtemp(prefix="runbook-review-"))
    out = [f"# offline review of {profile.profile_name} ({profile.source}): recipe {profile.recipe}, "
           f"{len(profile.nodes)} nodes; no node is contacted",
           "# nodes: " + ", ".join(f"{n.name}={n.ssh} (rank {n.rank}, home {homes[n.name]})" for n in profile.nodes),
           "# [read] = a read-only probe the step runs (answered 'unknown' unless declared); [run] = a change; "
           "secrets are ***",
           "# declared: each node's home (--home) and its fabric as the profile describes it (netdevs UP at "
           "FABRIC_MTU with their /24 addresses, HCAs ACTIVE, RoCE v2 GID index 3)"]
    try:
        run = RunDir.create(profile.profile_name, scratch, redactor)
        for name, entry in STEPS:
            step = Step(name, profile, run, dry_run=True)
            step._cluster = Cluster.offline(profile, facts=facts, log=log)
            first = len(log.entries)
            stopped = ""
            try:
                with contextlib.redirect_stdout(io.StringIO()):      # the steps' own progress lines
                    result = entry(step)
            except Exception as exc:  # noqa: BLE001 - a step that needs a real answer stops; the review goes on
                result, stopped = None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            out.append(f"\n## {name}")
            if name == "04_launch" and result is not None:
                out.append(result.plan.to_text())
                out.append("")
            entries = log.entries[first:]
            for e in entries:
                out.append(f"[{e['node']}] [{e['kind']}] {e['command']}")
            if not entries:
                out.append("(no command on the nodes)")
            if stopped:
                out.append(f"# stopped here offline (needs a real answer from a node): {redactor.redact(stopped)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return "\n".join(out) + "\n"


def _netdev_of(hca: str) -> str:
    """The DGX Spark CX-7 naming: rocep1s0f1 <-> enp1s0f1np1, roceP2p1s0f0 <-> enP2p1s0f0np0."""
    return f"en{hca[4:]}np{hca[-1]}" if hca.startswith("roce") and hca[-1:].isdigit() else hca


def _ipv4_gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a * 256 + b:04x}:{c * 256 + d:04x}"


def declared_network_facts(profile, spec) -> dict[str, str]:
    """What the profile says the node's fabric looks like, as the network step's first reads would answer it:
    each fabric/bootstrap netdev UP at MTU FABRIC_MTU with its address (/24), each HCA ACTIVE on its CX-7 netdev
    with a RoCE v2 IPv4 GID at index 3. An assumption the review states; a real run reads the node."""
    from .facts import net as fnet
    from .facts import rdma as fr
    addrs: dict[str, str] = {spec.fabric_if: spec.fabric_ip}
    if spec.bootstrap_if and spec.bootstrap_ip:
        addrs[spec.bootstrap_if] = spec.bootstrap_ip
    own_net = spec.fabric_ip.rsplit(".", 1)[0]
    peers = [n.fabric_ip.rsplit(".", 1)[0] for n in profile.nodes if n.fabric_ip.rsplit(".", 1)[0] != own_net]
    for hca in spec.ib_devs:
        dev = _netdev_of(hca)
        if dev not in addrs and peers and spec.is_head:      # the head's port toward a worker on another /24
            addrs[dev] = f"{peers.pop(0)}.1"
    ifaces = [{"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536,
               "operstate": "UNKNOWN", "link_type": "loopback",
               "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host", "label": "lo"}]}]
    for i, (dev, ip) in enumerate(addrs.items(), 2):
        ifaces.append({"ifindex": i, "ifname": dev, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
                       "mtu": int(profile.fabric_mtu), "operstate": "UP", "link_type": "ether",
                       "addr_info": [{"family": "inet", "local": ip, "prefixlen": 24, "scope": "global", "label": dev}]})
    gids, ports = [], []
    for hca in spec.ib_devs:
        dev = _netdev_of(hca)
        ports.append(f"{hca} port 1 ==> {dev} (Up)")
        base = f"{fr.SYSFS.rstrip('/')}/class/infiniband/{hca}/ports/1"
        gids += [f"{base}/state	4: ACTIVE", f"{base}/link_layer	Ethernet"]
        gid = _ipv4_gid(addrs[dev]) if dev in addrs else "0000:0000:0000:0000:0000:0000:0000:0000"
        for idx, (value, kind) in enumerate([("fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"),
                                              ("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"),
                                              (gid, "IB/RoCE v1"), (gid, "RoCE v2")]):
            gids += [f"{base}/gids/{idx}	{value}", f"{base}/gid_attrs/types/{idx}	{kind}",
                     f"{base}/gid_attrs/ndevs/{idx}	{dev}"]
    import json
    return {fnet.IP_ADDR_CMD: json.dumps(ifaces), fnet.IP_ROUTE_CMD: "[]",
            fr.IBDEV2NETDEV_CMD: "\n".join(ports) + "\n", fr.gid_dump_cmd(fr.SYSFS): "\n".join(gids) + "\n"}


def _default_home(ssh: str) -> str:
    """/home/<user> from user@host, else /home/<your user> (``--home`` overrides)."""
    import getpass
    user = ssh.split("@", 1)[0] if "@" in ssh else getpass.getuser()
    return "/root" if user == "root" else f"/home/{user}"
