"""Start the two-node vLLM server and watch it until the API streams a token (step 04).

    plan = launch_plan(cluster, profile)                      # plan.py; shown before anything runs
    result = start(cluster, profile, plan)                    # worker first, then head; raw texts in result.raw
    code = exit_code(result)                                  # 0 started, 3 reused, 1 failed

Start semantics (seed B's exit-3 rule, made explicit):

* head running with the same fingerprint -> reuse (NO-OP), readiness re-probed;
* head running with a different fingerprint -> refuse, with the stop command;
* a worker rank running without a head -> refuse (stale rank), with the stop command;
* the API or master port held on any node -> refuse, naming the holder, with the stop command first;
* the ranks would not load one build (``identity.py``: image, python, vLLM package tree, NCCL, driver, recipe
  files) -> refuse, naming each rank's value.

While waiting for readiness both ranks' liveness is polled; a dead worker ends the wait within about
10 s (2 consecutive misses at ~4 s), a dead head at once, each with both log tails. A log-silence hang
detector (``HANG_SECONDS``; periodic lines such as ``shm_broadcast`` excluded) collects diagnostics
(py-spy if the node has it, ps, log tails) and fails. On any failure the ranks this call started are
stopped (a half-started cluster holds memory and blocks the next start).

Memory (``memguard.py``): before the launch a node whose MemAvailable a previous stop left below its baseline, or
that is below ``MEM_FLOOR_GIB`` already, is refused; through the start every rank's MemAvailable and memory PSI
are sampled every 1.5 s on the guard's own thread, and a crossing of the floor (or of ``MEM_PSI_FULL_MAX``) stops
the ranks at once and fails the start naming the rank, the value, the limit and the cause.

The recipe (``recipe.py``): before the ranks start, the pinned checkout is brought to every node (clone
on the head, rsync to the workers over the fabric; ``checkout.py``) and verified at the pinned commit; a
reused server only has it verified. After readiness every rank's boot log is searched for the lines its start chain declares
(e.g. seed B's TP=3 pad on EVERY rank); ``step.data["recipe"]`` records
``{"repo", "commit", "markers": {node: [found lines]}}``. With ENGRAM=1 every rank's log must also say that it
attached its packed Engram shards (``engram_attach.py``, row ``engram attached``).
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import checkout, engram_attach, identity, memguard, ray_cluster, recipe, render
from ..facts import ranks
from .readiness import MASTER_BLOCKED_POLLS, PHASES, MasterProbe, Readiness, hang_diagnostics, probe_readiness
from .stop import stop
from ..api.endpoint import api_address, base_url
from .. import progress
from ..checks import Check, CheckList, Status, check, not_applicable
from ..errors import ALREADY_RUNNING, ActionError, ExitStatus
from ..facts import system, vllm_log
from .render import LaunchPlan
from ..remote import Cluster, quote, tail

__all__ = [
    "StartResult",
    "exit_code",
    "marker_checks",
    "patch_warning_checks",
    "second_start_check",
    "start",
    "writable_bind_sources",
]

POLL_S = 4.0                   # the readiness poll; memory is sampled every memguard.MEM_POLL_S on its own thread
ABORT_GRACE_S = 3.0            # a memory abort's stop: the host is close to wedging, no long SIGTERM grace
ABORT_SETTLE_S = 20.0          # ... then MemAvailable gets this long to come back before "reboot needed"
WORKER_DEAD_POLLS = 2          # consecutive "not alive" answers before the worker counts as dead
TAIL = 40


@dataclass
class StartResult:
    plan: LaunchPlan
    base_url: str
    reused: bool = False
    server_id: str = ""         # one start of this server: "<run id>@<head started_at>" of the head's rank record
    readiness: Readiness = field(default_factory=Readiness)
    startup: dict[str, dict[str, Any]] = field(default_factory=dict)      # node -> StartupLog dict
    capacity: list[dict[str, Any]] = field(default_factory=list)
    mem_before: dict[str, int] = field(default_factory=dict)            # node -> MemAvailable bytes
    # node -> [[seconds from launch, MemAvailable bytes], ...]: the memory guard's samples (every 1.5 s) of a
    # start, the readiness poll's of a reused server
    memory_profile: dict[str, list[list[float]]] = field(default_factory=dict)
    memory_psi: dict[str, list[list[float | None]]] = field(default_factory=dict)   # [[s, PSI some, full], ...]
    memory_guard: dict[str, Any] = field(default_factory=dict)     # limits, breach, per-rank minimum (memguard)
    checks: CheckList = field(default_factory=CheckList)
    evidence: list[str] = field(default_factory=list)
    failure_detected_at: float | None = None    # time.monotonic() when the wait ended on a failure
    failure_detected_s: float | None = None     # ... in seconds from launch
    recipe: dict[str, Any] = field(default_factory=dict)            # {"repo", "commit", "markers": {node: [lines]}}
    recipe_checkout: dict[str, Any] = field(default_factory=dict)   # per node: path, commit, action
    raw: dict[str, str] = field(default_factory=dict)               # raw texts for the caller to archive

    @property
    def ok(self) -> bool:
        return not self.checks.failures()

    def data(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "served_model_name": self.plan.served_model_name,
                "max_model_len": self.plan.max_model_len, "fingerprint": self.plan.fingerprint,
                "runtime": self.plan.runtime, "reused": self.reused, "server_id": self.server_id,
                "readiness_s": {ph: getattr(self.readiness, ph) for ph in PHASES},
                "head_started_s": self.readiness.head_started,
                "first_token_text": self.readiness.first_token_text,
                "first_token_latency_s": self.readiness.first_token_latency,
                "startup_log": self.startup, "capacity": self.capacity, "mem_available_before": self.mem_before,
                "memory_profile": self.memory_profile, "memory_psi": self.memory_psi,
                "memory_guard": self.memory_guard,
                "failure_detected_s": self.failure_detected_s}

    def timings_frame(self):
        import pandas as pd
        return pd.DataFrame(self.readiness.rows())

    def capacity_frame(self):
        import pandas as pd
        return pd.DataFrame(self.capacity)

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


def writable_bind_sources(docker_argv: list[str]) -> list[str]:
    """The host directories a ``docker run`` mounts writable (``-v SRC:DST`` without ``ro``), in order: the JIT
    caches, seed B's HF cache and ``/tmp``. Step 04 creates them as the SSH user before the run. A read-only
    source (weights, the checkout's files) is an input that must already exist, and a named volume is docker's."""
    out: list[str] = []
    for i, a in enumerate(docker_argv[:-1]):
        if a != "-v":
            continue
        src, _, rest = docker_argv[i + 1].partition(":")
        opts = rest.partition(":")[2].split(",")
        if src.startswith("/") and "ro" not in opts and src not in out:
            out.append(src)
    return out


def _make_bind_sources(node, rank) -> None:
    """Create the rank's writable bind sources as the SSH user, as seed A's launch_cluster does before its
    ``docker run``: dockerd creates a missing source as root, and a later run as the user (a JIT cache, seed B's
    ``/tmp``) cannot write there."""
    if sources := writable_bind_sources(rank.docker_argv):
        node.run("mkdir -p -- " + quote(*sources), timeout=30)


#: what carries a start's partial ``StartResult`` (``err.result``: timings, logs) to its caller: an error (of a node,
#: a command, the start, or a bug) and an interrupt while it waits; never SystemExit or GeneratorExit
CARRIES_RESULT = (Exception, KeyboardInterrupt)


def _stop_cmd(profile) -> str:
    return f"python -m runbook stop --profile {profile.source or '<profile>'}"


def start(cluster: Cluster, profile, plan: LaunchPlan, *, raw_prefix: str = "", run_id: str = "",
          api_key: str | None = None, raise_on_failure: bool = True, consistency: bool = True,
          cleanup_on_failure: bool = True, on_launched: Callable[[], None] | None = None) -> StartResult:
    """Start the worker rank(s), then the head; wait until the API streams a token.

    The raw texts (the rendered plan, rank logs, hang reports) come back in ``result.raw`` (name -> text)
    for the caller to archive; ``raw_prefix`` is the run-relative folder it archives them in (the rows'
    evidence paths), ``run_id`` the run recorded in the ranks' start record. On an exception the partial
    result rides on it as ``.result``. ``on_launched`` is a test hook called once both start commands
    returned (fault injection)."""
    if api_key is None:
        from ..secrets import load_secrets
        api_key = load_secrets().api_key
    # a dry run sends no request: no SSH forward is opened for it
    url = api_address(profile) if cluster.head.dry_run else base_url(profile)
    result = StartResult(plan=plan, base_url=api_address(profile))

    def ev(name: str, text: str) -> str:
        result.raw[name] = text
        return f"{raw_prefix}/{name}" if raw_prefix else ""

    result.evidence.append(ev("rendered.txt", plan.to_text()))
    result.evidence.append(ev("rendered.json", json.dumps(plan.to_record(), indent=2)))
    try:
        return _start(cluster, profile, plan, result, url, api_key, ev, raise_on_failure, consistency,
                      cleanup_on_failure, on_launched, run_id)
    except CARRIES_RESULT as err:       # also an interrupt: the caller records what ran
        if getattr(err, "result", None) is None:
            err.result = result      # the partial StartResult (timings, logs) for the caller to record
        raise


def _workers_not_running(cluster: Cluster, plan: LaunchPlan, settle_s: float = 2.0) -> dict[str, str]:
    """Workers whose rank is not running right after its start command returned, each with its log tail.
    A worker found alive costs one read; one found dead is read again after ``settle_s`` (a container
    between created and running)."""
    gone: dict[str, str] = {}
    for attempt in range(2):
        names = [r.node for r in plan.workers if attempt == 0 or r.node in gone]
        watches = {n: ranks.watch(cluster[n], plan.rank(n), fresh=True) for n in names}
        gone = {n: (" | ".join(w.tail[-6:]) or "no log line") for n, w in watches.items() if not w.alive}
        if not gone:
            return {}
        if attempt == 0:
            time.sleep(settle_s)
    return {n: f"not running {settle_s:.0f} s after its start; log tail: {tail_text}"
            for n, tail_text in gone.items()}


def server_id(head_record: dict[str, Any]) -> str:
    """Which start of a server this is: the run that started it and when, from the head's rank record ('' when the
    record says neither). A restart gives a new one, a reuse keeps it: 05-07 record it, the report compares."""
    started, run = head_record.get("started_at"), head_record.get("run_id") or ""
    return f"{run}@{float(started):.3f}" if isinstance(started, (int, float)) else ""


def exit_code(result: StartResult) -> int:
    """`python -m runbook start`'s exit status for a start result: 0 started, 3 its ranks already ran with the
    same configuration (the seeds' contract: dockerd restores them after a reboot), 1 could not start."""
    if result.reused:
        return ALREADY_RUNNING
    return ExitStatus.OK if result.ok else ExitStatus.FAILED


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
        _identity(cluster, profile, plan, result, ev)        # the reads are recorded; a difference does not stop it
        # recorded, not run: each rank's start command in start order (workers first; under ray every node's Ray,
        # the head's first, then the head's serve), the key by name only
        if plan.head.executor == "ray":
            for rank in plan.ranks:
                _make_bind_sources(cluster[rank.node], rank)
                cluster[rank.node].run(rank.ray_start_command(), timeout=120)
            cluster[plan.head.node].run(plan.head.start_command(), timeout=120,
                                        env={"VLLM_API_KEY": api_key or "***"} if plan.head.secret_env else None)
        for rank in ([] if plan.head.executor == "ray" else sorted(plan.ranks, key=lambda r: -r.rank)):
            _make_bind_sources(cluster[rank.node], rank)
            cluster[rank.node].run(rank.start_command(),
                                   env={"VLLM_API_KEY": api_key or "***"} if rank.secret_env else None, timeout=120)
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
            result.server_id = server_id(head_st.record)
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
        return _fail(result, "server started", "vLLM processes run on the head without its server (orphans of an "
                     "earlier run, or not the runbook's)", node="head", observed="; ".join(head_st.processes[:3]),
                     expected="none", fix=f"{_stop_cmd(profile)} (it stops orphaned EngineCore/Worker processes too), "
                                          "or kill them", raise_=raise_)
    # relaunch safety: the API and rendezvous ports closed on EVERY node (a rank of an earlier run that still
    # listens there takes the new worker into the old rendezvous: field report, tonyd2wild fix 6)
    held = _ports_held(cluster, profile)
    if held:
        where = ", ".join(held)
        return _fail(result, "server started", f"the API or rendezvous port is in use on the {where}",
                     node=where, observed="; ".join(f"{n}: " + ", ".join(f"{p}: {who}" for p, who in ports.items())
                                                    for n, ports in held.items()),
                     expected=f"PORT {profile.port} and MASTER_PORT {profile.master_port} closed on every node",
                     fix=f"{_stop_cmd(profile)} (stops every rank of an earlier run on every node, orphaned "
                         "EngineCore/Worker processes included); if what listens is not vLLM, stop that process "
                         "(ss -ltnp names it) -- changing PORT/MASTER_PORT would leave the orphans holding memory",
                     raise_=raise_)

    # -- the recipe checkout at the pinned commit on every node (its files are mounted into the ranks)
    if not _recipe_checkout(cluster, profile, result, ship=True):
        return _fail(result, "launch refused", "the recipe checkout is not at the pinned commit on every node: "
                     "nothing was started", node="cluster",
                     observed="; ".join(f"{c.node}: {c.observed}" for c in result.checks.failures())[:1500],
                     expected=f"{profile.recipe_repo} @ {profile.recipe_commit[:12]} on every node",
                     fix="see the recipe checkout rows", raise_=raise_)

    # -- identity across ranks: one image, python, vLLM build, NCCL, driver and recipe files, or nothing starts
    if not _identity(cluster, profile, plan, result, ev, homes=homes):
        bad = result.checks[-1]
        return _fail(result, "launch refused", "the ranks would not run one build: nothing was started",
                     node=bad.node, observed=bad.observed, expected=bad.expected, fix=bad.fix, raise_=raise_)

    # -- memory: the baseline the stop compares with; refused into a pool a previous stop left smaller
    pre = memguard.pre_launch(cluster, profile, homes)
    result.mem_before = pre.mem_before
    result.checks.add(pre.rows)
    if pre.refused:
        first = pre.refused[0]
        return _fail(result, first.name, "memory on a node is too low to launch into: nothing was started",
                     node=",".join(dict.fromkeys(c.node for c in pre.refused)),
                     observed="; ".join(c.observed for c in pre.refused)[:1500], expected=first.expected,
                     fix=first.fix, raise_=raise_)

    # -- launch: workers first, then the head
    env = {"VLLM_API_KEY": api_key} if api_key else None
    if api_key:
        from ..secrets import register_secret
        register_secret(api_key)
    t0 = time.monotonic()
    started: list[str] = []
    attempted: list[str] = []     # started, or tried to: a failed `docker run` can leave a created container
    if plan.head.executor == "ray":
        failed = _start_ray(cluster, profile, plan, result, env, run_id, raise_, cleanup, t0)
        if failed is not None:
            return failed
        if on_launched is not None:
            on_launched()
        return _readiness(cluster, profile, plan, result, url, api_key, ev, raise_, cleanup=cleanup, t0=t0,
                          started=True)
    try:
        for rank in sorted(plan.ranks, key=lambda r: -r.rank):
            node = cluster[rank.node]
            if rank.rank == 0 and (gone := _workers_not_running(cluster, plan)):
                # a worker that never came up (bad binary, quoting that split its environment, a crash on
                # start): the head would wait for it until vLLM's rendezvous timeout; never start it then
                if cleanup:
                    stop(cluster, profile, nodes=attempted, grace=10, mem_settle_s=0, together=True)
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
            if rank.rank == 0:
                result.server_id = server_id(rec)
            _make_bind_sources(node, rank)
            node.run(rank.start_command(), env=env if rank.secret_env else None, timeout=120)
            started.append(rank.node)
            if rank.rank == 0:
                result.readiness.head_started = round(time.monotonic() - t0, 3)
    except Exception as exc:  # noqa: BLE001 - any start failure: clean up, then report
        if cleanup and attempted:
            stop(cluster, profile, nodes=attempted, grace=10, mem_settle_s=0, together=True)
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


def _start_record(node, rank, plan, result, run_id) -> dict:
    rec = {"fingerprint": plan.fingerprint, "runtime": rank.runtime, "started_at": time.time(), "run_id": run_id,
           "mem_available_before": result.mem_before.get(rank.node), "container": rank.container,
           "log": rank.log_path, "base_url": result.base_url if rank.rank == 0 else ""}
    node.run(f"mkdir -p {quote(rank.state_dir)} && printf '%s\\n' {quote(json.dumps(rec))} "
             f"> {quote(rank.record_path)}", timeout=30)
    return rec


def _start_ray(cluster, profile, plan, result, env, run_id, raise_, cleanup, t0):
    """EXECUTOR=ray: Ray on every node (the head's GCS first), ``ray status`` until every node joined with its GPU
    (a node that never joined is named), then ``vllm serve`` on the head alone. Returns the failed result, or None
    once the head's serve was started."""
    records = {}
    for rank in plan.ranks:
        records[rank.node] = _start_record(cluster[rank.node], rank, plan, result, run_id)
        _make_bind_sources(cluster[rank.node], rank)
    up = ray_cluster.start_cluster(cluster, plan, timeout=min(profile.ready_timeout, ray_cluster.JOIN_TIMEOUT_S))
    result.checks.add(up.checks)
    result.raw["ray-status.txt"] = up.status_text
    if not up.ok:
        bad = next(c for c in up.checks if c.failed)
        if cleanup:
            result.checks.add(ray_cluster.stop_cluster(cluster, plan, grace=10))
            stop(cluster, profile, grace=10, mem_settle_s=0, together=True)
        return _fail(result, bad.name, "the Ray cluster did not come up on every node: vLLM was not started",
                     node=bad.node, observed=bad.observed, expected=bad.expected, fix=bad.fix, raise_=raise_)
    head = plan.head
    cluster[head.node].run(head.start_command(), env=env if head.secret_env else None, timeout=120)
    result.server_id = server_id(records[head.node])
    result.readiness.head_started = round(time.monotonic() - t0, 3)
    result.checks.add(check("ranks launched (Ray on every node, then vllm serve on the head)", True, node="cluster",
                            observed=f"{up.status.describe([r.node for r in plan.ranks])}; vllm serve started on "
                                     f"{head.node} {result.readiness.head_started:.1f} s after the first ray start",
                            expected="every node in the Ray cluster, then the head's serve"))
    return None


def _readiness(cluster, profile, plan, result, url, api_key, ev, raise_, *, cleanup, t0, started):
    # the ranks this call started: memory sampled every 1.5 s on a thread of its own, stopped at once on a breach
    kept_logs: dict[str, str] = {}
    guard = memguard.MemoryGuard(cluster, profile, t0, on_breach=_abort(profile, plan, kept_logs)).start() \
        if started else None
    try:
        failure, diagnostics = _wait_ready(cluster, profile, plan, result, url, api_key, t0, started, guard)
    finally:
        if guard is not None:
            guard.close()
    if guard is not None:
        result.memory_profile = guard.memory_profile()
        result.memory_psi = guard.psi_profile()
        result.memory_guard = guard.record(result.mem_before)
        result.checks.add(guard.minimum_rows(result.mem_before))
        if guard.stopped is not None:
            result.checks.add(guard.stopped.checks)       # the abort's stop: ranks gone, memory back or not
        if guard.breach is not None:                      # detected when the sample crossed, not after the stop
            result.failure_detected_at = t0 + guard.breach.t
    return _after_wait(cluster, profile, plan, result, ev, raise_, t0=t0, started=started, cleanup=cleanup,
                       failure=failure, diagnostics=diagnostics,
                       stopped_already=guard is not None and guard.stopped is not None, kept_logs=kept_logs)


def _abort(profile, plan: LaunchPlan, kept_logs: dict[str, str]):
    """The memory guard's action on a breach, on its own connections: stop every rank, the crossing one first.
    Docker ranks' logs are read first (``docker rm`` takes them along); a process rank's log stays on disk."""
    def abort(own: Cluster, breach: memguard.Breach):
        if plan.runtime == "docker":
            logs = own.each(lambda n: ranks.log_text(n, plan.rank(n.name), 2000))
            kept_logs.update({n: t for n, t in logs.items() if isinstance(t, str)})
        return stop(own, profile, grace=ABORT_GRACE_S, mem_settle_s=ABORT_SETTLE_S, first=breach.node)
    return abort


def _wait_ready(cluster, profile, plan, result, url, api_key, t0, started, guard):
    """Poll until ready or a failure: -> (failure (check, what, node, observed, fix) or None, diagnostics)."""
    ready = result.readiness
    deadline = t0 + profile.ready_timeout
    hang_s = profile.hang_seconds
    prev: dict[str, ranks.RankWatch | None] = {r.node: None for r in plan.ranks}
    last_progress = time.monotonic()
    dead_count = {r.node: 0 for r in plan.ranks}
    failure: tuple[str, str, str, str, str] | None = None
    diagnostics: dict[str, str] = {}
    master_probe = MasterProbe()

    def memory_failure() -> tuple[str, str, str, str, str] | None:
        if guard is None or guard.breach is None:
            return None
        what, node, observed, fix = guard.breach_row_text()
        return (memguard.GUARD_ROW, what, node, observed, fix)

    # counted work (runbook.progress): the ranks running of all, the seconds waited of READY_TIMEOUT
    with progress.count("ranks up", len(plan.ranks), "ranks") as up, \
            progress.count("ready wait", profile.ready_timeout, "s") as waited:
        while True:
            now = time.monotonic()
            watches = cluster.each(lambda n: ranks.watch(n, plan.rank(n.name), fresh=started))
            if (failure := memory_failure()) is not None:      # before "died": the guard stopped them
                break
            for name, w in watches.items():
                if isinstance(w, Exception):
                    dead_count[name] += 1
                    continue
                if guard is None and w.mem_available is not None:
                    result.memory_profile.setdefault(name, []).append([round(now - t0, 1), w.mem_available])
                if ranks.log_progressed(prev[name], w):
                    last_progress = now
                prev[name] = w
                dead_count[name] = 0 if w.alive else dead_count[name] + 1
            up.update(sum(1 for w in watches.values() if not isinstance(w, Exception) and w.alive))
            waited.update(now - t0)
            head_dead = dead_count["head"] >= 1
            dead_workers = [r.node for r in plan.workers if dead_count[r.node] >= WORKER_DEAD_POLLS]
            if head_dead or dead_workers:
                who = "head" if head_dead else dead_workers[0]
                failure = ("ranks alive while starting", f"the {who} rank died before the server was ready", who,
                           f"{who} process/container gone {now - t0:.0f} s after launch"
                           + (guard.last_seen(who) if guard is not None else ""),
                           "read both log tails below (a rank the kernel's OOM killer ended leaves no Python error: "
                           "dmesg | grep -i oom); fix the cause, then start again")
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
                failure = memory_failure() or ("models served", exc.what, "head", exc.observed, exc.fix)
                break
            if (failure := memory_failure()) is not None:
                break
            if ready.done:
                break
            if hang_s and time.monotonic() - last_progress > hang_s:
                diagnostics = hang_diagnostics(cluster, plan)
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
            pause = max(0.5, POLL_S - (time.monotonic() - now))
            guard.wait(pause) if guard is not None else time.sleep(pause)
    return failure, diagnostics


def _after_wait(cluster, profile, plan, result, ev, raise_, *, t0, started, cleanup, failure, diagnostics,
                stopped_already, kept_logs):
    ready = result.readiness
    if failure is not None:
        if result.failure_detected_at is None:
            result.failure_detected_at = time.monotonic()
        result.failure_detected_s = round(result.failure_detected_at - t0, 1)
    # -- evidence: logs of every rank, parsed
    texts = cluster.each(lambda n: ranks.log_text(n, plan.rank(n.name)))
    texts.update(kept_logs)             # read before the memory guard's stop removed the containers
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
        if started and cleanup and not stopped_already:
            stop(cluster, profile, grace=10, mem_settle_s=0, together=True)     # a booting vLLM ignores SIGTERM anyway
        expected = (result.memory_guard.get("expected") if cname == memguard.GUARD_ROW else
                    "both ranks alive until the API streams a token")
        return _fail(result, cname, what, node=node, observed=f"{observed}\n{tails}",
                     expected=expected, fix=fix, raise_=raise_,
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
    patch_warning_checks(plan, result, logs)
    sub = ray_cluster.substitution_check(profile, plan, logs.get(plan.head.node, ""), reused=result.reused)
    if sub is not None:
        result.checks.add(sub)
    result.checks.add(engram_attach.attach_checks(profile, plan, logs, reused=result.reused))
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


def patch_warning_checks(plan: LaunchPlan, result: StartResult, logs: dict[str, str]) -> None:
    """A tolerated start-chain step that failed (seed A's patch loop only warns): one WARN row per rank naming
    the patches, so a degraded boot is never a silent PASS."""
    for r in plan.ranks:
        warned = recipe.chain_warnings(logs.get(r.node, ""))
        if warned:
            result.checks.add(Check("recipe patches applied", node=r.node, status=Status.WARN,
                                    observed=" | ".join(warned[:6]),
                                    expected="every patch of the start chain applied",
                                    fix="the recipe tolerates this (its patch loop only warns) and the server runs; "
                                        "read the rank's log above the WARN line for the patch's error, then "
                                        "check the pinned image and checkout match (RECIPE_COMMIT, IMAGE)"))


def _ports_held(cluster: Cluster, profile) -> dict[str, dict[int, str]]:
    """Node -> {port: who listens} for PORT and MASTER_PORT on every node (read-only: ``ss -ltnp``, then the
    listeners' command lines, so an orphaned ``VLLM::EngineCore`` is named as such)."""
    ports = (profile.port, profile.master_port)

    def read(node) -> dict[int, str]:
        listening = system.parse_listening(node.read(system.LISTEN_CMD, timeout=20).stdout)
        held = {p: listening[p] for p in ports if p in listening}
        pids = sorted({int(pid) for who in held.values() for pid in re.findall(r"pid (\d+)", who)})
        if pids:
            args = dict(line.strip().split(None, 1) for line in node.read(
                f"ps -o pid=,args= -p {','.join(map(str, pids))} 2>/dev/null", timeout=20).stdout.splitlines()
                if len(line.split(None, 1)) == 2)
            for p, who in held.items():
                named = [f"{pid} {args[pid][:120]}" for pid in re.findall(r"pid (\d+)", who) if pid in args]
                held[p] = f"{who} [{'; '.join(named)}]" if named else who
        return {p: who or "a process (ss shows no owner: another user's?)" for p, who in held.items()}

    out: dict[str, dict[int, str]] = {}
    for name, value in cluster.each(read).items():
        if isinstance(value, Exception):
            raise value
        if value:
            out[name] = value
    return out


def _identity(cluster: Cluster, profile, plan: LaunchPlan, result: StartResult, ev, *,
              homes: dict[str, str] | None = None) -> bool:
    """The identity row (``identity.py``) and its table as raw evidence; False when the ranks differ."""
    table = identity.gather(cluster, profile, plan, homes=homes)
    row = identity.identity_check(table, profile, dry_run=cluster.head.dry_run)
    path = ev("identity.json", json.dumps(identity.to_record(table), indent=2))
    if path:
        row.evidence.append(path)
        result.evidence.append(path)
    result.checks.add(row)
    return not row.failed


def _recipe_checkout(cluster: Cluster, profile, result: StartResult, *, ship: bool) -> bool:
    """The pinned checkout on every node (``ship``: fetch on the head and copy to the workers first)."""
    if recipe.recipe_pin(profile) is None:
        return True
    checks, data = checkout.ensure_checkout(cluster, profile, ship=ship)
    result.checks.add(checks)
    result.recipe_checkout = data
    return not checks.failures()
