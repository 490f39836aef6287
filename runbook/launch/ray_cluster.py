"""The Ray cluster of ``EXECUTOR=ray``: started on every node (the head's GCS first), watched until ``ray status``
shows every node with its GPU, read back as a node table, and stopped after vLLM.

    up = start_cluster(nodes, plan, timeout=120)    # RayUp: rows, the status, seconds; names a node never joined
    table = node_table(nodes, plan)                 # RayStatus of now (what `status` shows)
    down = stop_cluster(nodes, plan)                # each node's Ray, after its vLLM

``nodes`` maps a node name to what runs its commands (``remote.Cluster`` or, for the netns test,
``lab.switchlab.NetnsNode``): ``.run(command, timeout=)`` and ``.read(command, timeout=)``. What each node runs is
the plan's (``render.RankLaunch.ray_start_command`` etc.); the parser is ``facts/ray.py``.

On the lab's CPU vLLM ``vllm serve --distributed-executor-backend ray`` dies without a lab-only substitution
(``profile.rules.RAY_CPU_ERROR``; ``runbook/lab/ray_cpu_site`` gives the CPU platform its Ray device key), so
``validate``/``start`` refuse EXECUTOR=ray on the lab when it or the lab's Ray is missing; ``substitution_check`` is
step 04's row that every rank's process ran it (its line in the head's log, Ray forwarding the actors' lines).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..checks import Check, check
from ..facts import ray as ray_facts
from ..profile.rules import LAB_RAY_CPU_MARKER, LAB_RAY_CPU_SITE, LAB_RAY_CPU_WHY
from .render import LaunchPlan, flag_value

__all__ = ["RayUp", "node_table", "start_cluster", "stop_cluster", "substitution_check"]

SUBSTITUTION_ROW = "lab substitution: CPU vLLM's Ray device key"

JOIN_ROW = "ray cluster: every node joined"
JOIN_TIMEOUT_S = 300       # a start waits this long (at most READY_TIMEOUT) for every node to join
GCS_ROW = "ray head up (GCS answers)"


@dataclass
class RayUp:
    checks: list[Check] = field(default_factory=list)
    status: ray_facts.RayStatus = field(default_factory=ray_facts.RayStatus)
    status_text: str = ""
    seconds: dict[str, float] = field(default_factory=dict)     # head_gcs, all_joined (from the first start)
    start_output: dict[str, str] = field(default_factory=dict)  # node -> what its start command printed

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)


def _names(plan: LaunchPlan) -> list[str]:
    return [r.node for r in plan.ranks]


def node_table(nodes: Mapping[str, Any], plan: LaunchPlan, timeout: float = 60) -> tuple[ray_facts.RayStatus, str]:
    """``ray status`` on the head, parsed (read-only): which of the plan's nodes are in the cluster now."""
    res = nodes[plan.head.node].read(plan.head.ray_status_command(), timeout=timeout)
    text = (res.stdout or "") + (res.stderr or "")
    return (ray_facts.parse_status(text) if res.ok else ray_facts.RayStatus()), text


def _wait(nodes, plan, deadline: float, poll: float, done) -> tuple[ray_facts.RayStatus, str, bool]:
    st, text = node_table(nodes, plan)
    while not done(st) and time.monotonic() < deadline:
        time.sleep(poll)
        st, text = node_table(nodes, plan)
    return st, text, done(st)


def start_cluster(nodes: Mapping[str, Any], plan: LaunchPlan, *, timeout: float = 120, poll: float = 2.0) -> RayUp:
    """Start Ray on the head and wait for its GCS, then on every worker, then wait until ``ray status`` shows
    every node and one GPU per node. A node that has not joined by ``timeout`` is named (FAIL), with the status."""
    out = RayUp()
    names = _names(plan)
    t0 = time.monotonic()
    head = plan.head
    res = nodes[head.node].run(head.ray_start_command(), timeout=120)
    out.start_output[head.node] = (res.stdout or "") + (res.stderr or "")
    st, text, up = _wait(nodes, plan, t0 + timeout, poll, lambda s: bool(s.active))
    out.seconds["head_gcs"] = round(time.monotonic() - t0, 1)
    out.checks.append(check(GCS_ROW, up, node=head.node,
                            observed=(f"GCS at {head.ray_status_command().split('--address ')[-1].split()[0]} "
                                      f"answers after {out.seconds['head_gcs']} s" if up else
                                      f"no answer after {timeout:.0f} s: {text.strip()[-300:]}"),
                            expected="ray status answers on the head",
                            fix=f"read the head's Ray log ({head.ray_log_path}; session logs "
                                f"{ray_facts.logs_dir(head.node)}): python -m runbook logs head"))
    if not up:
        out.status, out.status_text = st, text
        return out
    for r in plan.workers:
        res = nodes[r.node].run(r.ray_start_command(), timeout=120)
        out.start_output[r.node] = (res.stdout or "") + (res.stderr or "")
    st, text, joined = _wait(nodes, plan, t0 + timeout, poll, lambda s: s.complete(names))
    out.seconds["all_joined"] = round(time.monotonic() - t0, 1)
    out.status, out.status_text = st, text
    missing = st.missing(names)
    out.checks.append(check(
        JOIN_ROW, joined, node="cluster", data={"joined": st.joined(names), "missing": missing, "gpus": st.gpus},
        observed=(f"{st.describe(names)} after {out.seconds['all_joined']} s" if joined else
                  f"after {timeout:.0f} s: {st.describe(names)}"),
        expected=f"{len(names)} active nodes ({', '.join(names)}) and {len(names)} GPU in `ray status`",
        fix=("" if joined else
             f"on {', '.join(missing) or 'the node(s) short of a GPU'}: read its Ray log and session logs "
             f"(python -m runbook logs <node>); check it reaches the head's GCS at "
             f"{flag_value_address(plan)} over the fabric (firewall, --node-ip-address, the same Ray on every "
             "node); diagnose: ray-node-not-joined")))
    return out


def flag_value_address(plan: LaunchPlan) -> str:
    h = plan.head.ray_argv
    return f"{flag_value(h, '--node-ip-address')}:{flag_value(h, '--port')}"


def stop_cluster(nodes: Mapping[str, Any], plan: LaunchPlan, *, grace: int = 30) -> list[Check]:
    """End every node's Ray (head first, after the caller stopped vLLM), each proven gone from its pid file's group
    or container. Returns one row per node."""
    rows = []
    for r in plan.ranks:
        t0 = time.monotonic()
        res = nodes[r.node].run(r.ray_stop_command(grace), timeout=grace + 60, warn=True)
        left = nodes[r.node].read(r.ray_left_command(), timeout=30)
        gone = res.ok and not (left.stdout or "").strip()
        if gone and r.runtime == "process":
            nodes[r.node].run(f"rm -f {r.ray_pid_path}", timeout=30)
        rows.append(check("ray stopped", gone, node=r.node,
                          observed=(f"gone after {time.monotonic() - t0:.1f} s" if gone else
                                    f"left: {(left.stdout or res.stderr or '').strip()[:300]}"),
                          expected="no Ray process of this node left",
                          fix=f"on {r.node}: {r.ray_stop_command(grace)}"))
    return rows


def substitution_check(profile, plan: LaunchPlan, head_log: str, *, reused: bool = False) -> Check | None:
    """LAB ONLY (``EXECUTOR=ray`` with ``LAB=1``): the lab-only substitution ran in the head's serve and in a Ray
    actor on every node: :data:`LAB_RAY_CPU_MARKER` in the head's log, once without an ``ip=`` prefix (the head's own
    processes) and once per worker behind Ray's ``ip=<its host_ip>`` prefix. ``None`` elsewhere. A row that names the
    substitution and its reason, so the run's evidence says the lab did not serve vLLM's CPU build unchanged; a
    marker not seen is a WARN (a reused server's lines may have rotated out)."""
    if not (profile.lab and plan.head.executor == "ray"):
        return None
    lines = [ln for ln in head_log.splitlines() if LAB_RAY_CPU_MARKER in ln]
    seen = {r.node: any((f"ip={r.env.get('VLLM_HOST_IP', '')})" in ln) if r.rank else ("ip=" not in ln)
                        for ln in lines) for r in plan.ranks}
    missing = [n for n, ok in seen.items() if not ok]
    return check(SUBSTITUTION_ROW, not missing, node="cluster", warn_only=True,
                 observed=(f"ran on {', '.join(seen)} ({len(lines)} process(es) patched): {LAB_RAY_CPU_WHY}"
                           if not missing else f"its line not seen for {', '.join(missing)} in the head's log"
                           + (" (reused server: the lines may have rotated out)" if reused else "")),
                 expected=f"every node's vLLM process reports {LAB_RAY_CPU_SITE}/sitecustomize.py's line",
                 fix=("" if not missing else f"check the Ray processes' PYTHONPATH holds {LAB_RAY_CPU_SITE} "
                      "(the node's `ray start` line) and read the head's log"),
                 data={"patched_processes": len(lines), "nodes": seen})
