"""Typed benchmark results (``BenchResult``) and the raw-record writers.

``BenchResult`` is plain JSON (``schema_version`` = ``runbook.bench/1``) so a report can re-render the
table and plots from ``result.json`` alone; raw per-request and per-chunk JSONL sit beside it.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..evidence import write_redacted

SCHEMA_VERSION = "runbook.bench/1"


@dataclass
class BenchConfig:
    """What to measure. Every field is recorded in the result (the API key never is: only the name
    of the environment variable that holds it)."""
    endpoint: str = "completions"                  # "completions" (exact ISL, no template) | "chat"
    workload: str = "filler"                       # prompt text: filler (random words) | prose (prompts.WORKLOADS)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)   # chat: e.g. thinking off
    conditions: dict[str, Any] = field(default_factory=dict)   # where these settings come from (seed, deviations)
    prompt_tokens: int = 1024                      # ISL of the decode cases
    decode_tokens: int = 512                       # OSL (max_tokens = min_tokens, ignore_eos)
    concurrency: tuple[int, ...] = (1, 2, 4)       # decode cases (streams released together)
    prefill_tokens: tuple[int, ...] = (1024, 3072)  # prefill cases (C=1, max_tokens=1)
    repeats: int = 3
    warmup_requests: int = 0                       # 0 = max(concurrency); disjoint prompts
    warmup_prompt_tokens: int = 64
    warmup_decode_tokens: int = 8
    reset_prefix_cache: bool = True                # POST /reset_prefix_cache before each case if exposed
    temperature: float = 0.0
    ignore_eos: bool = True                        # with min_tokens = max_tokens
    request_timeout_s: float = 0.0                 # 0 = min(45 min, max(90 s, 60 s + 8 ms x prompt tokens))
    steady_min_coverage: float = 0.8
    soak_seconds: float = 0.0
    soak_concurrency: tuple[int, ...] = ()         # () = the decode concurrency list
    soak_window_s: float = 10.0
    soak_stall_s: float = 30.0                     # no token for this long = stall (FAIL)
    soak_min_ratio: float = 0.5                    # window tok/s < ratio x first window (same C) = collapse
    soak_prompt_tokens: int = 0                    # 0 = prompt_tokens
    soak_decode_tokens: int = 0                    # 0 = decode_tokens
    api_key_env: str = ""
    recipe: str = ""                               # lab | exl3-v41 | dspark-v4 (for published figures)
    nodes: int = 2                                 # Sparks the server runs on: published figures of as many only
    label: str = ""
    extra_body: dict[str, Any] = field(default_factory=dict)
    keep_chunks: bool = True                       # write chunks.jsonl
    allow_busy: bool = False                       # measure even with other requests running/waiting
    # the workload-class panel (kind "class"): each class x thinking is a chat decode case of its own
    classes: tuple[str, ...] = ()                  # () = no panel; from prompts.CLASSES: prose code structured tool
    class_thinking: tuple[str, ...] = ("off", "on")
    thinking_key: str = "enable_thinking"          # the chat_template_kwargs key that switches thinking
    class_concurrency: int = 1
    class_prompt_tokens: int = 0                   # 0 = prompt_tokens
    class_decode_tokens: int = 0                   # 0 = decode_tokens
    allow_other_model: bool = False                # measure even if /v1/models does not list the model

    def request_extra(self) -> dict[str, Any]:
        """Extra request-body fields: ``extra_body`` plus the chat template kwargs (chat only)."""
        extra = dict(self.extra_body)
        if self.chat_template_kwargs and self.endpoint == "chat":
            extra["chat_template_kwargs"] = {**extra.get("chat_template_kwargs", {}), **self.chat_template_kwargs}
        return extra

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("concurrency", "prefill_tokens", "soak_concurrency", "classes", "class_thinking"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchConfig:
        names = {f.name for f in fields(cls)}
        vals = {k: v for k, v in d.items() if k in names}
        for k in ("concurrency", "prefill_tokens", "soak_concurrency", "classes", "class_thinking"):
            if k in vals:
                vals[k] = tuple(vals[k])
        return cls(**vals)


@dataclass
class CaseResult:
    """One case (a kind x concurrency x lengths cell) with its repeats summarised.

    ``figures[metric]`` = ``Spread.to_dict()`` (median, min, max, q1, q3, iqr, n) over the repeats
    (per-trial metrics) or over all streams of all repeats (per-stream metrics: names starting with
    ``per_stream_``, ``ttft``, ``ttfr``).
    """
    name: str
    kind: str                        # decode | prefill | soak
    concurrency: int
    prompt_tokens: int
    decode_tokens: int
    repeats: int
    status: str = "PASS"             # PASS | WARN | FAIL
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    figures: dict[str, dict[str, float]] = field(default_factory=dict)
    trials: list[dict[str, Any]] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)
    workload: str = ""               # text class when it differs from the run's (class panel); "" = the run's
    thinking: str = ""               # off | on when set per case (class panel); "" = the run's

    def median(self, metric: str) -> float | None:
        f = self.figures.get(metric)
        return None if not f else f.get("median")


@dataclass
class BenchResult:
    schema_version: str
    run_id: str
    base_url: str
    model: str
    config: dict[str, Any]
    environment: dict[str, Any]
    cases: list[CaseResult]
    soak: dict[str, Any] | None = None
    started: str = ""
    finished: str = ""
    status: str = "PASS"

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"

    def case(self, name: str) -> CaseResult | None:
        return next((c for c in self.cases if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_redacted(Path(path), json.dumps(self.to_dict(), indent=1, default=str) + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchResult:
        if not str(d.get("schema_version", "")).startswith("runbook.bench/"):
            raise ValueError(f"not a runbook bench result: schema_version={d.get('schema_version')!r}")
        cases = [CaseResult(**c) for c in d.get("cases", [])]
        return cls(**{**d, "cases": cases})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BenchResult:
        p = Path(path)
        if p.is_dir():
            p = p / "result.json"
        return cls.from_dict(json.loads(p.read_text()))

    def checks(self):
        """One ``Check`` per case (and the soak) for the step's CheckList."""
        from ..checks import Check, Status
        out = []
        for c in self.cases:
            fig = c.figures
            key = {"decode": "aggregate_tok_s" if c.concurrency > 1 else "decode_tok_s",
                   "class": "decode_tok_s", "prefill": "prefill_tok_s"}.get(c.kind, "")
            med = fig.get(key, {}).get("median")
            obs = f"{key}={med:.1f}" if med is not None else "no figure"
            if c.failures:
                obs += "; " + "; ".join(c.failures[:3])
            elif c.warnings:
                obs += "; " + "; ".join(c.warnings[:2])
            out.append(Check(name=f"bench {c.name}", node="head", status=Status(c.status), observed=obs,
                             expected="no failed request, completion_tokens == requested, cached_tokens == 0",
                             fix="see raw/requests.jsonl for the failing requests" if c.failures else "",
                             data={"figures": fig}))
        if self.soak:
            st = self.soak.get("status", "PASS")
            out.append(Check(name="bench soak", node="head", status=Status(st),
                             observed="; ".join(self.soak.get("failures", [])) or
                             f"{self.soak.get('windows_n', 0)} windows, {self.soak.get('requests', 0)} requests",
                             expected="no error, no stall, no throughput collapse",
                             data={k: v for k, v in self.soak.items() if k != "windows"}))
        return out


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    lines = [json.dumps(r, default=str) + "\n" for r in rows]
    write_redacted(Path(path), "".join(lines))
    return len(lines)


def write_raw(out_dir: str | os.PathLike[str], records: list, t0: float = 0.0,
              snapshots: list[dict[str, Any]] | None = None, keep_chunks: bool = True) -> dict[str, str]:
    """Write ``requests.jsonl`` (one row per request), ``chunks.jsonl`` (one row per SSE event:
    request id, time, cumulative completion tokens) and ``metrics.jsonl`` (per-snapshot vLLM counters)
    under ``out_dir``. Times are seconds relative to ``t0`` on the client's monotonic clock."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"requests": str(out / "requests.jsonl")}
    write_jsonl(out / "requests.jsonl", (r.to_row(t0) for r in records))
    if keep_chunks:
        write_jsonl(out / "chunks.jsonl", (row for r in records for row in r.chunk_rows(t0)))
        paths["chunks"] = str(out / "chunks.jsonl")
    if snapshots is not None:
        write_jsonl(out / "metrics.jsonl", snapshots)
        paths["metrics"] = str(out / "metrics.jsonl")
    return paths


def load_records(out_dir: str | os.PathLike[str]) -> list:
    """Re-read ``requests.jsonl`` (+ ``chunks.jsonl`` when present) into ``RequestRecord``s, so every
    figure can be recomputed from the raw evidence (times stay relative to the run's t0)."""
    from .client import RequestRecord
    out = Path(out_dir)
    names = {f.name for f in fields(RequestRecord)}
    recs: dict[str, Any] = {}
    for line in (out / "requests.jsonl").read_text().splitlines():
        row = json.loads(line)
        recs[row["id"]] = RequestRecord(**{k: v for k, v in row.items() if k in names})
    chunks = out / "chunks.jsonl"
    if chunks.exists():
        for line in chunks.read_text().splitlines():
            c = json.loads(line)
            r = recs.get(c["id"])
            if r is not None:
                r.ev_t.append(c["t"])
                r.ev_cum.append(c["cum_tokens"])
    return list(recs.values())
