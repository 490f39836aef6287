"""Failures of a node's host: a rank stuck in uninterruptible I/O (NFS), OOM kills, MemAvailable below
the floor, an mDNS host-name storm, a known-bad or mixed kernel."""
from __future__ import annotations

import datetime as _dt
import json
import re

from ...facts import hostlog, procs, system
from .. import bundle as B
from .entry import FATAL, REG_MR_ENOMEM, WARNING, Entry, Hit, rendezvous_failures


_RANK_NAMES = re.compile(r"python|vllm|VLLM|EngineCore|pt_main_thread|ray::", re.IGNORECASE)

_DWAIT = re.compile(r"folio_wait|nfs|rpc_wait|wait_on_page|io_schedule|sunrpc")


def _sig_dstate(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        rows = procs.parse_ps(b.text(node, B.D_THREADS)) + procs.parse_ps(b.text(node, B.PROCESSES))
        # only rank processes: kernel threads (jbd2, kworker) pass through D state all the time
        stuck = {(p.pid, p.tid): p for p in rows if p.uninterruptible and _RANK_NAMES.search(p.cmd)}
        hung = [h for h in hostlog.hung_tasks(b.text(node, B.DMESG)) if _RANK_NAMES.search(h.name)]
        if not stuck and not hung:
            continue
        ev = [f"{node}: pid {p.pid}{f' tid {p.tid}' if p.tid else ''} state {p.stat} waiting in "
              f"{p.wchan or '?'}: {p.cmd[:80]}" for p in list(stuck.values())[:5]]
        ev += [f"{node}: {h.line}" for h in hung[:3]]
        mount = b.text(node, B.WEIGHTS_MOUNT)
        nfs = re.search(r"\bnfs4?\b", mount)
        if not (nfs or any(_DWAIT.search(p.wchan) for p in stuck.values()) or hung):
            continue
        if nfs:
            ev.append(f"{node}: weights on NFS: {mount.strip().splitlines()[-1][:200]}")
        ev += [f for f in rendezvous_failures(b) if "clients joined" in f]
        hits.append(Hit(node, ev))
    return hits


RANK_IN_D_STATE = Entry(
    "rank-in-d-state", "Rank stuck in uninterruptible I/O (NFS)", FATAL,
    symptom="a rank cannot be killed; after an out-of-step restart: `1/2 clients joined`",
    detect="rank threads in state D waiting in `folio_wait_bit_common` / `nfs_*` / `rpc_wait_*`, or kernel "
           "`blocked for more than N seconds`, with the weights on NFS",
    cause="NFS-served weights under heavy I/O; restarting one rank while the other is stuck leaves them "
          "out of step",
    fix="wait for the I/O or reboot the stuck node; always restart both ranks together; prefer node-local "
        "weights (WEIGHT_SYNC=rsync)",
    proof="ps -eLo pid,tid,stat,wchan:32,comm | awk '$3 ~ /^D/'; findmnt -T <weights dir>",
    signature=_sig_dstate, source="anchors-2026-12 #11",
    lines=(r"blocked for more than \d+ seconds",
           r"folio_wait_bit_common",),
    words=(r"\bd[- ]state|uninterruptible|can'?t (be )?kill|unkillable|kill -9 (does nothing|doesn'?t work|did nothing)",
           r"\bnfs\b|network (share|storage|mount)|shared storage",
           r"rank|worker|vllm|process|restart",),
    lab="none: the lab has no kernel NFS mount (fixture follows the published format)")


_DMESG_T = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")

RECENT_S = 3600.0


def rank_started(b: B.Bundle, node: str) -> float | None:
    """When the node's rank was last started (its start record), as epoch seconds."""
    try:
        return float(json.loads(b.text(node, B.START_RECORD) or "{}").get("started_at"))
    except (TypeError, ValueError):
        return None


def older_than_start(line: str, started: float | None) -> bool:
    """A ``dmesg -T`` line stamped more than a minute before the rank's start: an older event (the kernel
    ring buffer is the host's, shared by every namespace and every earlier run)."""
    m = _DMESG_T.match(line.strip())
    if started is None or not m:
        return False
    try:
        stamp = _dt.datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y").timestamp()
    except ValueError:
        return False
    return stamp < started - 60


def _sig_oom(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        text = b.text(node, B.DMESG) + "\n" + b.text(node, B.JOURNAL)
        started = rank_started(b, node)
        if started is None and b.timings.get("collected_at"):
            started = b.timings["collected_at"] - RECENT_S     # no rank runs: only what happened lately
        kills = [k for k in hostlog.oom_kills(text) if not k.dry_run and not older_than_start(k.line, started)]
        if not kills:
            continue
        ev = [f"{node}: {k.by} killed {k.name} (pid {k.pid}){' - a rank' if _RANK_NAMES.search(k.name) else ''}: "
              f"{k.line[:200]}" for k in kills[:4]]
        hits.append(Hit(node, ev))
    return hits


OOM_KILLED = Entry(
    "oom-killed", "Host memory pressure killed a process", FATAL,
    symptom="a rank vanishes without a Python error; the other waits",
    detect="kernel `Out of memory: Killed process`, earlyoom `sending SIGTERM/SIGKILL to process` or "
           "systemd-oomd kills in dmesg / the journal (the driver's `NV_ERR_NO_MEMORY` is `uma-pool-exhausted`)",
    cause="the unified memory pool ran out (weights + KV + graph capture + page cache); GPU allocations are "
          "invisible to cgroups",
    fix="lower GPU_MEM_UTIL / KV_CACHE_MEMORY_BYTES or MAX_NUM_SEQS, drop caches before start, keep "
        "earlyoom from targeting the ranks; change one thing at a time",
    proof="dmesg -T | grep -iE 'out of memory|oom-kill'; journalctl -u earlyoom -n 50",
    signature=_sig_oom, source="anchors-2026-12 seed B; bringup-anchors §5.16",
    words=(r"oom[- ]?kill|killed by (the )?(kernel|oom)|out of memory: killed|earlyoom|oomd|oom killer",
           r"(rank|worker|vllm|process|engine|container|server).{0,40}(vanish|disappear|killed|gone|exit|died)|"
           r"(killed|kills|killing|reaped) (the |a |our |my )?(vllm|rank|worker|engine|server|process|container)",),
    lab="capture_netns oom_killed (a memory cgroup's OOM kill)")


MEM_FLOOR_BYTES = 2 << 30         # below this MemAvailable the kernel / earlyoom start killing

MEM_FLOOR_FRACTION = 0.025


def _sig_mem_floor(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        mem = system.parse_meminfo(b.text(node, B.MEMINFO))
        avail, total = mem.get("MemAvailable"), mem.get("MemTotal")
        if avail is None or not total:
            continue
        floor = max(MEM_FLOOR_BYTES, int(total * MEM_FLOOR_FRACTION))
        if avail < floor:
            hits.append(Hit(node, [f"{node}: MemAvailable {avail / 2**30:.1f} GiB of {total / 2**30:.1f} GiB "
                                   f"(floor {floor / 2**30:.1f} GiB)"]))
    return hits


MEM_AVAILABLE_LOW = Entry(
    "mem-available-low", "MemAvailable below the floor", WARNING,
    symptom="the node is sluggish; ssh banners time out; kills are next",
    detect=f"MemAvailable below max({MEM_FLOOR_BYTES >> 30} GiB, {MEM_FLOOR_FRACTION:.1%} of MemTotal) in /proc/meminfo",
    cause="weights, KV cache and page cache leave no headroom",
    fix="lower GPU_MEM_UTIL or KV size; `sync; echo 1 | sudo tee /proc/sys/vm/drop_caches` before start",
    proof="grep -E 'MemTotal|MemAvailable' /proc/meminfo",
    signature=_sig_mem_floor, source="anchors-2026-12 seed B; bringup-anchors §5.17",
    lab="tests/lab/test_memory_guard_lab.py::test_memory_pressure_during_a_start_aborts_it_before_the_node_stops_answering (a balloon process on a lab node; the start's guard aborts)",
    words=(r"memavailable|available memory",
           r"(only|just|down to) \d+(\.\d+)? ?(gb|gib|%)",
           r"sluggish|ssh (banner|login|session)s? (slow|time)|swap(ping)?|kills? (are|is) next",))


def _sig_mdns(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        names = hostlog.hostname_conflicts(b.text(node, B.JOURNAL) + "\n" + b.text(node, B.DMESG))
        if names:
            top = max((hostlog.conflict_suffix(n) or 0) for n in names)
            hits.append(Hit(node, [f"{node}: avahi renamed the host {len(names)} time(s), last '{names[-1]}' "
                                   f"(suffix up to -{top})"]))
    return hits


MDNS_HOSTNAME_STORM = Entry(
    "mdns-hostname-storm", "mDNS host-name conflict storm", WARNING,
    symptom="`<host>.local` stops resolving; ssh by name fails",
    detect="avahi `Host name conflict, retrying with <host>-N` in the journal",
    cause="avahi sees its own announcements (twin interfaces, network flaps) and keeps renaming the host",
    fix="use IP addresses (or /etc/hosts) in the profile; restrict avahi to the management interface "
        "(`allow-interfaces=`) or disable it",
    proof="journalctl -u avahi-daemon -n 50 | grep -i conflict",
    signature=_sig_mdns, source="anchors-2026-12 #12",
    lines=(r"Host name conflict, retrying with",),
    words=(r"\.local\b|mdns|avahi",
           r"conflict|-\d{2,}\b|stops? resolving|renam\w+|hostname",),
    lab="none: avahi is not run in the lab")


#: (kernel release regex, why it is bad); checked when the profile expects RDMA
KNOWN_BAD_KERNELS: tuple[tuple[str, str], ...] = (
    (r"^7\.0\.0-1019\b", "7.0.0-1019 boots with CmaTotal: 0, so ibv_reg_mr fails with ENOMEM"),
    (r"^7\.0\.", "7.0 kernels fail RDMA memory registration during FlashInfer autotune "
                 "(one fleet pins 6.17.0-1032-nvidia)"),
)


def _sig_kernel(b: B.Bundle) -> list[Hit]:
    hits = []
    kernels = {}
    for node in b.nodes:
        text = b.text(node, B.OS)
        if not text:
            continue
        kernels[node] = system.parse_os(text).kernel
    for node, k in kernels.items():
        for rx, why in KNOWN_BAD_KERNELS:
            if b.context.expect_rdma and re.search(rx, k):
                hits.append(Hit(node, [f"{node}: kernel {k}: {why}"]))
                break
    if len(set(kernels.values())) > 1:
        hits.append(Hit("cluster", ["kernels differ: " + ", ".join(f"{n} {k}" for n, k in kernels.items())]))
    return hits


KERNEL_KNOWN_BAD = Entry(
    "kernel-known-bad", "Kernel known to break RDMA, or kernels differ", WARNING,
    symptom="RDMA registration fails during autotune, or throughput differs between nodes",
    detect="`uname -r` matches a known-bad release (7.0.x, 7.0.0-1019) with RDMA expected, or the nodes run "
           "different kernels; an `ibv_reg_mr` ENOMEM is a symptom (medium), ranked first when the report names a "
           "7.0 kernel or a kernel change",
    cause="kernel regressions in RDMA memory registration; mixed kernels mean mixed drivers",
    fix="boot the pinned kernel (6.17.0-1032-nvidia) on every node",
    proof="uname -r   # on every node",
    signature=_sig_kernel, source="anchors-2026-12 #14; symptom: NVIDIA/nccl src/misc/ibvwrap.cc "
                                  "(wrap_ibv_reg_mr_iova2's WARN, the ENOMEM a 7.0 kernel's registration gives)",
    # the registration's ENOMEM is this entry's symptom too (never high: memlock and CMA print the same line); the
    # reporter's naming of the kernel release (its words' anchor) is what ranks it above the other two
    symptoms=(REG_MR_ENOMEM,),
    lab="none: the lab nodes share one kernel",
    # the anchor names a bad release or a kernel change, never the good pinned one (6.17.0-1032-nvidia is the fix)
    words=(r"(?<![\d.])7\.0(\.\d+)?(-\d+)?(-nvidia)?\b(?!\.)|regression|downgrad\w+|"
           r"after (a |the )?kernel (update|upgrade)|mixed kernels|different kernels|kernels differ",
           r"\bkernel\b",
           r"rdma|ibv_reg_mr|registration|roce|13 ?gb/s|16 ?gb/s|throughput|autotune",))
