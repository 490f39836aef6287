"""How a step finds the OpenAI-compatible server, and the client the smoke, vision and tool steps talk
to it with (chat completions through the ``openai`` SDK).

Chat completions, plain and streamed, go through the ``openai`` SDK: the client users have, so a check
that passes here passes for them. vLLM's own routes (``/health``, ``/version``, ``/metrics``, ``/tokenize``)
are not OpenAI API and go through httpx, as does the raw ``GET /v1/models`` the smoke step reads vLLM's
``max_model_len`` from. Both carry a timeout on every call; the SDK never retries.

    server = find_server(profile, run_dir, base_url=base_url)     # 04_launch sidecar, or parameters
    client = ApiClient(server)                                    # API key from VLLM_API_KEY
    ex = client.chat({"messages": [...], "max_tokens": 8})       # openai SDK -> Exchange (never raises on HTTP)
    ex = client.stream_chat({...})                                # openai SDK stream: events, TTFT, usage
    n = client.count_chat_tokens(messages)                        # POST /tokenize (chat template applied)
    rec = Archive("raw/05_smoke")                                 # what run() writes through the step
    paths = archive(rec, "chat.basic", [ex])                      # raw/05_smoke/chat.basic.json (masked)

Where the server is (first match wins):
1. the ``base_url`` parameter (standalone run of a notebook against a server you started yourself);
2. the launch step's record in the run directory (``steps/04_launch.json``, read as
   :class:`runbook.records.LaunchRecord`: ``base_url``, ``served_model_name``, ``max_model_len``); a sidecar without
   one (an older runbook's) is a :class:`~runbook.records.RecordError` naming the step to re-run;
3. nothing: :class:`~runbook.errors.RunbookError` with the fix (run 04_launch first or pass base_url).

Only the values are taken from the record; the served name and context length the server really
reports are checked by the smoke step against them (and against the profile).
"""
from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
from openai.resources.chat.completions import Completions

from ..errors import RunbookError
from ..evidence import RunDir
from ..records import LAUNCH, LaunchRecord
from . import endpoint
from ..secrets import MASK, load_secrets, register_secret

__all__ = ["LAUNCH_STEP", "ApiClient", "Archive", "Exchange", "ServerInfo", "archive", "clip", "connect", "find_server"]

LAUNCH_STEP = LAUNCH.id


@dataclass(repr=False)
class ServerInfo:
    """Where the API is. ``base_url`` has no ``/v1`` suffix (``http://host:port``)."""
    base_url: str
    model: str
    max_model_len: int = 0          # what the launch step configured (0 = unknown: use the profile)
    source: str = ""                # "parameters" | "steps/04_launch.json"
    api_key: str = ""
    server_id: str = ""             # which start of the server (04's record); "" = unknown (base_url given)

    def __repr__(self) -> str:
        key = MASK if self.api_key else "''"
        return (f"ServerInfo(base_url={self.base_url!r}, model={self.model!r}, "
                f"max_model_len={self.max_model_len}, source={self.source!r}, api_key={key})")

    __str__ = __repr__

    def describe(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "model": self.model, "max_model_len": self.max_model_len,
                "source": self.source, "api_key": "set" if self.api_key else "none", "server_id": self.server_id}


def _norm_url(url: str) -> str:
    url = url.strip().rstrip("/")
    url = url.removesuffix("/v1")
    if url and "://" not in url:
        url = "http://" + url
    return url


def find_server(profile=None, run_dir: str | Path | None = None, *, base_url: str = "", model: str = "",
                max_model_len: int = 0, api_key: str | None = None) -> ServerInfo:
    """Locate the server (see the module docstring): ``base_url`` if given, else 04's sidecar in ``run_dir``;
    ``profile`` gives the default model name, context length and this process's route to the head."""
    if api_key is None:
        api_key = load_secrets().api_key
    if api_key:
        register_secret(api_key)
    default_model = profile.served_model_name if profile is not None else ""
    default_len = profile.max_model_len if profile is not None else 0
    if base_url:
        return ServerInfo(_norm_url(base_url), model or default_model, int(max_model_len or default_len),
                          "parameters", api_key)
    run = RunDir(Path(run_dir)) if run_dir else None
    rec = run.read_record(LaunchRecord, missing_ok=True) if run is not None else None   # old format: RecordError
    if rec is None:
        raise RunbookError("no server to talk to", observed=f"no {LAUNCH_STEP} sidecar in {run_dir or '(no run dir)'}",
                           expected=f"steps/{LAUNCH_STEP}.json from the launch step, or the base_url parameter",
                           fix=f"run {LAUNCH_STEP} first (make runbook), or pass base_url='http://host:port' "
                               "(and model=...) for a standalone run")
    if not rec.base_url:
        raise RunbookError(f"{LAUNCH_STEP} of this run made no start", observed=f"steps/{LAUNCH_STEP}.json: "
                           f"fingerprint {rec.fingerprint[:12]}, no base_url (its action was stop or status, or it "
                           "refused before starting)", expected="a server 04_launch started",
                           fix=f"run {LAUNCH_STEP} with action='start', or pass base_url=... to this notebook")
    # the record names the head's API; this process's route to it comes from the profile (an SSH forward)
    url = endpoint.base_url(profile) if profile is not None else rec.base_url
    return ServerInfo(_norm_url(url), model or rec.served_model_name or default_model,
                      int(max_model_len or rec.max_model_len or default_len), f"steps/{LAUNCH_STEP}.json", api_key,
                      rec.server_id)


def connect(profile, run_dir: str | Path, *, dry_run: bool = False, base_url: str = "", model: str = "",
            max_model_len: int = 0, timeout: float = 180.0) -> ApiClient | None:
    """The client for the step's server, or None in a dry run (no server was launched; the step's functions
    then report N/A rows and send nothing). The step's run() records ``client.server.describe()``."""
    if dry_run:
        return None
    server = find_server(profile, run_dir, base_url=base_url, model=model, max_model_len=max_model_len)
    return ApiClient(server, timeout=timeout)


# ------------------------------------------------------------------------------------------------
# exchanges
# ------------------------------------------------------------------------------------------------

@dataclass
class Exchange:
    """One request and what came back. ``status`` is None when no HTTP answer arrived (``error``)."""
    method: str
    path: str
    request: Any = None
    status: int | None = None
    body: Any = None                    # parsed JSON, or text
    latency_s: float = 0.0
    error: str = ""                     # transport problem: timeout, refused, broken stream
    auth: bool = True                   # whether the Authorization header was sent
    stream: bool = False
    events: list[dict] = field(default_factory=list)
    ttft_s: float | None = None         # streaming: time to the first content/reasoning/tool delta

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def json(self) -> dict:
        return self.body if isinstance(self.body, dict) else {}

    def summary(self) -> str:
        """One line for a check's observed column: ``HTTP 200 in 0.12 s`` / ``no answer: timeout``."""
        if self.status is None:
            return f"no answer: {self.error}"
        extra = f" ({self.error})" if self.error else ""
        return f"HTTP {self.status} in {self.latency_s:.2f} s{extra}"

    def error_message(self) -> str:
        err = self.json.get("error")
        if isinstance(err, dict):
            return str(err.get("message", ""))
        if isinstance(err, str):
            return err
        if isinstance(self.body, str):
            return self.body[:300]
        return str(self.json.get("detail") or self.json.get("message") or "")

    def to_archive(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request": {"method": self.method, "path": self.path,
                        "headers": {"Authorization": f"Bearer {MASK}"} if self.auth else {},
                        "body": clip(self.request)},
            "response": {"status": self.status, "body": clip(self.body)},
            "latency_s": round(self.latency_s, 4),
        }
        if self.error:
            out["error"] = self.error
        if self.stream:
            evs = self.events
            kept = evs if len(evs) <= 40 else evs[:20] + [{"_clipped_events": len(evs) - 30}] + evs[-10:]
            out["response"]["events"] = clip(kept)
            out["response"]["n_events"] = len(evs)
            out["ttft_s"] = self.ttft_s
        return out


def clip(obj: Any, limit: int = 2000, head: int = 600, tail: int = 300) -> Any:
    """Shorten long strings (long-context prompts, base64 images) inside nested JSON for archives."""
    if isinstance(obj, str):
        if len(obj) <= limit:
            return obj
        return f"{obj[:head]}…[{len(obj) - head - tail} chars clipped]…{obj[-tail:]}"
    if isinstance(obj, dict):
        return {k: clip(v, limit, head, tail) for k, v in obj.items()}
    if isinstance(obj, list):
        if len(obj) > 200 and all(isinstance(x, int) for x in obj):   # token id lists
            return obj[:20] + [f"…{len(obj) - 30} ids clipped…"] + obj[-10:]
        return [clip(v, limit, head, tail) for v in obj]
    return obj


@dataclass
class Archive:
    """What the cases below a step's ``run()`` leave for it to record: raw files (name -> text, written by
    ``run()`` through ``step.archive`` under ``raw/<step>/``) and data for the step's sidecar. ``prefix`` is
    the run-relative raw folder (``raw/05_smoke``), so rows can name their evidence before it is written."""
    prefix: str
    files: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def raw(self, name: str, text: str) -> str:
        """Keep one raw file for the step; returns the run-relative path it will have."""
        self.files[name] = text
        return f"{self.prefix}/{name}"


def archive(rec: Archive, name: str, exchanges: Exchange | Iterable[Exchange], **extra: Any) -> list[str]:
    """Keep the request/response pairs of one case as ``raw/<step>/<name>.json`` (secrets masked by the
    run's redactor when the step writes it; the Authorization header is never stored). Returns the
    evidence path list."""
    if isinstance(exchanges, Exchange):
        exchanges = [exchanges]
    doc = {"case": name, "exchanges": [e.to_archive() for e in exchanges], **clip(extra)}
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)
    return [rec.raw(f"{safe}.json", json.dumps(doc, indent=1, default=str))]


# ------------------------------------------------------------------------------------------------
# client
# ------------------------------------------------------------------------------------------------

#: the request fields the SDK's ``chat.completions.create`` takes by name; any other field of a payload
#: (vLLM's ``chat_template_kwargs``, ``top_k``, ...) travels in ``extra_body``
SDK_CHAT_FIELDS = frozenset(inspect.signature(Completions.create).parameters) - {
    "self", "extra_headers", "extra_query", "extra_body", "timeout"}
#: the SDK refuses to build a client without a key; a server without one gets no Authorization header
#: (``_no_auth``), so this placeholder is never sent
NO_KEY = "no-key"


class _SseTail(httpx2.SyncByteStream):
    """A streamed body passed through unchanged, keeping its last bytes: whether the server ended the
    stream with ``data: [DONE]`` (the SDK stops at it silently, and equally silently at a cut stream)."""

    def __init__(self, inner: Iterable[bytes]):
        self.inner, self.tail = inner, b""

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.tail = (self.tail + chunk)[-64:]
            yield chunk

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close:
            close()

    @property
    def done(self) -> bool:
        return self.tail.rstrip().endswith(b"data: [DONE]")


class _SseTap(httpx2.BaseTransport):
    """The SDK's transport, with every ``text/event-stream`` body read through an :class:`_SseTail`
    (found again as ``response.extensions["sse_tail"]``)."""

    def __init__(self, inner: httpx2.BaseTransport):
        self.inner = inner

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        resp = self.inner.handle_request(request)
        if not resp.headers.get("content-type", "").startswith("text/event-stream"):
            return resp
        tail = _SseTail(resp.stream)
        return httpx2.Response(resp.status_code, headers=resp.headers, stream=tail, request=request,
                               extensions={**resp.extensions, "sse_tail": tail})

    def close(self) -> None:
        self.inner.close()


class ApiClient:
    """Synchronous client: chat completions through the ``openai`` SDK, vLLM's other routes through httpx.
    Every call returns an :class:`Exchange`; HTTP errors, timeouts and refused connections are data, not
    exceptions (a check decides what they mean). The SDK never retries (``max_retries=0``): a failure
    shows at once, with its reason. ``transport``/``sdk_transport``: test doubles of the two."""

    def __init__(self, server: ServerInfo, *, timeout: float = 180.0,
                 transport: httpx.BaseTransport | None = None, sdk_transport: httpx2.BaseTransport | None = None):
        self.server = server
        self.model = server.model
        self.timeout = timeout
        self._http = httpx.Client(base_url=server.base_url, timeout=timeout, transport=transport,
                                  headers={"Content-Type": "application/json"},
                                  limits=httpx.Limits(max_connections=64, max_keepalive_connections=16))
        self._sdk_http = httpx2.Client(transport=_SseTap(sdk_transport or httpx2.HTTPTransport()), timeout=timeout,
                                       limits=httpx2.Limits(max_connections=64, max_keepalive_connections=16))
        self.openai = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key or NO_KEY,
                                    timeout=timeout, max_retries=0, http_client=self._sdk_http)

    # -- plumbing ---------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()
        self.openai.close()

    def __enter__(self) -> ApiClient:  # noqa: PYI034 (typing.Self needs 3.11; the project allows 3.10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self, auth: bool) -> dict[str, str]:
        if auth and self.server.api_key:
            return {"Authorization": f"Bearer {self.server.api_key}"}
        return {}

    def request(self, method: str, path: str, payload: Any = None, *, auth: bool = True,
                timeout: float | None = None) -> Exchange:
        ex = Exchange(method, path, payload, auth=bool(auth and self.server.api_key))
        t0 = time.perf_counter()
        try:
            resp = self._http.request(method, path, json=payload, headers=self._headers(auth),
                                      timeout=timeout or self.timeout)
            ex.status = resp.status_code
            try:
                ex.body = resp.json()
            except ValueError:
                ex.body = resp.text
        except httpx.TimeoutException:
            ex.error = f"timeout after {timeout or self.timeout:.0f} s"
        except httpx.HTTPError as exc:
            ex.error = f"{type(exc).__name__}: {exc}"
        ex.latency_s = time.perf_counter() - t0
        return ex

    def get(self, path: str, **kw: Any) -> Exchange:
        return self.request("GET", path, **kw)

    def post(self, path: str, payload: Any, **kw: Any) -> Exchange:
        return self.request("POST", path, payload, **kw)

    def _with_model(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"model": self.model, **payload}

    def _sdk_call(self, body: dict[str, Any], timeout: float | None, auth: bool) -> dict[str, Any]:
        """``chat.completions.create`` keywords for a request body: the SDK's named fields, the rest in
        ``extra_body``; no Authorization header without a key, or when ``auth`` is off."""
        call: dict[str, Any] = {k: v for k, v in body.items() if k in SDK_CHAT_FIELDS}
        extra = {k: v for k, v in body.items() if k not in SDK_CHAT_FIELDS}
        if extra:
            call["extra_body"] = extra
        if not (auth and self.server.api_key):
            call["extra_headers"] = {"Authorization": openai.omit}
        call["timeout"] = timeout or self.timeout
        return call

    def _sdk_failure(self, ex: Exchange, exc: openai.OpenAIError, timeout: float | None) -> None:
        """An SDK exception as the Exchange's data: the HTTP status and body, or why no answer came."""
        if isinstance(exc, openai.APIStatusError):
            ex.status = exc.status_code
            try:
                ex.body = exc.response.json()
            except ValueError:
                ex.body = exc.response.text
        elif isinstance(exc, openai.APITimeoutError):
            ex.error = f"timeout after {timeout or self.timeout:.0f} s"
        elif isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            ex.error = f"{type(cause).__name__}: {cause}"
        else:                               # an error event inside a stream, an answer the SDK cannot read
            ex.error = f"{type(exc).__name__}: {exc}"

    def chat(self, payload: dict[str, Any], *, timeout: float | None = None, auth: bool = True) -> Exchange:
        """One chat completion through the openai SDK; ``body`` is the completion the SDK parsed."""
        body = self._with_model(payload)
        ex = Exchange("POST", "/v1/chat/completions", body, auth=bool(auth and self.server.api_key))
        t0 = time.perf_counter()
        try:
            raw = self.openai.chat.completions.with_raw_response.create(**self._sdk_call(body, timeout, auth))
            ex.status = raw.http_response.status_code
            try:
                ex.body = raw.parse().to_dict()
            except ValueError:              # 200 but not JSON: the text is the evidence
                ex.body = raw.http_response.text
        except openai.OpenAIError as exc:
            self._sdk_failure(ex, exc, timeout)
        ex.latency_s = time.perf_counter() - t0
        return ex

    def stream_chat(self, payload: dict[str, Any], *, timeout: float | None = None, auth: bool = True) -> Exchange:
        """A streamed chat completion (``stream_options.include_usage``) through the openai SDK: every
        chunk the SDK yields is an event; a stream that stops without ``data: [DONE]`` is an error."""
        body = self._with_model({**payload, "stream": True,
                                 "stream_options": {"include_usage": True, **payload.get("stream_options", {})}})
        ex = Exchange("POST", "/v1/chat/completions", body, auth=bool(auth and self.server.api_key), stream=True)
        t0 = time.perf_counter()
        try:
            stream = self.openai.chat.completions.create(**self._sdk_call(body, timeout, auth))
            ex.status = stream.response.status_code
            with stream:
                for chunk in stream:
                    ev = chunk.to_dict()
                    if ex.ttft_s is None and _has_output(ev):
                        ex.ttft_s = time.perf_counter() - t0
                    ex.events.append(ev)
            tail = stream.response.extensions.get("sse_tail")
            if tail is None or not tail.done:
                ex.error = "stream ended without [DONE]"
            ex.body = assemble_stream(ex.events)
        except openai.OpenAIError as exc:
            self._sdk_failure(ex, exc, timeout)
            if ex.events:
                ex.body = assemble_stream(ex.events)
        except ValueError as exc:           # an event that is not JSON
            ex.error = f"unparsable SSE event: {exc}"
            ex.body = assemble_stream(ex.events)
        ex.latency_s = time.perf_counter() - t0
        return ex

    def count_chat_tokens(self, messages: list[dict[str, Any]], *, chat_template_kwargs: dict | None = None,
                          timeout: float | None = None) -> int:
        """Prompt tokens of a chat request as the server counts them (POST /tokenize with messages)."""
        payload: dict[str, Any] = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        if chat_template_kwargs:
            payload["chat_template_kwargs"] = chat_template_kwargs
        ex = self.post("/tokenize", payload, timeout=timeout)
        if not ex.ok or "count" not in ex.json:
            raise RunbookError("POST /tokenize failed", observed=f"{ex.summary()}: {ex.error_message()[:200]}",
                               expected="HTTP 200 with a token count",
                               fix="the server must expose vLLM's /tokenize (vllm serve does by default)")
        return int(ex.json["count"])

    def parallel(self, fn: Callable[[int], Exchange], n: int) -> list[Exchange]:
        """Run ``fn(i)`` for i in range(n) at the same time (threads); results in order."""
        with ThreadPoolExecutor(max_workers=max(1, n)) as pool:
            return list(pool.map(fn, range(n)))


def _has_output(ev: dict) -> bool:
    for ch in ev.get("choices") or []:
        d = ch.get("delta") or {}
        if d.get("content") or d.get("reasoning_content") or d.get("reasoning") or d.get("tool_calls"):
            return True
    return False


def assemble_stream(events: list[dict]) -> dict[str, Any]:
    """Fold SSE chunks into the shape of a non-streamed chat completion (content, reasoning,
    finish_reason, tool calls, and the usage of the final chunk)."""
    content: list[str] = []
    reasoning: list[str] = []
    finish = None
    usage = None
    calls: dict[int, dict[str, Any]] = {}
    usage_last = False
    for i, ev in enumerate(events):
        if ev.get("usage"):
            usage = ev["usage"]
            usage_last = i == len(events) - 1
        for ch in ev.get("choices") or []:
            d = ch.get("delta") or {}
            if d.get("content"):
                content.append(d["content"])
            r = d.get("reasoning_content") or d.get("reasoning")
            if r:
                reasoning.append(r)
            for tc in d.get("tool_calls") or []:
                slot = calls.setdefault(int(tc.get("index", 0)), {"id": "", "type": "function",
                                                                     "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content else None}
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [calls[k] for k in sorted(calls)]
    return {"object": "chat.completion(assembled)", "choices": [{"index": 0, "message": message,
                                                                  "finish_reason": finish}],
            "usage": usage, "usage_in_last_chunk": usage_last, "n_events": len(events)}


# ------------------------------------------------------------------------------------------------
# response accessors shared by the smoke, vision and tool checks
# ------------------------------------------------------------------------------------------------

def first_choice(body: Any) -> dict[str, Any]:
    choices = body.get("choices") if isinstance(body, dict) else None
    return choices[0] if choices and isinstance(choices[0], dict) else {}


def message_of(body: Any) -> dict[str, Any]:
    return first_choice(body).get("message") or {}


def content_of(body: Any) -> str:
    return message_of(body).get("content") or ""


def reasoning_of(body: Any) -> str:
    msg = message_of(body)
    return msg.get("reasoning_content") or msg.get("reasoning") or ""


def finish_of(body: Any) -> str | None:
    return first_choice(body).get("finish_reason")


def usage_problems(usage: Any, *, max_tokens: int | None = None, prompt_tokens: int | None = None) -> list[str]:
    """Why a usage block is not consistent (empty list = consistent)."""
    if not isinstance(usage, dict):
        return ["usage missing"]
    out = []
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    if not all(isinstance(v, int) for v in (p, c, t)):
        return [f"usage fields missing or not integers: {usage}"]
    if p <= 0:
        out.append(f"prompt_tokens={p} <= 0")
    if c < 0:
        out.append(f"completion_tokens={c} < 0")
    if t != p + c:
        out.append(f"total_tokens={t} != prompt {p} + completion {c}")
    if max_tokens is not None and c > max_tokens:
        out.append(f"completion_tokens={c} > max_tokens={max_tokens}")
    if prompt_tokens is not None and p != prompt_tokens:
        out.append(f"prompt_tokens={p} != {prompt_tokens} counted by /tokenize")
    return out
