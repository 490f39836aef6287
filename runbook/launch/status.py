"""What the server is doing now, read without changing anything: both ranks' state with the head's
``/health`` and ``/v1/models`` (``status``), and one rank's log tail (``logs``).

    status(cluster, profile); logs(cluster, profile, "worker", tail_lines=100)
"""
from __future__ import annotations

from typing import Any

from ..facts import ranks
from .readiness import api_get, models_ok
from ..api.endpoint import api_address, base_url
from ..remote import Cluster, quote

__all__ = [
    "is_up",
    "logs",
    "status",
    "verdict",
]


def status(cluster: Cluster, profile) -> dict[str, Any]:
    """Both ranks' state, the head's /health and /v1/models."""
    states = cluster.each(lambda n: ranks.rank_state(n, profile))
    out: dict[str, Any] = {"nodes": {}}
    for name, st in states.items():
        out["nodes"][name] = ({"error": str(st)} if isinstance(st, Exception) else
                              {"state": st.describe(), "running": st.running, "runtime": st.runtime,
                               "pid": st.pid, "container": st.container_status, "fingerprint": st.fingerprint,
                               "vllm_processes": st.processes})
    url = base_url(profile)
    from ..secrets import load_secrets
    key = load_secrets().api_key
    code, _ = api_get(url, "/health", key, timeout=3)
    mcode, mtext = api_get(url, "/v1/models", key, timeout=3) if code == 200 else (0, "")
    out["base_url"] = api_address(profile)
    out["health"] = code
    out["models"] = models_ok(mtext, profile)[1] if mcode == 200 else ""
    return out


def is_up(state: dict[str, Any]) -> bool:
    """A :func:`status` answer says the server is up: every rank running and the head's /health 200."""
    nodes = state.get("nodes") or {}
    return bool(nodes) and all(n.get("running") for n in nodes.values()) and state.get("health") == 200


def verdict(state: dict[str, Any], profile) -> tuple[str, str]:
    """One word and one line for a :func:`status` answer: ``up`` (every rank running, /health 200), ``stopped``
    (nothing of the server on any node), ``partial`` (anything between: some ranks, orphaned vLLM processes,
    a stopped rank left behind, or every rank running while the API does not answer 200), each with what to do."""
    nodes = state.get("nodes") or {}
    source = profile.source or "<profile>"
    stop = f"python -m runbook stop --profile {source}"
    if is_up(state):
        return "up", f"verdict: up -- every rank running ({', '.join(nodes)}), /health 200 at {state.get('base_url')}"
    unread = [n for n, v in nodes.items() if "error" in v]
    running = [n for n, v in nodes.items() if v.get("running")]
    leftovers = [n for n, v in nodes.items() if not v.get("running") and (v.get("vllm_processes") or v.get("container"))]
    health = state.get("health")
    if unread:
        return "partial", (f"verdict: unknown -- cannot read {', '.join(unread)} ({nodes[unread[0]]['error'][:160]}); "
                           f"/health {health or 'no answer'}")
    if not running and not leftovers and health != 200:
        return "stopped", (f"verdict: stopped -- no rank and no vLLM process on {', '.join(nodes) or 'any node'}; "
                           f"start it: python -m runbook start --profile {source}")
    parts = []
    if running:
        parts.append(f"running: {', '.join(running)}")
    down = [n for n in nodes if n not in running]
    if down:
        parts.append(f"not running: {', '.join(down)}")
    if leftovers:
        parts.append("left behind: " + "; ".join(
            f"{n} ({len(nodes[n].get('vllm_processes') or [])} vLLM process(es)"
            + (f", container {nodes[n]['container']}" if nodes[n].get("container") else "") + ")" for n in leftovers))
    parts.append(f"/health {health or 'no answer'}")
    fix = (f"wait and run status again (the API is still loading), or read `python -m runbook logs`; if it stays so: "
           f"{stop}" if not down and not leftovers else f"{stop}, then python -m runbook start --profile {source}")
    return "partial", f"verdict: partial -- {'; '.join(parts)}; fix: {fix}"


def logs(cluster: Cluster, profile, node: str = "head", tail_lines: int = 100) -> str:
    """The last lines of one rank's log (process log file or docker logs)."""
    n = cluster[node]
    home = n.read("printf %s \"$HOME\"").stdout.strip() or "/root"
    sd = ranks.state_dir(profile, home)
    container = profile.container_on(node)
    res = n.read(f"if docker inspect {quote(container)} >/dev/null 2>&1; then "
                 f"docker logs --tail {int(tail_lines)} {quote(container)} 2>&1; "
                 f"else tail -n {int(tail_lines)} {quote(sd + '/' + node + '.log')} 2>&1; fi", timeout=60)
    return res.stdout
