"""Protocol reconciliation: the harness's figures beside ``vllm bench serve``'s for the same cell, each delta split into the causes the two protocols' definitions predict (pure).

The two clients measure the same server and disagree by definition in known places (docs/bench.md,
"Units and definitions"):

* **TTFT**: vLLM stamps the first SSE chunk that carries ``choices`` (the chat role chunk counts),
  i.e. the harness's *time to first chunk* (TTFR); the harness's TTFT is the first chunk carrying a
  generated token; a harness that waits for the first *content* token (the answer, not reasoning)
  reports the time to first answer. Predicted part of the delta: ``TTFR - TTFT`` of the harness.
* **decode**: vLLM's TPOT = (latency - TTFT) / (n - 1) over the tokens after its TTFT chunk, while that
  chunk already carried ``f`` tokens (speculative decoding, stream interval); the harness divides by
  ``n - f``. 1000 / TPOT therefore reads ``(n - 1) / (n - f)`` times the harness's rate (minus the
  ``[DONE]`` tail in its latency). ITL is per *chunk*: 1000 / ITL = tok/s / tokens per chunk.
* **throughput**: vLLM's ``output_throughput`` = Σ tokens / benchmark duration, TTFT and the gaps
  between requests included; the harness's ``aggregate_wall_tok_s`` is its nearest figure.
* **warm-up**: the harness warms up on disjoint prompts and reuses keep-alive connections; vLLM's
  client runs no warm-up here, so its first request pays the connection (its mean TTFT exceeds its
  median).
* **prompt set**: vLLM sends random token ids; the harness sends text of the case's workload class.
  Prefill cost per token is the same; speculative acceptance is not (random ids are rarely predicted).
* **ignore_eos**: both send it; a completion shorter than asked is flagged.

``reconcile(harness, vllm, ...)`` returns one row per figure with both values, the delta, the
explained parts (each a number in the figure's unit, or a note) and the residual.
"""
from __future__ import annotations

from typing import Any

__all__ = ["reconcile", "reconciliation_table", "TTFT", "DECODE", "ITL", "THROUGHPUT"]

TTFT, DECODE, ITL, THROUGHPUT = "TTFT (ms)", "decode (tok/s)", "inter-chunk latency (ms)", "throughput (tok/s)"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and x == x else None


def _row(figure: str, harness: float | None, harness_def: str, vllm: float | None, vllm_def: str,
         parts: list[dict[str, Any]]) -> dict[str, Any]:
    delta = (vllm - harness) if harness is not None and vllm is not None else None
    explained = sum(p["estimate"] for p in parts if p.get("estimate") is not None)
    return {"figure": figure, "harness": harness, "harness_definition": harness_def, "vllm": vllm,
            "vllm_definition": vllm_def, "delta": delta,
            "delta_pct": (100.0 * delta / harness) if delta is not None and harness else None,
            "explained": explained if any(p.get("estimate") is not None for p in parts) else None,
            "residual": (delta - explained) if delta is not None else None, "causes": parts}


def reconcile(harness: dict[str, Any], vllm: dict[str, Any], *, vllm_args: dict[str, Any] | None = None,
              harness_config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rows (TTFT, decode, ITL, throughput) reconciling one cell measured by both clients.

    ``harness``: the case's medians: ``ttft_s``, ``ttfr_s``, ``ttfa_s``, ``decode_tok_s`` (or
    ``per_stream_decode_tok_s``), ``tokens_per_chunk``, ``aggregate_wall_tok_s``,
    ``spec_mean_acceptance_length``, and ``decode_tokens`` (n). ``vllm``: its result file's figures
    (``median_ttft_ms``, ``mean_ttft_ms``, ``median_tpot_ms``, ``median_itl_ms``, ``output_throughput``,
    ``total_output_tokens``, ``completed``). ``vllm_args``: how it ran (``num_prompts``,
    ``ignore_eos``, ``num_warmups``, ``dataset``, ``output_len``). ``harness_config``: the bench config
    (``ignore_eos``, ``warmup_requests``, ``workload``, ``endpoint``)."""
    va, hc = dict(vllm_args or {}), dict(harness_config or {})
    n = _num(harness.get("decode_tokens")) or _num(va.get("output_len"))
    f = _num(harness.get("tokens_per_chunk")) or 1.0
    ttft, ttfr, ttfa = (_num(harness.get(k)) for k in ("ttft_s", "ttfr_s", "ttfa_s"))
    rate = _num(harness.get("per_stream_decode_tok_s")) or _num(harness.get("decode_tok_s"))
    rows = []

    # ---- TTFT: vLLM's first chunk with choices = the harness's first chunk (TTFR)
    h_ttft = ttft * 1e3 if ttft is not None else None
    v_ttft = _num(vllm.get("median_ttft_ms"))
    parts = []
    if ttfr is not None and ttft is not None:
        parts.append({"cause": "first chunk vs first token",
                      "estimate": (ttfr - ttft) * 1e3,
                      "note": "vLLM stamps the first chunk carrying choices (a chat role chunk counts): the "
                              "harness's time to first chunk; the harness's TTFT waits for a generated token"})
    v_mean = _num(vllm.get("mean_ttft_ms"))
    warm = f"the harness ran {hc.get('warmup_requests') or 'max(concurrency)'} warm-up request(s) on keep-alive " \
           f"connections; vLLM's client ran {va.get('num_warmups', 0) or 'none'}"
    if v_mean is not None and v_ttft is not None:
        warm += f" (its mean TTFT {v_mean:.1f} ms vs median {v_ttft:.1f} ms: the first request pays set-up)"
    parts.append({"cause": "warm-up and connections", "estimate": None, "note": warm})
    parts.append({"cause": "prompt set", "estimate": None,
                  "note": f"vLLM: {va.get('dataset', 'random')} token ids; harness: "
                          f"{hc.get('workload', '?')} text on /v1/{hc.get('endpoint', 'completions')} "
                          "(same length, so prefill costs the same per token)"})
    if ttfa is not None and ttft is not None and abs(ttfa - ttft) > 1e-9:
        parts.append({"cause": "first content vs first token", "estimate": None,
                      "note": f"a client that starts TTFT at the first answer token would report "
                              f"{(ttfa - ttft) * 1e3:+.1f} ms more (reasoning tokens come first)"})
    rows.append(_row(TTFT, h_ttft, "first chunk carrying a generated token (median)", v_ttft,
                     "first chunk carrying choices (median)", parts))

    # ---- decode: 1000/TPOT over n-1 tokens vs (n-f)/(t_last-t_first)
    tpot = _num(vllm.get("median_tpot_ms"))
    v_rate = 1000.0 / tpot if tpot else None
    parts = []
    if rate is not None and n and n > f:
        factor = (n - 1.0) / (n - f)
        parts.append({"cause": "TPOT over n-1 tokens vs n-f", "estimate": rate * (factor - 1.0),
                      "note": f"its first chunk already carried {f:.2f} token(s): 1000/TPOT reads "
                              f"(n-1)/(n-f) = {factor:.4f} x the harness's rate"})
    acc = _num(harness.get("spec_mean_acceptance_length"))
    parts.append({"cause": "prompt set (speculative acceptance)", "estimate": None,
                  "note": (f"harness acceptance length {acc:.2f} on {hc.get('workload', '?')} text; random "
                           "token ids are rarely predicted, so vLLM's cell decodes at a lower acceptance")
                  if acc else "no speculative decoding in the harness's counters: none expected"})
    total, completed = _num(vllm.get("total_output_tokens")), _num(vllm.get("completed"))
    out_len = _num(va.get("output_len")) or n
    short = total is not None and completed and out_len and total < completed * out_len
    parts.append({"cause": "ignore_eos", "estimate": None,
                  "note": (f"vLLM produced {total:.0f} of {completed * out_len:.0f} tokens: a completion ended early "
                           "(its rate then covers fewer tokens)") if short else
                          f"both clients send ignore_eos (harness: {hc.get('ignore_eos', True)}, vLLM: "
                          f"{va.get('ignore_eos', True)}) and every completion has the asked length"})
    rows.append(_row(DECODE, rate, "(n - f) / (t_last token - t_first token), per stream (median)", v_rate,
                     "1000 / median TPOT, TPOT = (latency - TTFT) / (n - 1)", parts))

    # ---- ITL: per chunk, not per token
    itl = _num(vllm.get("median_itl_ms"))
    expect = 1000.0 * f / rate if rate else None
    rows.append(_row(ITL, expect, f"1000 x tokens per chunk ({f:.2f}) / the harness's decode rate", itl,
                     "median gap between chunks", [{"cause": "ITL is per chunk", "estimate": None,
                                                    "note": "with k tokens per chunk 1000/ITL = tok/s / k: never "
                                                            "compare ITL with TPOT"}]))

    # ---- throughput: Σ tokens / duration (TTFT and gaps included)
    wall = _num(harness.get("aggregate_wall_tok_s"))
    v_thr = _num(vllm.get("output_throughput"))
    parts = [{"cause": "TTFT and gaps counted", "estimate": None,
              "note": "vLLM: total output tokens / benchmark duration (the requests run one after another at "
                      "concurrency 1, TTFT and the gaps between them included); harness: Σ n / (last [DONE] - "
                      "first send) per trial"}]
    if wall is not None and rate and n and ttft is not None:
        predicted = n / (ttft + (n - f) / rate)
        parts.append({"cause": "one request's wall rate", "estimate": None,
                      "note": f"n / (TTFT + (n-f)/rate) = {predicted:.2f} tok/s from the harness's own medians "
                              f"(its wall figure: {wall:.2f}); vLLM's is lower by the gaps between its requests"})
    rows.append(_row(THROUGHPUT, wall, "Σ n / (max t_end - min t_sent), per trial (median)", v_thr,
                     "total output tokens / duration", parts))
    return rows


def reconciliation_table(rows: list[dict[str, Any]]):
    """The rows as a DataFrame: one line per figure, the causes joined (the notebook's view)."""
    import pandas as pd
    return pd.DataFrame([{
        "figure": r["figure"], "harness": r["harness"], "vllm bench serve": r["vllm"], "delta": r["delta"],
        "delta %": r["delta_pct"], "explained": r["explained"], "residual": r["residual"],
        "causes": " | ".join(c["cause"] + (f" ({c['estimate']:+.2f})" if c.get("estimate") is not None else "")
                             for c in r["causes"]),
        "definitions": f"harness: {r['harness_definition']}; vLLM: {r['vllm_definition']}"} for r in rows])
