"""Step 07 — benchmarks, and the streaming benchmark for OpenAI-compatible servers (vLLM) it runs.

    outcome = runbook.bench.run(step, repeats=None, soak_seconds=None)   # rows, result, previous, cross-check

Check names → code: ``bench <case>`` rows in ``result.py`` (``BenchResult.checks``), the soak in ``runner.py``,
``bench cross-check (vllm bench serve)`` in ``crosscheck.py``, ``serving watchdog`` in ``launch/watchdog.py``.

Library API (also ``python -m runbook bench`` against any server)::

    from runbook.bench import BenchConfig, run_benchmark, results_table, plot_comparison
    res = run_benchmark(base_url, model, BenchConfig(concurrency=(1, 2, 4)), out_dir)
    results_table(res, recipe="exl3-v41", previous=prev_dir); plot_comparison(res, recipe="exl3-v41")
"""
from .report import (
           anchors_table,
           class_table,
           load_published,
           plot_comparison,
           render_text,
           results_table,
           write_report,
)
from . import roofline_panel
from .reconcile import reconcile, reconciliation_table
from .result import SCHEMA_VERSION, BenchConfig, BenchResult, CaseResult, write_raw
from .runner import arun_benchmark, run_benchmark
from .step import BenchOutcome, run

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
