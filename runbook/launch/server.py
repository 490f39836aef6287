"""Start, watch, stop and inspect the two-node vLLM server (step 04).

    facts = gather_facts(cluster, profile)                    # home, GID index, packed Engram, lab mounts
    plan = render.render(profile, facts, api_key_set=...)     # pure; shown before anything runs
    result = start(cluster, profile, plan, step=step)         # worker first, then head; readiness timed
    stop(cluster, profile)                                    # both ranks, teardown proven
    status(cluster, profile); logs(cluster, profile, "worker", tail=100)

Start semantics (seed B's exit-3 rule, made explicit):

* head running with the same fingerprint -> reuse (NO-OP), readiness re-probed;
* head running with a different fingerprint -> refuse, with the stop command;
* a worker rank running without a head -> refuse (stale rank), with the stop command;
* the API port held by something else on the head -> refuse.

While waiting for readiness both ranks' liveness is polled; a dead worker ends the wait within about
10 s (2 consecutive misses at ~4 s), a dead head at once, each with both log tails. A log-silence hang
detector (``HANG_SECONDS``; periodic lines such as ``shm_broadcast`` excluded) collects diagnostics
(py-spy if the node has it, ps, log tails) and fails. On any failure the ranks this call started are
stopped (a half-started cluster holds memory and blocks the next start).

The recipe (``recipe.py``): before the ranks start, the pinned checkout is brought to every node (clone
on the head, rsync to the workers over the fabric) and verified at the pinned commit; a reused server only
has it verified. After readiness every rank's boot log is searched for the lines its start chain declares
(e.g. seed B's TP=3 pad on EVERY rank); ``step.data["recipe"]`` records
``{"repo", "commit", "markers": {node: [found lines]}}``.
"""
from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import ranks, recipe, render
from ..serve.endpoint import api_address, base_url, tunnelled
from ..checks import Check, CheckList, Status, check, not_applicable
from ..errors import ALREADY_RUNNING, ActionError
from ..facts import system, vllm_log
from .render import LaunchPlan, NodeFacts
from ..remote import Cluster, Node, quote, tail
from ..serve.server_info import ApiClient, ServerInfo

__all__ = [
    "StartResult",
    "StopResult",
    "gather_facts",
    "gids_from_network_sidecar",
    "logs",
    "probe_readiness",
    "render_plan",
    "start",
    "status",
    "stop",
]

GIB = 1024 ** 3
POLL_S = 4.0
WORKER_DEAD_POLLS = 2          # consecutive "not alive" answers before the worker counts as dead
TAIL = 40


# ------------------------------------------------------------------------------------------------
# facts and render
# ------------------------------------------------------------------------------------------------

def _lab_runtime_mounts(profile) -> tuple[str, ...]:
    """Lab docker runtime: the busybox image has no Python; bind the host interpreter, its venv and the
    repo read-only (lab-feasibility §7). Read from the local venv's pyvenv.cfg (the lab nodes share
    this filesystem)."""
    bin_parts = render.vllm_bin_parts(profile)
    mounts = ["/usr", "/lib", "/lib64", "/etc/ssl", str(profile.root)]
    py = Path(bin_parts[0])
    cfg = py.parent.parent / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            if line.startswith("home"):
                home = Path(line.split("=", 1)[1].strip())
                mounts.append(str(home.parent))          # <prefix>/bin -> <prefix>
    real = py.parent.parent.resolve()
    if not str(real).startswith(str(profile.root)):
        mounts.append(str(real))
    return tuple(dict.fromkeys(mounts))


def gids_from_network_sidecar(sidecar: dict[str, Any] | None) -> dict[str, int]:
    """Per-node GID index the network step (01) resolved from sysfs (its ``net.gid`` checks)."""
    out: dict[str, int] = {}
    for rec in (sidecar or {}).get("checks", []):
        if rec.get("name") == "net.gid" and isinstance((rec.get("data") or {}).get("resolved"), int):
            out[rec.get("node", "")] = rec["data"]["resolved"]
    return out


def gather_facts(cluster: Cluster, profile, *, gid_indexes: dict[str, int] | None = None) -> dict[str, NodeFacts]:
    """Per node: $HOME, whether this rank's packed Engram shard exists, and (lab docker) the host
    directories to bind-mount. ``gid_indexes`` are the GID indexes the network step resolved
    (:func:`gids_from_network_sidecar`); they are used where the profile says ``auto`` (seed B's
    ``auto`` leaves NCCL_IB_GID_INDEX unset instead, so NCCL picks per HCA). Read-only."""
    gid_indexes = dict(gid_indexes or {})

    def read(node: Node) -> NodeFacts:
        home = node.read("printf %s \"$HOME\"").stdout.strip() or "/root"
        gid = gid_indexes.get(node.name) if profile.recipe != "dspark-v4" else None
        packed = False
        if profile.engram and profile.engram_packed_dir:
            d = render.expand_home(profile.engram_packed_dir, home)
            f = f"{d}/engram-l1-r{node.spec.rank}of{profile.tp}.bin"
            packed = node.read(f"test -s {quote(f)}").ok
        mounts = _lab_runtime_mounts(profile) if (profile.lab and profile.runtime == "docker") else ()
        return NodeFacts(home=home, gid_index=gid, packed_engram=packed, runtime_mounts=mounts)

    out = cluster.each(read)
    for value in out.values():
        if isinstance(value, Exception):
            raise value
    return out  # type: ignore[return-value]


def render_plan(cluster: Cluster, profile, *, secrets=None, node_overrides=None,
                gid_indexes: dict[str, int] | None = None) -> LaunchPlan:
    """Gather the node facts and render (nothing runs)."""
    if secrets is None:
        from ..secrets import load_secrets
        secrets = load_secrets()
    return render.render(profile, gather_facts(cluster, profile, gid_indexes=gid_indexes),
                         api_key_set=bool(secrets.api_key), node_overrides=node_overrides)


# ------------------------------------------------------------------------------------------------
# HTTP readiness (from the runbook host to the head's API)
# ------------------------------------------------------------------------------------------------

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


def _models_ok(text: str, profile) -> tuple[bool, str]:
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
        ok, detail = _models_ok(text, profile)
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



def _diagnostics(cluster: Cluster, plan: LaunchPlan) -> dict[str, str]:
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


# ------------------------------------------------------------------------------------------------
# start
# ------------------------------------------------------------------------------------------------

@dataclass
class StartResult:
    plan: LaunchPlan
    base_url: str
    reused: bool = False
    readiness: Readiness = field(default_factory=Readiness)
    startup: dict[str, dict[str, Any]] = field(default_factory=dict)      # node -> StartupLog dict
    capacity: list[dict[str, Any]] = field(default_factory=list)
    mem_before: dict[str, int] = field(default_factory=dict)            # node -> MemAvailable bytes
    # node -> [[seconds from launch, MemAvailable bytes], ...] sampled at every readiness poll
    memory_profile: dict[str, list[list[float]]] = field(default_factory=dict)
    checks: CheckList = field(default_factory=CheckList)
    evidence: list[str] = field(default_factory=list)
    failure_detected_at: float | None = None    # time.monotonic() when the wait ended on a failure
    failure_detected_s: float | None = None     # ... in seconds from launch
    recipe: dict[str, Any] = field(default_factory=dict)            # {"repo", "commit", "markers": {node: [lines]}}
    recipe_checkout: dict[str, Any] = field(default_factory=dict)   # per node: path, commit, action

    @property
    def ok(self) -> bool:
        return not self.checks.failures()

    def data(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "served_model_name": self.plan.served_model_name,
                "max_model_len": self.plan.max_model_len, "fingerprint": self.plan.fingerprint,
                "runtime": self.plan.runtime, "reused": self.reused,
                "readiness_s": {ph: getattr(self.readiness, ph) for ph in PHASES},
                "head_started_s": self.readiness.head_started,
                "first_token_text": self.readiness.first_token_text,
                "first_token_latency_s": self.readiness.first_token_latency,
                "startup_log": self.startup, "capacity": self.capacity, "mem_available_before": self.mem_before,
                "memory_profile": self.memory_profile,
                "failure_detected_s": self.failure_detected_s}

    def timings_frame(self):
        import pandas as pd
        return pd.DataFrame(self.readiness.rows())

    def capacity_frame(self):
        import pandas as pd
        return pd.DataFrame(self.capacity)


def _mem_available(node: Node) -> int:
    return system.parse_meminfo(node.read(system.MEMINFO_CMD).stdout).get("MemAvailable", 0)


def _fail(result: StartResult, name: str, what: str, *, node: str = "", observed: str = "", expected: str = "",
          fix: str = "", raise_: bool = True, evidence: list[str] | None = None) -> StartResult:
    result.checks.add(check(name, False, node=node, observed=observed, expected=expected, fix=fix,
                            evidence=evidence or []))
    if raise_:
        err = ActionError(what, node=node, observed=observed, expected=expected, fix=fix,
                          evidence=", ".join(evidence or []))
        err.result = result          # the partial StartResult (timings, logs) for callers and tests
        raise err
    return result


def _stop_cmd(profile) -> str:
    return f"python -m runbook stop --profile {profile.source or '<profile>'}"


def start(cluster: Cluster, profile, plan: LaunchPlan, *, step=None, api_key: str | None = None,
          raise_on_failure: bool = True, consistency: bool = True, cleanup_on_failure: bool = True,
          on_launched: Callable[[], None] | None = None) -> StartResult:
    """Start the worker rank(s), then the head; wait until the API streams a token.

    ``step`` (optional): where to archive evidence (raw logs) and add checks. ``on_launched`` is a
    test hook called once both start commands returned (fault injection)."""
    if api_key is None:
        from ..secrets import load_secrets
        api_key = load_secrets().api_key
    url = base_url(profile)
    result = StartResult(plan=plan, base_url=api_address(profile))
    ev = (lambda name, text: step.raw(name, text)) if step is not None else (lambda name, text: "")
    result.evidence.append(ev("rendered.txt", plan.to_text()))
    result.evidence.append(ev("rendered.json", json.dumps(plan.to_record(), indent=2)))
    run_id = step.run.run_id if step is not None else ""
    try:
        return _start(cluster, profile, plan, result, url, api_key, ev, raise_on_failure, consistency,
                      cleanup_on_failure, on_launched, run_id)
    finally:
        if step is not None:
            step.add(result.checks)
            if result.recipe:
                step.data["recipe"] = result.recipe
            if result.recipe_checkout:
                step.data["recipe_checkout"] = result.recipe_checkout
            step.data.update({"launch": result.data(), "base_url": api_address(profile),
                              "served_model_name": plan.served_model_name})


def _workers_not_running(cluster: Cluster, plan: LaunchPlan, settle_s: float = 2.0) -> dict[str, str]:
    """Workers whose rank is not running right after its start command returned, each with its log tail.
    A worker found alive costs one read; one found dead is read again after ``settle_s`` (a container
    between created and running)."""
    gone: dict[str, str] = {}
    for attempt in range(2):
        names = [r.node for r in plan.workers if attempt == 0 or r.node in gone]
        watches = {n: ranks.watch(cluster[n], plan.rank(n)) for n in names}
        gone = {n: (" | ".join(w.tail[-6:]) or "no log line") for n, w in watches.items() if not w.alive}
        if not gone:
            return {}
        if attempt == 0:
            time.sleep(settle_s)
    return {n: f"not running {settle_s:.0f} s after its start; log tail: {tail_text}"
            for n, tail_text in gone.items()}


def exit_code(result: StartResult) -> int:
    """`python -m runbook start`'s exit status for a start result: 0 started, 3 its ranks already ran with the
    same configuration (the seeds' contract: dockerd restores them after a reboot), 1 could not start."""
    if result.reused:
        return ALREADY_RUNNING
    return 0 if result.ok else 1


def second_start_check(cluster: Cluster, profile, plan: LaunchPlan) -> Check:
    """Start again while the ranks run, as a user or a boot script would: nothing may be relaunched and the
    answer is exit 3, not a failure."""
    t0 = time.monotonic()
    again = start(cluster, profile, plan, raise_on_failure=False)
    code = exit_code(again)
    said = next((c.observed for c in again.checks if c.name == "server started"), "")
    return check("a second start while the ranks run", code == ALREADY_RUNNING, node="cluster",
                 observed=f"exit {code} in {time.monotonic() - t0:.1f} s: {said[:300]}",
                 expected=f"exit {ALREADY_RUNNING}: the running ranks reused, nothing relaunched",
                 fix="see the launch rows of the second start: a start must recognise its own running ranks "
                     "(same fingerprint on every rank)")


def _start(cluster, profile, plan, result, url, api_key, ev, raise_, consistency, cleanup, on_launched, run_id):
    problems = render.check_consistency(plan)
    if consistency:
        result.checks.add(check("ranks agree on rendezvous and shape", not problems, node="cluster",
                                observed="; ".join(problems) or "master addr/port, nnodes, TP, max-model-len equal",
                                expected="identical on every rank",
                                fix="fix the profile (one MASTER_PORT / HEAD_IP for all ranks); a disagreement "
                                    "hangs the rendezvous instead of failing"))
        if problems:
            return _fail(result, "launch refused", "ranks disagree on the rendezvous: nothing was started",
                         node="cluster", observed="; ".join(problems), expected="identical on every rank",
                         fix="fix the profile so every rank gets the same --master-addr/--master-port",
                         raise_=raise_)
    if cluster.head.dry_run:
        result.checks.add(not_applicable("server started", "dry run: the rendered commands above were "
                                         "recorded, nothing was started", node="cluster"))
        return result

    homes = {n.name: n.read("printf %s \"$HOME\"").stdout.strip() or "/root" for n in cluster}
    states = cluster.each(lambda n: ranks.rank_state(n, profile, homes[n.name]))
    for st in states.values():
        if isinstance(st, Exception):
            raise st
    head_st: ranks.RankState = states["head"]
    workers_st = [states[w.name] for w in cluster.workers]
    # -- already running?
    if head_st.running:
        if head_st.fingerprint == plan.fingerprint and all(w.running for w in workers_st):
            result.reused = True
            _recipe_checkout(cluster, profile, result, ship=False)     # read-only: what the running ranks mount
            result.checks.add(Check("server started", node="head", status=Status.NOOP,
                                    observed=f"already running with the same fingerprint "
                                             f"{plan.fingerprint[:12]} ({head_st.describe()}; started by run "
                                             f"{head_st.record.get('run_id') or '?'}); reused, not relaunched",
                                    expected="the rendered configuration running"))
            return _readiness(cluster, profile, plan, result, url, api_key, ev, raise_, cleanup=False,
                              t0=time.monotonic(), started=False)
        if head_st.fingerprint == plan.fingerprint:
            missing = ", ".join(w.node for w in workers_st if not w.running)
            return _fail(result, "server started", "the head runs but a worker rank is gone", node="cluster",
                         observed=f"head {head_st.describe()}; worker(s) not running: {missing}",
                         expected="every rank running", fix=f"{_stop_cmd(profile)}; then start again",
                         raise_=raise_)
        return _fail(result, "server started", "a different vLLM server is already running on the head",
                     node="head", observed=f"{head_st.describe()}; rendered fingerprint {plan.fingerprint[:12]}",
                     expected="no server, or the same configuration (fingerprint)",
                     fix=f"stop it first: {_stop_cmd(profile)}", raise_=raise_)
    stale = [w for w in workers_st if w.running or w.processes]
    if stale:
        return _fail(result, "server started", "a stale worker rank runs without a head", node=stale[0].node,
                     observed="; ".join(f"{w.node}: {w.describe()} {w.processes[:2]}" for w in stale),
                     expected="no vLLM on the workers before the head starts",
                     fix=f"{_stop_cmd(profile)} (or: python -m runbook stop worker --profile ...), then start",
                     raise_=raise_)
    if head_st.processes:
        return _fail(result, "server started", "vLLM processes not started by the runbook run on the head",
                     node="head", observed="; ".join(head_st.processes[:3]), expected="none",
                     fix=f"{_stop_cmd(profile)} or kill them", raise_=raise_)
    listening = system.parse_listening(cluster.head.read(system.LISTEN_CMD).stdout)
    busy = [p for p in (profile.port, profile.master_port) if p in listening]
    if busy:
        return _fail(result, "server started", "the API or rendezvous port is in use on the head", node="head",
                     observed=", ".join(f"{p}: {listening[p] or 'a process'}" for p in busy),
                     expected="free", fix="stop what listens there (ss -ltnp) or change PORT/MASTER_PORT",
                     raise_=raise_)

    # -- the recipe checkout at the pinned commit on every node (its files are mounted into the ranks)
    if not _recipe_checkout(cluster, profile, result, ship=True):
        return _fail(result, "launch refused", "the recipe checkout is not at the pinned commit on every node: "
                     "nothing was started", node="cluster",
                     observed="; ".join(f"{c.node}: {c.observed}" for c in result.checks.failures())[:1500],
                     expected=f"{profile.recipe_repo} @ {profile.recipe_commit[:12]} on every node",
                     fix="see the recipe checkout rows", raise_=raise_)

    # -- launch: workers first, then the head
    mem = cluster.each(_mem_available)
    result.mem_before = {k: v for k, v in mem.items() if isinstance(v, int)}
    env = {"VLLM_API_KEY": api_key} if api_key else None
    if api_key:
        from ..secrets import register_secret
        register_secret(api_key)
    t0 = time.monotonic()
    started: list[str] = []
    attempted: list[str] = []     # started, or tried to: a failed `docker run` can leave a created container
    try:
        for rank in sorted(plan.ranks, key=lambda r: -r.rank):
            node = cluster[rank.node]
            if rank.rank == 0 and (gone := _workers_not_running(cluster, plan)):
                # a worker that never came up (bad binary, quoting that split its environment, a crash on
                # start): the head would wait for it until vLLM's rendezvous timeout; never start it then
                if cleanup:
                    stop(cluster, profile, nodes=attempted, grace=10, mem_settle_s=0)
                return _fail(result, "workers running before the head starts",
                             "a worker rank is not running a moment after its start: the head was not started",
                             node=",".join(gone),
                             observed="; ".join(f"{n}: {why}" for n, why in gone.items())[:1500],
                             expected="every worker's process/container running before the head starts",
                             fix="read the worker's log tail above (a missing binary, an unknown flag, an "
                                 "environment split by quoting); fix it, then start again", raise_=raise_)
            attempted.append(rank.node)
            rec = {"fingerprint": plan.fingerprint, "runtime": rank.runtime, "started_at": time.time(),
                   "run_id": run_id,
                   "mem_available_before": result.mem_before.get(rank.node), "container": rank.container,
                   "log": rank.log_path, "base_url": result.base_url if rank.rank == 0 else ""}
            node.run(f"mkdir -p {quote(rank.state_dir)} && printf '%s\\n' {quote(json.dumps(rec))} "
                     f"> {quote(rank.record_path)}", timeout=30)
            node.run(rank.start_command(), env=env if rank.secret_env else None, timeout=120)
            started.append(rank.node)
            if rank.rank == 0:
                result.readiness.head_started = round(time.monotonic() - t0, 3)
    except Exception as exc:  # noqa: BLE001 - any start failure: clean up, then report
        if cleanup and attempted:
            stop(cluster, profile, nodes=attempted, grace=10, mem_settle_s=0)
        return _fail(result, "server started", "a start command failed", node="cluster",
                     observed=str(exc)[:1500], expected="both ranks started",
                     fix="see the error; every rank started or tried was stopped and removed", raise_=raise_)
    result.checks.add(check("ranks launched (worker first, then head)", True, node="cluster",
                            observed=f"{', '.join(reversed(started))} started; head {result.readiness.head_started:.1f} s "
                                     f"after the worker", expected="every rank started"))
    if on_launched is not None:
        on_launched()
    return _readiness(cluster, profile, plan, result, url, api_key, ev, raise_, cleanup=cleanup, t0=t0,
                      started=True)


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


def _readiness(cluster, profile, plan, result, url, api_key, ev, raise_, *, cleanup, t0, started):
    ready = result.readiness
    deadline = t0 + profile.ready_timeout
    hang_s = profile.hang_seconds
    prev: dict[str, ranks.RankWatch | None] = {r.node: None for r in plan.ranks}
    last_progress = time.monotonic()
    dead_count = {r.node: 0 for r in plan.ranks}
    failure: tuple[str, str, str, str, str] | None = None    # (check, what, node, observed, fix)
    diagnostics: dict[str, str] = {}
    master_probe = MasterProbe()

    while True:
        now = time.monotonic()
        watches = cluster.each(lambda n: ranks.watch(n, plan.rank(n.name)))
        for name, w in watches.items():
            if isinstance(w, Exception):
                dead_count[name] += 1
                continue
            if w.mem_available is not None:
                result.memory_profile.setdefault(name, []).append([round(now - t0, 1), w.mem_available])
            if ranks.log_progressed(prev[name], w):
                last_progress = now
            prev[name] = w
            dead_count[name] = 0 if w.alive else dead_count[name] + 1
        head_dead = dead_count["head"] >= 1
        dead_workers = [r.node for r in plan.workers if dead_count[r.node] >= WORKER_DEAD_POLLS]
        if head_dead or dead_workers:
            who = "head" if head_dead else dead_workers[0]
            failure = ("ranks alive while starting", f"the {who} rank died before the server was ready", who,
                       f"{who} process/container gone {now - t0:.0f} s after launch",
                       "read both log tails below; fix the cause, then start again")
            break
        if master_probe.pending:
            master_probe.poll(cluster, plan)
            if master_probe.blocked_polls >= MASTER_BLOCKED_POLLS:
                failure = ("workers reach the master port", "a worker cannot open a TCP connection to the head's "
                           "rendezvous port while the head listens on it", ",".join(master_probe.blocked),
                           master_probe.observed,
                           "a firewall on the head (or between the nodes) drops the master port: allow MASTER_PORT "
                           "from the workers' fabric addresses (ufw allow from <worker ip> to any port <port>; "
                           "nft list ruleset / iptables -S), then start again")
                break
        try:
            probe_readiness(profile, url, api_key, ready, t0)
        except ActionError as exc:
            failure = ("models served", exc.what, "head", exc.observed, exc.fix)
            break
        if ready.done:
            break
        if hang_s and time.monotonic() - last_progress > hang_s:
            diagnostics = _diagnostics(cluster, plan)
            failure = ("log progress (hang detector)", f"no new log line on any rank for {hang_s} s", "cluster",
                       f"silent since {last_progress - t0:.0f} s after launch (periodic lines excluded)",
                       ("read the diagnostics (py-spy dumps / ps / log tails); usual causes: a rendezvous "
                        "that never completes (wrong master address/port, firewall, socket IF), a stuck collective"))
            break
        if time.monotonic() > deadline:
            failure = ("ready within READY_TIMEOUT", f"not ready after {profile.ready_timeout} s", "head",
                       f"reached: {', '.join(p for p in PHASES if getattr(ready, p) is not None) or 'nothing'}",
                       "raise READY_TIMEOUT only if the log shows steady progress; otherwise read the log tails")
            break
        time.sleep(max(0.5, POLL_S - (time.monotonic() - now)))

    if failure is not None:
        result.failure_detected_at = time.monotonic()
        result.failure_detected_s = round(result.failure_detected_at - t0, 1)
    # -- evidence: logs of every rank, parsed
    texts = cluster.each(lambda n: ranks.log_text(n, plan.rank(n.name)))
    for name, text in texts.items():
        text = text if isinstance(text, str) else f"log unavailable: {text}"
        result.evidence.append(ev(f"{name}.log", text))
        result.startup[name] = vllm_log.parse_startup_log(text).to_dict()
    for name, text in diagnostics.items():
        result.evidence.append(ev(f"hang-{name}.txt", text))
    logs = {n: (t if isinstance(t, str) else "") for n, t in texts.items()}
    pin = recipe.recipe_pin(profile)
    if pin is not None:
        result.recipe = recipe.marker_record(pin, {r.node: r.recipe_markers for r in plan.ranks}, logs)

    if failure is not None:
        cname, what, node, observed, fix = failure
        tails = "\n".join(f"--- {n} log tail ---\n{tail(t if isinstance(t, str) else '', TAIL)}"
                          for n, t in texts.items())
        fatal = [f"{n}: {line}" for n, t in logs.items() for line in recipe.chain_failures(t)]
        if fatal:                            # the recipe's start chain refused: that is the cause
            observed = f"{observed}; recipe start chain: {' | '.join(fatal[:4])}"
        if started and cleanup:
            stop(cluster, profile, grace=10, mem_settle_s=0)     # a booting vLLM ignores SIGTERM anyway
        return _fail(result, cname, what, node=node, observed=f"{observed}\n{tails}",
                     expected="both ranks alive until the API streams a token", fix=fix, raise_=raise_,
                     evidence=[e for e in result.evidence if e])

    # -- readiness checks and startup numbers
    for ph in PHASES:
        result.checks.add(check(f"ready: {ph.replace('_', ' ')}", getattr(ready, ph) is not None, node="head",
                                observed=f"{getattr(ready, ph):.1f} s from launch" if not result.reused
                                else "reached (reused server)",
                                expected=f"within READY_TIMEOUT={profile.ready_timeout} s",
                                data={"seconds": getattr(ready, ph)}))
    result.checks.add(check("models lists the served name", True, node="head", observed=ready.models_detail,
                            expected=f"id {profile.served_model_name}, max_model_len {profile.max_model_len}"))
    head_log = vllm_log.StartupLog(**result.startup.get("head", {})) if result.startup.get("head") else None
    kv = head_log.kv_tokens if head_log else None
    if kv:
        obs = f"{kv:,} tokens; {head_log.max_concurrency}x at {head_log.concurrency_len:,} tokens/request" \
            if head_log.max_concurrency else f"{kv:,} tokens"
        if profile.expect_kv_tokens:
            dev = abs(kv - profile.expect_kv_tokens) / profile.expect_kv_tokens
            result.checks.add(check("KV cache size", dev <= 0.01, node="head", observed=obs,
                                    expected=f"{profile.expect_kv_tokens:,} tokens (EXPECT_KV_TOKENS, +-1 %)",
                                    fix="memory headroom differs from the reference boot (MemAvailable, "
                                        "GPU_MEM_UTIL, KV_CACHE_MEMORY_BYTES); long requests may not fit",
                                    warn_only=True, data={"kv_tokens": kv}))
        else:
            result.checks.add(Check("KV cache size", node="head", status=Status.PASS, observed=obs,
                                    expected="reported in the startup log (EXPECT_KV_TOKENS=0: not compared)",
                                    data={"kv_tokens": kv}))
        result.capacity = vllm_log.capacity(kv, render.lab_scaled_sizes(profile),
                                            max_model_len=profile.max_model_len, max_num_seqs=profile.max_num_seqs)
    elif result.reused:
        result.checks.add(not_applicable("KV cache size", "reused server: startup log lines may have rotated "
                                         "out; see the log evidence", node="head"))
    else:
        result.checks.add(check("KV cache size", False, node="head", observed="no 'KV cache size' line in the log",
                                expected="the startup log reports the KV pool", warn_only=True,
                                fix="check the log format of this vLLM build"))
    marker_checks(plan, result, logs)
    return result


def marker_checks(plan: LaunchPlan, result: StartResult, logs: dict[str, str]) -> None:
    """Every rank's boot log shows the lines its recipe start chain declares (seed B's TP=3 pad on every
    rank, not the head only). A reused server's boot lines may have rotated out: N/A, not FAIL."""
    for r in plan.ranks:
        if not r.recipe_markers:
            continue
        found = recipe.find_markers(r.recipe_markers, logs.get(r.node, ""))
        missing = [m for m, line in found.items() if line is None]
        name = "recipe start chain markers in the boot log"
        if missing and result.reused:
            result.checks.add(not_applicable(name, "reused server: the boot lines may have rotated out; missing: "
                                             + " | ".join(missing), node=r.node))
            continue
        fatal = recipe.chain_failures(logs.get(r.node, ""))
        sources = (plan.recipe_chain or {}).get("marker_sources", {}).get(r.node, {})
        result.checks.add(check(
            name, not missing, node=r.node,
            observed=(f"{len(found)} of {len(found)} found" if not missing else
                      f"missing: {' | '.join(missing)}" + (f"; chain: {' | '.join(fatal[:3])}" if fatal else "")),
            expected=" | ".join(r.recipe_markers),
            fix="the line's source did not run on this rank: " + "; ".join(f"{m} <- {sources.get(m, '?')}"
                                                                            for m in missing),
            data={"found": {m: line for m, line in found.items() if line}}))


def _recipe_checkout(cluster: Cluster, profile, result: StartResult, *, ship: bool) -> bool:
    """The pinned checkout on every node (``ship``: fetch on the head and copy to the workers first)."""
    if recipe.recipe_pin(profile) is None:
        return True
    checks, data = recipe.ensure_checkout(cluster, profile, ship=ship)
    result.checks.add(checks)
    result.recipe_checkout = data
    return not checks.failures()


# ------------------------------------------------------------------------------------------------
# stop / status / logs
# ------------------------------------------------------------------------------------------------

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
    # containers: stop (SIGTERM, grace) then remove
    if st.container_status:
        node.run(f"docker stop -t {int(grace)} {quote(container)} >/dev/null 2>&1; "
                 f"docker rm -f {quote(container)} >/dev/null 2>&1; true", timeout=grace + 60)
    # process runtime: SIGTERM the main pid (the headless rank does not exit on its own), then the group
    pid = st.pid or (st.record.get("pid") if st.record else None)
    if pid:
        node.run(f"kill -TERM {int(pid)} 2>/dev/null; true", timeout=30)
    deadline = time.monotonic() + grace
    left = _our_left(node, pid)
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = _our_left(node, pid)
    for sig, wait in (("TERM", 5.0), ("KILL", 5.0)):
        if not left:
            break
        node.run(f"kill -{sig} {' '.join(str(p) for p in left)} 2>/dev/null; "
                 + (f"kill -{sig} -- -{int(pid)} 2>/dev/null; " if pid else "") + "true", timeout=30)
        end = time.monotonic() + wait
        while left and time.monotonic() < end:
            time.sleep(0.5)
            left = _our_left(node, pid)
    node.run(f"rm -f {quote(sd + '/' + node.name + '.pid')} {quote(sd + '/' + node.name + '.fingerprint')} "
             f"{quote(sd + '/' + node.name + '.json')}; true", timeout=30)
    after = ranks.rank_state(node, profile, home)
    gone = not after.processes and not after.container_status
    info["after"] = after.describe()
    info["stop_s"] = round(time.monotonic() - t0, 1)
    checks = [check("no vLLM process or container left", gone, node=node.name,
                    observed=(f"gone after {info['stop_s']} s (was: {info['before']})" if gone else
                              f"left: {'; '.join(after.processes[:4])} {after.container_status}"),
                    expected="nothing", fix=f"kill the listed pids / docker rm -f {container} on {node.name}")]
    info["mem_available_before"] = (st.record or {}).get("mem_available_before")
    return checks, info


def _mem_check(node: Node, before: int | None, settle_s: float) -> tuple[Check, int | None]:
    """MemAvailable back near the value recorded before launch (after every rank is gone: the lab's
    nodes share one kernel, so MemAvailable is host-wide there)."""
    if not before:
        return not_applicable("MemAvailable back to its pre-launch value",
                              "no start record on this node (not started by the runbook)", node=node.name), None
    end = time.monotonic() + settle_s
    tol = max(GIB, int(before * 0.05))
    now_avail = _mem_available(node)
    while now_avail < before - tol and time.monotonic() < end:
        time.sleep(2.0)
        now_avail = _mem_available(node)
    return check("MemAvailable back to its pre-launch value", now_avail >= before - tol, node=node.name,
                 observed=f"{now_avail / GIB:.2f} GiB (before launch {before / GIB:.2f} GiB)",
                 expected=f">= {(before - tol) / GIB:.2f} GiB (before - max(1 GiB, 5 %))",
                 fix="something still holds memory: ps aux --sort=-rss | head; docker ps -a",
                 warn_only=True, data={"before": before, "after": now_avail}), now_avail


def _our_left(node: Node, pid: int | None) -> list[int]:
    procs = ranks.vllm_procs(ranks.parse_ps(node.read(ranks.PS_CMD).stdout), pgid=int(pid) if pid else None)
    return [p[0] for p in procs]


def stop(cluster: Cluster, profile, nodes: list[str] | None = None, *, grace: float = 30.0,
         mem_settle_s: float = 20.0, step=None) -> StopResult:
    """Stop the head, then the worker(s) (the headless rank does not exit with the head: it is
    stopped explicitly), and prove teardown on each node."""
    result = StopResult()
    order = [n for n in cluster.nodes if nodes is None or n.name in nodes]
    if cluster.head.dry_run:
        result.checks.add(not_applicable("server stopped", "dry run: nothing stopped", node="cluster"))
        return result
    for node in order:        # head first (rank order), one at a time like the seeds
        try:
            checks, info = _stop_node(node, profile, grace)
        except Exception as exc:  # noqa: BLE001 - report per node, keep stopping the others
            checks, info = [check("no vLLM process or container left", False, node=node.name,
                                  observed=f"stop failed: {exc}"[:500], expected="nothing",
                                  fix="check the node is reachable; stop it by hand")], {}
        result.checks.add(checks)
        result.per_node[node.name] = info
    for node in order:
        info = result.per_node.get(node.name, {})
        try:
            c, after = _mem_check(node, info.get("mem_available_before"), mem_settle_s)
        except Exception as exc:  # noqa: BLE001
            c, after = check("MemAvailable back to its pre-launch value", False, node=node.name, warn_only=True,
                             observed=f"cannot read: {exc}"[:300]), None
        info["mem_available_after"] = after
        result.checks.add(c)
    if step is not None:
        step.add(result.checks)
        step.data.setdefault("stop", {}).update(result.per_node)
    return result


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
    out["models"] = _models_ok(mtext, profile)[1] if mcode == 200 else ""
    return out


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
