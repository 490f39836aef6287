"""Stop the ranks and prove the teardown: head first, then the worker(s); on each node no vLLM process or
container left, and MemAvailable back near its value before the launch.

    result = stop(cluster, profile)                     # StopResult: checks, per-node before/after

Memory a failed start pinned is often freed only by a reboot (field reports: vLLM #45179, ~33 GB per failed
run). When MemAvailable is not back within ``mem_settle_s`` the row fails with "reboot needed" and a record is
left in the rank's state dir (``ranks.PIN_SUFFIX``): the next start reads it and refuses to launch into the
smaller pool while the memory stays below it (``memguard.pre_launch``). A stop told not to wait
(``mem_settle_s=0``: the cleanup of a failed start) checks once, warns, and leaves the record all the same.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..facts import ranks
from ..checks import Check, CheckList, check, not_applicable
from ..remote import Cluster, Node, quote
from .render import NodeFacts, render

__all__ = [
    "MEM_ROW",
    "StopResult",
    "stop",
    "tolerance",
]

GIB = 1024 ** 3


@dataclass
class StopResult:
    checks: CheckList = field(default_factory=CheckList)
    per_node: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.checks.failures()


def _stop_node(node: Node, profile, grace: float) -> tuple[list[Check], dict[str, Any]]:
    t0 = time.monotonic()
    home = node.read("printf %s \"$HOME\"").stdout.strip() or "/root"
    st = ranks.rank_state(node, profile, home)
    info: dict[str, Any] = {"before": st.describe(), "processes_before": st.processes}
    container = profile.container_on(node.name)
    sd = ranks.state_dir(profile, home)
    ray = _ray_rank(profile, node.name, home)
    if ray is not None and ray.runtime == "docker" and st.container_status:
        # EXECUTOR=ray: vLLM first (the head's serve, exec'd in the container), then the node's Ray, then the container
        if ray.serves:
            node.run(f"docker exec {quote(container)} sh -c "
                     + quote(f"p=$(cat {ray.pid_path} 2>/dev/null) && kill -TERM $p 2>/dev/null; i=0; "
                             f"while [ -n \"$p\" ] && kill -0 $p 2>/dev/null && [ $i -lt {int(grace)} ]; do "
                             f"sleep 1; i=$((i+1)); done; true") + " 2>/dev/null; true", timeout=grace + 60)
        node.run(ray.ray_stop_command(int(grace)), timeout=grace + 60)
    # containers: stop (SIGTERM, grace) then remove
    if st.container_status:
        node.run(f"docker stop -t {int(grace)} {quote(container)} >/dev/null 2>&1; "
                 f"docker rm -f {quote(container)} >/dev/null 2>&1; true", timeout=grace + 60)
    # process runtime: SIGTERM the rank's process group (the headless rank does not exit on its own), as Ctrl-C
    # does in a terminal: every process gets it at once, so the executor does not spend its shutdown grace waiting
    # for workers nobody told to stop, and what a killed main pid left (EngineCore, workers) gets it too
    # (the pid file's group only while a vLLM process is in it: a pid file outlives its rank -- a reboot, a lab
    # rebuilt after its nodes died -- and by then its number may be an sshd session's or dockerd's group)
    pid = st.pid or (st.record.get("pid") if st.record else None)
    group = int(pid) if pid and any(p[1] == int(pid) for p in _ours(node, pid)) else None
    signalled = bool(group) and "sent" in node.run(f"kill -TERM -- -{group} 2>/dev/null && echo sent; true",
                                                   timeout=30).stdout
    left = _our_left(node, group)
    if left and not signalled:
        # no group to signal (no pid file, or every member gone but strays): those get theirs now, not after a
        # grace spent waiting for processes that were never told to stop
        node.run(f"kill -TERM {' '.join(str(p) for p in left)} 2>/dev/null; true", timeout=30)
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = _our_left(node, group)
    for sig, wait in (("TERM", 5.0), ("KILL", 5.0)):
        if not left:
            break
        node.run(f"kill -{sig} {' '.join(str(p) for p in left)} 2>/dev/null; "
                 + (f"kill -{sig} -- -{group} 2>/dev/null; " if group else "") + "true", timeout=30)
        end = time.monotonic() + wait
        while left and time.monotonic() < end:
            time.sleep(0.5)
            left = _our_left(node, group)
    ray_left = ""
    if ray is not None and ray.runtime == "process":       # then the node's Ray: its `ray start` process group
        node.run(ray.ray_stop_command(int(grace)), timeout=grace + 60)
        ray_left = node.read(ray.ray_left_command(), timeout=30).stdout.strip()
        if not ray_left:
            node.run(f"rm -f {quote(ray.ray_pid_path)}", timeout=30)
    node.run(f"rm -f {quote(sd + '/' + node.name + '.pid')} {quote(sd + '/' + node.name + '.fingerprint')} "
             f"{quote(sd + '/' + node.name + '.json')}; true", timeout=30)
    after = ranks.rank_state(node, profile, home)
    gone = not after.processes and not after.container_status and not ray_left
    info["after"] = after.describe()
    info["stop_s"] = round(time.monotonic() - t0, 1)
    checks = [check("no vLLM process or container left", gone, node=node.name,
                    observed=(f"gone after {info['stop_s']} s (was: {info['before']})" if gone else
                              f"left: {'; '.join(after.processes[:4])} {after.container_status} "
                              f"{('Ray: ' + ray_left[:300]) if ray_left else ''}".rstrip()),
                    expected="nothing", fix=f"kill the listed pids / docker rm -f {container} on {node.name}")]
    info["mem_available_before"] = (st.record or {}).get("mem_available_before")
    info["run_id"] = (st.record or {}).get("run_id") or ""
    info["pin_path"] = ranks.pin_path(profile, home, node.name)
    return checks, info


def _ray_rank(profile, name: str, home: str):
    """The node's rendered launch under EXECUTOR=ray (its Ray commands and pid file), None under mp."""
    if profile.executor != "ray":
        return None
    return render(profile, {n.name: NodeFacts(home=home) for n in profile.nodes}).rank(name)


MEM_ROW = "MemAvailable back to its pre-launch value"


def tolerance(before: int) -> int:
    """How far below its pre-launch value MemAvailable may stay after a stop: max(2 GiB, 5 %). A failed start
    that pins memory holds the model's weights (tens of GiB on a Spark; the lab's two tiny CPU ranks hold more
    than 2 GiB with their 1 GiB KV pools each), while what moves on its own is page cache the kernel has not
    reclaimed yet and, on the lab, whatever else runs on the one host whose MemAvailable every lab node reads."""
    return max(2 * GIB, int(before * 0.05))


def _mem_check(node: Node, info: dict[str, Any], settle_s: float, *, shared: bool = False
               ) -> tuple[Check, int | None]:
    """MemAvailable back near the value recorded before launch (after every rank is gone: the lab's
    nodes share one kernel, so MemAvailable is host-wide there). Not back after ``settle_s``: FAIL, reboot
    needed, and the record the next start refuses on; ``settle_s=0``: checked once, WARN, the record too.
    ``shared``: ranks on other nodes still run on the same host (the lab, some nodes stopped): WARN, no record."""
    before = info.get("mem_available_before")
    if not before:
        return not_applicable(MEM_ROW, "no start record on this node (not started by the runbook)",
                              node=node.name), None
    end = time.monotonic() + settle_s
    tol = tolerance(before)
    now_avail = ranks.mem_available(node)
    while now_avail < before - tol and time.monotonic() < end:
        time.sleep(2.0)
        now_avail = ranks.mem_available(node)
    back = now_avail >= before - tol
    pin = info.get("pin_path") or ""
    data = {"before": before, "after": now_avail, "tolerance": tol, "pin": "" if back else pin}
    expected = f">= {(before - tol) / GIB:.2f} GiB (before launch - max(2 GiB, 5 %))"
    if back:
        if pin:
            node.run(f"rm -f {quote(pin)}", timeout=30)     # an earlier stop's record: the memory is back now
        return check(MEM_ROW, True, node=node.name, expected=expected, data=data,
                     observed=f"{now_avail / GIB:.2f} GiB (before launch {before / GIB:.2f} GiB)"), now_avail
    if pin and not shared:
        rec = {"baseline": before, "after": now_avail, "tolerance": tol, "stopped_at": time.time(),
               "run_id": info.get("run_id") or "", "settled_s": settle_s}
        node.run(f"mkdir -p {quote(pin.rsplit('/', 1)[0])} && printf '%s\\n' {quote(json.dumps(rec))} "
                 f"> {quote(pin)}", timeout=30)
    held = (before - now_avail) / GIB
    observed = (f"{now_avail / GIB:.2f} GiB (before launch {before / GIB:.2f} GiB): {held:.2f} GiB still held "
                f"with every rank stopped")
    fix = (f"find a holder first (ps aux --sort=-rss | head; docker ps -a); if there is none, the memory a "
           f"failed start pinned comes back only with a reboot: reboot {node.name} (sudo reboot). Until the "
           f"memory is back the next start refuses to launch into the smaller pool (record: {pin})")
    if shared:
        return check(MEM_ROW, False, node=node.name, warn_only=True, expected=expected, data=data,
                     observed=observed + " (the lab's nodes share one host's memory and ranks on other nodes "
                                         "still run: not a leak by itself)", fix="stop every node, then compare"), \
            now_avail
    if settle_s <= 0:
        return check(MEM_ROW, False, node=node.name, warn_only=True, expected=expected, data=data,
                     observed=observed + " (checked at once, right after the stop; the next start checks "
                                         "again and refuses while it stays low)", fix=fix), now_avail
    return check(MEM_ROW, False, node=node.name, expected=expected, data=data,
                 observed=f"{observed} after {settle_s:.0f} s: reboot needed", fix=fix), now_avail


def _ours(node: Node, pid: int | None, group_is_ours: bool = False) -> list[tuple[int, int, str, str]]:
    """The node's vLLM processes and the members of group ``pid`` while a vLLM process is in it (ranks.vllm_procs)."""
    return ranks.vllm_procs(ranks.parse_ps(node.read(ranks.PS_CMD).stdout), pgid=int(pid) if pid else None,
                            group_is_ours=group_is_ours)


def _our_left(node: Node, group: int | None) -> list[int]:
    """What is left of a stop's processes: ``group`` was seen holding a vLLM process when the stop began, so every
    member counts until the group is empty (make test met a worker rank killed mid-boot whose spawned child was
    not yet named VLLM::Worker when the named ones died, and was left running once it took the name)."""
    return [p[0] for p in _ours(node, group, group_is_ours=bool(group))]


def stop(cluster: Cluster, profile, nodes: list[str] | None = None, *, grace: float = 30.0,
         mem_settle_s: float = 20.0, first: str = "", together: bool = False) -> StopResult:
    """Stop the head, then the worker(s) (the headless rank does not exit with the head: it is
    stopped explicitly), and prove teardown on each node. Returns the rows and per-node facts; the step's
    entry records them. ``first``: a node stopped before the others (the memory guard's: the rank that crossed
    the floor); memory is checked only once every node is stopped. ``together``: every node at once (a failed
    start's cleanup: booting ranks ignore SIGTERM, so one node after the other costs one grace per node)."""
    result = StopResult()
    order = [n for n in cluster.nodes if nodes is None or n.name in nodes]
    order.sort(key=lambda n: n.name != first)       # stable: rank order otherwise
    if cluster.head.dry_run:
        result.checks.add(not_applicable("server stopped", "dry run: nothing stopped", node="cluster"))
        return result
    at_once = cluster.each(lambda n: _stop_node(n, profile, grace), order) if together else {}
    for node in order:        # head first (rank order), one at a time like the seeds
        try:
            got = at_once[node.name] if together else _stop_node(node, profile, grace)
            if isinstance(got, Exception):
                raise got
            checks, info = got
        except Exception as exc:  # noqa: BLE001 - report per node, keep stopping the others
            checks, info = [check("no vLLM process or container left", False, node=node.name,
                                  observed=f"stop failed: {exc}"[:500], expected="nothing",
                                  fix="check the node is reachable; stop it by hand")], {}
        result.checks.add(checks)
        result.per_node[node.name] = info
    # the lab's nodes read one host's MemAvailable: with ranks left on other nodes it cannot come back
    shared = bool(profile.is_lab or profile.lab) and len(order) < len(cluster.nodes)
    for node in order:
        info = result.per_node.get(node.name, {})
        try:
            c, after = _mem_check(node, info, mem_settle_s, shared=shared)
        except Exception as exc:  # noqa: BLE001
            c, after = check(MEM_ROW, False, node=node.name, warn_only=True,
                             observed=f"cannot read: {exc}"[:300]), None
        info["mem_available_after"] = after
        result.checks.add(c)
    return result
