"""Metric formulas. Every figure is derived from raw ``RequestRecord`` timestamps (one monotonic
clock) and server ``usage`` token counts -- never from counting chunks.

Notation for one request: ``n`` = ``usage.completion_tokens`` (final), ``f`` = cumulative
``completion_tokens`` carried by the first token-bearing event (continuous usage; 1 when the server
does not send continuous usage), ``t_sent``, ``t_first_chunk``, ``t_first_token``, ``t_last_token``,
``t_end`` as defined in :mod:`runbook.benchmark.client`.
"""
from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .client import RequestRecord


@dataclass
class Spread:
    """Median and spread of repeated measurements (``q1``/``q3`` by the inclusive method)."""
    median: float
    min: float
    max: float
    q1: float
    q3: float
    n: int

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["iqr"] = self.iqr
        return d


def spread(values: Iterable[float | None]) -> Spread | None:
    v = sorted(float(x) for x in values if x is not None)
    if not v:
        return None
    if len(v) == 1:
        q1 = q3 = v[0]
    else:
        q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive")
    return Spread(median=statistics.median(v), min=v[0], max=v[-1], q1=q1, q3=q3, n=len(v))


# ---------------------------------------------------------------- per request

def ttft_s(r: RequestRecord) -> float | None:
    """TTFT = t_first_token - t_sent (first generated token: non-empty content/reasoning/text)."""
    return None if r.t_first_token is None else r.t_first_token - r.t_sent


def ttfr_s(r: RequestRecord) -> float | None:
    """Time to first chunk (TTFR) = t_first_chunk - t_sent (any SSE data event, e.g. the role chunk)."""
    return None if r.t_first_chunk is None else r.t_first_chunk - r.t_sent


def ttfa_s(r: RequestRecord) -> float | None:
    """Time to first answer = t_first_content - t_sent (content or a tool call, not reasoning): with
    thinking on, the reasoning tax is ttfa_s(on) - ttfa_s(off)."""
    return None if r.t_first_content is None else r.t_first_content - r.t_sent


def first_tokens(r: RequestRecord) -> int:
    """``f``: tokens delivered with the first token event (continuous usage), else 1."""
    return r.first_chunk_tokens if r.first_chunk_tokens else 1


def decode_tok_s(r: RequestRecord) -> float | None:
    """Per-stream decode rate = (n - f) / (t_last_token - t_first_token).

    The tokens generated *after* the first token event divided by the time they took. With one token
    per chunk (f = 1) this is exactly the A.9 / llama-benchy definition (n - 1)/(t_last - t_first)
    (= 1000/TPOT_ms). With k tokens per chunk (speculative decoding, ``--stream-interval``) the first
    event already carries k tokens; subtracting 1 instead of k would overstate the rate by
    (n - 1)/(n - k). Without continuous usage f is unknown and taken as 1 (see ``exact_token_timing``).
    """
    n = r.completion_tokens
    if n is None or r.t_first_token is None or r.t_last_token is None:
        return None
    dt = r.t_last_token - r.t_first_token
    f = first_tokens(r)
    if dt <= 0 or n <= f:
        return None
    return (n - f) / dt


def prefill_tok_s(r: RequestRecord) -> float | None:
    """Client prefill rate = prompt_tokens / TTFT (meaningful for max_tokens=1, concurrency 1).

    Includes HTTP, tokenization and any server queueing; compare with :func:`server_prefill_tok_s`.
    """
    t = ttft_s(r)
    return None if (t is None or t <= 0 or not r.prompt_tokens) else r.prompt_tokens / t


def chunk_decode_tok_s(r: RequestRecord) -> float | None:
    """The WRONG rate a chunk-counting client reports: (token events - 1) / (t_last - t_first).
    Kept only to demonstrate the error with multi-token chunks; never reported as a figure."""
    if r.t_first_token is None or r.t_last_token is None or r.n_token_events < 2:
        return None
    dt = r.t_last_token - r.t_first_token
    return (r.n_token_events - 1) / dt if dt > 0 else None


def tokens_per_chunk(r: RequestRecord) -> float | None:
    """Mean tokens per token-bearing event (from usage): > 1 means spec decode or stream interval."""
    return (r.completion_tokens / r.n_token_events) if (r.completion_tokens and r.n_token_events) else None


def max_gap_s(r: RequestRecord) -> float | None:
    """Largest gap between consecutive token-bearing events after the first token."""
    pts = _curve(r)
    if len(pts) < 2:
        return None
    return max(b[0] - a[0] for a, b in itertools.pairwise(pts))


# ---------------------------------------------------------------- concurrent streams

def _curve(r: RequestRecord) -> list[tuple[float, float]]:
    """(time, cumulative tokens) points from the first token event to the last, one per distinct count."""
    if r.t_first_token is None or r.t_last_token is None:
        return []
    pts: list[tuple[float, float]] = []
    for t, c in zip(r.ev_t, r.ev_cum):
        if c is None or t < r.t_first_token or t > r.t_last_token:
            continue
        if pts and c <= pts[-1][1]:
            continue
        pts.append((t, float(c)))
    return pts


def _interp(pts: Sequence[tuple[float, float]], t: float) -> float:
    if t <= pts[0][0]:
        return pts[0][1]
    if t >= pts[-1][0]:
        return pts[-1][1]
    lo, hi = 0, len(pts) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pts[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (t0, c0), (t1, c1) = pts[lo], pts[hi]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def aggregate_figures(recs: Sequence[RequestRecord]) -> dict[str, Any]:
    """Figures for N streams released together (one barrier).

    * ``aggregate_tok_s`` (primary, A.9): steady window W = [max_i t_first_token_i, min_i t_last_token_i]
      -- the interval in which all N streams are decoding. Tokens in W = sum_i (C_i(W_end) - C_i(W_start))
      where C_i is stream i's cumulative ``completion_tokens`` (continuous usage) linearly interpolated
      between event arrivals; aggregate = tokens in W / |W|. Interpolation makes it independent of
      chunk size and of the streams' relative phase. Without continuous usage: sum of per-stream decode rates.
    * ``aggregate_span_tok_s`` (llama-benchy / sparkDash "aggregate", used by the EXL3 published
      figures): sum_i (n_i - f_i) / (max_i t_last_token_i - min_i t_first_token_i).
    * ``aggregate_wall_tok_s`` (vLLM ``output_throughput``, AIPerf, DSpark benchmark-0731 "case
      aggregate"): sum_i n_i / (max_i t_end_i - min_i t_sent_i) -- includes TTFT and ramp.
    * ``steady_coverage`` = |W| / (max t_last - min t_first): < 0.8 means the streams were not decoding
      together for most of the window (staggered admission), so ``aggregate_tok_s`` covers little.
    * ``per_stream_decode_tok_s``: :func:`decode_tok_s` of each stream; ``release_skew_s`` = max - min t_sent.
    """
    ok = [r for r in recs if r.ok and r.t_first_token is not None and r.t_last_token is not None]
    out: dict[str, Any] = {"streams": len(recs), "ok_streams": len(ok)}
    if not ok:
        return out
    per = [decode_tok_s(r) for r in ok]
    out["per_stream_decode_tok_s"] = per
    out["release_skew_s"] = max(r.t_sent for r in recs) - min(r.t_sent for r in recs)
    first = min(r.t_first_token for r in ok)
    last = max(r.t_last_token for r in ok)
    span = last - first
    toks = sum((r.completion_tokens or 0) - first_tokens(r) for r in ok)
    out["aggregate_span_tok_s"] = toks / span if span > 0 else None
    t_end = max((r.t_end or r.t_last_token) for r in ok)
    t_start = min(r.t_sent for r in ok)
    out["aggregate_wall_tok_s"] = sum(r.completion_tokens or 0 for r in ok) / (t_end - t_start)
    ws = max(r.t_first_token for r in ok)
    we = min(r.t_last_token for r in ok)
    out["steady_window_s"] = max(0.0, we - ws)
    out["steady_coverage"] = (max(0.0, we - ws) / span) if span > 0 else None
    curves = [_curve(r) for r in ok]
    if we > ws and all(len(c) >= 2 for c in curves) and all(r.continuous_usage for r in ok):
        out["aggregate_tok_s"] = sum(_interp(c, we) - _interp(c, ws) for c in curves) / (we - ws)
        out["aggregate_method"] = "steady-window"
    elif all(p is not None for p in per):
        out["aggregate_tok_s"] = sum(per)  # type: ignore[arg-type]
        out["aggregate_method"] = "sum-of-stream-rates"
    else:
        out["aggregate_tok_s"] = out["aggregate_span_tok_s"]
        out["aggregate_method"] = "span"
    return out


def server_prefill_tok_s(prompt_tokens: int, server_prefill_time_s: float | None) -> float | None:
    """Server prefill rate = sum of usage.prompt_tokens of the case's requests / delta of
    ``vllm:request_prefill_time_seconds_sum`` over the case (excludes HTTP, queueing, tokenization)."""
    if not server_prefill_time_s or server_prefill_time_s <= 0:
        return None
    return prompt_tokens / server_prefill_time_s


def request_spreads(records: Iterable[RequestRecord], *, decode: bool) -> dict[str, dict[str, float]]:
    """The per-request figures of one case as Spread dicts, over its OK requests. One function for
    the bench runner and for the report, which recomputes them from ``requests.jsonl``."""
    ok = [r for r in records if r.ok]
    per_request = [("ttft_s", ttft_s), ("ttfr_s", ttfr_s), ("ttfa_s", ttfa_s), ("tokens_per_chunk", tokens_per_chunk)]
    if decode:
        per_request += [("decode_tok_s", decode_tok_s), ("per_stream_decode_tok_s", decode_tok_s),
                        ("max_gap_s", max_gap_s)]
    out: dict[str, dict[str, float]] = {}
    for key, fn in per_request:
        s = spread(fn(r) for r in ok)
        if s:
            out[key] = s.to_dict()
    return out
