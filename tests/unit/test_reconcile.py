"""bench/reconcile.py: each delta between the harness and ``vllm bench serve`` split into the causes the two
definitions predict, on results constructed from a known stream (the truth is written out per test)."""
from __future__ import annotations

import pytest

from runbook.bench.reconcile import DECODE, ITL, THROUGHPUT, TTFT, reconcile, reconciliation_table

N, F, RATE = 128, 4.0, 40.0            # 128 tokens, 4 per chunk (speculative decoding), 40 tok/s per stream


def harness(ttfr_s: float, ttft_s: float = 0.200, ttfa_s: float | None = None, **kw) -> dict:
    d = {"ttft_s": ttft_s, "ttfr_s": ttfr_s, "ttfa_s": ttft_s if ttfa_s is None else ttfa_s,
         "per_stream_decode_tok_s": RATE, "decode_tok_s": RATE, "tokens_per_chunk": F,
         "spec_mean_acceptance_length": 3.2, "decode_tokens": N}
    d.update(kw)
    return d


def vllm_of_truth(first_chunk_s: float, first_token_s: float = 0.200) -> dict:
    """What vLLM's client reports for one request of the truth: TTFT at its first chunk with choices,
    latency at the last token (no tail), TPOT = (latency - TTFT) / (n - 1), ITL = the chunk gap."""
    latency = first_token_s + (N - F) / RATE
    tpot = (latency - first_chunk_s) / (N - 1)
    return {"median_ttft_ms": first_chunk_s * 1e3, "mean_ttft_ms": first_chunk_s * 1e3 + 6.0,
            "median_tpot_ms": tpot * 1e3, "median_itl_ms": 1e3 * F / RATE, "output_throughput": 37.0,
            "total_output_tokens": 3 * N, "completed": 3}


ARGS = {"num_prompts": 3, "ignore_eos": True, "num_warmups": 0, "dataset": "random", "output_len": N}
CFG = {"ignore_eos": True, "warmup_requests": 0, "workload": "prose", "endpoint": "chat"}


def by_figure(rows):
    return {r["figure"]: r for r in rows}


def test_completions_stream_every_delta_is_explained():
    # /v1/completions: no role chunk, so the first chunk is the first token
    rows = by_figure(reconcile(harness(ttfr_s=0.200), vllm_of_truth(0.200), vllm_args=ARGS, harness_config=CFG))
    t = rows[TTFT]
    assert t["delta"] == pytest.approx(0.0, abs=1e-9) and t["residual"] == pytest.approx(0.0, abs=1e-9)
    d = rows[DECODE]
    # vLLM: 127 tokens over (n - f)/rate = 3.1 s -> 40.97 tok/s; harness 40; all of it is n-1 vs n-f
    assert d["vllm"] == pytest.approx(127 / 3.1)
    assert d["delta"] == pytest.approx(127 / 3.1 - 40.0)
    assert d["explained"] == pytest.approx(d["delta"], rel=1e-9) and abs(d["residual"]) < 1e-9
    assert "TPOT over n-1 tokens vs n-f" in [c["cause"] for c in d["causes"]]


def test_chat_role_chunk_is_the_ttft_delta_and_leaves_its_10_ms_in_tpot():
    rows = by_figure(reconcile(harness(ttfr_s=0.190), vllm_of_truth(0.190), vllm_args=ARGS, harness_config=CFG))
    t = rows[TTFT]
    assert t["delta"] == pytest.approx(-10.0) and t["explained"] == pytest.approx(-10.0) and abs(t["residual"]) < 1e-9
    d = rows[DECODE]
    # the 10 ms between role chunk and first token land in vLLM's TPOT: 127 / 3.11 s, not 127 / 3.1 s
    assert d["vllm"] == pytest.approx(127 / 3.11)
    assert d["residual"] == pytest.approx(127 / 3.11 - 127 / 3.1)


def test_itl_is_per_chunk_and_throughput_keeps_its_definitions():
    rows = by_figure(reconcile(harness(ttfr_s=0.2, aggregate_wall_tok_s=38.9), vllm_of_truth(0.2), vllm_args=ARGS,
                               harness_config=CFG))
    assert rows[ITL]["harness"] == pytest.approx(1e3 * F / RATE) == pytest.approx(rows[ITL]["vllm"])
    thr = rows[THROUGHPUT]
    assert thr["harness"] == 38.9 and thr["vllm"] == 37.0 and thr["delta"] == pytest.approx(-1.9)
    assert thr["explained"] is None and "gaps" in " ".join(c["note"] for c in thr["causes"])


def test_warm_up_prompt_set_first_content_and_ignore_eos_are_named():
    v = vllm_of_truth(0.2)
    rows = by_figure(reconcile(harness(ttfr_s=0.2, ttfa_s=1.45), v, vllm_args=ARGS, harness_config=CFG))
    notes = {c["cause"]: c["note"] for c in rows[TTFT]["causes"]}
    assert "mean TTFT 206.0 ms vs median 200.0 ms" in notes["warm-up and connections"]
    assert "random token ids" in notes["prompt set"] and "prose text" in notes["prompt set"]
    assert "+1250.0 ms" in notes["first content vs first token"]
    dnotes = {c["cause"]: c["note"] for c in rows[DECODE]["causes"]}
    assert "acceptance length 3.20" in dnotes["prompt set (speculative acceptance)"]
    assert "every completion has the asked length" in dnotes["ignore_eos"]
    short = dict(v, total_output_tokens=3 * N - 40)
    d = by_figure(reconcile(harness(ttfr_s=0.2), short, vllm_args=ARGS, harness_config=CFG))[DECODE]
    assert "ended early" in {c["cause"]: c["note"] for c in d["causes"]}["ignore_eos"]


def test_missing_figures_leave_the_delta_empty_not_invented():
    rows = by_figure(reconcile({"ttft_s": 0.2}, {}, vllm_args={}, harness_config={}))
    assert rows[TTFT]["vllm"] is None and rows[TTFT]["delta"] is None
    assert rows[DECODE]["harness"] is None and rows[DECODE]["delta"] is None


def test_table_has_one_line_per_figure():
    df = reconciliation_table(reconcile(harness(ttfr_s=0.19), vllm_of_truth(0.19), vllm_args=ARGS, harness_config=CFG))
    assert list(df["figure"]) == [TTFT, DECODE, ITL, THROUGHPUT]
    assert "first chunk vs first token (-10.00)" in df.loc[0, "causes"]
