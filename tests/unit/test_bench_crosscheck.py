"""The 07_bench cross-check with ``vllm bench serve``: its argv, the key kept off the command line,
a failing client reported as WARN, and (with the lab's vLLM venv) a real run of vLLM's client
against the reference server agreeing with the harness."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from runbook.benchmark import crosscheck
from runbook.benchmark.refserver import RefConfig, spawn
from runbook.benchmark.result import BenchConfig
from runbook.benchmark.runner import run_benchmark
from runbook.checks import Status
from runbook.lab import control

# some cases time the reference server's answers: on the lab's xdist worker in `make test`, never niced
pytestmark = pytest.mark.timed


def _result(url: str, tmp_path: Path, **kw):
    cfg = BenchConfig(prompt_tokens=64, decode_tokens=48, concurrency=(1,), prefill_tokens=(), repeats=3, **kw)
    return run_benchmark(url, "ref-model", cfg, tmp_path / "harness")


def test_argv_is_exact_lengths_and_never_carries_the_key(tmp_path):
    argv = crosscheck.vllm_bench_argv("py", base_url="http://h:8000/", model="m", tokenizer="tok", input_len=256,
                                      output_len=64, num_prompts=3, concurrency=1, seed=7, result_dir=tmp_path)
    pairs = {flag: argv[argv.index(flag) + 1] for flag in argv if flag.startswith("--") and flag != "--ignore-eos"}
    assert argv[:2] == ["py", "-c"] and "--ignore-eos" in argv
    assert pairs["--base-url"] == "http://h:8000" and pairs["--endpoint"] == "/v1/completions"
    assert pairs["--random-input-len"] == "256" and pairs["--random-output-len"] == "64"
    assert pairs["--random-range-ratio"] == "0" and pairs["--seed"] == "7"
    assert not any("key" in a.lower() for a in argv)


@pytest.mark.slow
def test_a_client_that_fails_is_a_warn_not_a_pass(tmp_path):
    with spawn(RefConfig(ttft_s=0.01, interval_s=0.004)) as url:
        result = _result(url, tmp_path)
        # a python without vLLM: the client exits non-zero
        check, data = crosscheck.cross_check(result, base_url=url, model="ref-model", python=sys.executable,
                                             tokenizer="none", out_dir=tmp_path / "vb", api_key="sk-x")
    assert check.status is Status.WARN and data["rc"] != 0, check
    assert "No module named" in (tmp_path / "vb" / "vllm-bench.log").read_text()


@pytest.mark.slow
def test_no_vllm_or_no_single_stream_case_is_na(tmp_path):
    with spawn(RefConfig(ttft_s=0.01, interval_s=0.004)) as url:
        result = _result(url, tmp_path)
    check, _ = crosscheck.cross_check(result, base_url=url, model="m", python="", tokenizer="t", out_dir=tmp_path)
    assert check.status is Status.NA
    result.cases = [c for c in result.cases if c.concurrency != 1]
    check, _ = crosscheck.cross_check(result, base_url=url, model="m", python="py", tokenizer="t", out_dir=tmp_path)
    assert check.status is Status.NA


@pytest.mark.vllm
@pytest.mark.skipif(not control.VLLM_PYTHON.exists(), reason="needs the lab's vLLM venv (make lab-vllm)")
def test_vllm_bench_serve_agrees_with_the_harness_on_the_reference_server(tmp_path):
    tokenizer = control.ensure_tiny_model(echo=lambda *_: None)   # made once, reused (about 40 s to make)
    with spawn(RefConfig(ttft_s=0.2, interval_s=0.01)) as url:   # truth: 100 tok/s, TTFT 200 ms
        result = _result(url, tmp_path)
        check, data = crosscheck.cross_check(result, base_url=url, model="ref-model",
                                             python=str(control.VLLM_PYTHON), tokenizer=str(tokenizer),
                                             out_dir=tmp_path / "vb", api_key="sk-cross-DO-NOT-LEAK")
    assert check.status is Status.PASS, (check.observed, data)
    assert data["vllm_bench"]["completed"] == 3 and data["vllm_bench"]["failed"] == 0
    assert abs(data["vllm"]["decode_tok_s"] - 100.0) / 100.0 < 0.05, data["vllm"]
    assert abs(data["harness"]["decode_tok_s"] - 100.0) / 100.0 < 0.01, data["harness"]
    # the protocol reconciliation: every figure of both clients, the deltas split into their causes
    rec = {r["figure"]: r for r in data["reconciliation"]}
    assert rec["TTFT (ms)"]["vllm"] == data["vllm_bench"]["median_ttft_ms"]
    assert rec["decode (tok/s)"]["harness"] == pytest.approx(data["harness"]["decode_tok_s"])
    assert abs(rec["decode (tok/s)"]["residual"]) < 5.0          # one token per chunk: n-1 vs n-f explains ~0
    assert [c["cause"] for c in rec["TTFT (ms)"]["causes"]][:2] == ["first chunk vs first token",
                                                                     "warm-up and connections"]
    saved = json.loads((tmp_path / "vb" / "vllm-bench.json").read_text())
    assert "sk-cross-DO-NOT-LEAK" not in json.dumps(saved) + (tmp_path / "vb" / "vllm-bench.log").read_text()
