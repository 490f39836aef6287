"""What the server is doing now, read without changing anything: both ranks' state with the head's
``/health`` and ``/v1/models`` (``status``), and one rank's log tail (``logs``).

    status(cluster, profile); logs(cluster, profile, "worker", tail_lines=100)
"""
from __future__ import annotations

from typing import Any

from . import ranks
from .readiness import api_get, models_ok
from ..serve.endpoint import api_address, base_url
from ..remote import Cluster, quote

__all__ = [
    "is_up",
    "logs",
    "status",
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
