"""Prometheus text parsing and the vLLM counters the benchmark reads from ``/metrics``.

Only deltas of monotonic counters (and histogram ``_sum``/``_count``) between two snapshots are
used: never absolute values, never client-minus-server timestamps.

Sample input (vLLM 0.x ``GET /metrics``)::

    # TYPE vllm:prompt_tokens_total counter
    vllm:prompt_tokens_total{engine="0",model_name="m"} 8211.0
    vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 8.41
    vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 812.0
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

#: counters (or histogram sums/counts) whose deltas are recorded per case
VLLM_COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_prefill_time_seconds_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_decode_time_seconds_count",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:num_preemptions_total",
)
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse exposition text into ``{(name, sorted label items): value}``; comments skipped."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, _, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        items = tuple(sorted(_LABEL.findall(labels or "")))
        out[(name, items)] = v
    return out


@dataclass
class MetricsSnapshot:
    """One ``/metrics`` scrape at client time ``t`` (perf_counter); ``ok`` False if unavailable."""
    t: float
    ok: bool
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    error: str = ""

    @classmethod
    def from_text(cls, t: float, text: str) -> MetricsSnapshot:
        return cls(t=t, ok=True, samples=parse_prometheus(text))

    def total(self, name: str) -> float | None:
        """Sum of a metric over all label sets (engines, models); None if absent."""
        vals = [v for (n, _), v in self.samples.items() if n == name]
        return sum(vals) if vals else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (n, items), v in self.samples.items():
            if n == name:
                key = dict(items).get(label, "")
                out[key] = out.get(key, 0.0) + v
        return out

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}

    def vllm_subset(self) -> dict[str, float]:
        """The counters we keep in raw records (summed over labels)."""
        out = {n: self.total(n) for n in VLLM_COUNTERS}
        return {k: v for k, v in out.items() if v is not None}


def delta(before: MetricsSnapshot | None, after: MetricsSnapshot | None) -> dict[str, Any]:
    """Counter deltas and derived server-side figures between two snapshots.

    Derived (each only when its inputs are exposed):

    * ``server_prefill_time_s`` = Δ``request_prefill_time_seconds_sum``; ``server_prefill_requests`` = Δ``_count``
    * ``mean_queue_time_s`` = Δqueue_sum / Δqueue_count
    * ``prefix_cache_hit_tokens`` = Δ``prefix_cache_hits_total`` (tokens)
    * ``spec_acceptance_rate`` = Δaccepted / Δdraft_tokens
    * ``spec_mean_acceptance_length`` = 1 + Δaccepted / Δnum_drafts (tokens per verify step)
    * ``spec_per_position_rate[i]`` = Δaccepted_per_pos[i] / Δnum_drafts
    """
    if not (before and after and before.ok and after.ok):
        return {"available": False}
    d: dict[str, Any] = {"available": True, "interval_s": after.t - before.t, "counters": {}}
    for name in VLLM_COUNTERS:
        a, b = after.total(name), before.total(name)
        if a is not None:
            d["counters"][name] = a - (b or 0.0)
    c = d["counters"]

    def get(n: str) -> float | None:
        return c.get(n)

    if get("vllm:request_prefill_time_seconds_sum") is not None:
        d["server_prefill_time_s"] = get("vllm:request_prefill_time_seconds_sum")
        d["server_prefill_requests"] = get("vllm:request_prefill_time_seconds_count")
    qs, qc = get("vllm:request_queue_time_seconds_sum"), get("vllm:request_queue_time_seconds_count")
    if qs is not None and qc:
        d["mean_queue_time_s"] = qs / qc
    if get("vllm:prefix_cache_hits_total") is not None:
        d["prefix_cache_hit_tokens"] = get("vllm:prefix_cache_hits_total")
    nd, dt, acc = (get("vllm:spec_decode_num_drafts_total"), get("vllm:spec_decode_num_draft_tokens_total"),
                   get("vllm:spec_decode_num_accepted_tokens_total"))
    if dt:
        d["spec_acceptance_rate"] = (acc or 0.0) / dt
    if nd:
        d["spec_mean_acceptance_length"] = 1.0 + (acc or 0.0) / nd
        pa, pb = after.by_label(PER_POS, "position"), before.by_label(PER_POS, "position")
        if pa:
            d["spec_per_position_rate"] = {
                p: (pa[p] - pb.get(p, 0.0)) / nd for p in sorted(pa, key=lambda s: int(s) if s.isdigit() else math.inf)}
    return d
