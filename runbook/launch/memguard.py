"""The start's memory guard: MemAvailable and the memory PSI on every rank every 1.5 s through a start, an abort
floor that stops the start before the host wedges, the minimum per rank, and the refusal to launch into a pool a
previous stop left smaller.

    pre = pre_launch(cluster, profile, homes)     # PreLaunch: rows, refusal, MemAvailable per node before launch
    guard = MemoryGuard(cluster, profile, t0, on_breach=stop_ranks).start()   # stop_ranks(cluster, breach)
    ...; guard.breach                             # Breach | None, set before on_breach runs
    guard.close(); guard.minimum(pre.mem_before)  # per rank: lowest MemAvailable, highest PSI

On a Spark the GPU's allocations are host RAM (unified memory): vLLM's startup profiling does not honour
``--gpu-memory-utilization`` and page cache counts as used, so a start can take the host down to where it stops
answering (field reports: vLLM #46307, #56824, dgx-spark-playbooks #97). The guard samples on its own thread
and over its own SSH connections, so a readiness probe that blocks (the first request can run 60 s) never delays
a sample, and on a breach it stops the ranks itself at once (``on_breach``); the readiness loop then fails the
start with the rank, the value, the limit and the cause.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..checks import Check, check
from ..facts import ranks
from ..facts.system import MemSample
from ..remote import Cluster, Node, quote
from .stop import tolerance

__all__ = [
    "Breach",
    "GUARD_ROW",
    "MEM_POLL_S",
    "MIN_ROW",
    "MemoryGuard",
    "PreLaunch",
    "breach_of",
    "pre_launch",
]

GIB = 1024 ** 3
MEM_POLL_S = 1.5            # one sample per rank every 1.5 s (each a single read of MemAvailable and the PSI file)
SAMPLE_TIMEOUT_S = 5.0      # a node that does not answer a sample within this is counted as a miss
GUARD_ROW = "memory above the floor while starting"
MIN_ROW = "minimum MemAvailable through the start"
POOL_ROW = "memory back since the last stop"
FLOOR_ROW = "MemAvailable above the floor before launch"

CAUSE = ("unified memory: on a Spark the GPU's allocations are host RAM, and a start crosses the floor when vLLM's "
         "startup profiling takes more than --gpu-memory-utilization says (it is not honoured while profiling, "
         "vLLM #46307), when page cache is counted as used (CUDA's 'free' is MemFree), or when JIT/autotune "
         "builds run beside the load (dgx-spark-playbooks #97)")
FIX = ("pin the KV pool (KV_CACHE_MEMORY_BYTES) or lower GPU_MEM_UTIL; drop the page cache before the start "
       "(sync; echo 3 | sudo tee /proc/sys/vm/drop_caches); cap JIT builds (MAX_JOBS=2) and leave "
       "--enable-flashinfer-autotune out of EXTRA_ARGS; stop other memory users on the node "
       "(ps aux --sort=-rss | head). Read the stop rows below: if MemAvailable did not come back, reboot the node "
       "first. MEM_FLOOR_GIB / MEM_PSI_FULL_MAX set the limits (0 = off)")


@dataclass
class Breach:
    """A rank crossed a limit: ``what`` is "floor" (MemAvailable below MEM_FLOOR_GIB) or "psi" (PSI full avg10
    above MEM_PSI_FULL_MAX)."""
    node: str
    t: float                  # seconds from the launch
    what: str
    value: float              # bytes (floor) or percent (psi)
    limit: float
    sample: MemSample

    def observed(self) -> str:
        psi = (f"; memory PSI full avg10 {_pct(self.sample.psi_full)}, some {_pct(self.sample.psi_some)}"
               if self.sample.psi else "; no memory PSI on this kernel")
        if self.what == "floor":
            return (f"{self.node}: MemAvailable {self.value / GIB:.2f} GiB {self.t:.0f} s after launch, below the "
                    f"floor {self.limit / GIB:.2f} GiB (MEM_FLOOR_GIB){psi}")
        mem = self.sample.mem_available
        avail = f"MemAvailable {mem / GIB:.2f} GiB" if mem is not None else "MemAvailable unreadable"
        return (f"{self.node}: memory PSI full avg10 {self.value:.2f} % {self.t:.0f} s after launch, above "
                f"{self.limit:g} % (MEM_PSI_FULL_MAX): every task stalled on memory that share of the last 10 s; "
                f"{avail}")

    def to_record(self) -> dict[str, Any]:
        return {"node": self.node, "t": self.t, "what": self.what, "value": self.value, "limit": self.limit,
                "mem_available": self.sample.mem_available, "psi_full": self.sample.psi_full,
                "psi_some": self.sample.psi_some}


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f} %"


def limits(profile) -> tuple[int, float]:
    """(floor in bytes, PSI full avg10 ceiling in percent); 0 = that limit is off."""
    return int(profile.mem_floor_gib * GIB), float(profile.mem_psi_full_max)


def breach_of(node: str, t: float, sample: MemSample, floor: int, psi_max: float) -> Breach | None:
    """The limit this sample crosses, if any (the floor first: it is the one that says how close the host is)."""
    if floor and sample.mem_available is not None and sample.mem_available < floor:
        return Breach(node, t, "floor", sample.mem_available, floor, sample)
    if psi_max and sample.psi_full is not None and sample.psi_full > psi_max:
        return Breach(node, t, "psi", sample.psi_full, psi_max, sample)
    return None


def _own_connections(cluster: Cluster) -> tuple[Cluster, bool]:
    """The same nodes over connections of the guard's own (the start's belong to its thread), logging into the
    same command log; a cluster of test doubles (no connections) is used as it is. -> (cluster, owned)."""
    if not all(isinstance(n, Node) for n in cluster.nodes):
        return cluster, False
    nodes = [Node(n.spec, n.ssh, log=n.log, dry_run=n.dry_run, command_prefix=n.command_prefix) for n in cluster]
    return Cluster(nodes, log=cluster.log), True


class MemoryGuard:
    """Samples every rank's memory every ``period`` seconds on a thread of its own until ``close()``. The first
    sample that crosses a limit sets ``breach`` (and ``breached``), then ``on_breach(cluster, breach)`` runs on
    the guard's own connections (the start stops its ranks there); its return value is kept in ``stopped``, an
    exception it raised in ``stop_error``."""

    def __init__(self, cluster: Cluster, profile, t0: float, *, nodes: list[str] | None = None,
                 on_breach: Callable[[Cluster, Breach], Any] | None = None, period: float | None = None):
        self.profile, self.t0, self.period = profile, t0, MEM_POLL_S if period is None else period
        self.cluster, self._owned = _own_connections(cluster)
        self.nodes = [n for n in self.cluster.nodes if nodes is None or n.name in nodes]
        self.floor, self.psi_max = limits(profile)
        self.on_breach = on_breach
        self.samples: dict[str, list[list[float | None]]] = {n.name: [] for n in self.nodes}  # [t, bytes, some, full]
        self.misses: dict[str, int] = {n.name: 0 for n in self.nodes}
        self.breach: Breach | None = None
        self.breached = threading.Event()
        self.stopped: Any = None
        self.stop_error: BaseException | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="start-memory-guard", daemon=True)

    def start(self) -> "MemoryGuard":
        self._thread.start()
        return self

    def close(self, timeout: float = 180.0) -> None:
        """End the sampling (an abort's stop in progress is waited for) and close the guard's connections."""
        self._halt.set()
        self._thread.join(timeout=timeout)
        if self._owned:
            for n in self.cluster:
                n.close()

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``; return at once when a rank crosses a limit."""
        self.breached.wait(max(0.0, seconds))

    def sample_once(self) -> Breach | None:
        now = time.monotonic()
        got = self.cluster.each(ranks.mem_sample, self.nodes)
        t = round(now - self.t0, 1)
        found: Breach | None = None
        for name, s in got.items():
            if isinstance(s, Exception) or s.mem_available is None:
                self.misses[name] += 1
                continue
            self.samples[name].append([t, s.mem_available, s.psi_some, s.psi_full])
            found = found or breach_of(name, t, s, self.floor, self.psi_max)
        return found

    def _loop(self) -> None:
        while not self._halt.is_set():
            began = time.monotonic()
            found = self.sample_once()
            if found is not None:
                self.breach = found
                self.breached.set()
                if self.on_breach is not None:
                    try:
                        self.stopped = self.on_breach(self.cluster, found)
                    except BaseException as exc:  # noqa: BLE001 - the start reports it with the breach
                        self.stop_error = exc
                return
            self._halt.wait(max(0.1, self.period - (time.monotonic() - began)))

    # -- what the start records ------------------------------------------------------------------------
    def memory_profile(self) -> dict[str, list[list[float]]]:
        """node -> [[seconds from launch, MemAvailable bytes], ...] (the report's startup memory plot)."""
        return {n: [[s[0], s[1]] for s in rows] for n, rows in self.samples.items() if rows}

    def psi_profile(self) -> dict[str, list[list[float | None]]]:
        """node -> [[seconds from launch, PSI some avg10, PSI full avg10], ...] (nodes with PSI only)."""
        return {n: [[s[0], s[2], s[3]] for s in rows] for n, rows in self.samples.items()
                if any(s[3] is not None or s[2] is not None for s in rows)}

    def minimum(self, before: dict[str, int]) -> dict[str, dict[str, Any]]:
        """Per rank: the lowest MemAvailable and when, the value before launch, the highest PSI (None: no PSI)."""
        out: dict[str, dict[str, Any]] = {}
        for name, rows in self.samples.items():
            if not rows:
                out[name] = {"samples": 0, "misses": self.misses[name], "before": before.get(name)}
                continue
            low = min(rows, key=lambda s: s[1])
            full = [s[3] for s in rows if s[3] is not None]
            some = [s[2] for s in rows if s[2] is not None]
            out[name] = {"min_mem_available": int(low[1]), "min_at_s": low[0], "before": before.get(name),
                         "max_psi_full": max(full) if full else None, "max_psi_some": max(some) if some else None,
                         "psi": bool(full or some), "samples": len(rows), "misses": self.misses[name]}
        return out

    def record(self, before: dict[str, int]) -> dict[str, Any]:
        return {"period_s": self.period, "floor_gib": self.floor / GIB, "psi_full_max": self.psi_max,
                "expected": self.expected(),
                "breach": self.breach.to_record() if self.breach else None,
                "stop_error": str(self.stop_error)[:500] if self.stop_error else "",
                "minimum": self.minimum(before)}

    def last_seen(self, node: str) -> str:
        """The node's memory at its last sample and lowest, for a failure row that is not the guard's own (a rank
        the kernel's OOM killer ended shows as a rank that died): "" before any sample."""
        rows = self.samples.get(node) or []
        if not rows:
            return ""
        low = min(rows, key=lambda r: r[1])
        return (f"; MemAvailable {rows[-1][1] / GIB:.2f} GiB at the last sample ({rows[-1][0]:.0f} s), lowest "
                f"{low[1] / GIB:.2f} GiB ({low[0]:.0f} s)")

    def expected(self) -> str:
        floor = f"MemAvailable >= {self.floor / GIB:.2f} GiB (MEM_FLOOR_GIB)" if self.floor else "no floor"
        psi = f"memory PSI full avg10 <= {self.psi_max:g} % (MEM_PSI_FULL_MAX)" if self.psi_max else "no PSI ceiling"
        return f"{floor} and {psi} on every rank through the start, sampled every {self.period:g} s"

    def minimum_rows(self, before: dict[str, int]) -> list[Check]:
        """One row per rank: the lowest MemAvailable through the start against the floor (WARN at the breached
        rank: the start's failing row says why), with the highest memory PSI."""
        rows = []
        for name, m in self.minimum(before).items():
            if not m["samples"]:
                rows.append(check(MIN_ROW, False, node=name, warn_only=True,
                                  observed=f"no sample answered ({m['misses']} missed)",
                                  expected=f"a sample every {self.period:g} s", fix="check the node answers SSH"))
                continue
            psi = (f"; memory PSI full avg10 at most {_pct(m['max_psi_full'])}, some {_pct(m['max_psi_some'])}"
                   if m["psi"] else "; no memory PSI on this kernel (/proc/pressure/memory absent)")
            was = f" (before launch {m['before'] / GIB:.2f} GiB)" if m["before"] else ""
            low = m["min_mem_available"]
            rows.append(check(MIN_ROW, not self.floor or low >= self.floor, node=name, warn_only=True,
                              observed=f"{low / GIB:.2f} GiB at {m['min_at_s']:.0f} s after launch{was}{psi}; "
                                       f"{m['samples']} samples, every {self.period:g} s",
                              expected=(f">= {self.floor / GIB:.2f} GiB (MEM_FLOOR_GIB)" if self.floor
                                        else "recorded (MEM_FLOOR_GIB=0: no floor)"),
                              fix=FIX, data=m))
        return rows

    def breach_row_text(self) -> tuple[str, str, str, str]:
        """(what, node, observed, fix) of the start's failing row."""
        b = self.breach
        assert b is not None
        if self.stop_error is not None:
            how = f"the guard's stop failed ({self.stop_error}); the start stops them now"
        elif self.stopped is not None:
            how = "every rank stopped by the guard at once"
        else:            # the guard saw the breach but did not stop (it only stops during its own watch)
            how = "the start stops every rank now"
        what = (f"memory on {b.node} fell below the floor while starting: the start was aborted"
                if b.what == "floor" else
                f"memory pressure on {b.node} crossed the ceiling while starting: the start was aborted")
        return what, b.node, f"{b.observed()}; {how}. Cause: {CAUSE}", FIX


@dataclass
class PreLaunch:
    """Memory before a launch: MemAvailable per node (the baseline the stop compares with), the rows, and the
    refusal (the failing rows; empty = go)."""
    mem_before: dict[str, int] = field(default_factory=dict)
    samples: dict[str, MemSample] = field(default_factory=dict)
    rows: list[Check] = field(default_factory=list)
    refused: list[Check] = field(default_factory=list)


def pre_launch(cluster: Cluster, profile, homes: dict[str, str]) -> PreLaunch:
    """Read every node's memory and the record a previous stop left. Refuse to launch on a node whose
    MemAvailable is still below the baseline that record holds (minus its tolerance: the memory a failed start
    pinned is not back) or below MEM_FLOOR_GIB already; a record whose memory is back is removed."""
    out = PreLaunch()
    floor, _ = limits(profile)
    states = cluster.each(lambda n: ranks.memory_state(n, profile, homes.get(n.name) or "/root"))
    for name, st in states.items():
        if isinstance(st, Exception):        # the launch fails on an unreachable node by itself
            continue
        out.samples[name] = st.sample
        live = st.sample.mem_available
        if live is None:
            continue
        out.mem_before[name] = live
        pin = st.pin or {}
        baseline = pin.get("baseline")
        if st.pin is not None and isinstance(baseline, int):
            tol = pin.get("tolerance") if isinstance(pin.get("tolerance"), int) else tolerance(baseline)
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(pin["stopped_at"])) \
                if isinstance(pin.get("stopped_at"), (int, float)) else "?"
            run = f" of run {pin['run_id']}" if pin.get("run_id") else ""
            if live < baseline - tol:
                out.refused.append(check(
                    POOL_ROW, False, node=name,
                    observed=(f"MemAvailable {live / GIB:.2f} GiB on {name}, {(baseline - live) / GIB:.2f} GiB below "
                              f"the {baseline / GIB:.2f} GiB it had before the last start{run} (stopped {when}; "
                              f"{(pin.get('after') or 0) / GIB:.2f} GiB right after that stop): memory a failed "
                              "start pinned is still held, a launch now would start into a smaller pool"),
                    expected=f">= {(baseline - tol) / GIB:.2f} GiB (that baseline - {tol / GIB:.2f} GiB)",
                    fix=(f"reboot {name} (sudo reboot): only a reboot frees memory a failed start pinned; if that "
                         f"memory is in use on purpose, remove the record ({st.pin_path}) and start again"),
                    data={"live": live, "baseline": baseline, "tolerance": tol, "record": st.pin_path}))
                continue
            cluster[name].run(f"rm -f {quote(st.pin_path)}", timeout=30)
            out.rows.append(check(POOL_ROW, True, node=name,
                                  observed=f"MemAvailable {live / GIB:.2f} GiB, back to the {baseline / GIB:.2f} GiB "
                                           f"before the last start{run} (its record removed)",
                                  expected=f">= {(baseline - tol) / GIB:.2f} GiB"))
        elif st.pin is not None:
            out.rows.append(check(POOL_ROW, False, node=name, warn_only=True,
                                  observed=f"a record without a baseline at {st.pin_path}: {st.pin}",
                                  expected="the JSON a stop writes", fix=f"remove {st.pin_path}"))
        if floor and live < floor:
            out.refused.append(check(
                FLOOR_ROW, False, node=name,
                observed=f"MemAvailable {live / GIB:.2f} GiB on {name} before anything started",
                expected=f">= {floor / GIB:.2f} GiB (MEM_FLOOR_GIB) before launch: the start only takes more",
                fix=("free memory on the node first (ps aux --sort=-rss | head; leftovers of an earlier start: "
                     "python -m runbook stop; page cache: sync; echo 3 | sudo tee /proc/sys/vm/drop_caches)"),
                data={"live": live, "floor": floor}))
    return out
