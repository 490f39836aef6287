"""Headroom benchmark: does the client's own overhead stay below 1 % at high stream counts?

    python -m runbook.bench.headroom [--streams 64] [--rate 20000] [--tokens-per-chunk 1]
        [--decode-tokens 1024] [--repeats 3] [--client-cpu 0] [--server-cpu 1] [--out DIR]

The reference server (own process, pinned to ``--server-cpu``) streams ``--streams`` concurrent
requests at ``--rate`` tokens/s in total (per-token interval = streams / rate); the harness (this
process, pinned to ``--client-cpu``) runs the normal decode case against it. Errors are reported
against two truths: the configured one (aggregate = rate, per stream = rate / streams) and the
delivered one (the server's write-time log, through the same formulas), which separates the
client's error from the server's own lateness. Prints a JSON report; writes it under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from ..evidence import write_redacted
from . import metrics as M
from .crosscheck import run_vllm_bench, vllm_bench_argv
from .refserver import RefConfig, spawn
from .reftiming import truth_records
from .result import BenchConfig, load_records
from .runner import run_benchmark
from ..errors import BenchError
from ..serve.server_info import ApiClient, ServerInfo


def rel(x: float, t: float) -> float:
    return abs(x - t) / t


def ref_control(url: str, path: str, payload: dict | None = None):
    """GET (or POST ``payload`` to) one of the reference server's /ref/* routes through the runbook's API client."""
    with ApiClient(ServerInfo(url, "ref-model"), timeout=60) as api:
        ex = api.get(path, auth=False) if payload is None else api.post(path, payload, auth=False)
    if ex.status != 200:
        raise BenchError(f"reference server {path}: {ex.summary()}", fix="read the reference server's output")
    return ex.body


def measure(streams: int, rate: float, k: int, decode_tokens: int, repeats: int, client_cpu: int,
            server_cpu: int, out: Path, ttft: float = 0.2) -> dict:
    interval = streams / rate
    cfg_srv = RefConfig(ttft_s=ttft, interval_s=interval, tokens_per_chunk=k)
    if client_cpu >= 0:
        os.sched_setaffinity(0, {client_cpu})
    with spawn(cfg_srv, cpu=server_cpu) as url:
        cfg = BenchConfig(prompt_tokens=64, decode_tokens=decode_tokens, concurrency=(streams,),
                          prefill_tokens=(), repeats=repeats, warmup_requests=streams)
        res = run_benchmark(url, "ref-model", cfg, out)
        log = ref_control(url, "/ref/log")
    case = res.cases[0]
    recs = [r for r in load_records(out) if r.case == case.name]
    t0 = res.environment["t0_perf_counter"]
    truth = {t.nonce: t for t in truth_records(log)}
    for t in truth.values():
        t.t_first_token -= t0; t.t_last_token -= t0; t.t_sent -= t0
        t.ev_t = [x - t0 for x in t.ev_t]
    per_trial = []
    for trial in range(repeats):
        cl = [r for r in recs if r.trial == trial]
        sv = [truth[r.nonce] for r in cl]
        ca, sa = M.aggregate_figures(cl), M.aggregate_figures(sv)
        dec = [rel(M.decode_tok_s(r), M.decode_tok_s(truth[r.nonce])) for r in cl]
        ttft_err = [rel(M.ttft_s(r), truth[r.nonce].t_first_token - r.t_sent) for r in cl]
        per_trial.append({
            "trial": trial,
            "client_aggregate_tok_s": ca["aggregate_tok_s"], "server_aggregate_tok_s": sa["aggregate_tok_s"],
            "aggregate_err_vs_delivered": rel(ca["aggregate_tok_s"], sa["aggregate_tok_s"]),
            "aggregate_err_vs_configured": rel(ca["aggregate_tok_s"], rate),
            "server_aggregate_err_vs_configured": rel(sa["aggregate_tok_s"], rate),
            "span_err_vs_delivered": rel(ca["aggregate_span_tok_s"], sa["aggregate_span_tok_s"]),
            "per_stream_decode_err_median": statistics.median(dec), "per_stream_decode_err_max": max(dec),
            "ttft_err_median": statistics.median(ttft_err), "ttft_err_max": max(ttft_err),
            "release_skew_s": ca["release_skew_s"], "steady_coverage": ca["steady_coverage"],
        })
    return {"streams": streams, "rate_tok_s": rate, "interval_s": interval, "tokens_per_chunk": k,
            "decode_tokens": decode_tokens, "repeats": repeats, "client_cpu": client_cpu, "server_cpu": server_cpu,
            "case_status": case.status, "failures": case.failures,
            "client_cpu_pct": case.figures.get("client_cpu_pct", {}).get("median"),
            "aggregate_tok_s_median": case.median("aggregate_tok_s"),
            "per_trial": per_trial,
            "max_aggregate_err_vs_delivered": max(t["aggregate_err_vs_delivered"] for t in per_trial),
            "max_per_stream_decode_err_median": max(t["per_stream_decode_err_median"] for t in per_trial),
            "load_avg": os.getloadavg()}


def compare_vllm_bench(vllm_python: str, streams: int, rate: float, k: int, decode_tokens: int,
                       tokenizer: str, client_cpu: int, server_cpu: int, out: Path, ttft: float = 0.2) -> dict:
    """One cell measured by ``vllm bench serve`` (random dataset, exact lengths, ignore_eos, no
    warm-ups) and by this harness, against the same reference server; plus the delivered truth."""
    interval = streams / rate
    out.mkdir(parents=True, exist_ok=True)
    with spawn(RefConfig(ttft_s=ttft, interval_s=interval, tokens_per_chunk=k), cpu=server_cpu) as url:
        argv = ["taskset", "-c", str(client_cpu)] + vllm_bench_argv(
            vllm_python, base_url=url, model="ref-model", tokenizer=tokenizer, input_len=64,
            output_len=decode_tokens, num_prompts=streams, concurrency=streams, seed=4242, result_dir=out)
        rc, vb = run_vllm_bench(argv, out, timeout=600)
        log = ref_control(url, "/ref/log")
        truth = [t for t in truth_records(log) if t.max_tokens == decode_tokens]
        tr = M.aggregate_figures(truth)
        ref_control(url, "/ref/clear", {})
        ours = measure_on(url, streams, decode_tokens, client_cpu, out / "harness")
    return {"cell": {"streams": streams, "rate": rate, "tokens_per_chunk": k, "decode_tokens": decode_tokens,
                     "prompt_tokens": 64, "ttft_s": ttft},
            "vllm_bench_rc": rc, "vllm_bench": vb,
            "vllm_bench_per_stream_from_tpot": (1000.0 / vb["median_tpot_ms"]) if vb.get("median_tpot_ms") else None,
            "delivered_truth_vllm_run": {"aggregate_tok_s": tr.get("aggregate_tok_s"),
                                         "aggregate_wall_tok_s": tr.get("aggregate_wall_tok_s"),
                                         "per_stream_decode_median": statistics.median(
                                             x for x in tr.get("per_stream_decode_tok_s", []) if x)},
            "harness": ours}


def measure_on(url: str, streams: int, decode_tokens: int, client_cpu: int, out: Path) -> dict:
    if client_cpu >= 0:
        os.sched_setaffinity(0, {client_cpu})
    cfg = BenchConfig(prompt_tokens=64, decode_tokens=decode_tokens, concurrency=(streams,), prefill_tokens=(),
                      repeats=1, warmup_requests=streams)
    res = run_benchmark(url, "ref-model", cfg, out)
    c = res.cases[0]
    return {k: c.median(k) for k in ("aggregate_tok_s", "aggregate_span_tok_s", "aggregate_wall_tok_s",
                                     "decode_tok_s", "ttft_s", "ttfr_s")} | {"status": c.status}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.bench.headroom", description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--rate", type=float, default=20000.0)
    ap.add_argument("--tokens-per-chunk", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--decode-tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--out", default="test-artifacts/bench-headroom")
    ap.add_argument("--vllm-python", default="", help="python of a vLLM install: also compare one cell with vllm bench serve")
    ap.add_argument("--tokenizer", default="", help="HF tokenizer dir for vllm bench serve's random dataset")
    ap.add_argument("--nice", type=int, default=0, help="niceness for client and server (root: < 0 raises priority)")
    a = ap.parse_args(argv)
    if a.nice:
        os.nice(a.nice)           # inherited by the spawned reference server
    reports = []
    if a.vllm_python:
        rep = compare_vllm_bench(a.vllm_python, a.streams, a.rate, a.tokens_per_chunk[0], a.decode_tokens,
                                 a.tokenizer, a.client_cpu, a.server_cpu, Path(a.out) / "vllm-compare")
        write_redacted(Path(a.out) / "vllm-compare" / "compare.json", json.dumps(rep, indent=1) + "\n")
        print(json.dumps(rep, indent=1))
        return 0 if rep["vllm_bench_rc"] == 0 else 1
    for k in a.tokens_per_chunk:
        out = Path(a.out) / f"k{k}"
        rep = measure(a.streams, a.rate, k, a.decode_tokens, a.repeats, a.client_cpu, a.server_cpu, out)
        rep["nice"] = a.nice
        reports.append(rep)
        print(json.dumps(rep, indent=1), flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    write_redacted(Path(a.out) / "headroom.json", json.dumps(reports, indent=1) + "\n")
    ok = all(r["max_aggregate_err_vs_delivered"] <= 0.01 for r in reports)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
