"""Step 07 — benchmarks, and the streaming benchmark for OpenAI-compatible servers (vLLM) it runs.

    outcome = runbook.bench.run(step, repeats=None, soak_seconds=None)   # rows, result, previous, cross-check

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
        vllm_tokenizer: str = "", echo=print) -> BenchOutcome:
    """Step 07: find the server (04's, or ``base_url``), probe every rank's memory bandwidth, measure every cell of
    the profile's conditions under the serving watchdog, probe again, record the rows, cross-check one cell with
    vLLM's own client, and put the measured decode beside its roofline."""
    from ..api import watchdog, endpoint
    from ..api.server_info import find_server
    from ..facts import node_paths
    server = find_server(step.profile, step.run.path, base_url=base_url, model=model)
    network = step.run.read_record(NetworkRecord, missing_ok=True)     # before measuring: an old 01 stops here
    profile = step.profile
    config = config_from_profile(profile, repeats=repeats, soak_seconds=soak_seconds)
    # a loopback-bound API is measured through the SSH forward, which costs a few % (docs/bench.md): say so
    route = "direct (base_url)" if base_url else endpoint.api_address(profile)
    echo(f"route: {route}")
    echo(server.describe())
    step.data["server"] = server.describe()
    # which server start the figures belong to (RunDir.evidence_of_other_servers reads it)
    step.record = BenchRecord.of(server, result="")
    echo(config.to_dict())
    out_dir = step.raw_dir / RAW_DIR_NAME
    # every rank's memory bandwidth before and after: a rank in a slow state makes the bench invalid. The probe
    # runs in the serving container, or outside one with the python next to VLLM_BIN on GPU nodes (it has torch)
    probe_python = node_paths.vllm_python(profile) if membw.on_gpu(profile) else None
    probing = not base_url        # another server's nodes are not the profile's: nothing to probe
    raw_prefix = f"raw/{step.name}"

    def probe(phase: str) -> dict[str, dict[str, Any]]:
        if not probing:
            return {}
        results, rows, raws = membw.probe_ranks(step.cluster, profile, phase, probe_python, raw_prefix=raw_prefix)
        step.archive(raws)
        step.add(rows)
        return results

    before = probe("before")
    for node, r in before.items():
        if not r.get("error"):
            echo(f"{node}: {r['gbs']:.1f} GB/s ({r.get('label', '')})")
    # the wedge / API-gone alarm watches the server 04 started, not a foreign one
    with watchdog.watching(profile, step.add, dry_run=step.dry_run) if not base_url else contextlib.nullcontext():
        result = run_benchmark(server.base_url, server.model, config=config, out_dir=out_dir,
                               api_key=server.api_key or None)
    step.add(result.checks())
    membw_data = {"before": before, "after": probe("after")}
    valid, row = membw.validity(membw_data, gpu=membw.on_gpu(profile))
    if not probing:
        row = not_applicable(membw.VALID_ROW, "base_url given: the server's nodes are not the profile's, not probed",
                             node="cluster")
    membw_data["valid"] = valid
    step.add(row)
    step.data["membw"] = membw_data
    step.data["bench"] = {"result": str(out_dir.relative_to(step.run.path) / "result.json"), "route": route,
                          "valid": valid}
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
    return BenchOutcome(server, config, result, previous_result(step.run.path), cross, out_dir, panel, valid)
