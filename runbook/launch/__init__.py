"""Step 04 — launch: render every rank's command from the profile, make the image present, start the
worker(s) then the head, and wait until the API streams a token (fail fast on a dead rank or a hang).

    outcome = runbook.launch.run(step, action="start")   # start | stop | restart | status; outcome.shown: LaunchOutcome
    plan = launch_plan(cluster, profile); launched = bring_up(cluster, profile, plan)   # `python -m runbook start`

``run`` reads as the step's phases (docs/DESIGN.md, "One inner shape"): ``plan_launch`` (the key a start needs, the
node facts and the rendered plan, recorded before anything runs) → ``apply`` (start / restart through ``bring_up``,
stop, or status) → ``verify`` (after a start: why it failed, or that it holds).

Modules: ``render`` (pure: profile + node facts → per-rank container/env/argv and fingerprint), ``plan``
(the node facts render needs, read-only, and the rendered plan), ``recipe`` (pure: each rank's start chain
and its boot-log markers), ``checkout`` (the recipe checkout at the pinned commit on every node),
``image`` (the runtime image on every node), ``facts/ranks.py`` (read-only: what runs on each node, liveness
and log growth while a start is watched), ``server`` (start and its watch until the first token), ``readiness``
(the API's readiness phases, the master-port probe, hang diagnostics), ``identity`` (every rank one build before
launch: image, python, vLLM package tree, torch, NCCL, driver, recipe files), ``stop`` (stop, teardown proven),
``memguard`` (memory before a launch and through a start: the refusal, the abort floor, the minimum per rank),
``status`` (read-only: status, logs), ``exposure`` (the key a bind beyond loopback needs; what listens on
each node), ``warmup`` (the recipe's boot-shape warm-up after readiness), ``selfcheck`` (seed A's image stamp and GPU
self-check before the launch), ``parity`` (the parity tables of docs/parity: what the recipes' scripts set beside what
render renders). Where the API is and the SSH forward that reaches a loopback bind: ``api/endpoint.py``.
Check names → code: "runtime image …" rows in ``image.py``; "api exposure", "ports exposed" in
``exposure.py``; "recipe checkout at the pinned commit" in ``checkout.py``; "ranks run one build (identity
before launch)" in ``identity.py``; "no vLLM process or container
left", "MemAvailable back to its pre-launch value", "server stopped" in ``stop.py``; "memory back since the last
stop", "MemAvailable above the floor before launch", "memory above the floor while starting", "minimum MemAvailable
through the start" in ``memguard.py``; every other row (start, readiness, KV cache, recipe markers) in ``server.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..checks import Check, CheckList
from ..profile import refuse_unservable
from ..secrets import load_secrets
from . import checkout, diagnosis, exposure, image, selfcheck, server, status, stop, warmup
from ..api.endpoint import api_address
from ..facts import ranks
from ..records import LaunchRank, LaunchRecord, NetworkRecord, RecordError, record_from_sidecar
from ..step import StepOutcome
from .plan import launch_plan
from .render import LaunchPlan

ACTIONS = ("start", "stop", "restart", "status")
#: what carries bring_up's partial outcome (``err.outcome``) for ``run`` to record what ran: an error of a node, a
#: command or the start (RunbookError, RemoteError, a bug) and an interrupt while it waits (Ctrl-C in the notebook).
#: Nothing else: SystemExit and GeneratorExit pass untouched, and so does a refusal raised before anything runs
#: (``refuse_unservable``), which has no outcome to carry. The same tuple carries a start's ``err.result``.
CARRIES_OUTCOME = server.CARRIES_RESULT


@dataclass
class LaunchOutcome:
    """What the notebook shows after the step's actions (and what ``python -m runbook start`` prints)."""
    plan: LaunchPlan
    started: server.StartResult | None = None
    stopped: stop.StopResult | None = None
    status: dict[str, Any] = field(default_factory=dict)
    image: image.ImageChecks | None = None
    selfchecks: list[Check] = field(default_factory=list)       # seed A's image stamp and GPU self-check
    warmup: list[Check] = field(default_factory=list)           # the recipe's boot-shape warm-up after readiness
    checks: CheckList = field(default_factory=CheckList)        # every row of bring_up, in order


def bring_up(cluster, profile, plan: LaunchPlan, *, stop_first: bool = False, go: bool = True,
             raw_prefix: str = "", run_id: str = "") -> LaunchOutcome:
    """Step 04's start and restart, and ``python -m runbook start``: the image on every node, the stop of a
    restart, then (when no row failed and ``go``) the start until the first token. On an exception of
    ``CARRIES_OUTCOME`` the partial outcome rides on it as ``.outcome``; a refusal before anything runs carries none."""
    out = LaunchOutcome(plan=plan)
    if go and not cluster.dry_run:          # a render shows the commands; a start is refused before anything runs
        refuse_unservable(profile)          # (EXECUTOR=ray on the lab's CPU vLLM)
    try:
        out.image = image.ensure_image(cluster, profile)
        out.checks.add(out.image)
        if not out.image.failures():       # seed A: the image's recipe stamp, then its GPU self-check
            out.selfchecks = [selfcheck.stamp_check(cluster, profile), selfcheck.gpu_selfcheck(cluster, profile)]
            out.checks.add(out.selfchecks)
        if stop_first:
            out.stopped = stop.stop(cluster, profile)
            out.checks.add(out.stopped.checks)
        # a dry run goes past a failing read-only check, so every command of the start is shown
        if go and (not out.checks.failures() or cluster.dry_run):
            if cluster.dry_run:
                # a real start fetches the pinned recipe checkout on the head and copies it to the workers after
                # its read-only state checks, before the identity reads; server.start's dry-run path skips that,
                # so the dry run records it here, in the same place among the commands shown
                out.checks.add(checkout.ensure_checkout(cluster, profile)[0])
            out.started = server.start(cluster, profile, plan, raw_prefix=raw_prefix, run_id=run_id,
                                       raise_on_failure=False)
            out.checks.add(out.started.checks)
            if out.started.ok and not out.started.reused:
                # the recipe's boot-shape warm-up once the API answers (non-fatal, as in both seeds); a dry run
                # records its command too, so the offline review shows it
                out.warmup = [warmup.run_warmup(cluster, profile, api_key=load_secrets().api_key)]
                out.checks.add(out.warmup)
    except CARRIES_OUTCOME as err:
        if out.started is None:
            out.started = getattr(err, "result", None)
        err.outcome = out
        raise
    return out


def run(step, *, action: str = "start") -> StepOutcome:
    """Step 04: plan (archived before anything runs) → apply the action (start / restart / stop / status) →
    verify a start; shows the :class:`LaunchOutcome` (the plan, the start, the stop or the status)."""
    if action not in ACTIONS:
        raise ValueError(f"action {action!r}: expected one of {', '.join(ACTIONS)}")
    plan = plan_launch(step, action)
    launched = apply(step, action, plan)
    if action in ("start", "restart"):
        verify(step, launched)
    return step.outcome(launched)


def plan_launch(step, action: str) -> LaunchPlan:
    """Facts and plan: a start's API key first (the plan renders it), then the node facts the render reads and
    the rendered plan (launch_plan), recorded in the step's data and its :class:`LaunchRecord` before anything
    runs."""
    profile = step.profile
    if action in ("start", "restart"):
        step.add([exposure.ensure_api_key(profile, dry_run=step.dry_run)])   # before the plan renders the key
        step.run.redactor.add_current()      # a key generated just now is masked in this step's evidence too
    plan = launch_plan(step.cluster, profile, step.run.read_record(NetworkRecord, missing_ok=True), site=step.site)
    step.data["rendered"] = plan.to_record()
    step.data["fingerprint"] = plan.fingerprint
    step.record = LaunchRecord(fingerprint=plan.fingerprint, served_model_name=plan.served_model_name,
                               max_model_len=plan.max_model_len,
                               ranks=tuple(LaunchRank(node=r.node, rank=r.rank, headless=r.headless)
                                           for r in plan.ranks))
    return plan


def apply(step, action: str, plan: LaunchPlan) -> LaunchOutcome:
    """Apply the action: start or restart (``bring_up``: image, self-checks, the stop of a restart, the start
    and its warm-up), stop, or read the status; every row and figure recorded in the step. When a start raises
    (an exception of ``CARRIES_OUTCOME``) what ran is recorded first; the exception itself always propagates,
    never hidden by an error while recording (that one is added to it as a note)."""
    profile = step.profile
    outcome = LaunchOutcome(plan=plan)
    if action in ("start", "restart"):
        try:
            outcome = bring_up(step.cluster, profile, plan, stop_first=action == "restart",
                               go=not step.checks.failures() or step.dry_run, raw_prefix=f"raw/{step.name}",
                               run_id=step.run.run_id)
        except CARRIES_OUTCOME as err:
            partial = getattr(err, "outcome", None)      # None: refused before anything ran
            if partial is not None:
                try:
                    record(step, profile, partial)
                except Exception as secondary:           # the start's own error stays the one raised
                    note(err, f"recording what ran before it also failed: {type(secondary).__name__}: {secondary}")
            raise
        record(step, profile, outcome)
    elif action == "stop":
        outcome.stopped = stop.stop(step.cluster, profile)
        step.add(outcome.stopped.checks)
        step.data.setdefault("stop", {}).update(outcome.stopped.per_node)
    elif action == "status":
        outcome.status = status.status(step.cluster, profile)
    return outcome


def note(err: BaseException, text: str) -> None:
    """Add ``text`` to ``err``'s notes (``BaseException.add_note`` from Python 3.11; the same ``__notes__`` list
    before it, which 3.10's traceback does not print but a reader of the exception finds)."""
    if hasattr(err, "add_note"):
        err.add_note(text)
    else:
        err.__notes__ = [*getattr(err, "__notes__", ()), text]


def verify(step, outcome: LaunchOutcome) -> None:
    """Verify a start (not in a dry run): a failed start or image pull is matched against the known failures
    (collected from every node); a start that came up is checked to hold (a second start refused, unless this one
    reused a running server) and to expose only what the profile allows."""
    if step.dry_run:
        return
    profile, plan = step.profile, outcome.plan
    pulls = diagnosis.failed_pulls(outcome.image)
    if (outcome.started is not None and not outcome.started.ok) or pulls:
        # say why, not only that: collect from every node and match the known failures (a failed pull's
        # output goes into the node's bundle as docker_pull.txt)
        archive, findings = diagnosis.diagnose_server(step.cluster, profile, step.run.path, step.run.redactor,
                                                      plan=plan, pulls=pulls)
        step.add(diagnosis.finding_checks(findings, archive, step.run.path))
        step.data["diagnose"] = {"archive": str(archive.relative_to(step.run.path)),
                                 "findings": [f.id for f in findings]}
        for finding in findings:
            print(finding.to_text())
    elif outcome.started is not None and outcome.started.ok:
        if not outcome.started.reused:
            step.add(server.second_start_check(step.cluster, profile, plan))
        step.add(exposure.exposure_checks(step.cluster, profile))


def record(step, profile, outcome: LaunchOutcome) -> None:
    """bring_up's rows, raw texts and figures into the step, in the order they happened."""
    if outcome.image is not None:
        step.add(outcome.image)
        step.data["image"] = outcome.image.data
    step.add(outcome.selfchecks)
    if outcome.stopped is not None:
        step.add(outcome.stopped.checks)
        step.data.setdefault("stop", {}).update(outcome.stopped.per_node)
    if outcome.started is not None:
        record_start(step, profile, outcome.started)
    step.add(outcome.warmup)


def record_start(step, profile, result: server.StartResult) -> None:
    """A start's rows, raw texts and figures into the step."""
    step.archive(result.raw)
    step.add(result.checks)
    if result.recipe:
        step.data["recipe"] = result.recipe
    if result.recipe_checkout:
        step.data["recipe_checkout"] = result.recipe_checkout
    step.data.update({"launch": result.data(), "base_url": api_address(profile),
                      "served_model_name": result.plan.served_model_name})
    # where 05-07 find the server (api.server_info.find_server); set once a start was made
    step.record = step.record.model_copy(update={"base_url": api_address(profile), "server_id": result.server_id})


def state_left(cluster, profile, sidecar: dict[str, Any] | None) -> str:
    """What a resume re-checks before skipping a passed 04: every rank still runs the configuration that
    step started (same fingerprint). '' when intact, else why not."""
    try:
        fingerprint = record_from_sidecar(sidecar, LaunchRecord).fingerprint
    except RecordError as err:         # an older run's 04: resume runs it again
        return f"{err.what}: {err.fix}"
    states = cluster.each(lambda node: ranks.rank_state(node, profile))
    for name, st in states.items():
        if isinstance(st, Exception):
            return f"{name}: cannot read its rank ({st})"
        if not st.running:
            return f"the server 04_launch started is gone: {name} {st.describe()}"
        if st.fingerprint and st.fingerprint != fingerprint:
            return f"{name} runs another configuration (fingerprint {st.fingerprint[:12]}, 04 started {fingerprint[:12]})"
    return ""

