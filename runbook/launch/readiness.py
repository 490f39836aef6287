"""Is the server ready: the readiness phases from the runbook host to the head's API (port open, ``/health``,
``/v1/models``, a first streamed token), the workers' probe of the master port, and the diagnostics of a hang.

    ready = Readiness()
    probe_readiness(profile, url, api_key, ready, t0)   # advances the phases as far as they go now
    MasterProbe().poll(cluster, plan)                   # can every worker open the rendezvous port?
"""
from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit
from dataclasses import dataclass, field
from typing import Any

from ..facts import ranks, system
from ..api.endpoint import tunnelled
from ..errors import ActionError
from .render import LaunchPlan
from ..remote import Cluster, Node, quote, tail
from ..api.server_info import ApiClient, ServerInfo

__all__ = [
    "MASTER_BLOCKED_POLLS",
    "PHASES",
    "MasterProbe",
    "Readiness",
    "api_get",
    "hang_diagnostics",
    "master_port_of",
    "models_ok",
    "probe_readiness",
]


def _port_open(host: str, port: int, timeout: float = 1.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def api_get(base: str, path: str, api_key: str, timeout: float = 5.0) -> tuple[int, str]:
    """(HTTP status or 0, body text or the transport error) of one GET, through the runbook's API client."""
    with ApiClient(ServerInfo(base, "", api_key=api_key), timeout=timeout) as api:
        ex = api.get(path, timeout=timeout)
    if ex.status is None:
        return 0, ex.error
    return ex.status, ex.body if isinstance(ex.body, str) else json.dumps(ex.body)


def _first_token(base: str, model: str, api_key: str, timeout: float = 60.0,
                 extra: dict[str, Any] | None = None) -> tuple[bool, str, float]:
    """Stream a tiny chat; return (ok, first non-empty delta or error, seconds to it)."""
    payload = {"messages": [{"role": "user", "content": "Reply with OK."}], "max_tokens": 8, "temperature": 0,
               **(extra or {})}
    with ApiClient(ServerInfo(base, model, api_key=api_key), timeout=timeout) as api:
        ex = api.stream_chat(payload, timeout=timeout)
    if ex.status is None:
        return False, ex.error, ex.latency_s
    if ex.status != 200:
        return False, f"HTTP {ex.status}: {ex.error_message()[:300]}", ex.latency_s
    for ev in ex.events:
        for ch in ev.get("choices") or []:
            d = ch.get("delta") or {}
            text = d.get("content") or d.get("reasoning_content") or d.get("reasoning") or ""
            if text:
                return True, text, ex.ttft_s if ex.ttft_s is not None else ex.latency_s
    return False, ex.error or "stream ended without a token", ex.latency_s


def _chat_extra(profile) -> dict[str, Any]:
    if profile.recipe == "exl3-v41":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    return {}


def models_ok(text: str, profile) -> tuple[bool, str]:
    try:
        data = json.loads(text).get("data") or []
    except (ValueError, AttributeError):
        return False, f"not JSON: {text[:120]}"
    for m in data:
        if m.get("id") == profile.served_model_name:
            mml = m.get("max_model_len")
            return mml == profile.max_model_len, f"id {m.get('id')}, max_model_len {mml}"
    return False, "ids " + ", ".join(str(m.get("id")) for m in data)


PHASES = ("port_open", "health", "models", "first_token")


@dataclass
class Readiness:
    """Seconds from launch (worker start) to each readiness phase; None = not reached."""
    port_open: float | None = None
    health: float | None = None
    models: float | None = None
    first_token: float | None = None
    head_started: float | None = None     # head start command, seconds after the worker's
    models_detail: str = ""
    first_token_text: str = ""
    first_token_latency: float | None = None   # the chat request's own time to first token

    @property
    def done(self) -> bool:
        return self.first_token is not None

    def rows(self) -> list[dict[str, Any]]:
        return [{"phase": ph, "seconds_from_launch": getattr(self, ph)} for ph in PHASES]


def probe_readiness(profile, url: str, api_key: str, ready: Readiness, t0: float) -> None:
    """Advance the readiness phases as far as they go now (one attempt each); each phase is stamped
    with the seconds since ``t0`` (monotonic) at which it succeeded."""
    def since() -> float:
        return round(time.monotonic() - t0, 3)
    if ready.port_open is None:
        # through the SSH forward the local port always accepts: "open" is then any HTTP answer
        if not (api_get(url, "/health", api_key, timeout=2)[0] if tunnelled(profile) else
                _port_open(*urlsplit(url).netloc.rsplit(":", 1))):
            return
        ready.port_open = since()
    if ready.health is None:
        code, _ = api_get(url, "/health", api_key)
        if code != 200:
            return
        ready.health = since()
    if ready.models is None:
        code, text = api_get(url, "/v1/models", api_key)
        if code != 200:
            return
        ok, detail = models_ok(text, profile)
        ready.models_detail = detail
        if not ok:
            raise ActionError("the server does not serve the expected model", node="head", observed=detail,
                              expected=f"id {profile.served_model_name}, max_model_len {profile.max_model_len}",
                              fix="another server holds the port, or the profile changed: "
                                  "python -m runbook status; stop it and start again")
        ready.models = since()
    if ready.first_token is None:
        ok, text, lat = _first_token(url, profile.served_model_name, api_key, extra=_chat_extra(profile))
        if ok:
            ready.first_token = since()
            ready.first_token_text, ready.first_token_latency = text, round(lat, 3)


def hang_diagnostics(cluster: Cluster, plan: LaunchPlan) -> dict[str, str]:
    """Hang diagnostics per node: py-spy dumps when available, the process table, log tails."""
    def diag(node: Node) -> str:
        rank = plan.rank(node.name)
        ps = node.read(ranks.PS_CMD).stdout
        procs = ranks.vllm_procs(ranks.parse_ps(ps))
        parts = ["# vLLM processes", "\n".join(f"{p[0]} {p[2]} {p[3][:200]}" for p in procs) or "(none)"]
        if node.read("command -v py-spy").ok:
            for p in procs[:8]:
                parts.append(f"# py-spy dump --pid {p[0]}")
                parts.append(node.read(f"py-spy dump --pid {p[0]} 2>&1", timeout=60).stdout)
        else:
            parts.append("# py-spy not installed on this node (pip install py-spy for stack dumps)")
        parts.append("# log tail")
        parts.append(tail(ranks.log_text(node, rank, 200), 80))
        return "\n".join(parts)
    out = cluster.each(diag)
    return {k: (v if isinstance(v, str) else f"diagnostics failed: {v}") for k, v in out.items()}


MASTER_BLOCKED_POLLS = 3     # ~12 s of a listening head the workers cannot reach: not a slow start


def master_port_of(plan) -> tuple[str, int] | None:
    """The rendezvous address and port the head's argv carries (--master-addr / --master-port)."""
    argv = list(plan.rank("head").serve_argv)
    try:
        return argv[argv.index("--master-addr") + 1], int(argv[argv.index("--master-port") + 1])
    except (ValueError, IndexError):
        return None


@dataclass
class MasterProbe:
    """Firewalls drop the master port silently: vLLM then waits ~30 min for "clients joined". Once the head
    listens on it, every worker opens one TCP connection to it; when none can for a few polls, say so now.
    Stops probing after the first success (the rendezvous store sees only a few short connections)."""
    pending: bool = True
    blocked_polls: int = 0
    blocked: list[str] = field(default_factory=list)
    observed: str = ""

    def poll(self, cluster, plan) -> None:
        target = master_port_of(plan)
        workers = [cluster[r.node] for r in plan.workers]
        if target is None or not workers:
            self.pending = False
            return
        addr, port = target
        if port not in system.parse_listening(cluster.head.read(system.LISTEN_CMD, timeout=15).stdout):
            return                                   # the head has not bound it yet
        probe = quote("bash", "-c", f"exec 3<>/dev/tcp/{addr}/{port}")
        results = cluster.each(lambda n: n.read(f"timeout 3 {probe} && echo open || echo closed", timeout=15))
        self.blocked = sorted(n for n, r in results.items()
                              if n != "head" and (isinstance(r, Exception) or "open" not in r.stdout))
        if not self.blocked:
            self.pending = False
            return
        self.blocked_polls += 1
        self.observed = (f"{', '.join(self.blocked)} → {addr}:{port}: no TCP connection within 3 s, "
                         f"{self.blocked_polls} poll(s) in a row, while the head listens on {port}")
