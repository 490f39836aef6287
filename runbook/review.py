"""The offline review (``python -m runbook render``): every command each step would run on every node, in order,
with no SSH and no lab, secrets masked.

    text = review("env/exl3-v41.env", home="/home/spark")     # the steps' commands, node by node
    text = review("env/exl3-v41.env", step="4")                # only 04_launch's section
    diff = review_diff("env/exl3-v41.env", "env/my.env")       # what a profile change does to the commands

It is the steps' own code in a dry run, on :class:`runbook.remote.OfflineNode` s: a change is recorded, not run;
a read is answered only from declared facts (each node's $HOME) and otherwise recorded as a command the step
would read with, and answered "unknown". Nothing connects: an OfflineNode raises before any socket opens. A
step that cannot go on without a real answer says where it stopped, and the review goes on with the next step.
Steps 05-07 send HTTP requests to the server (none in a dry run); 08 runs no command. The evidence of the dry run
goes to a scratch folder that is removed afterwards. Two reviews of one profile are byte-identical: no path of this
machine (``<runbook>``, ``<tmp>``), no random name; the SSH options in force head the text.
"""
from __future__ import annotations

import contextlib
import difflib
import io
import itertools
import posixpath
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from . import bench, engram, launch, network, preflight, weights
from .errors import UsageError
from .evidence import RunDir
from .facts import net as fnet
from .lab.site import site_for
from .launch.image import TARGET_PLATFORM_CMD, ship_facts_cmd
from .profile import REPO_ROOT, load_profile
from .remote import Cluster, CommandLog
from .records import BENCH, ENGRAM, LAUNCH, NETWORK, PREFLIGHT, WEIGHTS
from .secrets import load_secrets, redactor_from_env
from .step import Step
from .facts.node_paths import USER_CMD

__all__ = ["STEPS", "review", "review_diff", "ssh_lines", "step_name"]

# the steps that run commands on the nodes, in run order, with the entry each notebook calls
STEPS: list[tuple[str, Callable]] = [
    (PREFLIGHT.id, preflight.run),
    (NETWORK.id, network.run),
    (WEIGHTS.id, weights.run),              # download, verify, the worker's copy or the NFS share
    (ENGRAM.id, engram.run),
    (LAUNCH.id, launch.run),                # checkout, image, self-checks, start (the rendered serve per rank)
    (BENCH.id, bench.run),
]


def review(profile_path: str | Path, *, home: str = "", overrides: dict[str, str] | None = None,
           step: str = "") -> str:
    """Every command of every step on every node, grouped by step, in the order the steps issue them
    (``step``: only that step's section, e.g. ``4`` or ``04_launch``). Deterministic: this checkout's path
    reads ``<runbook>``, a local temporary file ``<tmp>``."""
    wanted = step_name(step) if step else ""
    header, sections = _render(profile_path, home=home, overrides=overrides)
    out = header + [line for name, lines in sections for line in (f"\n## {name}", *lines)
                    if not wanted or name == wanted]
    return "\n".join(out) + "\n"


def review_diff(profile_path: str | Path, other_path: str | Path, *, home: str = "",
                overrides: dict[str, str] | None = None, step: str = "") -> str:
    """A unified diff of the two profiles' reviews (the same ``home``, ``overrides`` and ``step``): what changing
    the profile does to the commands. "" when they run the same commands."""
    a = review(profile_path, home=home, overrides=overrides, step=step)
    b = review(other_path, home=home, overrides=overrides, step=step)
    return "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                        fromfile=_stable(str(profile_path)), tofile=_stable(str(other_path))))


def step_name(step: str) -> str:
    """``4``, ``04``, ``04_launch`` or ``launch`` -> ``04_launch``; UsageError naming the choices otherwise."""
    s = str(step).strip()
    for name, _ in STEPS:
        number, _, word = name.partition("_")
        if s in (name, word) or (s.isdigit() and int(s) == int(number)):
            return name
    raise UsageError(f"render --step {step}: no such step",
                     expected="one of " + ", ".join(name for name, _ in STEPS),
                     fix="steps 05, 06 and 08 run no command on the nodes (05/06 talk HTTP to the server)")


def ssh_lines(profile) -> list[str]:
    """How this machine reaches the nodes (``remote.Node._connect``), from the profile's keys as written. The
    config file is not parsed here: paramiko runs a ``Match exec`` command while it looks a host up."""
    def key(name: str, value: str, unset: str) -> str:
        return f"#   {name}={value}" if value else f"#   {name} unset: {unset}"
    return ["# ssh from this machine to the nodes (fabric/paramiko; the nodes' own ssh to each other is in the "
            "commands below):",
            key("SSH_CONFIG", profile.ssh_config, "fabric reads ~/.ssh/config and /etc/ssh/ssh_config of this "
                "machine"),
            key("SSH_KEY", profile.ssh_key, "the keys ~/.ssh/id_* of this machine (no ssh agent)"),
            key("KNOWN_HOSTS", profile.known_hosts, "the config's UserKnownHostsFile, else ~/.ssh/known_hosts"),
            "#   host keys: " + ("an unknown key is accepted and stored (SSH_ACCEPT_NEW_HOST_KEYS=1)"
                                 if profile.ssh_accept_new_host_keys else
                                 "an unknown or changed key is refused (SSH_ACCEPT_NEW_HOST_KEYS=0)"),
            f"#   connect timeout {profile.ssh_connect_timeout} s (SSH_CONNECT_TIMEOUT); ssh agent not used"]


def _render(profile_path, *, home: str, overrides) -> tuple[list[str], list[tuple[str, list[str]]]]:
    profile = load_profile(profile_path, overrides=overrides)
    site = site_for(profile)           # the one builder of sites, as step.begin calls it
    load_secrets()                     # a refused secrets file stops here (exit 2), as it would stop the run
    homes = {n.name: home or _default_home(n.ssh) for n in profile.nodes}
    # the facts the review declares: each node's home (and the user it implies) and its fabric as the profile
    # describes it (netdevs, addresses, HCAs, a RoCE v2 GID at index 3); every other read is unknown
    facts = {spec.name: {'printf %s "$HOME"': homes[spec.name],
                         USER_CMD: f"{homes[spec.name]}\n1000\n{posixpath.basename(homes[spec.name]) or 'root'}\n",
                         **declared_network_facts(profile, spec), **declared_docker_facts(profile)}
             for spec in profile.nodes}
    redactor = redactor_from_env()
    log = CommandLog(None, redactor)
    scratch = Path(tempfile.mkdtemp(prefix="runbook-review-"))
    tmp = scratch / "tmp"
    tmp.mkdir()
    header = [f"# offline review of {profile.profile_name} ({profile.source}): recipe {profile.recipe}, "
              f"{len(profile.nodes)} nodes; no node is contacted",
              "# nodes: " + ", ".join(f"{n.name}={n.ssh} (rank {n.rank}, home {homes[n.name]})"
                                      for n in profile.nodes),
              *ssh_lines(profile),
              "# [read] = a read-only probe the step runs (answered 'unknown' unless declared); [run] = a change; "
              "# [node] text = a note; secrets are ***; <runbook> = this checkout, <tmp> = a local temporary file",
              "# declared: each node's home (--home) and its fabric as the profile describes it (netdevs UP at "
              "FABRIC_MTU with their /24 addresses, HCAs ACTIVE, RoCE v2 GID index 3); docker API "
              f"{DECLARED_DOCKER_API} on {DECLARED_PLATFORM} (a DGX Spark's); the image and the recipe checkout on "
              "no node yet (the full pull, ship and clone)"]
    sections: list[tuple[str, list[str]]] = []
    saved_tmp = tempfile.tempdir
    tempfile.tempdir = str(tmp)        # every local temporary file of the steps under one known folder
    try:
        run = RunDir.create(profile.profile_name, scratch, redactor)
        for name, entry in STEPS:
            step = Step(name, profile, run, site=site, dry_run=True)
            step._cluster = _InOrder.offline(profile, facts=facts, log=log)
            first = len(log.entries)
            stopped = ""
            try:
                with contextlib.redirect_stdout(io.StringIO()):      # the steps' own progress lines
                    outcome = entry(step)
            except Exception as exc:  # noqa: BLE001 - a step that needs a real answer stops; the review goes on
                outcome, stopped = None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            entries = log.entries[first:]
            lines = [f"# [{e['node']}] {e['command']}" if e["kind"] == "note" else
                     f"[{e['node']}] [{e['kind']}] {e['command']}" for e in entries]
            if name == LAUNCH.id and outcome is not None:
                # the plan, rank by rank, where its start commands run: after the probes that precede them
                plan = outcome.shown.plan          # the step's StepOutcome shows its LaunchOutcome
                starts = [redactor.redact(r.start_command()) for r in plan.ranks]
                at = next((i for i, e in enumerate(entries)
                           if e["kind"] == "run" and any(s in e["command"] for s in starts)), len(lines))
                lines[at:at] = ["# the rendered plan of the start commands below:",
                                *plan.to_text().splitlines(), ""]
            if not entries:
                lines.append("(no command on the nodes)")
            if stopped:
                lines.append(f"# stopped here offline (needs a real answer from a node): {redactor.redact(stopped)}")
            sections.append((name, [_stable(line, tmp) for line in lines]))
    finally:
        tempfile.tempdir = saved_tmp
        shutil.rmtree(scratch, ignore_errors=True)
    return [_stable(line, tmp) for line in header], sections


class _InOrder(Cluster):
    """The offline cluster, one node after the other in rank order where a step asks every node at once: the
    review's order is the same on every render (threads would interleave the nodes' commands at random)."""

    def each(self, fn, nodes=None):
        out = {}
        for node in (list(nodes) if nodes is not None else self.nodes):
            try:
                out[node.name] = fn(node)
            except Exception as exc:  # noqa: BLE001 - returned per node, as Cluster.each does
                out[node.name] = exc
        return out


def _stable(text: str, tmp: Path | None = None) -> str:
    """``text`` with no name of this machine: this checkout's path -> ``<runbook>``, a local temporary file
    (under ``tmp``) -> ``<tmp>``."""
    if tmp is not None:
        text = re.sub(re.escape(str(tmp)) + r"/[^\s'\"]+", "<tmp>", text)
    return text.replace(str(REPO_ROOT), "<runbook>")


#: what the review declares about each node's docker: the API of Docker 28 (``docker save --platform``) on a DGX
#: Spark's platform; a real run reads both (an older docker with the containerd store is refused, ``image.py``)
DECLARED_DOCKER_API = "1.48"
DECLARED_PLATFORM = "linux/arm64"


def declared_docker_facts(profile) -> dict[str, str]:
    """The answers of the image ship's two docker reads (``launch.image``): API versions, the classic image
    store, the head image's and the target daemon's platform. A real run reads the nodes."""
    return {ship_facts_cmd(profile.image): f"{DECLARED_DOCKER_API} {DECLARED_DOCKER_API}\n"
                                           f'[["Backing Filesystem","extfs"]]\n{DECLARED_PLATFORM}\n',
            TARGET_PLATFORM_CMD: f"{DECLARED_PLATFORM}\n"}


def _netdev_of(hca: str) -> str:
    """The DGX Spark CX-7 naming: rocep1s0f1 <-> enp1s0f1np1, roceP2p1s0f0 <-> enP2p1s0f0np0."""
    return f"en{hca[4:]}np{hca[-1]}" if hca.startswith("roce") and hca[-1:].isdigit() else hca


def _ipv4_gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a * 256 + b:04x}:{c * 256 + d:04x}"


def declared_addresses(profile) -> dict[str, dict[str, str]]:
    """node -> {netdev: IPv4} as the profile describes the fabric: each node's ``<NODE>_CX7_IF`` at ``<NODE>_IP``,
    and, for a pair without a shared subnet (:func:`runbook.facts.net.pair_path`, the rails of 01_network), a
    cable between free ports of their HCAs (TP=3 triangle): on the /24 of one end's address when only that end
    is on it (on the TP=3 triangle: the head's port toward the second worker on that worker's /24), else on the next
    free /24 (between the two workers).
    The review states this assumption; a real run reads the nodes."""
    nodes = list(profile.nodes)
    addrs = {n.name: {n.fabric_if: n.fabric_ip} for n in nodes}
    free = {n.name: [d for d in dict.fromkeys(_netdev_of(h) for h in n.ib_devs) if d != n.fabric_if] for n in nodes}

    def members(net: str) -> list[str]:
        return [n for n, a in addrs.items() for ip in a.values() if ip.rsplit(".", 1)[0] == net]

    def join(node, net: str) -> None:
        taken = {int(ip.rsplit(".", 1)[1]) for a in addrs.values() for ip in a.values() if ip.rsplit(".", 1)[0] == net}
        host = next(h for h in range(node.rank + 1, 255) if h not in taken)
        addrs[node.name][free[node.name].pop(0)] = f"{net}.{host}"

    for a, b in itertools.combinations(nodes, 2):
        ends = {n.name: fnet.fabric_ends(list(addrs[n.name]), {}, addrs[n.name]) for n in (a, b)}
        if fnet.pair_path(ends[a.name], ends[b.name]) or not free[a.name]:
            continue
        own = {x.name: x.fabric_ip.rsplit(".", 1)[0] for x in (a, b)}
        if members(own[b.name]) == [b.name]:           # a's free port on b's own cable
            join(a, own[b.name])
        elif free[b.name] and members(own[a.name]) == [a.name]:
            join(b, own[a.name])
        elif free[b.name]:                              # both cables taken: a third one of their own
            used = {ip.rsplit(".", 1)[0] for x in addrs.values() for ip in x.values()}
            head, third = own[a.name].rsplit(".", 1)
            net = next(f"{head}.{k}" for k in range(int(third) + 1, 256) if f"{head}.{k}" not in used)
            join(a, net)
            join(b, net)
    return addrs


def declared_network_facts(profile, spec) -> dict[str, str]:
    """What the profile says the node's fabric looks like, as the network step's first reads would answer it:
    each fabric/bootstrap netdev UP at MTU FABRIC_MTU with its address (/24, :func:`declared_addresses`), each HCA
    ACTIVE on its CX-7 netdev with a RoCE v2 IPv4 GID at index 3. An assumption the review states; a real run
    reads the node."""
    from .facts import rdma as fr
    addrs: dict[str, str] = dict(declared_addresses(profile)[spec.name])
    if spec.bootstrap_if and spec.bootstrap_ip:
        addrs[spec.bootstrap_if] = spec.bootstrap_ip
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
