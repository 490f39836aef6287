"""Cross-check one benchmark cell with ``vllm bench serve`` (vLLM's own client), fresh seed.

Two independent clients measuring the same server: vLLM's random dataset at the case's exact lengths,
``--ignore-eos``, ``/v1/completions`` like the harness, the same concurrency. The figures differ by
definition in places (vLLM's TPOT divides by ``n-1`` tokens and counts chunks as tokens arrive; its
TTFT includes its own connection set-up and no warm-ups), so a disagreement is a WARN to look at, never
a FAIL. The API key goes to vLLM through ``OPENAI_API_KEY`` in its environment, never on the command line.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ..checks import Check, Status, not_applicable
from ..evidence import write_redacted
from .reconcile import reconcile

#: ``python -c`` body that runs vLLM's benchmark client from any python that has vLLM (the lab's venv
#: has no console-script metadata, so ``vllm bench serve`` itself is not always on PATH)
VLLM_BENCH_SCRIPT = ("import argparse,sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
                     "p=argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")
RESULT_KEYS = ("completed", "failed", "duration", "total_output_tokens", "output_throughput", "mean_ttft_ms",
               "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "median_itl_ms")
CHECK_NAME = "bench cross-check (vllm bench serve)"
#: the case medians the reconciliation reads
HARNESS_KEYS = ("ttft_s", "ttfr_s", "ttfa_s", "decode_tok_s", "per_stream_decode_tok_s", "tokens_per_chunk",
                "aggregate_wall_tok_s", "spec_mean_acceptance_length")


def vllm_bench_argv(python: str, *, base_url: str, model: str, tokenizer: str, input_len: int, output_len: int,
                    num_prompts: int, concurrency: int, seed: int, result_dir: Path,
                    result_filename: str = "vllm-bench.json") -> list[str]:
    """The argv of one ``vllm bench serve`` run: random dataset of exact lengths, no early stop."""
    return [python, "-c", VLLM_BENCH_SCRIPT, "--backend", "openai", "--base-url", base_url.rstrip("/"),
            "--endpoint", "/v1/completions", "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len",
            str(output_len), "--random-range-ratio", "0", "--ignore-eos", "--num-prompts", str(num_prompts),
            "--max-concurrency", str(concurrency), "--seed", str(seed), "--save-result",
            "--result-dir", str(result_dir), "--result-filename", result_filename]


def run_vllm_bench(argv: list[str], out_dir: Path, *, timeout: float = 900,
                   env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """Run it, keep its log (tails) in ``out_dir``; return (exit code, the figures of its result file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, **(env or {})})
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = f"timed out after {timeout:.0f} s"
    write_redacted(out_dir / "vllm-bench.log", stdout[-20000:] + "\n--- stderr ---\n" + stderr[-20000:])
    result_file = out_dir / argv[argv.index("--result-filename") + 1]
    figures = {}
    if rc == 0 and result_file.is_file():
        raw = json.loads(result_file.read_text())
        figures = {k: raw.get(k) for k in RESULT_KEYS}
    return rc, figures


def find_vllm_python(explicit: str = "", *, lab_python: Path | None = None) -> str:
    """The python to run vLLM's client with: the one given, else the lab's venv (lab profiles),
    else a ``python3`` on PATH that imports vllm; "" when there is none."""
    if explicit:
        return explicit
    if lab_python is not None and lab_python.exists():
        return str(lab_python)
    py = shutil.which("python3")
    if py and subprocess.run([py, "-c", "import vllm.benchmarks.serve"], capture_output=True,
                             timeout=120, check=False).returncode == 0:
        return py
    return ""


def cross_check(result, *, base_url: str, model: str, python: str, tokenizer: str, out_dir: Path,
                api_key: str | None = None, seed: int | None = None, tolerance: float = 0.25,
                timeout: float = 900) -> tuple[Check, dict[str, Any]]:
    """Measure the harness's single-stream decode cell again with ``vllm bench serve``; compare
    per-stream decode tok/s (vLLM: 1000 / median TPOT) and median TTFT with the harness's medians."""
    cases = [c for c in result.cases if c.kind == "decode" and c.concurrency == 1]
    if not python:
        return not_applicable(CHECK_NAME, "no python with vLLM where the runbook runs (pass vllm_bench_python)",
                              node="local"), {}
    if not cases:
        return not_applicable(CHECK_NAME, "no single-stream decode case was measured", node="local"), {}
    case = cases[0]
    seed = random.SystemRandom().randrange(1, 2 ** 31) if seed is None else seed
    repeats = max(3, case.repeats)
    argv = vllm_bench_argv(python, base_url=base_url, model=model, tokenizer=tokenizer,
                           input_len=case.prompt_tokens, output_len=case.decode_tokens, num_prompts=repeats,
                           concurrency=1, seed=seed, result_dir=out_dir)
    rc, vb = run_vllm_bench(argv, out_dir, timeout=timeout, env={"OPENAI_API_KEY": api_key} if api_key else None)
    ours = {"decode_tok_s": case.median("per_stream_decode_tok_s") or case.median("decode_tok_s"),
            "ttft_ms": (case.median("ttft_s") or 0.0) * 1000.0}
    theirs = {"decode_tok_s": 1000.0 / vb["median_tpot_ms"] if vb.get("median_tpot_ms") else None,
              "ttft_ms": vb.get("median_ttft_ms")}
    data = {"case": case.name, "seed": seed, "num_prompts": repeats, "rc": rc, "vllm_bench": vb,
            "harness": ours, "vllm": theirs, "log": str(out_dir / "vllm-bench.log")}
    if vb:
        # every figure of both clients side by side, each delta split into its causes (reconcile.py)
        medians = {k: case.median(k) for k in HARNESS_KEYS}
        medians["decode_tokens"] = case.decode_tokens
        data["reconciliation"] = reconcile(
            medians, vb, vllm_args={"num_prompts": repeats, "ignore_eos": True, "num_warmups": 0,
                                    "dataset": "random", "output_len": case.decode_tokens,
                                    "input_len": case.prompt_tokens, "endpoint": "/v1/completions"},
            harness_config={k: result.config.get(k) for k in ("ignore_eos", "warmup_requests", "workload", "endpoint")})
    if rc != 0 or not vb or vb.get("failed") or theirs["decode_tok_s"] is None:
        return Check(CHECK_NAME, node="local", status=Status.WARN,
                     observed=f"vllm bench serve exit {rc}, {vb.get('failed', '?')} failed request(s)",
                     expected=f"{repeats} requests completed", fix=f"read {out_dir / 'vllm-bench.log'}",
                     data=data), data
    rel = {k: abs(ours[k] - theirs[k]) / theirs[k] for k in ours if theirs.get(k)}
    data["relative_difference"] = rel
    worst = max(rel.values()) if rel else 0.0
    observed = (f"decode {ours['decode_tok_s']:.1f} vs vLLM {theirs['decode_tok_s']:.1f} tok/s, TTFT "
                f"{ours['ttft_ms']:.1f} vs {theirs['ttft_ms']:.1f} ms ({case.name}, seed {seed})")
    return Check(CHECK_NAME, node="local", status=Status.PASS if worst <= tolerance else Status.WARN,
                 observed=observed, expected=f"within {tolerance:.0%} of vLLM's own client",
                 fix="" if worst <= tolerance else "compare raw/07_bench/vllm-bench with the harness's requests.jsonl",
                 data=data), data
