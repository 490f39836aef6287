"""Step 07 — benchmarks, and the streaming benchmark for OpenAI-compatible servers (vLLM) it runs.

    bench = runbook.bench.run(step, repeats=None, soak_seconds=None).shown   # BenchOutcome: result, previous, cross-check

Check names → code: ``bench <case>`` rows in ``benchmark/result.py`` (``BenchResult.checks``), the soak in
``benchmark/runner.py``, ``bench cross-check (vllm bench serve)`` in ``benchmark/crosscheck.py`` (run by
``config.cross_check``), ``serving watchdog`` in ``api/watchdog.py``. The step's conditions are in ``config.py``.

Library API (also ``python -m runbook bench`` against any server)::

    from runbook.bench import BenchConfig, run_benchmark, results_table, plot_comparison
    res = run_benchmark(base_url, model, BenchConfig(concurrency=(1, 2, 4)), out_dir)
    results_table(res, recipe="exl3-v41", previous=prev_dir); plot_comparison(res, recipe="exl3-v41")
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..benchmark.report import (
           anchors_table,
           class_table,
           load_published,
           plot_comparison,
           render_text,
           results_table,
           write_report,
)
from ..benchmark import roofline_panel
from ..benchmark.reconcile import reconcile, reconciliation_table
from ..benchmark.result import SCHEMA_VERSION, BenchConfig, BenchResult, CaseResult, write_raw
from ..benchmark.runner import arun_benchmark, run_benchmark
from ..checks import not_applicable
from ..records import BenchRecord, NetworkRecord
from ..step import StepOutcome
from . import ceiling, membw
from .config import RAW_DIR_NAME, config_from_profile, cross_check, previous_result

__all__ = [
           "BenchOutcome",
           "run",
           "SCHEMA_VERSION",
           "anchors_table",
           "class_table",
           "BenchConfig",
           "BenchResult",
           "CaseResult",
           "arun_benchmark",
           "load_published",
           "plot_comparison",
           "render_text",
           "results_table",
           "run_benchmark",
           "write_raw",
           "write_report",
           "reconcile",
           "reconciliation_table",
           "roofline_panel",
]


@dataclass
class BenchOutcome:
    """What notebook 07 shows after the measurement."""
    server: Any                  # api.server_info.ServerInfo
    config: BenchConfig
    result: BenchResult
    previous: BenchResult | None  # the previous good run's result (the report's drift compares with it too)
    cross: Any                   # the `vllm bench serve` cross-check row
    out_dir: Path
    roofline: dict[str, Any] | None = None   # the roofline panel (ceiling.panel): inputs and one row per class
    valid: bool | None = None     # False: a rank's memory bandwidth fell below 80 % of another (membw.py)

    def roofline_table(self):
        """The roofline panel as a DataFrame (measured/ceiling per class and thinking mode)."""
        import pandas as pd
        rows = (self.roofline or {}).get("rows") or []
        cols = roofline_panel.PANEL_COLUMNS
        return pd.DataFrame([{k: r.get(k) for k in cols} for r in rows], columns=list(cols))


def run(step, *, base_url: str = "", model: str = "", repeats: int | None = None,
        soak_seconds: float | None = None, vllm_cross_check: bool = True, vllm_python: str = "",
        vllm_tokenizer: str = "", echo=print) -> StepOutcome:
    """Step 07: facts (the server: 04's, or ``base_url``; 01's record) → plan (the profile's conditions, the route,
    the memory-bandwidth probe) → apply (every rank's memory bandwidth, every cell under the serving watchdog, the
    bandwidth again) → verify (the bench's validity, one cell cross-checked with vLLM's own client, the measured
    decode beside its roofline). Shows a :class:`BenchOutcome`."""
    server, network = read_facts(step, base_url=base_url, model=model)
    plan = plan_bench(step, server, base_url=base_url, repeats=repeats, soak_seconds=soak_seconds, echo=echo)
    result, membw_data = apply(step, server, plan, echo=echo)
    valid, cross, panel = verify(step, server, plan, result, membw_data, network, vllm_cross_check=vllm_cross_check,
                                 vllm_python=vllm_python, vllm_tokenizer=vllm_tokenizer)
    return step.outcome(BenchOutcome(server, plan.config, result, previous_result(step.run.path), cross, plan.out_dir,
                                     panel, valid))


@dataclass(frozen=True)
class BenchPlan:
    """What step 07 measures and how: the conditions, the route to the server, where the raw records go, and
    whether (and with which python) every rank's memory bandwidth is probed and the serving watchdog watches."""
    config: BenchConfig
    route: str
    out_dir: Path
    probing: bool                 # False for a base_url: another server's nodes are not the profile's
    probe_python: str | None      # the python next to VLLM_BIN on GPU nodes (it has torch); None: in the container
    watched: bool                 # the wedge / API-gone alarm watches the server 04 started, not a foreign one


def read_facts(step, *, base_url: str, model: str) -> tuple[Any, NetworkRecord | None]:
    """Facts: the server (04's record, or ``base_url``) and 01's record, read before measuring (an old 01 stops
    here)."""
    from ..api.server_info import find_server
    server = find_server(step.profile, step.run.path, base_url=base_url, model=model)
    network = step.run.read_record(NetworkRecord, missing_ok=True)
    return server, network


def plan_bench(step, server, *, base_url: str, repeats: int | None, soak_seconds: float | None,
               echo=print) -> BenchPlan:
    """Plan: the profile's conditions, the route (a loopback-bound API is measured through the SSH forward, which
    costs a few %: docs/bench.md), and the step's record of which server start the figures belong to
    (``RunDir.evidence_of_other_servers`` reads it)."""
    from ..api import endpoint
    from ..facts import node_paths
    profile = step.profile
    config = config_from_profile(profile, repeats=repeats, soak_seconds=soak_seconds)
    route = "direct (base_url)" if base_url else endpoint.api_address(profile)
    echo(f"route: {route}")
    echo(server.describe())
    step.data["server"] = server.describe()
    step.record = BenchRecord.of(server, result="")
    echo(config.to_dict())
    # every rank's memory bandwidth before and after: a rank in a slow state makes the bench invalid. The probe
    # runs in the serving container, or outside one with the python next to VLLM_BIN on GPU nodes (it has torch)
    return BenchPlan(config=config, route=route, out_dir=step.raw_dir / RAW_DIR_NAME,
                     probing=not base_url, watched=not base_url,
                     probe_python=node_paths.vllm_python(profile) if membw.on_gpu(profile) else None)


def probe_bandwidth(step, plan: BenchPlan, phase: str) -> dict[str, dict[str, Any]]:
    """Every rank's memory bandwidth (``phase``: before | after), its rows and raw files into the step."""
    if not plan.probing:
        return {}
    results, rows, raws = membw.probe_ranks(step.cluster, step.profile, phase, plan.probe_python,
                                            raw_prefix=f"raw/{step.name}")
    step.archive(raws)
    step.add(rows)
    return results


def apply(step, server, plan: BenchPlan, *, echo=print) -> tuple[BenchResult, dict[str, Any]]:
    """Apply: the bandwidth before, every cell of the conditions under the serving watchdog (its rows), the
    bandwidth after; returns the result and the two probes."""
    from ..api import watchdog
    before = probe_bandwidth(step, plan, "before")
    for node, r in before.items():
        if not r.get("error"):
            echo(f"{node}: {r['gbs']:.1f} GB/s ({r.get('label', '')})")
    with watchdog.watching(step.profile, step.add, dry_run=step.dry_run) if plan.watched else contextlib.nullcontext():
        result = run_benchmark(server.base_url, server.model, config=plan.config, out_dir=plan.out_dir,
                               api_key=server.api_key or None)
    step.add(result.checks())
    return result, {"before": before, "after": probe_bandwidth(step, plan, "after")}


def verify(step, server, plan: BenchPlan, result: BenchResult, membw_data: dict[str, Any],
           network: NetworkRecord | None, *, vllm_cross_check: bool, vllm_python: str,
           vllm_tokenizer: str) -> tuple[bool | None, Any, dict[str, Any]]:
    """Verify: is the bench valid (no rank's bandwidth below 80 % of another's), one cell again with vLLM's own
    client, and the measured decode beside its roofline; the result's path into the step's record. Returns the
    validity, the cross-check row and the roofline panel."""
    profile = step.profile
    valid, row = membw.validity(membw_data, gpu=membw.on_gpu(profile))
    if not plan.probing:
        row = not_applicable(membw.VALID_ROW, "base_url given: the server's nodes are not the profile's, not probed",
                             node="cluster")
    membw_data["valid"] = valid
    step.add(row)
    step.data["membw"] = membw_data
    step.data["bench"] = {"result": str(plan.out_dir.relative_to(step.run.path) / "result.json"),
                          "route": plan.route, "valid": valid}
    step.record = step.record.model_copy(update={"result": step.data["bench"]["result"]})   # the report's result
    cross, cross_data = cross_check(profile, server, result, step.raw_dir / "vllm-bench",
                                    enabled=vllm_cross_check, python=vllm_python, tokenizer=vllm_tokenizer,
                                    site=step.site)
    if cross_data:
        cross_data["log"] = str(Path(cross_data["log"]).relative_to(step.run.path))
        step.data["vllm_cross_check"] = cross_data
    step.add(cross)
    panel = ceiling.panel(step.cluster, profile, result, membw_data, network, site=step.site)
    step.data["roofline"] = panel
    return valid, cross, panel
