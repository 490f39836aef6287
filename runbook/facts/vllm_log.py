"""Parse a vLLM startup log into numbers (pure; the launch step reads the log, this parses it).

Lines it understands (vLLM 0.25 GPU builds as quoted in the seed recipes, and the lab's vLLM 0.32 CPU
build as captured in ``tests/unit/data/vllm_logs/``)::

    (EngineCore pid=1234) INFO 12-01 04:23:58 [kv_cache_utils.py:2327] CPU KV cache size: 29,120 tokens, Maximum concurrency for 4,096 tokens per request: 7.11x
    INFO ... GPU KV cache size: 2,331,430 tokens
    INFO ... Maximum concurrency for 1,048,576 tokens per request: 2.22x
    INFO ... Available KV cache memory: 17.04 GiB
    INFO ... Model loading took 98.86 GiB memory and 270.5 seconds
    INFO ... Loading weights took 191.75 seconds
    INFO ... init engine (profile, create kv cache, warmup model) took 10.01 s
    INFO ... Explicitly set (1.0/13.21) GiB for KV cache on node 0.           (CPU build)
    INFO ... Starting vLLM server on http://0.0.0.0:8000                      (0.32; 0.25: "API server 0")
    INFO ... Using DeepSeek's fp8_ds_mla KV cache format
    INFO ... Starting vLLM API server 0 on http://0.0.0.0:8000
    INFO:     Application startup complete.
    INFO ... Launching vLLM (v0.32.0) headless multiproc executor, with head node address 169.254.77.1:29501
    WARNING ... Truncating max_cudagraph_capture_size to 24
    INFO ... DSv4 TP pad: heads 64 -> 72 for TP=3                             (seed B TP3 patch)

    parse_startup_log(text) -> StartupLog   (every field None when its line is absent)
    is_periodic(line) -> bool               (lines the hang detector must not count as progress)
    capacity(kv_tokens, sizes, max_model_len, max_num_seqs) -> list of rows
    tp_pad_check(expected, startup, node="head") -> Check   (the TP3 head pad really applied)
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..checks import check, not_applicable

__all__ = [
    "PERIODIC_PATTERNS",
    "StartupLog",
    "capacity",
    "error_lines",
    "is_periodic",
    "parse_startup_log",
    "tp_pad_check",
]


def _num(s: str) -> float:
    return float(s.replace(",", ""))


_RX = {
    "kv_tokens": re.compile(r"(?:(\w+) )?KV cache size: ([\d,]+) tokens"),
    "concurrency": re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
    "kv_memory": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "model_loading": re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds"),
    "weights_loading": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "init_engine": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
    "kv_explicit": re.compile(r"Explicitly set \(([\d.]+)/([\d.]+)\) GiB for KV cache"),
    "init_model": re.compile(r"Initializing model took ([\d.]+) seconds"),
    "kv_format": re.compile(r"Using DeepSeek's (\S+) KV cache format"),
    "api_server": re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (\S+)"),
    "startup_complete": re.compile(r"Application startup complete"),
    "version": re.compile(r"vLLM API server version ([\w.+-]+)|Launching vLLM \(v([\w.+-]+)\)|"
                          r"Initializing a V1 LLM engine \(v([\w.+-]+)\)"),
    "headless": re.compile(r"headless multiproc executor, with head node address (\S+)"),
    "capture_truncated": re.compile(r"Truncating max_cudagraph_capture_size to (\d+)"),
    "world": re.compile(r"world_size=(\d+) rank=(\d+).*?distributed_init_method=(\S+) backend=(\w+)"),
    "tp_pad": re.compile(r"DSv4 TP pad: heads (\d+) -> (\d+) for TP=(\d+)"),
}

#: log lines that repeat while nothing progresses (never count them as liveness)
PERIODIC_PATTERNS = [
    r"No available shared memory broadcast block found",        # a rank is stuck (seed A excludes it)
    r"shm_broadcast\.py",
    r"Engine \d+: Avg prompt throughput",                        # metrics logger every 10 s
    r"GET /health HTTP",                                        # our own readiness polling
    r"GET /metrics HTTP",
    r"DSV41 engram stats",                                       # seed A stats line (DSV41_STATS_SECONDS)
]
_PERIODIC = re.compile("|".join(PERIODIC_PATTERNS))

_ERROR = re.compile(r"(Traceback \(most recent call last\)|^\S*Error: |\bERROR\b.*(?:Error|failed|Exception)|"
                    r"RuntimeError|ValueError|AssertionError|OutOfMemoryError|EngineDeadError|"
                    r"WorkerProc initialization failed)")


def is_periodic(line: str) -> bool:
    return bool(_PERIODIC.search(line))


@dataclass
class StartupLog:
    kv_device: str | None = None                 # "GPU" / "CPU"
    kv_tokens: int | None = None                 # "KV cache size: N tokens"
    concurrency_len: int | None = None           # tokens per request the concurrency refers to
    max_concurrency: float | None = None         # "Maximum concurrency ...: X x"
    kv_memory_gib: float | None = None
    model_loading_gib: float | None = None
    model_loading_s: float | None = None
    weights_loading_s: float | None = None
    init_model_s: float | None = None            # CPU build: "Initializing model took X seconds"
    init_engine_s: float | None = None
    kv_format: str | None = None
    api_url: str | None = None
    startup_complete: bool = False
    version: str | None = None
    headless_master: str | None = None
    capture_truncated_to: int | None = None
    world: dict[str, Any] | None = None
    tp_pad: dict[str, int] | None = None        # seed B TP3: {"heads": 64, "padded": 72, "tp": 3}
    errors: list[str] = field(default_factory=list)
    lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def error_lines(text: str, limit: int = 10) -> list[str]:
    out = []
    for line in text.splitlines():
        if _ERROR.search(line) and "EngineDeadError" not in line[:0]:
            out.append(line.strip()[:400])
            if len(out) >= limit:
                break
    return out


def parse_startup_log(text: str) -> StartupLog:
    """Numbers from a vLLM startup log (the last occurrence of each line wins: a log may hold
    several boots)."""
    out = StartupLog()
    lines = text.splitlines()
    out.lines = len(lines)
    for line in lines:
        if m := _RX["kv_tokens"].search(line):
            out.kv_device = m.group(1) or out.kv_device
            out.kv_tokens = int(_num(m.group(2)))
        if m := _RX["concurrency"].search(line):
            out.concurrency_len = int(_num(m.group(1)))
            out.max_concurrency = float(m.group(2))
        if m := _RX["kv_memory"].search(line):
            out.kv_memory_gib = float(m.group(1))
        if m := _RX["kv_explicit"].search(line):
            out.kv_memory_gib = float(m.group(1))
        if m := _RX["init_model"].search(line):
            out.init_model_s = float(m.group(1))
        if m := _RX["model_loading"].search(line):
            out.model_loading_gib, out.model_loading_s = float(m.group(1)), float(m.group(2))
        if m := _RX["weights_loading"].search(line):
            out.weights_loading_s = float(m.group(1))
        if m := _RX["init_engine"].search(line):
            out.init_engine_s = float(m.group(1))
        if m := _RX["kv_format"].search(line):
            out.kv_format = m.group(1)
        if m := _RX["api_server"].search(line):
            out.api_url = m.group(1)
        if _RX["startup_complete"].search(line):
            out.startup_complete = True
        if m := _RX["version"].search(line):
            out.version = next(g for g in m.groups() if g)
        if m := _RX["headless"].search(line):
            out.headless_master = m.group(1).rstrip(".,")
        if m := _RX["capture_truncated"].search(line):
            out.capture_truncated_to = int(m.group(1))
        if m := _RX["tp_pad"].search(line):
            out.tp_pad = {"heads": int(m.group(1)), "padded": int(m.group(2)), "tp": int(m.group(3))}
        if m := _RX["world"].search(line):
            out.world = {"world_size": int(m.group(1)), "rank": int(m.group(2)),
                         "init_method": m.group(3).rstrip(","), "backend": m.group(4)}
    out.errors = error_lines(text)
    return out


def capacity(kv_tokens: int, sizes: Iterable[tuple[str, int]], *, max_model_len: int,
             max_num_seqs: int) -> list[dict[str, Any]]:
    """How many concurrent requests of each size fit in a KV pool of ``kv_tokens`` tokens.

    ``fit_in_pool`` = floor(pool / size); ``servable`` is bounded by MAX_NUM_SEQS and is 0 when a
    request of that size exceeds MAX_MODEL_LEN. (Prefix caching and block rounding are ignored:
    this is the pool's arithmetic, which is also how vLLM computes "Maximum concurrency".)
    """
    rows = []
    for label, n in sizes:
        fit = kv_tokens // n if n else 0
        allowed = n <= max_model_len
        rows.append({"request": label, "tokens": n, "fit_in_pool": fit,
                     "concurrent_servable": min(fit, max_num_seqs) if allowed else 0,
                     "note": "" if allowed else f"exceeds MAX_MODEL_LEN={max_model_len}",
                     "pool_ratio": round(kv_tokens / n, 2) if n else None})
    return rows


def tp_pad_check(expected: dict[str, Any] | None, startup: StartupLog | None, *, node: str = "head"):
    """The TP3 head pad really applied (seed B: the boot log must show ``DSv4 TP pad: heads 64 -> 72
    for TP=3``; stock vLLM refuses ``64 % 3`` or silently keeps ``8 // 3`` groups per rank).

    ``expected`` is :func:`runbook.launch.tp_pad` of the profile (None: no pad needed -> N/A)."""
    name = "TP pad applied (boot log)"
    if not expected:
        return not_applicable(name, "TP divides the model's attention groups: no pad", node=node)
    got = startup.tp_pad if startup else None
    want = {k: expected[k] for k in ("heads", "padded", "tp")}
    ok = got == want
    return check(name, ok, node=node,
                 observed=(f"DSv4 TP pad: heads {got['heads']} -> {got['padded']} for TP={got['tp']}" if got
                           else "no 'DSv4 TP pad' line in the boot log"),
                 expected=expected["line"],
                 fix=("the image's entrypoint did not apply patches/tp3/apply_tp3_patch.py (it runs only when "
                      "TP_SIZE=3) or a stale patched container layer was reused: stop (docker rm -f) and start "
                      "again; never serve TP=3 without the pad (wrong or refused attention shards)"),
                 data={"expected": want, "observed": got})
