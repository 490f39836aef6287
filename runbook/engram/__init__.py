"""Step 03 — Engram: pack each rank's rows of every Engram table onto its node's NVMe, verify, probe reads.

    outcome = runbook.engram.run(step, check_samples=256, probe_seconds=3.0)
    outcome.shown                          # {node: {"pack": …, "verify": …, "probe": …}}

``run`` reads as the step's four phases (docs/DESIGN.md, "One inner shape"): ``read_facts`` (the lab's fixture
source, what each node has, the rows packing needs first) → ``plan_pack`` (each node's commands, shown) →
``apply`` (pack and verify every rank not blocked, recipe A's slim source) → ``verify`` (the read probe), then
the numbers and the record.

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

from ..step import StepOutcome
from .facts import gather_facts
from .packing import applicable, blocked_nodes, disabled_checks, engram_record, plan_pack, run_pack, summarize
from .precheck import precheck as precheck_rows     # the name `precheck` stays the submodule
from .read_probe import run_probe
from .slim_source import make_slim_source


def run(step, *, check_samples: int = 256, probe_seconds: float = 3.0, echo=print) -> StepOutcome:
    """Step 03: facts → plan → apply → verify, each stage skipping the nodes an earlier row failed on; shows the
    per-node pack, verify and probe figures (also in ``step.data["engram"]``). ENGRAM=0: N/A rows only."""
    enabled, reason = applicable(step.profile)
    echo(reason)
    if not enabled:
        step.add(disabled_checks(step.profile, reason))
        step.record = engram_record(step.profile, {}, {})
        return step.outcome({})
    facts = read_facts(step, echo=echo)
    plans = plan_pack(step.profile, facts, check_samples=check_samples)
    for node, commands in plans.items():
        echo(f"{node}:", *commands[1:], sep="\n  ")
    results: dict[str, dict] = {}          # {node: {"pack": …, "check": …, "probe": …}}: the tools' own JSON
    apply(step, facts, plans, results)
    verify(step, facts, results, probe_seconds=probe_seconds)
    summary = record(step, results)
    step.record = engram_record(step.profile, facts, summary)     # records.EngramRecord: which rank's files are where
    return step.outcome(summary)


def read_facts(step, *, echo=print) -> dict[str, dict[str, Any]]:
    """Facts: the lab's fixture source first (RECIPE=lab: ``step.site.engram_source``; elsewhere 02_weights brought it), then what each node
    has (read-only), and the rows packing needs to pass (python3, the source, its size and parity, free space)."""
    if step.site.engram_source is not None:        # the lab generates the source 02 downloads on the Sparks
        step.add(step.site.engram_source(step.cluster, step.profile))
    else:
        echo("not the lab: the Engram source comes from 02_weights (HF_ENGRAM_REPO)")
    facts = gather_facts(step.cluster, step.profile)
    step.add(precheck_rows(step.profile, facts))
    return facts


def apply(step, facts: Mapping[str, Any], plans: Mapping[str, list[str]], results: dict[str, dict]) -> None:
    """Apply: run the plan on every rank no row has failed on (pack, then the checker against the source, per node
    in parallel: a node's verify follows its own pack), then recipe A's slim source (N/A elsewhere)."""
    step.add(run_pack(step.cluster, step.profile, facts, results=results, stream=True, plans=plans,
                      skip=blocked(step)))
    step.add(make_slim_source(step.cluster, step.profile, facts))


def verify(step, facts: Mapping[str, Any], results: dict[str, dict], *, probe_seconds: float) -> None:
    """Verify: the bounded random-read probe on each packed node no row has failed on (WARN-only rows)."""
    step.add(run_probe(step.cluster, step.profile, facts, results=results, seconds=probe_seconds,
                       skip=blocked(step)))


def blocked(step) -> set[str]:
    """The nodes a later stage skips: those with a failed row so far. A dry run goes past a failed read-only row
    (answers are unknown offline), so every command is shown."""
    return set() if step.dry_run else blocked_nodes(step.checks)


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
