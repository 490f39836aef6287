"""The support bundle: what to collect on every node, the in-memory :class:`Bundle` the catalogue
reads, and the writer of one redacted archive plus a findings page.

Contracts (the remote collection and ``python -m runbook diagnose`` are wired elsewhere):

* :func:`collect_commands` ``(profile) -> {node: [Command(name, cmd, timeout)]}``: read-only shell
  lines, each with its own timeout; run each with ``node.read(cmd, timeout=timeout)`` and keep
  ``stdout`` (plus ``stderr`` when it has something) under ``texts[node][name]``. A command that
  fails still yields useful text (its error); a command that times out should leave the text
  ``"(timed out after N s)"``.
* Texts collected on the runbook's own machine go under node :data:`LOCAL` (see ``LOCAL_*`` names:
  the rendered launch plan, ``/health``, ``/v1/models``, two ``/metrics`` scrapes, docker pull output).
* :func:`write_bundle` ``(run_dir, texts, redactor, *, context=None, timings=None) -> Path`` masks
  secrets in every text, matches the catalogue, and writes ``<run_dir>/diagnose/diagnose-<stamp>.tar.gz``
  with ``<stamp>.md`` / ``.html`` pages beside it (the page is inside the archive too). Returns the
  archive path; :func:`page_paths` gives the pages.
* :func:`read_bundle` reads an archive (or an extracted directory) back into a :class:`Bundle`.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Mapping, NamedTuple

from ..facts import firewall, hostlog, ibv, net, procs, rdma, sockets, system
from ..facts import ray as ray_facts

LOCAL = "local"            # texts collected on the runbook's machine, not on a node

# per-node text names (the catalogue reads these)
RANK_LOG = "rank.log"              # the rank's log since its last start
RANK_PREV_LOG = "rank_prev.log"    # the log of the start before (process runtime keeps one)
RAY_LOG = "ray.log"                # EXECUTOR=ray: the node's `ray start` output and its Ray session logs' tails
START_RECORD = "start_record.json"
ENV = "env.txt"                    # the running rank's environment (kept keys only, secrets masked)
CMDLINE = "cmdline.txt"
PROCESSES = "processes.txt"
D_THREADS = "d_threads.txt"
SS = "ss.txt"
TCP_MASTER = "tcp_master.txt"      # TCP connect from this node to the master address:port
FIREWALL = "firewall.txt"
IP_ADDR = "ip_addr.json"
IP_ROUTE = "ip_route.json"
IBDEV2NETDEV = "ibdev2netdev.txt"
GIDS = "gids.txt"
IBV_DEVINFO = "ibv_devinfo.txt"
NCCL_CONF = "nccl_conf.txt"
MEMINFO = "meminfo.txt"
DISK = "disk.txt"
WEIGHTS_MOUNT = "weights_mount.txt"
DMESG = "dmesg.txt"
JOURNAL = "journal.txt"
OS = "os.txt"
HOME = "home.txt"
GPU = "gpu.txt"
DOCKER_PULL = "docker_pull.txt"    # output of the last docker pull (node or local)
PING_PREFIX = "ping_"              # ping_<peer>.txt: small ping to the peer's fabric address
PING_MTU_PREFIX = "ping_mtu_"      # ping_mtu_<peer>.txt: DF-set ping of FABRIC_MTU-28 bytes

# local text names
LOCAL_LAUNCH_PLAN = "launch_plan.txt"   # LaunchPlan.to_text(): rendered commands and environment
LOCAL_HEALTH = "health.txt"             # "200" (or the error) of GET /health
LOCAL_MODELS = "models.json"            # body of GET /v1/models
LOCAL_METRICS_1 = "metrics_1.txt"       # GET /metrics, then again metrics_interval_s later
LOCAL_METRICS_2 = "metrics_2.txt"
LOCAL_COMMANDS = "commands.jsonl"       # the run's command log (results/<run>/commands.jsonl), masked

#: timings keys a caller may pass (seconds)
TIMING_KEYS = {
    "metrics_interval_s": "seconds between metrics_1 and metrics_2",
    "since_head_start_s": "seconds from the head's start to the collection",
    "collected_at": "epoch seconds of the collection (judges how old a kernel line is when no rank runs)",
}

MAX_TEXT_BYTES = 8 << 20          # one text in the archive (a rank log can be large)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class Command(NamedTuple):
    name: str
    cmd: str
    timeout: int


# --------------------------------------------------------------------------- context


@dataclass(frozen=True)
class NodeInfo:
    name: str
    rank: int
    fabric_ip: str = ""
    fabric_if: str = ""
    host_ip: str = ""          # VLLM_HOST_IP (bootstrap address when BOOTSTRAP_IF is set)
    socket_if: str = ""        # NCCL/GLOO socket interface
    ib_devs: tuple[str, ...] = ()
    gid: str = "auto"


@dataclass(frozen=True)
class Context:
    """What the bundle was collected against (from the profile): the expectations entries compare to."""
    nodes: tuple[NodeInfo, ...] = ()
    master_port: int = 0
    port: int = 0
    served_model_name: str = ""
    expect_rdma: bool = False
    fabric_mtu: int = 0
    runtime: str = ""
    api_host: str = ""         # the address the head's API binds (API_HOST): 127.0.0.1, 0.0.0.0 or one address

    @classmethod
    def from_profile(cls, profile) -> "Context":
        nodes = tuple(NodeInfo(name=n.name, rank=n.rank, fabric_ip=n.fabric_ip, fabric_if=n.fabric_if,
                               host_ip=n.host_ip, socket_if=n.socket_if, ib_devs=tuple(n.ib_devs), gid=str(n.gid))
                      for n in profile.nodes)
        return cls(nodes=nodes, master_port=int(profile.master_port), port=int(profile.port),
                   served_model_name=profile.served_model_name, expect_rdma=bool(profile.expect_rdma),
                   fabric_mtu=int(profile.fabric_mtu), runtime=profile.runtime,
                   api_host=str(profile.api_host))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Context":
        d = dict(d)
        nodes = tuple(NodeInfo(**{**n, "ib_devs": tuple(n.get("ib_devs", ()))}) for n in d.pop("nodes", []))
        unknown = set(d) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise ValueError(f"context.json: unknown key(s) {sorted(unknown)} "
                             f"(known: {sorted(cls.__dataclass_fields__)})")
        return cls(nodes=nodes, **d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def api_url(self) -> str:
        """Where the API answers on the head itself (its bind address; loopback for 0.0.0.0 or unknown)."""
        host = self.api_host if self.api_host and self.api_host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}" if self.port else ""

    @property
    def head(self) -> NodeInfo | None:
        return next((n for n in self.nodes if n.rank == 0), None)

    @property
    def master_addr(self) -> str:
        return self.head.host_ip if self.head else ""

    def node(self, name: str) -> NodeInfo | None:
        return next((n for n in self.nodes if n.name == name), None)

    @property
    def fabric_ips(self) -> set[str]:
        return {ip for n in self.nodes for ip in (n.fabric_ip, n.host_ip) if ip}


# --------------------------------------------------------------------------- bundle


@dataclass
class Bundle:
    """Collected texts (``texts[node][name]``), the context they were collected against, and timings."""
    texts: dict[str, dict[str, str]]
    context: Context = field(default_factory=Context)
    timings: dict[str, float] = field(default_factory=dict)

    def text(self, node: str, name: str) -> str:
        return self.texts.get(node, {}).get(name, "")

    def has(self, node: str, name: str) -> bool:
        return name in self.texts.get(node, {})

    @property
    def nodes(self) -> list[str]:
        """Collected nodes (not :data:`LOCAL`), in rank order when the context knows them."""
        rank = {n.name: n.rank for n in self.context.nodes}
        return sorted((n for n in self.texts if n != LOCAL), key=lambda n: (rank.get(n, 99), n))

    @property
    def workers(self) -> list[str]:
        head = self.context.head.name if self.context.head else "head"
        return [n for n in self.nodes if n != head]

    @property
    def head(self) -> str:
        return self.context.head.name if self.context.head else "head"

    def logs(self) -> list[tuple[str, str]]:
        """(node, rank log text) for every node that has one."""
        return [(n, self.text(n, RANK_LOG)) for n in self.nodes if self.has(n, RANK_LOG)]

    def named(self, prefix: str) -> list[tuple[str, str, str]]:
        """(node, name, text) of every text whose name starts with ``prefix`` (local included)."""
        return [(node, name, t) for node, items in self.texts.items() for name, t in sorted(items.items())
                if name.startswith(prefix)]

    @cached_property
    def _env(self) -> dict[str, dict[str, str]]:
        return {n: procs.parse_environ(self.text(n, ENV)) for n in self.nodes}

    def env(self, node: str) -> dict[str, str]:
        return self._env.get(node, {})

    @cached_property
    def _ifaces(self) -> dict[str, dict[str, net.Interface]]:
        return {n: net.parse_ip_addr(self.text(n, IP_ADDR)) for n in self.nodes}

    def interfaces(self, node: str) -> dict[str, net.Interface]:
        return self._ifaces.get(node, {})

    def iface_of(self, node: str, ip: str) -> str | None:
        """The interface of ``node`` that holds ``ip`` (None: not on that node, or unknown)."""
        for name, iface in self.interfaces(node).items():
            if ip in iface.ipv4_addresses:
                return name
        return None


# --------------------------------------------------------------------------- what to collect


def _node_path(path: str) -> str:
    """A node-side path for the shell: ``~/x`` -> ``"$HOME"/'x'`` (quoted, expanded on the node)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def collect_commands(profile, *, state_dirs: Mapping[str, str] | None = None,
                     log_lines: int = 20000, fabric: Mapping[str, dict[str, list[str]]] | None = None
                     ) -> dict[str, list[Command]]:
    """Read-only commands per node, in rank order: ``{node: [Command(name, cmd, timeout)]}``.

    ``state_dirs``: node -> the rank's launch state directory (pid, log, start record); default
    ``<CACHE_DIR>/launch`` as the launcher uses it (pass ``{r.node: r.state_dir for r in plan.ranks}``
    to follow the plan exactly). ``fabric``: node -> its given fabric interfaces with the addresses read
    (:func:`runbook.facts.net.node_fabric_ends`; :func:`runbook.diagnose.collect.collect` reads them first);
    a node without one is known by its profile address only.
    """
    nodes = list(profile.nodes)
    ends = {n.name: (fabric or {}).get(n.name) or net.node_fabric_ends(n) for n in nodes}
    ctx = Context.from_profile(profile)
    out: dict[str, list[Command]] = {}
    for spec in nodes:
        sd = (state_dirs or {}).get(spec.name) or f"{profile.cache_dir.rstrip('/')}/launch"
        sdq = _node_path(sd)
        log, pidf = f"{sdq}/{spec.name}.log", f"{sdq}/{spec.name}.pid"
        cmds: list[Command] = []
        if profile.runtime == "docker":
            c = shlex.quote(profile.container_on(spec.name))
            cmds += [Command(RANK_LOG, f"docker logs --tail {int(log_lines)} {c} 2>&1", 60),
                     Command(ENV, procs.container_env_cmd(profile.container_on(spec.name)), 20),
                     Command(CMDLINE, f"docker inspect --format '{{{{json .Config.Cmd}}}}' {c} 2>&1", 20)]
        else:
            cmds += [Command(RANK_LOG, f"tail -n {int(log_lines)} {log} 2>&1", 60),
                     Command(RANK_PREV_LOG, f"tail -n 3000 {log}.1 2>&1", 30),
                     Command(ENV, procs.proc_environ_cmd(pidf), 20),
                     Command(CMDLINE, procs.proc_cmdline_cmd(pidf), 20)]
        if profile.executor == "ray":        # Ray's own words: the node that never joined says why here
            session = ray_facts.logs_command(spec.name, 2000)
            cmds.append(Command(RAY_LOG, (f"docker exec {shlex.quote(profile.container_on(spec.name))} sh -c "
                                          f"{shlex.quote(session)} 2>&1" if profile.runtime == "docker" else
                                          f"tail -n {int(log_lines)} {sdq}/{spec.name}.ray.log 2>&1; {session}"), 60))
        cmds += [
            Command(START_RECORD, f"cat {sdq}/{spec.name}.json 2>&1", 15),
            Command(PROCESSES, procs.PS_CMD, 20),
            Command(D_THREADS, procs.D_THREADS_CMD, 20),
            Command(SS, sockets.SS_CMD, 20),
            Command(TCP_MASTER, sockets.tcp_connect_cmd(ctx.master_addr, ctx.master_port, timeout_s=5), 15),
            Command(FIREWALL, firewall.FIREWALL_CMD, 20),
            Command(IP_ADDR, net.IP_ADDR_CMD, 15),
            Command(IP_ROUTE, net.IP_ROUTE_CMD, 15),
            Command(IBDEV2NETDEV, f"{rdma.IBDEV2NETDEV_CMD} 2>&1", 15),
            Command(GIDS, rdma.GID_DUMP_CMD, 20),
            Command(IBV_DEVINFO, ibv.IBV_DEVINFO_CMD, 20),
            Command(NCCL_CONF, "for f in /etc/nccl.conf \"$HOME/.nccl.conf\"; do echo \"## $f\"; cat \"$f\" 2>&1; done", 10),
            Command(MEMINFO, system.MEMINFO_CMD, 10),
            Command(DISK, "df -B1 -T 2>&1 | head -n 60", 20),
            Command(WEIGHTS_MOUNT, f"findmnt -T {_node_path(profile.weights_dir_on(spec.name) or '/')} "
                                   f"-o TARGET,SOURCE,FSTYPE,OPTIONS 2>&1", 15),
            Command(DMESG, hostlog.DMESG_CMD, 30),
            Command(JOURNAL, hostlog.JOURNAL_CMD, 30),
            Command(OS, system.OS_CMD, 10),
            Command(HOME, 'printf "%s\\n" "$HOME"', 10),
            Command(GPU, system.GPU_CMD, 20),
        ]
        for peer in nodes:
            # over the path the two share (the rails of 01_network): on the TP=3 triangle two workers ping each other
            # over their own cable; none (a worker given only its head-facing port): no ping to misread
            path = net.pair_path(ends[spec.name], ends[peer.name]) if peer.name != spec.name else None
            if path is None:
                continue
            cmds.append(Command(f"{PING_PREFIX}{peer.name}.txt",
                                net.ping_cmd(path.peer_ip, size=56, count=3, iface=path.iface, deadline_s=6), 15))
            if profile.fabric_mtu > 1500:
                cmds.append(Command(f"{PING_MTU_PREFIX}{peer.name}.txt",
                                    net.ping_cmd(path.peer_ip, size=int(profile.fabric_mtu) - 28, count=3,
                                                 iface=path.iface, deadline_s=6), 15))
        out[spec.name] = cmds
    return out


# --------------------------------------------------------------------------- archive
