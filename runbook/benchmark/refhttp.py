"""The reference server itself: a raw asyncio HTTP/1.1 server (keep-alive, chunked SSE), its routes, and each
generation request turned into timed SSE writes in the configured framing.

Configured by a ``refserver.RefConfig`` (the module docstring there lists the truth it guarantees); run it with
``refserver.serve_in_thread``, ``refserver.spawn`` or ``python -m runbook.benchmark.refserver``. The write
schedule and its log are ``reftiming``, the token count and prefix cache ``reftokens``, the answers ``refanswers``.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import time
from typing import Any

from .refanswers import Answer, answer_for
from .reftiming import EmitLog, Emitter, WriteScheduler, clock
from .reftokens import cached_tokens, prompt_words, text_head

__all__ = ["Framer", "Metrics", "RefServer"]

#: bytes that finish an open chunk at the next write (fragment mode): an SSE comment, skipped by clients
_PAD = b":\n\n"


class Framer:
    """Turns SSE text into the bytes of each socket write, in the configured framing.

    chunked: each write is one HTTP chunk, or (``fragment_seed``) several chunks cut at seeded byte
    offsets (events split mid-JSON across chunks) whose last one declares ``len(_PAD)`` more bytes
    than it carries: that chunk is completed at the next write, so a reader that waits for whole
    chunks sees every event one write late. length / close: the SSE bytes as they are."""

    def __init__(self, cfg: Any, rid: int):
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


class Metrics:
    """The vLLM counters ``/metrics`` exposes (Prometheus text), counted as the server works."""
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


class RefServer:
    """``config`` is a ``refserver.RefConfig`` (this module sits below it: ``refserver`` runs this class)."""

    def __init__(self, config: Any, host: str = "127.0.0.1", port: int = 0):
        self.config = config
        self.host, self.port = host, port
        self.log: list[EmitLog] = []
        self.metrics = Metrics()
        self._n_gen = 0
        self._cache: set[bytes] = set()       # the prefix cache's block hashes (reftokens.cached_tokens)
        self._running = 0
        self._waiting = 0
        self._sem: asyncio.Semaphore | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.n_connections = 0
        self._writes = WriteScheduler()

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
            words = prompt_words(req, cfg.chat_template_tokens,
                                 add_generation_prompt=req.get("add_generation_prompt", True))
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

    # ------------------------------------------------------------------ generation
    async def _generate(self, path: str, req: dict[str, Any], writer: asyncio.StreamWriter,
                        t_arr: float, conn: int = 0) -> bool:
        """Serve one generation request; False when the connection must close after it."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._n_gen += 1
        nth = self._n_gen
        chat = path.endswith("chat/completions")
        words = prompt_words(req, cfg.chat_template_tokens)
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
        cached = cached_tokens(self._cache, words, cfg.block_size) if cfg.prefix_cache else 0
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
                        text_head=text_head(req))
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

        fr = Framer(cfg, nth)
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

                    em = Emitter(t_first, step, make, entry, writer.transport, loop.create_future(),
                                  cfg.keep_chunk_log)
                    self._writes.schedule(em)
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
