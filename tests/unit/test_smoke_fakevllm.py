"""Self-tests of the shared fake vLLM server (tests/support/fake_vllm.py), so a broken fake fails here and
not in every dependent smoke / vision / tool-call test."""
from __future__ import annotations

import pytest

from support.fake_vllm import (OVERHEAD, RECORDED_FORCED_NAMED, RECORDED_PROBE_LAB, RECORDED_TRUNCATED_REQUIRED,
                               FakeVllm)


def test_fake_counts_additively():
    fake = FakeVllm()
    a, _ = fake.count([{"role": "user", "content": "alpha beta"}])
    b, _ = fake.count([{"role": "user", "content": "alpha beta gamma"}])
    assert b - a == 1 and a == OVERHEAD + 2


def test_fake_enforces_key_and_context():
    fake = FakeVllm(api_key="k-123456")
    c = fake.client()
    assert c.get("/v1/models").status == 200
    assert c.get("/v1/models", auth=False).status == 401
    big = " ".join(["w"] * 5000)
    ex = c.chat({"messages": [{"role": "user", "content": big}], "max_tokens": 1})
    assert ex.status == 400 and "maximum context length" in ex.error_message()


@pytest.mark.parametrize("body", [RECORDED_TRUNCATED_REQUIRED, RECORDED_FORCED_NAMED, RECORDED_PROBE_LAB])
def test_recorded_shapes_are_chat_completions(body):
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_fake_answers_unknown_paths_like_vllm_with_404_and_records_them():
    fake = FakeVllm()
    got = fake.client().get("/v1/no-such-endpoint")
    assert got.status == 404 and fake.requests == [("/v1/no-such-endpoint", None)]


def test_fake_refuses_a_chat_field_it_does_not_model():
    fake = FakeVllm()
    ex = fake.client().chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "top_k": 5})
    assert ex.status == 400 and "top_k" in ex.error_message()


def test_fake_over_http_answers_like_in_process():
    from runbook.serve.server_info import ApiClient, ServerInfo
    from support.fake_vllm import serve_http

    fake = FakeVllm()
    with serve_http(fake) as url, ApiClient(ServerInfo(url, "tiny", 4096, "parameters"), timeout=10) as cl:
        assert cl.get("/health").status == 200
        st = cl.stream_chat({"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 4})
        assert st.ok and st.json["usage_in_last_chunk"], st.error
        assert cl.get("/v1/nope").status == 404
    assert [p for p, _ in fake.requests] == ["/health", "/v1/chat/completions", "/v1/nope"]
