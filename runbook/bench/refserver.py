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
  answer key (``answer_key``; default: the quality gate's set ``runbook/serve/quality_set.json``, whose
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

Run: ``python -m runbook.bench.refserver --port 8123 --ttft 0.2 --interval 0.015 --tokens-per-chunk 4``.
In-process: ``with serve_in_thread(RefConfig(...)) as srv: srv.base_url``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import heapq
import json
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

clock = time.perf_counter


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
    # --- wire framing of streamed responses (what proxies and other servers do; see _Framer)
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
    answer_key: str = ""                # JSON answer key; empty = runbook/serve/quality_set.json

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
#: bytes that finish an open chunk at the next write (fragment mode): an SSE comment, skipped by clients
_PAD = b":\n\n"


class _Framer:
    """Turns SSE text into the bytes of each socket write, in the configured framing.

    chunked: each write is one HTTP chunk, or (``fragment_seed``) several chunks cut at seeded byte
    offsets (events split mid-JSON across chunks) whose last one declares ``len(_PAD)`` more bytes
    than it carries: that chunk is completed at the next write, so a reader that waits for whole
    chunks sees every event one write late. length / close: the SSE bytes as they are."""

    def __init__(self, cfg: RefConfig, rid: int):
        import random
        self.mode = cfg.body
        self.rng = random.Random(cfg.fragment_seed * 1_000_003 + rid) if cfg.fragment_seed else None
        self.close = cfg.connection_close or cfg.body == "close"
        self.open_tail = b""                 # the rest of a chunk left open by the previous write

    def head(self, content_length: int = 0) -> bytes:
        h = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        if self.mode == "chunked":
            h += b"Transfer-Encoding: chunked\r\n"
        elif self.mode == "length":
            h += b"Content-Length: %d\r\n" % content_length
        if self.close:
            h += b"Connection: close\r\n"
        return h + b"\r\n"

    def data(self, sse: bytes, end: bool = False) -> bytes:
        """The bytes of one write carrying ``sse``; ``end`` adds the terminating chunk."""
        if self.mode != "chunked":
            return sse
        out = [self.open_tail]
        self.open_tail = b""
        if self.rng is None or not sse:
            out.append(b"%x\r\n%s\r\n" % (len(sse), sse) if sse else b"")
        else:
            n = len(sse)
            cuts = sorted(self.rng.sample(range(1, n), min(n - 1, self.rng.randint(1, 3)))) if n > 1 else []
            bounds = [0, *cuts, n]
            for a, b in zip(bounds[:-1], bounds[1:-1]):
                out.append(b"%x\r\n%s\r\n" % (b - a, sse[a:b]))
            a = bounds[-2]
            out.append(b"%x\r\n%s" % (n - a + len(_PAD), sse[a:]))
            if end:
                out.append(_PAD + b"\r\n")
            else:
                self.open_tail = _PAD + b"\r\n"
        if end:
            out.append(b"0\r\n\r\n")
        return b"".join(out)


@dataclass
class EmitLog:
    id: int
    endpoint: str
    prompt_tokens: int
    max_tokens: int
    t_arrival: float
    nonce: str = ""                      # first word of the prompt / the system message
    conn: int = 0                        # which TCP connection carried it (1, 2, ... in accept order)
    temperature: float | None = None     # as requested
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    text_head: str = ""                  # the first 80 characters of the last message / the prompt
    t_slot: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    tokens: int = 0
    chunk_t: list[float] = field(default_factory=list)
    chunk_cum: list[int] = field(default_factory=list)
    status: str = "running"


@dataclass
class _Emitter:
    t_first: float
    step: float
    make: Any
    entry: EmitLog
    transport: Any
    fut: asyncio.Future
    keep_log: bool
    j: int = 0


class _Metrics:
    def __init__(self) -> None:
        self.c: dict[str, float] = {}

    def inc(self, name: str, v: float = 1.0) -> None:
        self.c[name] = self.c.get(name, 0.0) + v

    def render(self, model: str, running: int, waiting: int) -> str:
        lab = f'{{model_name="{model}",engine="0"}}'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{lab} {running}",
            f"vllm:num_requests_waiting{lab} {waiting}",
        ]
        for name in sorted(self.c):
            typ = "counter" if name.endswith("_total") else "histogram"
            if name.endswith(("_sum", "_count")):
                base = name.rsplit("_", 1)[0]
                lines.append(f"# TYPE {base} histogram")
            else:
                lines.append(f"# TYPE {name.removesuffix('_total')} {typ}")
            if name.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total:"):
                pos = name.split(":")[-1]
                lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{model}",engine="0",position="{pos}"}} {self.c[name]}')
            else:
                lines.append(f"{name}{lab} {self.c[name]}")
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ answers (answer_mode)

_UNIT = re.compile(r"\S+\s*")
DEFAULT_ANSWER_KEY = "runbook/serve/quality_set.json"
#: plausible replacements for a string value in a near-miss answer
_ALTERNATES = ("Lyon", "Berlin", "Madrid", "Oslo", "sports", "news", "relevance", "asc", "EUR")


@dataclass(frozen=True)
class Answer:
    """What one request is answered with: content tokens (whitespace units, as /tokenize counts) or
    tool calls (``{"name", "arguments"}``; ``pieces`` then holds the call's raw text, for its token count
    and for the truncated form)."""
    pieces: tuple[str, ...] = ()
    tool_calls: tuple[dict[str, Any], ...] = ()


def load_answer_key(path: str = "") -> tuple[tuple[str, tuple[str, Any]], ...]:
    """``(prompt, (reference kind, value))`` for each case of an answer key; ValueError names the file
    and the entry. Read again when the file changes."""
    try:
        st = Path(path).stat() if path else None
    except OSError:
        st = None
    return _load_answer_key(path, (st.st_mtime_ns, st.st_size) if st else None)


@lru_cache(maxsize=8)
def _load_answer_key(path: str, _version: tuple[int, int] | None) -> tuple[tuple[str, tuple[str, Any]], ...]:
    where = path or DEFAULT_ANSWER_KEY
    try:
        text = (Path(path).read_text() if path else
                resources.files("runbook.serve").joinpath("quality_set.json").read_text())
        doc = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"RefConfig.answer_key={where}: cannot read it as JSON ({exc})") from None
    cases = doc.get("cases") if isinstance(doc, dict) else None
    out = []
    for i, c in enumerate(cases if isinstance(cases, list) else []):
        prompt = c.get("prompt") if isinstance(c, dict) else None
        ref = c.get("reference") if isinstance(c, dict) else None
        if (not isinstance(prompt, str) or not prompt.strip() or not isinstance(ref, dict) or len(ref) != 1
                or next(iter(ref)) not in ("content", "content_from", "tool_calls")):
            raise ValueError(f"RefConfig.answer_key={where}: cases[{i}] needs a prompt and a reference with one "
                             "of content | content_from | tool_calls")
        out.append((prompt.strip(), next(iter(ref.items()))))
    if not out:
        raise ValueError(f"RefConfig.answer_key={where}: no cases")
    return tuple(out)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _seeded(text: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big"))


def _wrong_leaf(v: Any, rng: random.Random) -> Any:
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + rng.choice((-2, -1, 1, 2, 10))
    if isinstance(v, float):
        return v + 1.5
    if isinstance(v, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        return f"{v[:8]}{int(v[8:]) % 28 + 1:02d}"                 # a day later (or the 1st)
    return rng.choice([a for a in _ALTERNATES if a.casefold() != str(v).casefold()])


def _near_miss(obj: Any, rng: random.Random) -> Any:
    """``obj`` with one leaf value changed: the shape a fluent but wrong model gives."""
    leaves: list[tuple[Any, Any]] = []

    def walk(o: Any) -> None:
        for k in (range(len(o)) if isinstance(o, list) else list(o)):
            if isinstance(o[k], (dict, list)) and o[k]:
                walk(o[k])
            else:
                leaves.append((o, k))

    out = json.loads(json.dumps(obj))
    if not isinstance(out, (dict, list)) or not out:
        return _wrong_leaf(out, rng)
    walk(out)
    parent, k = rng.choice(leaves)
    parent[k] = _wrong_leaf(parent[k], rng)
    return out


def _wrong_text(text: str, rng: random.Random) -> str:
    """A plausible wrong answer: a near-miss number, JSON with one wrong value, a passphrase with its
    digits moved, or the words in another order."""
    if re.fullmatch(r"-?\d+", text):
        return str(int(text) + rng.choice((-10, -2, -1, 1, 2, 9, 10, 100)))
    m = re.fullmatch(r"([A-Za-z]+-)(\d+)", text)
    if m:
        digits = m.group(2)
        moved = digits[1:] + digits[0]
        return m.group(1) + (moved if moved != digits else str((int(digits) + 1) % 10 ** len(digits)).zfill(len(digits)))
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, (dict, list)) and obj:
        return json.dumps(_near_miss(obj, rng))
    words = text.split()
    rng.shuffle(words)
    return " ".join(words if words != text.split() else words[::-1])


def _garble(rng: random.Random, last: str, max_tokens: int) -> Answer:
    """Broken output, one of three kinds: the lab's tiny model's two-character loop (to max_tokens),
    words with U+FFFD, a control character and letters of three scripts, or consonant soup."""
    kind = rng.randrange(3)
    if kind == 0:
        return Answer(('")',) * (max_tokens + 1))
    if kind == 1:
        words = (last.split() or ["answer"])[:12]
        noisy = []
        for i, w in enumerate(words):
            if i % 3 == 0:
                w = w[:2] + "\ufffd" + w[2:]
            elif i % 3 == 1:
                w = w.replace("a", "\u0430").replace("o", "\u043e").replace("e", "\u0435") + "\u0007"
            noisy.append(w + " ")
        return Answer(tuple(noisy) + ("\u6570\u636e\u03bb\u03cc\u03b3\u03bf\u03c2 ",))
    consonants = "bcdfghjklmnpqrstvwxz"
    return Answer(tuple("".join(rng.choice(consonants) for _ in range(rng.randint(7, 13))) + " "
                        for _ in range(24)))


def answer_for(mode: str, req: dict[str, Any], key_path: str, max_tokens: int) -> tuple[Answer | None, str]:
    """The answer to a chat request in ``mode`` (not filler), or (None, why it is refused)."""
    msgs = [m for m in req.get("messages") or [] if isinstance(m, dict)]
    conversation = "\n".join(_text(m) for m in msgs)
    rng = _seeded(conversation)
    last = _text(msgs[-1]).strip() if msgs else ""
    if mode == "garble":
        return _garble(rng, last, max_tokens), ""
    who = f"refserver answer_mode={mode}"
    if not msgs or msgs[-1].get("role") != "user":
        return None, f"{who}: the last message is not a user message (only single questions are known)"
    hits = [(p, ref) for p, ref in load_answer_key(key_path) if last.endswith(p)]
    if not hits:
        return None, (f"{who}: no reference answer for this prompt (it ends {last[-80:]!r}; answer key "
                      f"{key_path or DEFAULT_ANSWER_KEY})")
    _, (kind, value) = max(hits, key=lambda h: len(h[0]))
    if kind == "tool_calls":
        if req.get("stream"):
            return None, f"{who}: streamed tool calls are not implemented"
        offered = {(t.get("function") or {}).get("name") for t in req.get("tools") or [] if isinstance(t, dict)}
        calls = [{"name": c["name"], "arguments": c.get("arguments", {})} for c in value]
        missing = [c["name"] for c in calls if c["name"] not in offered]
        if missing:
            return None, f"{who}: the reference calls {missing}, which the request does not offer (tools: {sorted(offered)})"
        if mode == "garbage":
            calls = [dict(c, arguments=_near_miss(c["arguments"], rng)) for c in calls]
        raw = "".join(f"<tool_call>{json.dumps({'name': c['name'], 'arguments': c['arguments']})}</tool_call>"
                      for c in calls)
        return Answer(tuple(_UNIT.findall(raw)), tuple(calls)), ""
    if kind == "content_from":
        m = re.search(value, conversation)
        if not m:
            return None, f"{who}: the reference pattern {value!r} is not in the conversation"
        text = m.group(1)
    else:
        text = str(value)
    if mode == "garbage":
        text = _wrong_text(text, rng)
    return Answer(tuple(_UNIT.findall(text))), ""


class RefServer:
    def __init__(self, config: RefConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.config = config or RefConfig()
        self.host, self.port = host, port
        self.log: list[EmitLog] = []
        self.metrics = _Metrics()
        self._n_gen = 0
        self._cache: set[bytes] = set()
        self._running = 0
        self._waiting = 0
        self._sem: asyncio.Semaphore | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.n_connections = 0
        self._heap: list = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    # ------------------------------------------------------------------ emission scheduler
    def _schedule(self, em: _Emitter) -> None:
        """One timer for all streams: a heap of absolute chunk deadlines (no per-chunk coroutine)."""
        self._seq += 1
        heapq.heappush(self._heap, (em.t_first, self._seq, em))
        if self._timer is None or em.t_first < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._arm()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer_at = self._heap[0][0]
        self._timer = loop.call_at(self._timer_at + (loop.time() - clock()), self._tick)

    def _tick(self) -> None:
        self._timer = None
        heap = self._heap
        now = clock()
        while heap and heap[0][0] <= now + 0.0002:
            _, seq, em = heapq.heappop(heap)
            if em.transport.is_closing():
                em.entry.status = "disconnected"
                if not em.fut.done():
                    em.fut.set_result(None)
                continue
            data, last = em.make(em.j)
            t = clock()                 # truth stamp: just before the bytes are handed to the kernel
            em.transport.write(data)
            e = em.entry
            if em.j == 0:
                e.t_first = t
            e.t_last = t
            if em.keep_log:
                e.chunk_t.append(t)
                e.chunk_cum.append(e.tokens)
            em.j += 1
            if last:
                if not em.fut.done():
                    em.fut.set_result(None)
            else:
                heapq.heappush(heap, (em.t_first + em.j * em.step, seq, em))
            now = clock()
        if heap:
            self._arm()

    # ------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> RefServer:
        self._server = await asyncio.start_server(self._handle, self.host, self.port,
                                                  limit=1 << 20, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server:
            self._server.close()
            for w in list(self._conns):
                w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def set_config(self, **changes: Any) -> None:
        self.config = dataclasses.replace(self.config, **changes)
        self._sem = None

    def clear(self) -> None:
        self.log.clear()
        self._cache.clear()

    # ------------------------------------------------------------------ HTTP plumbing
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        self.n_connections += 1
        conn = self.n_connections
        sock = writer.get_extra_info("socket")
        if sock is not None:            # each write leaves at once (coalesced framings are one segment)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                t_arr = clock()
                parts = line.decode("latin-1").split()
                if len(parts) < 2:
                    break
                method, path = parts[0], parts[1]
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(n) if n else b""
                keep = await self._route(method, path.split("?")[0], body, writer, t_arr, conn)
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    def _respond(writer: asyncio.StreamWriter, status: int, payload: Any,
                 ctype: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else (
            payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(status, "X")
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)

    async def _route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter,
                     t_arr: float, conn: int = 0) -> bool:
        cfg = self.config
        try:
            req = json.loads(body) if body else {}
        except ValueError:
            self._respond(writer, 400, {"error": {"message": "bad json"}})
            return True
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            return await self._generate(path, req, writer, t_arr, conn)
        if path == "/tokenize" and method == "POST":
            words = self._prompt_words(req, add_generation_prompt=req.get("add_generation_prompt", True))
            self._respond(writer, 200, {"count": len(words), "max_model_len": cfg.max_model_len,
                                        "tokens": list(range(len(words)))})
        elif path == "/detokenize" and method == "POST":
            self._respond(writer, 200, {"prompt": " ".join(f"w{t}" for t in req.get("tokens", []))})
        elif path == "/metrics":
            self._respond(writer, 200, self.metrics.render(cfg.model, self._running + cfg.extra_running,
                                                           self._waiting + cfg.extra_waiting),
                          "text/plain; version=0.0.4")
        elif path == "/reset_prefix_cache" and method == "POST":
            self._cache.clear()
            self._respond(writer, 200, b"")
        elif path in ("/health", "/ping"):
            self._respond(writer, 200, b"")
        elif path == "/version":
            self._respond(writer, 200, {"version": "refserver"})
        elif path == "/v1/models":
            self._respond(writer, 200, {"object": "list", "data": [
                {"id": cfg.model, "object": "model", "max_model_len": cfg.max_model_len}]})
        elif path == "/ref/log":
            self._respond(writer, 200, [dataclasses.asdict(e) for e in self.log])
        elif path == "/ref/clear" and method == "POST":
            self.clear()
            self._respond(writer, 200, {})
        elif path == "/ref/config" and method == "POST":
            try:
                self.set_config(**req)
            except (TypeError, ValueError) as e:     # unknown field or bad value: say which
                self._respond(writer, 400, {"error": {"message": f"/ref/config: {e}"}})
                return True
            self._respond(writer, 200, dataclasses.asdict(self.config))
        else:
            self._respond(writer, 404, {"error": {"message": f"no route {method} {path}"}})
        return True

    # ------------------------------------------------------------------ model behaviour
    @staticmethod
    def _text_head(req: dict[str, Any]) -> str:
        if req.get("messages"):
            content = req["messages"][-1].get("content") or ""
            return content[:80] if isinstance(content, str) else ""
        return str(req.get("prompt", ""))[:80]

    def _prompt_words(self, req: dict[str, Any], add_generation_prompt: bool = True) -> list[str]:
        if "messages" in req:
            words: list[str] = ["<bos>"]
            for m in req["messages"]:
                content = m.get("content") or ""
                if isinstance(content, list):
                    content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
                words += [f"<{m.get('role', 'user')}>"] * self.config.chat_template_tokens + content.split()
            if add_generation_prompt:
                words.append("<assistant>")
                kw = req.get("chat_template_kwargs") or {}
                if kw.get("enable_thinking") is False or kw.get("thinking") is False:
                    words.append("</think>")      # as DeepSeek's template: thinking off closes the block
            return words
        prompt = req.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(map(str, prompt))
        return prompt.split()

    def _cached(self, words: list[str]) -> int:
        cfg = self.config
        if not cfg.prefix_cache:
            return 0
        b = cfg.block_size
        h = b""
        hits, hashes = 0, []
        miss = False
        for i in range(len(words) // b):
            h = hashlib.blake2b(h + "\x00".join(words[i * b:(i + 1) * b]).encode(), digest_size=16).digest()
            hashes.append(h)
            if not miss and h in self._cache:
                hits += b
            else:
                miss = True
        if len(self._cache) > 2_000_000:
            self._cache.clear()
        self._cache.update(hashes)
        return min(hits, max(0, len(words) - 1))

    async def _generate(self, path: str, req: dict[str, Any], writer: asyncio.StreamWriter,
                        t_arr: float, conn: int = 0) -> bool:
        """Serve one generation request; False when the connection must close after it."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._n_gen += 1
        nth = self._n_gen
        chat = path.endswith("chat/completions")
        words = self._prompt_words(req)
        P = len(words)
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        if P + max_tokens > cfg.max_model_len:
            self._respond(writer, 400, {"error": {"message": "max_model_len exceeded"}})
            return True
        if cfg.fail_every and nth % cfg.fail_every == 0:
            self._respond(writer, 500, {"error": {"message": "injected failure"}})
            return True
        answer: Answer | None = None
        if cfg.answer_mode != "filler":
            answer, refusal = (answer_for(cfg.answer_mode, req, cfg.answer_key, max_tokens) if chat else
                               (None, f"refserver answer_mode={cfg.answer_mode}: chat completions only"))
            if answer is None:
                self._respond(writer, 400, {"error": {"message": refusal}})
                return True
        cached = self._cached(words)
        if cfg.force_cached_tokens:
            cached = cfg.force_cached_tokens
        min_tokens = int(req.get("min_tokens") or 0)
        n = max_tokens
        finish = "length"
        if answer is not None:
            size = len(answer.pieces)
            n = min(size, max_tokens)
            if size <= max_tokens:
                finish = "tool_calls" if answer.tool_calls else "stop"
        elif cfg.eos_after and not req.get("ignore_eos"):
            n = min(max_tokens, max(min_tokens, cfg.eos_after))
            finish = "stop" if n < max_tokens else "length"
        so = req.get("stream_options") or {}
        include_usage = bool(so.get("include_usage"))
        continuous = bool(so.get("continuous_usage_stats"))
        stream = bool(req.get("stream"))
        nonce = ""
        if chat and req.get("messages"):
            nonce = str(req["messages"][0].get("content") or "").split(" ", 1)[0]
        elif isinstance(req.get("prompt"), str):
            nonce = req["prompt"].split(" ", 1)[0]
        entry = EmitLog(id=nth, endpoint=path, prompt_tokens=P, max_tokens=max_tokens, t_arrival=t_arr,
                        nonce=nonce, conn=conn, temperature=req.get("temperature"),
                        chat_template_kwargs=dict(req.get("chat_template_kwargs") or {}),
                        text_head=self._text_head(req))
        self.log.append(entry)
        m = self.metrics
        m.inc("vllm:prefix_cache_queries_total", P)
        m.inc("vllm:prefix_cache_hits_total", cached)
        # one local reference: set_config() may reset self._sem from the test's thread at any moment
        sem = self._sem
        if sem is None:
            sem = self._sem = asyncio.Semaphore(cfg.max_num_seqs or 1_000_000)
        rid = f"cmpl-ref{nth}"
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":"{cfg.model}","choices":['

        def usage_json(c: int, final: bool) -> str:
            u = f'"prompt_tokens":{P},"total_tokens":{P + c},"completion_tokens":{c}'
            if final and cfg.prompt_tokens_details:
                u += f',"prompt_tokens_details":{{"cached_tokens":{cached}}}'
            return "{" + u + "}"

        choice_cache: dict[tuple[str, str | None, bool], str] = {}

        def choice(text: str, fin: str | None, reasoning: bool) -> str:
            key = (text, fin, reasoning)
            hit = choice_cache.get(key)
            if hit is None:
                hit = choice_cache[key] = _choice(text, fin, reasoning)
            return hit

        def _choice(text: str, fin: str | None, reasoning: bool) -> str:
            fr = "null" if fin is None else f'"{fin}"'
            if chat:
                key = cfg.reasoning_field if reasoning else "content"
                return f'{{"index":0,"delta":{{"{key}":{json.dumps(text)}}},"logprobs":null,"finish_reason":{fr}}}'
            return f'{{"index":0,"text":{json.dumps(text)},"logprobs":null,"finish_reason":{fr}}}'

        fr = _Framer(cfg, nth)
        kw = req.get("chat_template_kwargs") or {}
        thinking_on = kw.get("enable_thinking") is True or kw.get("thinking") is True
        reasoning = 0 if answer is not None else max(cfg.reasoning_tokens, cfg.thinking_tokens if thinking_on else 0)

        def text_of(a: int, b: int) -> str:
            """Content tokens a..b-1 (counted from the first content token)."""
            return "tok " * (b - a) if answer is None else "".join(answer.pieces[a:b])
        role = ('data: ' + head + '{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]'
                + (',"usage":' + usage_json(0, False) if continuous else "") + '}\n\n')
        role_early = chat and cfg.role_chunk_early
        k = max(1, cfg.tokens_per_chunk)
        err_at = (n // (2 * k)) if (cfg.error_every and nth % cfg.error_every == 0) else -1

        def sse(j: int) -> tuple[bytes, int, bool]:
            """Emission j's SSE bytes, the cumulative tokens after it, whether it ends the generation."""
            if j == err_at:
                return b'data: {"error":{"message":"injected stream error","code":500}}\n\n', j * k, True
            sent = j * k
            c = min(k, n - sent)
            parts = [role] if (j == 0 and chat and not role_early) else []
            r = max(0, min(c, reasoning - sent)) if chat else 0
            sent += c
            fin = finish if sent >= n else None
            us = (',"usage":' + usage_json(sent, False)) if continuous else ""
            if r:
                parts.append("data: " + head + choice("tok " * r, None if c > r else fin, True) + "]" + us + "}\n\n")
            if c > r:
                parts.append("data: " + head + choice(text_of(sent - c + r - reasoning, sent - reasoning), fin, False)
                             + "]" + us + "}\n\n")
            return "".join(parts).encode(), sent, sent >= n

        def tail(errored: bool) -> bytes:
            usage = ("data: " + head + '],"usage":' + usage_json(n, True) + "}\n\n"
                     if include_usage and not errored else "")
            return (usage + "data: [DONE]\n\n").encode()

        self._waiting += 1
        try:
            pending_head = b""
            if stream:
                content_length = 0
                if cfg.body == "length":       # the whole body is known in advance
                    j, last, total = 0, False, 0
                    while not last:
                        b, _, last = sse(j)
                        total += len(b)
                        j += 1
                    content_length = total + len(tail(err_at >= 0)) + (len(role.encode()) if role_early else 0)
                pending_head = fr.head(content_length)
                early = fr.data(role.encode()) if role_early else b""
                if early or not cfg.coalesce_head:
                    writer.write(pending_head + early)   # with the role chunk: still one write
                    pending_head = b""
            queued = sem.locked()
            async with sem:
                self._waiting -= 1
                self._running += 1
                # no queueing: the request holds its slot from arrival (parsing is inside the TTFT)
                t_slot = clock() if queued else t_arr
                entry.t_slot = t_slot
                m.inc("vllm:request_queue_time_seconds_sum", t_slot - t_arr)
                m.inc("vllm:request_queue_time_seconds_count")
                prefill = cfg.ttft_s + (P / cfg.prefill_tok_s if cfg.prefill_tok_s > 0 else 0.0)
                t_first = t_slot + prefill
                step = k * cfg.interval_s
                # schedule on loop time (same clock) with absolute deadlines
                off = loop.time() - clock()
                if stream:
                    def make(j: int) -> tuple[bytes, bool]:
                        """The bytes of write j and whether it ends the generation."""
                        nonlocal pending_head
                        data, sent, last = sse(j)
                        if j == err_at:
                            entry.status = "error"
                        else:
                            if cfg.spec_tokens and j > 0:
                                c = sent - j * k
                                m.inc("vllm:spec_decode_num_drafts_total")
                                m.inc("vllm:spec_decode_num_draft_tokens_total", cfg.spec_tokens)
                                m.inc("vllm:spec_decode_num_accepted_tokens_total", c - 1)
                                for p_ in range(c - 1):
                                    m.inc(f"vllm:spec_decode_num_accepted_tokens_per_pos_total:{p_}")
                            entry.tokens = sent
                        if j == 0:
                            m.inc("vllm:request_prefill_time_seconds_sum", prefill)
                            m.inc("vllm:request_prefill_time_seconds_count")
                        end = last and cfg.coalesce_tail
                        if end:
                            data += tail(entry.status == "error")
                            if entry.status != "error":
                                entry.status = "ok"
                        out = pending_head + fr.data(data, end=end)
                        pending_head = b""
                        return out, last

                    em = _Emitter(t_first, step, make, entry, writer.transport, loop.create_future(),
                                  cfg.keep_chunk_log)
                    self._schedule(em)
                    await em.fut
                    if not cfg.coalesce_tail:
                        if entry.status != "error":
                            entry.status = "ok"
                        writer.write(fr.data(tail(entry.status == "error"), end=True))
                    await writer.drain()
                else:
                    total = prefill + n * cfg.interval_s
                    await asyncio.sleep(max(0.0, t_first + total - prefill + off - loop.time()))
                    entry.t_first = entry.t_last = clock()
                    entry.tokens = n
                    entry.status = "ok"
                    m.inc("vllm:request_prefill_time_seconds_sum", prefill)
                    m.inc("vllm:request_prefill_time_seconds_count")
                    text = text_of(0, n)
                    msg = ({"role": "assistant", "content": text} if chat else None)
                    if answer is not None and answer.tool_calls and finish == "tool_calls":
                        msg = {"role": "assistant", "content": None, "tool_calls": [
                            {"id": f"call_ref{nth}_{i}", "type": "function",
                             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                            for i, c in enumerate(answer.tool_calls)]}
                    ch = {"index": 0, "finish_reason": finish}
                    ch.update({"message": msg} if chat else {"text": text})
                    body = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                            "created": created, "model": cfg.model, "choices": [ch],
                            "usage": json.loads(usage_json(n, True))}
                    self._respond(writer, 200, body)
                m.inc("vllm:prompt_tokens_total", P)
                m.inc("vllm:generation_tokens_total", entry.tokens)
                m.inc("vllm:request_success_total")
                self._running -= 1
            return not (stream and fr.close)
        except (ConnectionError, asyncio.CancelledError):
            entry.status = "disconnected"
            self._running = max(0, self._running - 1)
            raise


def truth_records(log: list[EmitLog] | list[dict[str, Any]]):
    """Server-side truth as ``RequestRecord``s (same clock as the client): t_sent = arrival of the
    request line, token times = write times. Feed them to :mod:`runbook.bench.metrics` to get the
    figures the server actually produced; ``nonce`` links them to the client's records."""
    from .client import RequestRecord
    out = []
    for e in log:
        d = e if isinstance(e, dict) else dataclasses.asdict(e)
        if not d["chunk_t"]:
            continue
        out.append(RequestRecord(
            id=f"server/{d['id']}", nonce=d["nonce"], t_sent=d["t_arrival"], t_first_chunk=d["t_first"],
            t_first_token=d["t_first"], t_last_token=d["t_last"], t_end=d["t_last"],
            first_chunk_tokens=d["chunk_cum"][0], prompt_tokens=d["prompt_tokens"],
            completion_tokens=d["tokens"], continuous_usage=True, n_token_events=len(d["chunk_t"]),
            ev_t=list(d["chunk_t"]), ev_cum=list(d["chunk_cum"]), max_tokens=d["max_tokens"],
            error="" if d["status"] == "ok" else d["status"]))
    return out


@contextlib.contextmanager
def serve_in_thread(config: RefConfig | None = None, host: str = "127.0.0.1", port: int = 0):
    """Run a RefServer on its own event loop in a daemon thread; yields the server."""
    srv = RefServer(config, host, port)
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
        raise RuntimeError("refserver did not start")
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
    argv = [python or sys.executable, "-m", "runbook.bench.refserver", "--host", host, "--port", str(port),
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
            raise RuntimeError(f"refserver did not start: {line!r} {err[-500:]}")
        yield line.strip().rsplit(" ", 1)[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.bench.refserver", description=__doc__.split("\n")[0])
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
