"""Async streaming client for OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``.

One clock: ``time.perf_counter`` (CLOCK_MONOTONIC). Every request records, on that clock:

* ``t_sent``        just before the HTTP request is issued
* ``t_headers``     response headers received (the socket read that completed them)
* ``t_first_chunk`` first SSE ``data:`` event of any kind (TTFR; the chat role chunk counts)
* ``t_first_token`` first event carrying a generated token: non-empty ``content`` / ``reasoning_content``
  / ``reasoning`` / ``text``, or a continuous-usage ``completion_tokens >= 1`` (TTFT)
* ``t_first_content`` first event carrying answer text (``content`` / ``text``) or a tool call, not
  reasoning (time to first answer: with thinking on, TTFT plus the reasoning)
* per event: arrival time and cumulative ``usage.completion_tokens`` (continuous usage) -- events
  that arrive in the same socket read share that read's timestamp
* ``t_last_token``  the event at which the cumulative count first reached the final
  ``completion_tokens`` (continuous usage), else the last event with non-empty text
* ``t_end``         ``[DONE]`` / end of stream
* final ``usage``: ``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``

Token counts come **only** from server ``usage``; chunks are never counted as tokens.
Failures (HTTP status, ``{"error": ...}`` in the stream, timeout, missing ``[DONE]``, missing usage)
are recorded in ``error``; a request never raises.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .http import HTTPError, RawHTTP
from ..facts.prom import MetricsSnapshot
from ..api.server_info import ApiClient, Exchange, ServerInfo
from ..errors import BenchError

clock = time.perf_counter


def request_timeout_s(prompt_tokens: int) -> float:
    """Per-request total timeout: min(45 min, max(90 s, 60 s + 8 ms x prompt tokens)) (sparkDash's rule)."""
    return min(2700.0, max(90.0, 60.0 + 0.008 * prompt_tokens))


@dataclass
class RequestRecord:
    id: str
    endpoint: str = ""
    case: str = ""
    trial: int = 0
    stream: int = 0
    nonce: str = ""
    target_prompt_tokens: int = 0
    max_tokens: int = 0
    t_sent: float = 0.0
    t_headers: float | None = None
    t_first_chunk: float | None = None
    t_first_token: float | None = None
    t_first_content: float | None = None      # first answer token: content / text / a tool call, not reasoning
    t_last_token: float | None = None
    t_end: float | None = None
    first_chunk_tokens: int | None = None    # cumulative tokens at the first token event
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None          # None = server did not report it
    continuous_usage: bool = False
    finish_reason: str | None = None
    http_status: int | None = None
    n_events: int = 0
    n_token_events: int = 0
    text_chars: int = 0
    error: str = ""
    # per-event series (parallel lists); cum is None when the event had no usage
    ev_t: list[float] = field(default_factory=list)
    ev_cum: list[int | None] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error

    def to_row(self, t0: float = 0.0) -> dict[str, Any]:
        """JSON-safe per-request row; times relative to ``t0``; per-event lists dropped."""
        row = asdict(self)
        row.pop("ev_t"); row.pop("ev_cum")
        for k, v in list(row.items()):
            if k.startswith("t_") and isinstance(v, float):
                row[k] = round(v - t0, 7)
        return row

    def chunk_rows(self, t0: float = 0.0) -> list[dict[str, Any]]:
        return [{"id": self.id, "i": i, "t": round(t - t0, 7), "cum_tokens": c}
                for i, (t, c) in enumerate(zip(self.ev_t, self.ev_cum))]


def normalize_base_url(url: str) -> str:
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def build_payload(endpoint: str, model: str, prompt: str | list[dict[str, Any]], max_tokens: int,
                  *, ignore_eos: bool = True, temperature: float = 0.0,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Request body: streaming with final + continuous usage, exact output length."""
    body: dict[str, Any] = {
        "model": model, "max_tokens": max_tokens, "stream": True, "temperature": temperature,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if endpoint == "chat":
        body["messages"] = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(extra or {})
    return body


_CT_RE = re.compile(rb'"completion_tokens":\s*(\d+)')
_ANSWER_RE = re.compile(rb'[{,]\s*"(?:content"\s*:\s*"[^"]|text"\s*:\s*"[^"]|tool_calls"\s*:\s*\[\s*\{)')
_FR = b'"finish_reason":"'


def handle_event(rec: RequestRecord, ev: bytes, t: float) -> bool:
    """Handle one SSE event; returns True on ``[DONE]``.

    Fast path (no JSON decode) once the first token has been seen and the server sends continuous
    usage: the event's cumulative ``"completion_tokens":N`` and ``"finish_reason":"..."`` are read
    directly. Events with an error, an empty ``choices`` list (the final usage chunk) or no usage
    take the full JSON path, as do all events before the first token."""
    if ev.startswith(b"data:") and b"\n" not in ev:
        data = ev[5:].strip()
        if data == b"[DONE]":
            return True
        if rec.continuous_usage and rec.t_first_token is not None and b'"error"' not in data \
                and b'"choices":[]' not in data:
            mt = _CT_RE.search(data)
            if mt is not None:
                cum = int(mt.group(1))
                rec.n_events += 1
                last = rec.completion_tokens or 0
                if cum > last:
                    rec.n_token_events += 1
                rec.completion_tokens = cum
                rec.ev_t.append(t)
                rec.ev_cum.append(cum)
                if rec.t_first_content is None and _ANSWER_RE.search(data):
                    rec.t_first_content = t
                k = data.find(_FR)
                if k >= 0:
                    rec.finish_reason = data[k + len(_FR):data.find(b'"', k + len(_FR))].decode()
                return False
        return _event_json(rec, data, t)
    done = False
    for line in ev.split(b"\n"):
        if line.startswith(b"data:"):                 # comments / pings / event: lines skipped
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
            else:
                _event_json(rec, data, t)
    return done


def _event_json(rec: RequestRecord, data: bytes, t: float) -> bool:
    try:
        obj = json.loads(data)
    except ValueError:
        rec.error = rec.error or f"bad SSE json: {data[:120]!r}"
        return False
    rec.n_events += 1
    if rec.t_first_chunk is None:
        rec.t_first_chunk = t
    if "error" in obj:
        e = obj["error"]
        rec.error = "stream error: " + (e.get("message", str(e)) if isinstance(e, dict) else str(e))[:300]
        return False
    has_text = False
    for ch in obj.get("choices") or ():
        d = ch.get("delta")
        if d is not None:
            answer = d.get("content") or ""
            txt = answer or d.get("reasoning_content") or d.get("reasoning") or ""
            if (answer or d.get("tool_calls")) and rec.t_first_content is None:
                rec.t_first_content = t
        else:
            txt = ch.get("text") or ""
            if txt and rec.t_first_content is None:
                rec.t_first_content = t
        if txt:
            has_text = True
            rec.text_chars += len(txt)
        if ch.get("finish_reason"):
            rec.finish_reason = ch["finish_reason"]
    usage = obj.get("usage")
    cum = None
    prev = rec.completion_tokens or 0
    if usage:
        cum = usage.get("completion_tokens")
        if obj.get("choices"):
            rec.continuous_usage = True
        rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
        rec.completion_tokens = cum
        det = usage.get("prompt_tokens_details")
        if det and det.get("cached_tokens") is not None:
            rec.cached_tokens = det["cached_tokens"]
    rec.ev_t.append(t)
    rec.ev_cum.append(cum)
    if has_text or (cum or 0) > prev:
        if obj.get("choices"):
            rec.n_token_events += 1
        if rec.t_first_token is None:
            rec.t_first_token = t
            rec.first_chunk_tokens = cum if (cum and rec.continuous_usage) else None
        if has_text:
            rec.t_last_token = t
    return False


def finalize(rec: RequestRecord) -> None:
    """Fix ``t_last_token`` from the cumulative series and flag missing usage."""
    n = rec.completion_tokens
    if rec.continuous_usage and n is not None:
        for t, c in zip(rec.ev_t, rec.ev_cum):
            if c is not None and c >= n:
                rec.t_last_token = t
                break
    if not rec.error and n is None:
        rec.error = "no usage in stream (server ignored stream_options.include_usage)"


def make_stream_client(base_url: str, api_key: str | None = None) -> RawHTTP:
    """The HTTP client for generation requests (pre-encoded requests on a keep-alive pool)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return RawHTTP(normalize_base_url(base_url), headers)


async def stream_request(http: RawHTTP, endpoint: str, payload: dict[str, Any] | bytes,
                         rec: RequestRecord, *, timeout_s: float,
                         on_event: Callable[[RequestRecord, float], None] | None = None,
                         keep_events: bool = True) -> RequestRecord:
    """Send one streaming request and fill ``rec``; never raises (errors go to ``rec.error``).

    The request bytes are fully encoded before ``t_sent`` is stamped; ``t_sent`` is taken right
    before the bytes are written to a pooled keep-alive connection. SSE events are parsed inside
    the connection's ``data_received`` and stamped with that socket read's time, including events
    that arrive in the same read as the response head."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    rec.endpoint = endpoint
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    raw = http.request_bytes("POST", path, body)
    state = {"buf": b"", "done": False, "status": 0}
    err_body: list[bytes] = []

    def on_body(data: bytes, t: float) -> None:
        if state["status"] != 200:
            if sum(map(len, err_body)) < 2000:
                err_body.append(data)
            return
        buf = state["buf"] + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        start = 0
        while True:
            i = buf.find(b"\n\n", start)
            if i < 0:
                break
            n0 = len(rec.ev_t)
            if handle_event(rec, buf[start:i], t):
                state["done"] = True
            start = i + 2
            if len(rec.ev_t) > n0:
                if on_event is not None:
                    on_event(rec, t)
                if not keep_events and len(rec.ev_t) > 4:
                    del rec.ev_t[1:-2], rec.ev_cum[1:-2]     # soak: bounded memory
        state["buf"] = buf[start:]

    def on_sent() -> None:
        rec.t_sent = clock()

    def on_head(status: int, headers: dict[str, str], t: float) -> None:
        # runs inside the read that completed the head, before any body byte of that read
        rec.t_headers = t
        rec.http_status = state["status"] = status

    resp = None
    try:
        async with asyncio.timeout(timeout_s):
            resp = await http.send(raw, on_body, on_sent, on_head)
            await resp.wait()
            rec.t_end = clock()
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: " + b"".join(err_body)[:300].decode("utf-8", "replace")
            resp.release()
            resp = None
    except TimeoutError:
        rec.t_end = clock()
        rec.error = rec.error or f"timeout after {timeout_s:.0f} s"
    except (OSError, HTTPError, ValueError) as e:
        rec.t_end = clock()
        rec.error = rec.error or f"{type(e).__name__}: {e}"[:300]
    except asyncio.CancelledError:
        rec.t_end = clock()
        rec.error = rec.error or "cancelled"
        raise
    finally:
        if resp is not None:
            resp.abort()
    if not rec.error and not state["done"]:
        rec.error = "stream ended without [DONE]"
    finalize(rec)
    return rec


class ServerAPI:
    """The non-generation endpoints: /tokenize, /metrics, /reset_prefix_cache, /v1/models, /version, through the
    runbook's one API client (``serve.server_info.ApiClient``), each call on a worker thread so the event loop
    that times the streams never blocks on it. Only the generation streams use the bench's own reader."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None):
        self.base, self.model = normalize_base_url(base_url), model
        self.client = ApiClient(ServerInfo(self.base, model, api_key=api_key or ""), timeout=300)

    def close(self) -> None:
        self.client.close()

    async def _call(self, method: str, path: str, payload: Any = None, timeout: float = 30) -> Exchange:
        return await asyncio.to_thread(self.client.request, method, path, payload, timeout=timeout)

    async def tokenize(self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
                       timeout: float = 300, chat_template_kwargs: dict[str, Any] | None = None,
                       tools: list[dict[str, Any]] | None = None) -> int:
        body: dict[str, Any] = {"model": self.model}
        if messages is not None:
            body.update(messages=messages, add_generation_prompt=True)
            if chat_template_kwargs:     # the template the requests use (thinking on/off changes the count)
                body["chat_template_kwargs"] = chat_template_kwargs
            if tools:
                body["tools"] = tools
        else:
            body["prompt"] = prompt
        ex = await self._call("POST", "/tokenize", body, timeout)
        if ex.status is None:
            # no HTTP answer at all: the API is gone (a killed head, a dropped forward), not an endpoint missing
            raise BenchError(f"the server does not answer: POST /tokenize {ex.summary()}",
                             fix="the server stopped answering: python -m runbook status says which rank is gone "
                                 "and what to run; python -m runbook logs shows why")
        if ex.status in (404, 405):
            raise BenchError(f"/tokenize {ex.summary()}: {str(ex.body or ex.error)[:200]}",
                             fix="the server must serve POST /tokenize (vLLM does) to build exact-length prompts")
        if ex.status != 200:
            raise BenchError(f"/tokenize {ex.summary()}: {str(ex.body or ex.error)[:200]}",
                             fix="the server answered /tokenize with an error: python -m runbook logs shows why")
        return int(ex.json["count"])

    async def metrics(self) -> MetricsSnapshot:
        t = clock()
        ex = await self._call("GET", "/metrics")
        if ex.status is None:               # a missing /metrics is recorded, not fatal
            return MetricsSnapshot(t=t, ok=False, error=ex.error)
        if ex.status != 200:
            return MetricsSnapshot(t=t, ok=False, error=f"HTTP {ex.status}")
        return MetricsSnapshot.from_text(t, ex.body if isinstance(ex.body, str) else json.dumps(ex.body))

    async def reset_prefix_cache(self) -> bool:
        return (await self._call("POST", "/reset_prefix_cache", timeout=60)).status == 200

    async def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path, key in (("/version", "version"), ("/v1/models", "models")):
            ex = await self._call("GET", path, timeout=15)
            out[key] = (ex.body if ex.status == 200 else f"HTTP {ex.status}" if ex.status is not None
                        else ex.error.split(":", 1)[0])
        return out
