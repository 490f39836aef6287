"""Reference streaming server whose timing truth is known exactly.

An OpenAI-compatible stand-in for vLLM used to validate the benchmark harness (fidelity tests and
the headroom benchmark). It is a raw asyncio HTTP/1.1 server (keep-alive, chunked SSE) so that it
is cheap per token and does not become the bottleneck.

Truth it guarantees (all times on ``time.perf_counter`` = CLOCK_MONOTONIC, shared system-wide):

* a generation request arriving at ``t_arr`` waits for a slot (``max_num_seqs``; queue time),
  then its first token-bearing chunk is written at ``t_first = t_slot + ttft_s + P / prefill_tok_s``
  (``P`` = prompt tokens; the prefill term only when ``prefill_tok_s > 0``);
* chunk ``j`` (0-based) carrying ``tokens_per_chunk = k`` tokens is written at the absolute
  deadline ``t_first + j * k * interval_s`` (no drift), so the true decode rate is ``1/interval_s``
  and ``C`` concurrent streams decode at ``C/interval_s`` in aggregate;
* token counting: ``/tokenize`` counts one token per whitespace-separated word (chat messages add
  ``chat_template_tokens`` per message plus 1 for the generation prompt, plus 1 when
  ``chat_template_kwargs`` switch thinking off), so exact-length prompts can be built;
  ``usage.prompt_tokens`` uses the same count;
* usage: a final usage chunk when ``stream_options.include_usage``; cumulative usage in every chunk
  when ``stream_options.continuous_usage_stats`` (as vLLM does);
* a real block prefix cache (``block_size`` words, chained block hashes, as vLLM) reports
  ``prompt_tokens_details.cached_tokens`` and ``vllm:prefix_cache_hits_total``; ``force_cached_tokens``
  fakes a hit for rule tests;
* fault injection: ``fail_every`` (HTTP 500 on every n-th generation request), ``error_every``
  (an in-stream ``{"error": ...}`` payload), ``eos_after`` (stop early unless ``ignore_eos``/``min_tokens``).
* wire framing (``body``, ``coalesce_head``, ``coalesce_tail``, ``fragment_seed``,
  ``connection_close``): chunked, Content-Length or read-to-close bodies; headers and the first
  events in one write; the last event, usage, ``[DONE]`` and the terminating chunk in one write;
  events cut into HTTP chunks at seeded byte offsets with a chunk left open until the next write;
  keep-alive or ``Connection: close`` (TCP_NODELAY, so one write is one segment). The truth
  stamp of a write is taken just before it, whatever it carries;
* ``extra_running`` / ``extra_waiting`` add other clients' requests to ``/metrics`` (busy-server guard);
* answers (``answer_mode``, chat only): ``filler`` (default) emits ``tok tok ...``; the other modes read an
  answer key (``answer_key``; default: the quality gate's set ``runbook/answers/quality_set.json``, whose
  ``cases[].prompt`` / ``cases[].reference`` it uses) and match the last user message by its ending:
  ``correct`` answers with the reference (content, a regex group taken from the conversation, or
  tool calls), ``garbage`` with a plausible wrong answer derived from it (a near-miss number, JSON or
  arguments with wrong values, a passphrase with its digits changed), ``garble`` with broken text
  (a ``")")")"`` loop, replacement/control characters in mixed scripts, or consonant soup) for any
  prompt. All three are deterministic (seeded by the prompt). ``correct`` and ``garbage`` refuse (400)
  a prompt the key does not know, a streamed tool call and a call to a tool the request does not offer;
  answer tokens are whitespace units (as ``/tokenize`` counts), ``finish_reason`` is ``stop`` when the
  answer fits ``max_tokens`` (``tool_calls`` for a call), else ``length``;
* every emission is logged (``RefServer.log`` / ``GET /ref/log``): arrival, first and last write
  times and every chunk's write time, so a client's figures can be compared with server truth.

Run: ``python -m runbook.benchmark.refserver --port 8123 --ttft 0.2 --interval 0.015 --tokens-per-chunk 4``.
In-process: ``with serve_in_thread(RefConfig(...)) as srv: srv.base_url``.

This module holds the knobs (``RefConfig``, one CLI flag per field) and the ways to run the server (in a
thread, as a process, the CLI). The server is ``refhttp``; its write schedule and log ``reftiming``; its
token count and prefix cache ``reftokens``; its answers ``refanswers``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass

from ..errors import BenchError
from .refanswers import load_answer_key
from .refhttp import RefServer

__all__ = ["ANSWER_MODES", "BODY_MODES", "RefConfig", "main", "serve_in_thread", "spawn"]


@dataclass
class RefConfig:
    model: str = "ref-model"
    ttft_s: float = 0.05                # fixed time to first token (after a slot is free)
    prefill_tok_s: float = 0.0          # >0: add prompt_tokens / prefill_tok_s to the TTFT
    interval_s: float = 0.015           # seconds per generated token
    tokens_per_chunk: int = 1           # tokens per streamed chunk (spec decode / stream interval)
    max_num_seqs: int = 0               # 0 = unlimited concurrency; else queue beyond this
    max_model_len: int = 1_000_000
    chat_template_tokens: int = 2       # tokens added per chat message (+1 generation prompt)
    role_chunk_early: bool = False      # chat: send the empty role chunk at arrival (TTFR << TTFT)
    reasoning_tokens: int = 0           # chat: first N tokens go to delta.reasoning_content
    reasoning_field: str = "reasoning_content"
    thinking_tokens: int = 0            # chat with thinking switched on (chat_template_kwargs): first N reasoning
    block_size: int = 16                # prefix-cache block (tokens)
    prefix_cache: bool = True
    prompt_tokens_details: bool = True  # report usage.prompt_tokens_details.cached_tokens
    force_cached_tokens: int = 0        # fake cached tokens in usage (rule tests)
    eos_after: int = 0                  # >0: natural EOS after this many tokens (unless ignore_eos)
    fail_every: int = 0                 # every n-th generation request -> HTTP 500
    error_every: int = 0                # every n-th generation request -> in-stream error payload
    spec_tokens: int = 0                # >0: emit spec-decode counters (accepted = k-1 per step)
    keep_chunk_log: bool = True
    # --- wire framing of streamed responses (what proxies and other servers do; see refhttp.Framer)
    body: str = "chunked"               # chunked | length (Content-Length) | close (read to close)
    coalesce_head: bool = False         # response headers + the first events in ONE write
    coalesce_tail: bool = False         # last token event + usage + [DONE] (+ 0 chunk) in ONE write
    fragment_seed: int = 0              # chunked: >0 = events cut into HTTP chunks at seeded byte
                                        # offsets, the last chunk of each write left open until the next
    connection_close: bool = False      # answer "Connection: close" and close after the response
    # --- what /metrics and /v1/models report besides this server's own work (guard tests)
    extra_running: int = 0              # other clients' requests running
    extra_waiting: int = 0              # other clients' requests waiting
    # --- what the answers say (quality gate tests; see the module docstring)
    answer_mode: str = "filler"         # filler | correct | garbage | garble
    answer_key: str = ""                # JSON answer key; empty = runbook/answers/quality_set.json

    def __post_init__(self) -> None:
        if self.answer_mode not in ANSWER_MODES:
            raise ValueError(f"RefConfig.answer_mode={self.answer_mode!r}: expected one of {', '.join(ANSWER_MODES)}")
        if self.answer_mode in ("correct", "garbage"):
            load_answer_key(self.answer_key)          # a bad key is refused now, not at the first request
        if self.body not in BODY_MODES:
            raise ValueError(f"RefConfig.body={self.body!r}: expected one of {', '.join(BODY_MODES)}")
        if self.fragment_seed and self.body != "chunked":
            raise ValueError("RefConfig.fragment_seed cuts HTTP chunks: it needs body='chunked' "
                             f"(got body={self.body!r})")


BODY_MODES = ("chunked", "length", "close")
ANSWER_MODES = ("filler", "correct", "garbage", "garble")


@contextlib.contextmanager
def serve_in_thread(config: RefConfig | None = None, host: str = "127.0.0.1", port: int = 0):
    """Run a RefServer on its own event loop in a daemon thread; yields the server."""
    srv = RefServer(config or RefConfig(), host, port)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(srv.start())
        ready.set()
        loop.run_forever()

    th = threading.Thread(target=run, name="refserver", daemon=True)
    th.start()
    if not ready.wait(10):
        raise BenchError("refserver did not start within 10 s")
    try:
        yield srv
    finally:
        fut = asyncio.run_coroutine_threadsafe(srv.stop(), loop)
        with contextlib.suppress(Exception):
            fut.result(5)
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)


@contextlib.contextmanager
def spawn(config: RefConfig | None = None, host: str = "127.0.0.1", port: int = 0, cpu: int = -1,
          python: str | None = None, start_timeout: float = 20.0):
    """Run the reference server as a separate process (no GIL sharing with the client);
    yields its base URL. ``cpu`` pins it to one core."""
    import subprocess
    import sys
    cfg = config or RefConfig()
    argv = [python or sys.executable, "-m", "runbook.benchmark.refserver", "--host", host, "--port", str(port),
            "--cpu", str(cpu)]
    for f in dataclasses.fields(RefConfig):
        argv += ["--" + f.name.replace("_", "-"), str(getattr(cfg, f.name))]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline() if proc.stdout else ""
            if "listening on" in line or proc.poll() is not None:
                break
        if "listening on" not in line:
            err = proc.stderr.read() if proc.stderr and proc.poll() is not None else ""
            raise BenchError("refserver did not start", observed=f"{line!r} {err[-500:]}")
        yield line.strip().rsplit(" ", 1)[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.benchmark.refserver", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    for f in dataclasses.fields(RefConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            ap.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=f.default)
        else:
            conv = {"float": float, "int": int, "str": str}.get(str(f.type), str)
            ap.add_argument(flag, type=conv, default=f.default)
    ap.add_argument("--ttft", dest="ttft_s", type=float)
    ap.add_argument("--interval", dest="interval_s", type=float)
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU")
    a = ap.parse_args(argv)
    if a.cpu >= 0:
        import os
        os.sched_setaffinity(0, {a.cpu})
    cfg = RefConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(RefConfig)
                       if getattr(a, f.name) is not None})

    async def run() -> None:
        import gc
        gc.freeze()
        srv = await RefServer(cfg, a.host, a.port).start()
        print(f"refserver listening on {srv.base_url}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
