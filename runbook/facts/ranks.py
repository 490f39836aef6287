"""What runs on each node right now, read without changing anything: the rank's pid file, fingerprint,
start record and container state, the vLLM processes in the process table, and (while a start is watched)
liveness, log growth and MemAvailable.

    st = rank_state(node, profile)      # RankState: running? which runtime, pid, fingerprint, processes
    w = watch(node, rank)               # RankWatch: alive, log lines, tail, MemAvailable, memory PSI
    m = memory_state(node, profile, home)   # MemoryState: live MemAvailable + PSI, a previous stop's record

Used by start (``server.py``), ``stop.py`` and ``status.py``, the failure rows of ``health.py`` and
resume.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import ray as ray_facts, system, vllm_log
from ..remote import Node, expand_home, quote

STATE_SUBDIR = "launch"                 # <CACHE_DIR>/launch/<node>.{pid,fp,log,json} (process runtime)
FINGERPRINT_LABEL = "spark-runbook.fingerprint"

PS_CMD = "ps -eo pid=,pgid=,stat=,args= 2>/dev/null"
# a vLLM server process: `vllm serve`, the lab wrapper `vllm_cli.py serve`, the module entry point,
# or a child with a vLLM process title (VLLM::EngineCore, VLLM::Worker_TP0)
_VLLM_PROC = re.compile(r"\bvllm(?:_cli\.py)?\s+serve\b|vllm\.entrypoints|VLLM::")
# a Python multiprocessing child (spawn, forkserver, resource tracker): vLLM's workers start as one and take their
# VLLM:: title only after their imports, seconds later on a loaded node
_MP_CHILD = re.compile(r"\bmultiprocessing\.(?:spawn|forkserver|resource_tracker)\b|--multiprocessing-fork\b")


@dataclass
class RankState:
    node: str
    runtime: str = ""             # "process" | "docker" | "" (nothing found)
    running: bool = False
    pid: int | None = None
    container_status: str = ""
    fingerprint: str = ""
    processes: list[str] = field(default_factory=list)   # vLLM processes seen on the node
    record: dict[str, Any] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)     # of those, stopped (ps state T: SIGSTOP, a debugger)
    argv: str = ""                # a running process rank's whole command line (the same ps)

    def describe(self) -> str:
        """One phrase, no placeholders: what runs, or why nothing counts as a rank (a pid file naming a dead
        process, a container left in a non-running state, vLLM processes no rank owns)."""
        frozen = (f"; {len(self.stopped)} process(es) frozen (state T): {', '.join(self.stopped[:4])}"
                  if self.stopped else "")
        if self.running:
            what = ([f"pid {self.pid}"] if self.pid else []) + \
                ([f"container {self.container_status}"] if self.container_status else [])
            fp = f", fingerprint {self.fingerprint[:12]}" if self.fingerprint else ", no fingerprint recorded"
            return f"running ({self.runtime}: {', '.join(what) or 'no pid'}{fp})" + frozen
        why = []
        if self.pid:
            why.append(f"pid file names {self.pid}, which is not a live vLLM process")
        if self.container_status:
            why.append(f"container {self.container_status}")
        if self.processes:
            why.append(f"{len(self.processes)} vLLM process(es) that no running rank owns")
        return ("not running" + (f" ({'; '.join(why)})" if why else "")) + frozen


def state_dir(profile, home: str) -> str:
    return f"{expand_home(profile.cache_dir, home)}/{STATE_SUBDIR}"


def parse_ps(text: str) -> list[tuple[int, int, str, str]]:
    out = []
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
            out.append((int(parts[0]), int(parts[1]), parts[2], parts[3]))
    return out


def vllm_procs(ps: list[tuple[int, int, str, str]], pgid: int | None = None, *, group_is_ours: bool = False
               ) -> list[tuple[int, int, str, str]]:
    """The vLLM processes of ``ps``, and every member of process group ``pgid`` (the pid file's: what a killed main
    pid left, e.g. multiprocessing's resource tracker) while a vLLM process is in that group. A group without one is
    not ours: a pid file outlives its rank (a reboot, a lab rebuilt after its nodes died) and its number can be
    another process group's by then -- an sshd session's, dockerd's. ``group_is_ours``: the caller saw a vLLM
    process in it already (a stop in progress): every member counts, also a child spawned but not yet named
    ``VLLM::Worker`` once the named ones are gone (a group's number is not reused while a member lives). A group
    whose only members are multiprocessing children counts too: a rank whose main pid died mid-boot (kill -9, the
    OOM killer) leaves its spawned worker importing, unnamed, until it takes the name (CI, make test)."""
    live = [p for p in ps if not p[2].startswith("Z") and not p[3].startswith(("ps ", "bash -c", "sh -c"))]
    ours = pgid is not None and (group_is_ours or any(
        p[1] == pgid and (_VLLM_PROC.search(p[3]) or _MP_CHILD.search(p[3])) for p in live))
    return [p for p in live if _VLLM_PROC.search(p[3]) or (ours and p[1] == pgid)]


def rank_state(node: Node, profile, home: str | None = None) -> RankState:
    """What runs on this node: our pid file (process runtime), our container (docker runtime),
    and any vLLM process at all."""
    home = home or node.read("printf %s \"$HOME\"").stdout.strip() or "/root"
    sd = state_dir(profile, home)
    name = node.name
    container = profile.container_on(name)
    # EXECUTOR=ray: a worker runs no vLLM of its own; its rank is its `ray start` (process runtime: that pid)
    ray_worker = profile.executor == "ray" and name != profile.nodes[0].name
    pid_file = ray_facts.pid_path(sd, name) if ray_worker else sd + '/' + name + '.pid'
    script = (f"cat {quote(pid_file)} 2>/dev/null; echo '@@'; "
              f"cat {quote(sd + '/' + name + '.fingerprint')} 2>/dev/null; echo '@@'; "
              f"cat {quote(sd + '/' + name + '.json')} 2>/dev/null; echo '@@'; "
              f"docker inspect -f '{{{{.State.Status}}}} {{{{index .Config.Labels \"{FINGERPRINT_LABEL}\"}}}}' "
              f"{quote(container)} 2>/dev/null; echo '@@'; {PS_CMD}")
    parts = (node.read(script).stdout.split("@@\n") + [""] * 5)[:5]
    pid_s, fp_s, rec_s, docker_s, ps_s = (p.strip() for p in parts)
    st = RankState(node=name)
    try:
        st.record = json.loads(rec_s) if rec_s else {}
    except ValueError:
        st.record = {}
    ps = parse_ps(ps_s)
    pid = int(pid_s) if pid_s.isdigit() else None
    procs = vllm_procs(ps, pgid=pid)
    st.processes = [f"{p[0]} {p[3][:160]}" for p in procs]
    st.stopped = [f"{p[0]} {p[3][:60]}" for p in procs if p[2][:1] in ("T", "t")]
    if docker_s:
        status_, _, label = docker_s.partition(" ")
        st.container_status = status_
        # "created" (a `docker run` that failed after creating it) and "exited" are leftovers, not ranks:
        # the start command removes them (docker rm -f) before it runs the container again
        if status_ in ("running", "restarting"):
            st.runtime, st.running, st.fingerprint = "docker", True, label.strip()
    if ray_worker and not st.running and pid is not None and any(p[0] == pid for p in ps):
        st.runtime, st.running, st.pid, st.fingerprint = "process", True, pid, fp_s
    if not st.running and pid is not None and any(p[0] == pid for p in procs):
        st.runtime, st.running, st.pid, st.fingerprint = "process", True, pid, fp_s
        st.argv = next(p[3] for p in procs if p[0] == pid)
    elif not st.running and pid is not None:
        st.pid = pid
    return st


class LaunchedRank(Protocol):
    """What a watch reads of a rank's launch (``runbook.launch.render.RankLaunch`` is one)."""
    runtime: str
    container: str
    log_path: str
    pid_path: str


@dataclass
class RankWatch:
    alive: bool
    lines: int
    tail: list[str]
    mem_available: int | None = None     # bytes, read in the same command (the startup memory profile)
    psi_full: float | None = None        # memory PSI "full" avg10, percent (None: no PSI on this kernel)


MEM_LINE = system.MEM_SAMPLE_CMD      # two lines: MemAvailable (kB), the memory PSI file on one line


def watch_cmd(rank: LaunchedRank, *, fresh: bool = False) -> str:
    return MEM_LINE + rank_watch_cmd(rank, fresh=fresh)


def rank_watch_cmd(rank: LaunchedRank, *, fresh: bool = False) -> str:
    """alive/dead, the log's line count and its tail. ``fresh``: a container this start created counts as dead
    once docker has restarted it (seed B's `--restart unless-stopped` would otherwise hide a rank that crashes
    while booting behind its restarts until READY_TIMEOUT)."""
    if rank.runtime == "docker":
        c = quote(rank.container)
        alive = "'true 0'" if fresh else "'true '*"
        return (f"case \"$(docker inspect -f '{{{{.State.Running}}}} {{{{.RestartCount}}}}' {c} 2>/dev/null)\" in "
                f"{alive}) echo alive;; *) echo dead;; esac; docker logs {c} 2>&1 | wc -l; "
                f"docker logs --tail 200 {c} 2>&1")
    log = quote(rank.log_path)
    return (f"pid=$(cat {quote(rank.pid_path)} 2>/dev/null); "
            f"if [ -n \"$pid\" ] && kill -0 \"$pid\" 2>/dev/null && "
            f"! grep -q '^State:.*Z' /proc/$pid/status 2>/dev/null; then echo alive; else echo dead; fi; "
            f"wc -l < {log} 2>/dev/null || echo 0; tail -n 200 {log} 2>/dev/null")


def watch(node: Node, rank: LaunchedRank, *, fresh: bool = False) -> RankWatch:
    out = node.read(watch_cmd(rank, fresh=fresh), timeout=30).stdout.splitlines()
    mem = system.parse_mem_sample(out[:2])
    out = out[2:]
    alive = bool(out) and out[0].strip() == "alive"
    lines = int(out[1].strip()) if len(out) > 1 and out[1].strip().isdigit() else 0
    return RankWatch(alive, lines, out[2:], mem.mem_available, mem.psi_full)


def mem_available(node: Node) -> int:
    """MemAvailable in bytes (0 when unreadable): recorded before the launch, compared after the stop."""
    return system.parse_meminfo(node.read(system.MEMINFO_CMD).stdout).get("MemAvailable", 0)


def mem_sample(node: Node, timeout: float = 5.0) -> system.MemSample:
    """MemAvailable and the memory PSI in one read (the start's memory guard samples it every 1-2 s)."""
    return system.parse_mem_sample(node.read(system.MEM_SAMPLE_CMD, timeout=timeout).stdout.splitlines())


# A stop that found MemAvailable still below its pre-launch value leaves this record in the rank's state dir
# (<CACHE_DIR>/launch/<node>.memory.json): {"baseline", "after", "tolerance", "stopped_at", "run_id"}. The next
# start reads it and refuses to launch into the smaller pool until the memory is back (or the record is removed).
PIN_SUFFIX = ".memory.json"


def pin_path(profile, home: str, node_name: str) -> str:
    return f"{state_dir(profile, home)}/{node_name}{PIN_SUFFIX}"


@dataclass
class MemoryState:
    """A node's memory before a start: the live sample and the record a previous stop left (None: none)."""
    node: str
    sample: system.MemSample
    pin: dict[str, Any] | None = None
    pin_path: str = ""


def memory_state(node: Node, profile, home: str) -> MemoryState:
    """The previous stop's record (if any) and a live sample, in one read."""
    path = pin_path(profile, home, node.name)
    out = node.read(f"cat {quote(path)} 2>/dev/null; echo; echo '@@'; {system.MEM_SAMPLE_CMD}",
                    timeout=15).stdout
    rec_s, _, mem_s = out.partition("@@\n")
    try:
        pin = json.loads(rec_s) if rec_s.strip() else None
    except ValueError:
        pin = {"unreadable": rec_s.strip()[:200]}
    return MemoryState(node.name, system.parse_mem_sample(mem_s.splitlines()),
                       pin if isinstance(pin, dict) else None, path)


def log_progressed(prev: RankWatch | None, cur: RankWatch) -> bool:
    """True when the log grew by at least one non-periodic line."""
    if prev is None:
        return cur.lines > 0
    grown = cur.lines - prev.lines
    if grown <= 0:
        return False
    new = cur.tail[-grown:] if grown <= len(cur.tail) else cur.tail
    return grown > len(cur.tail) or any(not vllm_log.is_periodic(l) for l in new)


def log_text(node: Node, rank: LaunchedRank, lines: int = 5000) -> str:
    if rank.runtime == "docker":
        return node.read(f"docker logs --tail {lines} {quote(rank.container)} 2>&1", timeout=60).stdout
    return node.read(f"tail -n {lines} {quote(rank.log_path)} 2>/dev/null", timeout=60).stdout
