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
from ..benchmark.result import SCHEMA_VERSION, BenchConfig, BenchResult, CaseResult, write_raw
from ..benchmark.runner import arun_benchmark, run_benchmark
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


def run(step, *, base_url: str = "", model: str = "", repeats: int | None = None,
        soak_seconds: float | None = None, vllm_cross_check: bool = True, vllm_python: str = "",
        vllm_tokenizer: str = "", echo=print) -> BenchOutcome:
    """Step 07: find the server (04's, or ``base_url``), measure every cell of the profile's conditions under
    the serving watchdog, record the rows, cross-check one cell with vLLM's own client."""
    from ..api import watchdog, endpoint
    from ..api.server_info import find_server
    server = find_server(step, base_url=base_url, model=model)
    config = config_from_profile(step.profile, repeats=repeats, soak_seconds=soak_seconds)
    # a loopback-bound API is measured through the SSH forward, which costs a few % (docs/bench.md): say so
    route = "direct (base_url)" if base_url else endpoint.api_address(step.profile)
    echo(f"route: {route}")
    echo(server.describe())
    echo(config.to_dict())
    out_dir = step.raw_dir / RAW_DIR_NAME
    # the wedge / API-gone alarm watches the server 04 started, not a foreign one
    with watchdog.watching(step) if not base_url else contextlib.nullcontext():
        result = run_benchmark(server.base_url, server.model, config=config, out_dir=out_dir,
                               api_key=server.api_key or None)
    step.add(result.checks())
    step.data["bench"] = {"result": str(out_dir.relative_to(step.run.path) / "result.json"), "route": route}
    cross, cross_data = cross_check(step.profile, server, result, step.raw_dir / "vllm-bench",
                                    enabled=vllm_cross_check, python=vllm_python, tokenizer=vllm_tokenizer)
    if cross_data:
        cross_data["log"] = str(Path(cross_data["log"]).relative_to(step.run.path))
        step.data["vllm_cross_check"] = cross_data
    step.add(cross)
    return BenchOutcome(server, config, result, previous_result(step.run.path), cross, out_dir)
