"""What the server is doing now, read without changing anything: both ranks' state with the head's
``/health`` and ``/v1/models`` (``status``), and one rank's log tail (``logs``).

    status(cluster, profile); logs(cluster, profile, "worker", tail_lines=100)
"""
from __future__ import annotations

from typing import Any

from ..facts import ranks
from .readiness import api_get, models_ok
from ..api.endpoint import api_address, base_url
from ..errors import ExitStatus
from ..remote import Cluster, operator_ssh, quote
from . import ray_cluster
from .render import NodeFacts, render

__all__ = [
    "VERDICT_EXIT",
    "is_up",
    "logs",
    "status",
    "table",
    "verdict",
]


# each verdict's exit code (README's table): scripts tell a frozen rank from a stopped server without parsing
VERDICT_EXIT = {
    "up": ExitStatus.OK,
    "stopped": ExitStatus.SERVER_DOWN,
    "partial": ExitStatus.SERVER_PARTIAL,
    "frozen": ExitStatus.SERVER_FROZEN,
    "orphaned": ExitStatus.SERVER_ORPHANED,
    "unknown": ExitStatus.REMOTE_FAILED,
}


def status(cluster: Cluster, profile) -> dict[str, Any]:
    """Every rank's state, the head's /health and /v1/models."""
    states = cluster.each(lambda n: ranks.rank_state(n, profile))
    out: dict[str, Any] = {"nodes": {}}
    for name, st in states.items():
        rank = next((n.rank for n in profile.nodes if n.name == name), None)
        out["nodes"][name] = ({"rank": rank, "error": str(st), "fix": getattr(st, "fix", "")}
                              if isinstance(st, Exception) else
                              {"rank": rank, "state": st.describe(), "running": st.running, "runtime": st.runtime,
                               "pid": st.pid, "container": st.container_status, "fingerprint": st.fingerprint,
                               "vllm_processes": st.processes, "frozen": st.stopped})
    out["base_url"] = api_address(profile)
    head = profile.nodes[0].name
    if profile.executor == "ray" and "error" not in out["nodes"].get(head, {}):
        out["ray"] = ray_table(cluster, profile)
        for name, v in out["nodes"].items():     # a Ray worker runs no vLLM of its own: it runs when it joined
            if name != head and "error" not in v:
                joined = name in out["ray"]["joined"]
                v["running"], v["state"] = joined, ("in the Ray cluster" if joined else "not in the Ray cluster")
    if "error" in out["nodes"].get(head, {}):
        # the API is reached over an SSH forward to the head (or on the head): not tried when the head cannot be
        # read, so the head's own error (a changed host key, refused auth) is what status reports, not the forward's
        out["health"], out["models"] = None, ""
        return out
    url = base_url(profile)
    from ..secrets import load_secrets
    key = load_secrets().api_key
    code, _ = api_get(url, "/health", key, timeout=3)
    mcode, mtext = api_get(url, "/v1/models", key, timeout=3) if code == 200 else (0, "")
    out["base_url"] = api_address(profile)
    out["health"] = code
    out["models"] = models_ok(mtext, profile)[1] if mcode == 200 else ""
    return out


def ray_table(cluster: Cluster, profile) -> dict[str, Any]:
    """EXECUTOR=ray: Ray's node table from ``ray status`` on the head (read-only): which nodes joined, which not."""
    home = cluster.head.read("printf %s \"$HOME\"").stdout.strip() or "/root"
    plan = render(profile, {n.name: NodeFacts(home=home) for n in profile.nodes})
    st, text = ray_cluster.node_table(cluster, plan)
    names = [n.name for n in profile.nodes]
    return {"joined": st.joined(names), "missing": st.missing(names), "active": len(st.active), "gpus": st.gpus,
            "line": st.describe(names) if st.active else f"no answer from ray status ({text.strip()[-200:]})"}


def is_up(state: dict[str, Any]) -> bool:
    """A :func:`status` answer says the server is up: every rank running, none frozen, the head's /health 200."""
    nodes = state.get("nodes") or {}
    return (bool(nodes) and all(n.get("running") and not n.get("frozen") for n in nodes.values())
            and state.get("health") == 200)


def _pids(entries: list[str]) -> str:
    return " ".join(e.split(None, 1)[0] for e in entries)


def verdict(state: dict[str, Any], profile) -> tuple[str, str]:
    """One word and one line for a :func:`status` answer, with what to do:
    ``up`` (every rank running, none frozen, /health 200), ``frozen`` (a rank's vLLM process in state T),
    ``orphaned`` (vLLM processes or containers on a node and no rank running anywhere), ``stopped`` (nothing
    of the server on any node), ``partial`` (anything between), ``unknown`` (a node could not be read).
    Each word's exit code: :data:`VERDICT_EXIT`."""
    nodes = state.get("nodes") or {}
    source = profile.source or "<profile>"
    stop = f"python -m runbook stop --profile {source}"
    start = f"python -m runbook start --profile {source}"
    health = state.get("health")
    health_text = f"/health {health or 'no answer'}"
    unread = [n for n, v in nodes.items() if "error" in v]
    if unread:
        first = nodes[unread[0]]
        fix = f"{first['fix']}; then " if first.get("fix") else ""
        return "unknown", (f"verdict: unknown -- cannot read {', '.join(unread)} ({first['error'].splitlines()[0][:200]}); "
                           f"{health_text}; fix: {fix}check that node answers: {operator_ssh(profile, unread[0])} true")
    frozen = {n: v["frozen"] for n, v in nodes.items() if v.get("frozen")}
    if frozen:
        where = "; ".join(f"{n}: {len(p)} process(es) ({_pids(p)})" for n, p in frozen.items())
        cont = "; ".join(f"{operator_ssh(profile, n)} kill -CONT {_pids(p)}" for n, p in frozen.items())
        first = next(iter(frozen.items()))
        return "frozen", (f"verdict: frozen -- stopped vLLM process(es), state T (SIGSTOP/SIGTSTP or a debugger): "
                          f"{where}; {health_text}; fix: if nobody is debugging it (a non-zero TracerPid in "
                          f"/proc/<pid>/status names the debugger: {operator_ssh(profile, first[0])} grep TracerPid "
                          f"/proc/{_pids(first[1]).split()[0]}/status), continue them: {cont}; "
                          f"then run status again, or restart: {stop}, then {start}")
    if is_up(state):
        return "up", f"verdict: up -- every rank running ({', '.join(nodes)}), /health 200 at {state.get('base_url')}"
    running = [n for n, v in nodes.items() if v.get("running")]
    leftovers = [n for n, v in nodes.items() if not v.get("running") and (v.get("vllm_processes") or v.get("container"))]
    left_text = "left behind: " + "; ".join(
        f"{n} ({len(nodes[n].get('vllm_processes') or [])} vLLM process(es)"
        + (f", container {nodes[n]['container']}" if nodes[n].get("container") else "") + ")" for n in leftovers)
    if not running and not leftovers and health != 200:
        return "stopped", (f"verdict: stopped -- no rank and no vLLM process on {', '.join(nodes) or 'any node'}; "
                           f"start it: {start}")
    if not running and leftovers:
        return "orphaned", (f"verdict: orphaned -- no rank running; {left_text}; {health_text}; "
                            f"fix: {stop} (it stops what the ranks left), then {start}")
    parts = []
    if running:
        parts.append(f"running: {', '.join(running)}")
    down = [n for n in nodes if n not in running]
    if down:
        parts.append(f"not running: {', '.join(down)}")
    if leftovers:
        parts.append(left_text)
    parts.append(health_text)
    fix = (f"wait and run status again (the API is still loading), or read `python -m runbook logs`; if it stays so: "
           f"{stop}" if not down and not leftovers else f"{stop}, then {start}")
    return "partial", f"verdict: partial -- {'; '.join(parts)}; fix: {fix}"


def table(state: dict[str, Any]) -> list[str]:
    """The short table ``status`` prints: one line per node (rank, state) and the API's answer."""
    nodes = state.get("nodes") or {}
    rows = [("node", "rank", "state")]
    for name, v in nodes.items():
        rank = "" if v.get("rank") is None else str(v["rank"])
        rows.append((name, rank, (v.get("error") or "?").splitlines()[0][:100] if "error" in v else v.get("state", "")))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]}" for r in rows]
    health = state.get("health")
    if state.get("ray"):
        lines.append(f"ray: {state['ray']['line']}")
    lines.append(f"api {state.get('base_url')}: /health {health or 'no answer'}"
                 + (f"; {state['models']}" if state.get("models") else ""))
    return lines


def logs(cluster: Cluster, profile, node: str = "head", tail_lines: int = 100) -> str:
    """The last lines of one rank's log (process log file or docker logs); under EXECUTOR=ray also that node's
    ``ray start`` log and the tails of its Ray session logs (raylet, GCS, the Ray workers' stderr)."""
    n = cluster[node]
    home = n.read("printf %s \"$HOME\"").stdout.strip() or "/root"
    sd = ranks.state_dir(profile, home)
    container = profile.container_on(node)
    res = n.read(f"if docker inspect {quote(container)} >/dev/null 2>&1; then "
                 f"docker logs --tail {int(tail_lines)} {quote(container)} 2>&1; "
                 f"else tail -n {int(tail_lines)} {quote(sd + '/' + node + '.log')} 2>&1; fi", timeout=60)
    if profile.executor != "ray":
        return res.stdout
    rank = render(profile, {s.name: NodeFacts(home=home) for s in profile.nodes}).rank(node)
    ray = n.read(f"tail -n {int(tail_lines)} {quote(rank.ray_log_path)} 2>/dev/null; "
                 + rank.ray_logs_command(tail_lines), timeout=60)
    return res.stdout + f"\n==> Ray on {node} <==\n" + ray.stdout
