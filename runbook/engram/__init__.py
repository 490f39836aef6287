"""Step 03 — Engram: pack each rank's rows of every Engram table onto its node's NVMe, verify, probe reads.

    numbers = runbook.engram.run(step, check_samples=256, probe_seconds=3.0)   # {node: {"pack": …, "probe": …}}

Check names → code: every ``engram …`` row is built in ``step.py`` (``precheck``/``space_checks``,
``pack_checks``, ``check_checks``, ``probe_checks``); the slim ``/engram-src`` tree of recipe A in ``slim.py``;
the byte layout in ``layout.py``; the node-side tools are ``pack.py`` and ``probe.py``.
"""
from __future__ import annotations


def run(step, *, check_samples: int = 256, probe_seconds: float = 3.0, echo=print) -> dict[str, dict]:
    """Engram packing in order, each stage skipping the nodes an earlier stage failed on; returns the
    per-node pack and probe figures (also recorded in ``step.data``). ENGRAM=0: N/A rows only."""
    from . import step as flow
    profile, cluster = step.profile, step.cluster
    enabled, reason = flow.applicable(profile)
    echo(reason)
    if not enabled:
        step.add(flow.disabled_checks(profile, reason))
        return {}
    if profile.is_lab:
        step.add(flow.prepare_lab_source(cluster, profile))
    else:
        echo("not the lab: the Engram source comes from 02_weights (HF_ENGRAM_REPO)")
    facts = flow.gather_facts(cluster, profile)
    step.add(flow.precheck(profile, facts))
    for node, commands in flow.plan_pack(profile, facts).items():
        echo(f"{node}:", *commands[1:], sep="\n  ")
    results: dict = {}
    step.add(flow.run_pack(cluster, profile, facts, results=results, stream=True, check_samples=check_samples,
                           skip=flow.blocked_nodes(step.checks)))
    step.add(flow.make_slim_source(cluster, profile, facts))   # recipe A's /engram-src (N/A elsewhere)
    step.add(flow.run_probe(cluster, profile, facts, results=results, seconds=probe_seconds,
                            skip=flow.blocked_nodes(step.checks)))
    return flow.record(step, results)
