"""The shared state of one 01_network verification and the helpers every check module uses: node facts,
rails, the context (profile knobs, raw evidence, check list) and the bounded probe.

Probes go through ``node.read`` with bounded timeouts; a probe that raises becomes a failed result (and so a
check), never a crash.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks import Check, CheckList, Status, simulated
from ..evidence import write_redacted
from ..facts import net as fnet
from ..facts import rdma as fr
from ..records import NETWORK
from ..site import SPARKS_SITE, Site

STEP = NETWORK.id
EVIDENCE_PREFIX = f"raw/{STEP}"


@dataclass
class ReadFailure:
    """Stand-in for a CommandResult when ``node.read`` raised (timeout, lost connection)."""
    exit_code: int = 255
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def read(node, cmd: str, timeout: float):
    try:
        return node.read(cmd, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a probe failure becomes a check, not a crash
        return ReadFailure(255, "", f"{type(exc).__name__}: {exc}")


def split_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def text_of(res) -> str:
    return (res.stdout or "") + (("\n" + res.stderr) if res.stderr else "")


@dataclass
class RailEnd:
    node: str
    iface: str
    ip: str = ""            # the IPv4 used for traffic on this rail
    hca: str = ""


@dataclass
class Rail:
    index: int
    ends: dict[str, RailEnd] = field(default_factory=dict)   # node name -> end

    @property
    def name(self) -> str:
        return f"rail{self.index}"


@dataclass
class NetFacts:
    ifaces: dict[str, fnet.Interface] = field(default_factory=dict)
    routes: list[fnet.Route] = field(default_factory=list)
    hca_ports: list[fr.HcaPort] = field(default_factory=list)
    gids: dict[str, fr.GidPort] = field(default_factory=dict)
    ethtool: dict[str, fnet.Ethtool] = field(default_factory=dict)
    pcie: dict[str, fnet.PcieLink] = field(default_factory=dict)
    rp: dict[str, int] = field(default_factory=dict)
    error: str = ""

    @property
    def hca_netdev(self) -> dict[str, str]:
        return {p.hca: p.netdev for p in self.hca_ports}

    @property
    def netdev_ipv4(self) -> dict[str, list[str]]:
        return {n: i.ipv4_addresses for n, i in self.ifaces.items()}


class Verification:
    """One verification: the profile's knobs, each node's facts, the raw evidence and the checks so far."""

    def __init__(self, cluster, profile, raw_dir, site: Site = SPARKS_SITE):
        self.profile = profile
        self.site = site
        self.cluster = cluster
        self.nodes = list(cluster.nodes)
        self.raw: dict[str, str] = {}
        self.raw_dir = Path(raw_dir) if raw_dir else None
        self.checks = CheckList()
        self.facts: dict[str, NetFacts] = {}
        self.expect_rdma = profile.expect_rdma
        self.expect_gpu = profile.expect_gpu
        self.timeout = float(profile.command_timeout)
        self.rehearsal = site.simulated              # the hardware-only tools are the site's simulators
        self.sysfs = site.sysfs                      # where the GID tables are read (a rehearsal's simulated ones)
        self.nccl_dirs: dict[str, str] = {}        # node -> nccl-tests build dir (from the tools probe)

    def save(self, name: str, text: str) -> str:
        self.raw[name] = text
        if self.raw_dir is not None:
            write_redacted(self.raw_dir / name, text)
        return f"{EVIDENCE_PREFIX}/{name}"

    def add(self, c: Check) -> Check:
        self.checks.append(c)
        return c

    def add_hw(self, c: Check, why: str) -> Check:
        """A row read from a hardware-only tool: in a rehearsal a passing row says SIMULATED (with why); a WARN
        or FAIL keeps its status and gains the note (its value came from a simulator too)."""
        if self.rehearsal and c.status is not Status.NA:
            if c.status in (Status.WARN, Status.FAIL):
                c.observed = f"{c.observed} [simulated: {why}]"
            else:
                c = simulated(c, why)
        return self.add(c)


def iface_of(f: NetFacts, name: str) -> fnet.Interface:
    return f.ifaces.get(name) or fnet.Interface(name=name, state="ABSENT")


def pairs(ctx: Verification):
    return list(itertools.combinations(ctx.nodes, 2))


def both_ways(ctx: Verification):
    for a, b in pairs(ctx):
        yield a, b
        yield b, a


def concurrently(calls: list[Callable[[], Any]]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=max(1, len(calls))) as pool:
        futures = [pool.submit(c) for c in calls]
        return [f.result() for f in futures]


def pairs_on(ctx: Verification, rail: Rail, both_directions: bool = True):
    """The node pairs (a, b) that are both ends of ``rail``."""
    chosen = both_ways(ctx) if both_directions else pairs(ctx)
    return [(a, b) for a, b in chosen if a.name in rail.ends and b.name in rail.ends]
