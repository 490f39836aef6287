"""Step 04 — launch: render every rank's command from the profile, make the image present, start the
worker(s) then the head, and wait until the API streams a token (fail fast on a dead rank or a hang).

    outcome = runbook.launch.run(step, action="start")   # start | stop | restart | status

Modules: ``render`` (pure: profile + node facts → per-rank container/env/argv and fingerprint), ``plan``
(the node facts render needs, read-only, and the rendered plan), ``recipe`` (pure: each rank's start chain
and its boot-log markers), ``checkout`` (the recipe checkout at the pinned commit on every node),
``image`` (the runtime image on every node), ``ranks`` (read-only: what runs on each node, liveness and log
growth while a start is watched), ``server`` (start and its watch until the first token), ``readiness``
(the API's readiness phases, the master-port probe, hang diagnostics), ``stop`` (stop, teardown proven),
``status`` (read-only: status, logs), ``exposure`` (the key a bind beyond loopback needs; what listens on
each node), ``warmup`` (the recipe's boot-shape warm-up after readiness), ``selfcheck`` (seed A's image stamp and GPU
self-check before the launch), ``parity`` (the parity tables of
docs/parity: what the recipes' scripts set beside what render renders). Where the API is and the SSH forward that reaches a loopback bind: ``serve/endpoint.py``.
Check names → code: "runtime image …" rows in ``image.py``; "api exposure", "ports exposed" in
``exposure.py``; "recipe checkout at the pinned commit" in ``checkout.py``; "no vLLM process or container
left", "MemAvailable back to its pre-launch value", "server stopped" in ``stop.py``; every other row
(start, readiness, KV cache, recipe markers) in ``server.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..secrets import load_secrets
from . import diagnosis, exposure, image, ranks, selfcheck, server, status, stop, warmup
from .plan import gids_from_network_sidecar, render_plan
from .render import LaunchPlan

ACTIONS = ("start", "stop", "restart", "status")


@dataclass
class LaunchOutcome:
    """What the notebook shows after the step's actions."""
    plan: LaunchPlan
    started: server.StartResult | None = None
    stopped: stop.StopResult | None = None
    status: dict[str, Any] = field(default_factory=dict)


def run(step, *, action: str = "start") -> LaunchOutcome:
    """Render the plan (archived before anything runs), then start / stop / restart or read status."""
    if action not in ACTIONS:
        raise ValueError(f"action {action!r}: expected one of {', '.join(ACTIONS)}")
    profile = step.profile
    if action in ("start", "restart"):
        step.add([exposure.ensure_api_key(profile, dry_run=step.dry_run)])   # before the plan renders the key
        step.run.redactor.add_current()      # a key generated just now is masked in this step's evidence too
    gids = gids_from_network_sidecar(step.run.read_sidecar("01_network"))
    plan = render_plan(step.cluster, profile, gid_indexes=gids)
    step.data["rendered"] = plan.to_record()
    step.data["fingerprint"] = plan.fingerprint
    outcome = LaunchOutcome(plan=plan)
    if action in ("start", "restart"):
        image_checks = image.ensure_image(step.cluster, profile)
        step.add(image_checks)
        step.data["image"] = image_checks.data
        if not image_checks.failures():     # seed A: the image's recipe stamp, then its GPU self-check
            step.add([selfcheck.stamp_check(step.cluster, profile), selfcheck.gpu_selfcheck(step.cluster, profile)])
    if action in ("stop", "restart"):
        outcome.stopped = stop.stop(step.cluster, profile)
        step.add(outcome.stopped.checks)
        step.data.setdefault("stop", {}).update(outcome.stopped.per_node)
    # a dry run goes past a failing read-only check, so every command of the start is shown
    if action in ("start", "restart") and (not step.checks.failures() or step.dry_run):
        outcome.started = server.start(step.cluster, profile, plan, step=step, raise_on_failure=False)
        if not outcome.started.ok and not step.dry_run:
            # say why, not only that: collect from every node and match the known failures
            archive, findings = diagnosis.diagnose_server(step.cluster, profile, step.run.path, step.run.redactor,
                                                          plan=plan)
            step.add(diagnosis.finding_checks(findings, archive, step.run.path))
            step.data["diagnose"] = {"archive": str(archive.relative_to(step.run.path)),
                                     "findings": [f.id for f in findings]}
            for finding in findings:
                print(finding.to_text())
        elif outcome.started.ok and not step.dry_run:
            if not outcome.started.reused:
                # the recipe's boot-shape warm-up once the API answers (non-fatal, as in both seeds)
                step.add(warmup.run_warmup(step.cluster, profile, api_key=load_secrets().api_key))
                step.add(server.second_start_check(step.cluster, profile, plan))
            step.add(exposure.exposure_checks(step.cluster, profile))
    if action == "status":
        outcome.status = status.status(step.cluster, profile)
    return outcome


def state_left(profile, cluster, sidecar: dict[str, Any] | None) -> str:
    """What a resume re-checks before skipping a passed 04: every rank still runs the configuration that
    step started (same fingerprint). '' when intact, else why not."""
    fingerprint = ((sidecar or {}).get("data") or {}).get("fingerprint", "")
    if not fingerprint:
        return "04_launch recorded no fingerprint"
    states = cluster.each(lambda node: ranks.rank_state(node, profile))
    for name, st in states.items():
        if isinstance(st, Exception):
            return f"{name}: cannot read its rank ({st})"
        if not st.running:
            return f"the server 04_launch started is gone: {name} {st.describe()}"
        if st.fingerprint and st.fingerprint != fingerprint:
            return f"{name} runs another configuration (fingerprint {st.fingerprint[:12]}, 04 started {fingerprint[:12]})"
    return ""

