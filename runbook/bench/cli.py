"""``python -m runbook bench``: run the benchmark against an OpenAI-compatible server.

    python -m runbook bench --base-url http://127.0.0.1:8000 --model NAME [--api-key-env VAR]
        [--prompt-tokens N] [--decode-tokens N] [--concurrency 1,2,4] [--prefill-tokens 1024,3072]
        [--repeats 3] [--out DIR] [--soak-seconds S] [--endpoint completions|chat] [--recipe R]
        [--previous DIR_OR_JSON] [--allow-busy] [--allow-other-model]

The API key is read from the named environment variable; it is never printed or written (the
result records only the variable's name). Exit codes: 0 all cases pass (warnings allowed), 6 a case
or the soak failed (``BenchError.exit_code``), 2 bad arguments.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import BenchError, RunbookError
from ..benchmark.result import BenchConfig


def _ints(s: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in s.replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {s!r}")
    if any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError("values must be > 0")
    return vals


def parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    ap = argparse.ArgumentParser(prog="python -m runbook bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is ok)")
    ap.add_argument("--model", required=True, help="served model name")
    ap.add_argument("--api-key-env", default="", help="name of the environment variable holding the API key")
    ap.add_argument("--endpoint", choices=("completions", "chat"), default=d.endpoint)
    ap.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    ap.add_argument("--decode-tokens", type=int, default=d.decode_tokens)
    ap.add_argument("--concurrency", type=_ints, default=d.concurrency)
    ap.add_argument("--prefill-tokens", type=_ints, default=d.prefill_tokens)
    ap.add_argument("--repeats", type=int, default=d.repeats)
    ap.add_argument("--warmup", type=int, default=d.warmup_requests, help="warm-up requests (0 = max concurrency)")
    ap.add_argument("--no-reset-cache", action="store_true", help="do not POST /reset_prefix_cache before cases")
    ap.add_argument("--timeout", type=float, default=0.0, help="per-request timeout s (0 = by prompt size)")
    ap.add_argument("--soak-seconds", type=float, default=0.0)
    ap.add_argument("--soak-window", type=float, default=d.soak_window_s)
    ap.add_argument("--soak-stall", type=float, default=d.soak_stall_s)
    ap.add_argument("--soak-min-ratio", type=float, default=d.soak_min_ratio)
    ap.add_argument("--recipe", default="", help="lab | exl3-v41 | dspark-v4: published figures to compare with")
    ap.add_argument("--previous", default="", help="a previous run's result.json (or its directory)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="", help="output directory (result.json, JSONL, table, plot)")
    ap.add_argument("--no-plot", action="store_true", help="write the table but not comparison.png")
    ap.add_argument("--allow-busy", action="store_true",
                    help="measure even when /metrics shows other requests running or waiting")
    ap.add_argument("--allow-other-model", action="store_true",
                    help="measure even when /v1/models does not list --model")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) if e.code in (0, None) else 2
    if a.repeats < 1 or a.prompt_tokens < 1 or a.decode_tokens < 1:
        print("error: --repeats, --prompt-tokens and --decode-tokens must be >= 1", file=sys.stderr)
        return 2
    if a.api_key_env and not os.environ.get(a.api_key_env):
        print(f"error: environment variable {a.api_key_env} is empty or unset", file=sys.stderr)
        return 2
    cfg = BenchConfig(endpoint=a.endpoint, prompt_tokens=a.prompt_tokens, decode_tokens=a.decode_tokens,
                      concurrency=a.concurrency, prefill_tokens=a.prefill_tokens, repeats=a.repeats,
                      warmup_requests=a.warmup, reset_prefix_cache=not a.no_reset_cache,
                      request_timeout_s=a.timeout, soak_seconds=a.soak_seconds, soak_window_s=a.soak_window,
                      soak_stall_s=a.soak_stall, soak_min_ratio=a.soak_min_ratio, api_key_env=a.api_key_env,
                      recipe=a.recipe, label=a.label, allow_busy=a.allow_busy,
                      allow_other_model=a.allow_other_model)
    from ..benchmark.report import render_text, write_report
    from ..benchmark.runner import run_benchmark
    out = Path(a.out) if a.out else None
    try:
        res = run_benchmark(a.base_url, a.model, cfg, out)
    except RunbookError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    previous = a.previous or None
    print(render_text(res))
    if out is not None:
        paths = write_report(res, out, previous=previous, recipe=a.recipe or None, plot=not a.no_plot)
        print(f"results: {out / 'result.json'}; " + "; ".join(f"{k}: {v}" for k, v in paths.items()))
    return BenchError.exit_code if res.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
