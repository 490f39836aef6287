"""Step 03 — Engram: pack each rank's rows of every Engram table onto its node's NVMe, verify, probe reads.

    numbers = runbook.engram.run(step, check_samples=256, probe_seconds=3.0)   # {node: {"pack": …, "probe": …}}

Check names → code: ``engram source``, ``engram python3``, ``engram source size|parity``, ``engram layout``,
``engram packed dir free space`` in ``precheck.py``; ``engram pack …`` and ``engram packed … verify`` in
``packing.py`` (with the N/A rows of ENGRAM=0); ``engram slim source`` in ``slim_source.py``; ``engram read
probe …`` in ``read_probe.py``; ``lab fixture: …`` in ``lab/engram_source.py`` (the lab's, through
``step.site.engram_source``). The read-only node facts are in ``facts.py``; shipping the tools in
``engram_tools/ship.py``; the byte layout (``layout.py``) and the node-side tools ``pack.py`` (with
``pack_partial.py``, ``pack_writer.py``), ``check.py``, ``probe.py`` and ``slim.py`` are in ``runbook/engram_tools/``.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .packing import summarize


def run(step, *, check_samples: int = 256, probe_seconds: float = 3.0, echo=print) -> dict[str, dict]:
    """Engram packing in order, each stage skipping the nodes an earlier stage failed on; returns the
    per-node pack and probe figures (also recorded in ``step.data``). ENGRAM=0: N/A rows only."""
    from .facts import gather_facts
    from .precheck import precheck
    from .read_probe import run_probe
    from .slim_source import make_slim_source
    from .packing import applicable, blocked_nodes, disabled_checks, engram_record, plan_pack, run_pack
    profile, cluster = step.profile, step.cluster
    enabled, reason = applicable(profile)
    echo(reason)
    if not enabled:
        step.add(disabled_checks(profile, reason))
        step.record = engram_record(profile, {}, {})
        return {}
    if step.site.engram_source is not None:        # the lab generates the source 02 downloads on the Sparks
        step.add(step.site.engram_source(cluster, profile))
    else:
        echo("not the lab: the Engram source comes from 02_weights (HF_ENGRAM_REPO)")
    facts = gather_facts(cluster, profile)
    step.add(precheck(profile, facts))
    for node, commands in plan_pack(profile, facts).items():
        echo(f"{node}:", *commands[1:], sep="\n  ")
    results: dict = {}

    def blocked() -> set[str]:
        # a dry run goes past a failed read-only check (unknown answers offline), so every command is shown
        return set() if step.dry_run else blocked_nodes(step.checks)
    step.add(run_pack(cluster, profile, facts, results=results, stream=True, check_samples=check_samples,
                      skip=blocked()))
    step.add(make_slim_source(cluster, profile, facts))   # recipe A's /engram-src (N/A elsewhere)
    step.add(run_probe(cluster, profile, facts, results=results, seconds=probe_seconds, skip=blocked()))
    summary = record(step, results)
    step.record = engram_record(profile, facts, summary)     # records.EngramRecord: which rank's files are where
    return summary


def record(step, results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Put the numbers into ``step.data["engram"]`` and every tool's raw JSON under raw/<step>/."""
    summary = summarize(results)
    step.data["engram"] = summary
    raw = {}
    for name, r in sorted(results.items()):
        for tool, value in sorted(r.items()):
            raw[f"{tool}-{name}"] = step.raw(f"{tool}-{name}.json", json.dumps(value, indent=1, sort_keys=True))
    step.data["engram_raw"] = raw
    return summary
