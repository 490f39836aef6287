"""Step 07 — benchmarks against the launched server, with the profile's sizes.

The profile chooses the sizes (the lab's are scaled to the tiny model; the hardware profiles keep
the recipes' 32k/256k prefill cases); the figures are compared with the published figures of the
matching recipe and with the previous good run of the same profile.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..evidence import previous_good_run
from .result import BenchConfig, BenchResult

RAW_DIR_NAME = "bench"


def config_from_profile(profile, *, repeats: int | None = None, soak_seconds: float | None = None) -> BenchConfig:
    return BenchConfig(
        endpoint="completions",
        prompt_tokens=profile.bench_prompt_tokens,
        decode_tokens=profile.bench_decode_tokens,
        concurrency=tuple(profile.bench_concurrency),
        prefill_tokens=tuple(profile.bench_prefill_tokens),
        repeats=profile.bench_repeats if repeats is None else repeats,
        soak_seconds=float(profile.soak_seconds if soak_seconds is None else soak_seconds),
        recipe=profile.recipe,
        label=profile.profile_name,
    )


def previous_result(run_path: Path, step: str = "07_bench") -> BenchResult | None:
    """The bench result of the previous good run (``evidence.previous_good_run``, the run the report's
    drift compares with), if it has one."""
    previous = previous_good_run(run_path)
    result = previous / "raw" / step / RAW_DIR_NAME / "result.json" if previous else None
    return BenchResult.load(result) if result is not None and result.is_file() else None


def cross_check(step, server, result: BenchResult, *, enabled: bool = True, python: str = "",
                tokenizer: str = ""):
    """The notebook's optional cell: the single-stream decode cell measured again by ``vllm bench
    serve`` with a fresh seed (``runbook.bench.crosscheck``). Lab profiles find the lab's vLLM venv
    and the tiny model's tokenizer; elsewhere pass ``python`` (a python with vLLM) and ``tokenizer``
    (default: the profile's HF_MODEL_REPO, fetched by vLLM)."""
    from ..checks import not_applicable
    from . import crosscheck
    if not enabled:
        return not_applicable(crosscheck.CHECK_NAME, "vllm_cross_check=False", node="local")
    profile = step.profile
    lab_python = lab_tokenizer = None
    if profile.is_lab:
        from ..lab import control
        lab_python = control.VLLM_PYTHON
        lab_tokenizer = control.tiny_variant(profile.hf_model_repo)[1]
    py = crosscheck.find_vllm_python(python, lab_python=lab_python)
    tok = tokenizer or (str(lab_tokenizer) if lab_tokenizer and lab_tokenizer.is_dir() else profile.hf_model_repo)
    out_dir = step.raw_dir / "vllm-bench"
    check, data = crosscheck.cross_check(result, base_url=server.base_url, model=server.model, python=py,
                                         tokenizer=tok, out_dir=out_dir, api_key=server.api_key or None)
    if data:
        data["log"] = str(Path(data["log"]).relative_to(step.run.path))
        step.data["vllm_cross_check"] = data
    return check
