"""Seed conditions by default for the recipe profiles; the shipped prose corpus; the one exact-length
prompt builder (sync and async drivers of one search) against tokenizers with awkward boundaries."""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from runbook.benchmark.conditions import PUBLISHED_PREFILL, SEEDS
from runbook.api.prompts import (
    WORKLOADS,
    PromptBuilder,
    abuild_exact_prompt,
    build_exact_prompt,
    corpus,
)
from runbook.benchmark.refserver import RefConfig, serve_in_thread
from runbook.benchmark.result import BenchConfig
from runbook.benchmark.runner import run_benchmark
from runbook.bench.config import config_from_profile
from runbook.errors import BenchError
from runbook.profile import REPO_ROOT, load_profile

# some cases time the reference server's answers: on the lab's xdist worker in `make test`, never niced
pytestmark = pytest.mark.timed


def profile_without_bench_keys(tmp_path: Path, name: str, overrides: dict | None = None):
    """A shipped recipe profile minus its BENCH_* lines (what a user gets who does not set them)."""
    src = REPO_ROOT / "env" / name
    text = "\n".join(ln for ln in src.read_text().splitlines() if not ln.startswith("BENCH_"))
    dst = tmp_path / name
    dst.write_text(text + "\n")
    return load_profile(dst, overrides)


@pytest.mark.parametrize("name,recipe", [("exl3-v41.env", "exl3-v41"), ("dspark-v4.env", "dspark-v4")])
def test_recipe_profiles_default_to_the_seed_conditions(tmp_path, name, recipe):
    d = config_from_profile(profile_without_bench_keys(tmp_path, name)).to_dict()
    seed = SEEDS[recipe]
    assert d["endpoint"] == "chat" and d["workload"] == "prose" and d["temperature"] == 0.0
    assert d["chat_template_kwargs"] == seed.thinking_off and list(seed.thinking_off.values()) == [False]
    assert (d["prompt_tokens"], d["decode_tokens"]) == (seed.prompt_tokens, seed.decode_tokens)
    assert d["concurrency"][:3] == [1, 2, 4]
    assert d["prefill_tokens"] == list(PUBLISHED_PREFILL) == [32789, 262158]
    assert d["conditions"]["thinking"] == "off" and d["conditions"]["deviations"] == []
    assert "seed" in d["conditions"]["source"]
    json.dumps(d)                                          # what --dry-run / the manifest show


def test_exl3_seed_lengths_are_the_published_ones():
    s = SEEDS["exl3-v41"]
    assert (s.prompt_tokens, s.decode_tokens, s.concurrency) == (256, 400, (1, 2, 4))


def test_profile_keys_win_and_are_listed_as_deviations():
    p = load_profile(REPO_ROOT / "env" / "exl3-v41.env",
                     {"BENCH_DECODE_TOKENS": "512", "BENCH_PREFILL_TOKENS": "8192"})
    d = config_from_profile(p).to_dict()
    assert d["decode_tokens"] == 512 and d["prefill_tokens"] == [8192]
    devs = d["conditions"]["deviations"]
    assert "BENCH_DECODE_TOKENS=512 (published: 400)" in devs
    assert "BENCH_PREFILL_TOKENS=8192 (published: 32789,262158)" in devs
    assert d["workload"] == "prose" and d["endpoint"] == "chat"     # the text conditions stay


def test_lab_keeps_its_scaled_sizes():
    p = load_profile(REPO_ROOT / "env" / "lab.env")
    d = config_from_profile(p).to_dict()
    assert d["endpoint"] == "completions" and d["workload"] == "filler" and d["chat_template_kwargs"] == {}
    assert d["prompt_tokens"] == p.bench_prompt_tokens and d["prefill_tokens"] == list(p.bench_prefill_tokens)


def test_published_prefill_that_does_not_fit_is_a_clear_error(tmp_path):
    p = profile_without_bench_keys(tmp_path, "exl3-v41.env", {"MAX_MODEL_LEN": "200000"})
    with pytest.raises(BenchError) as ei:
        config_from_profile(p)
    msg = str(ei.value)
    assert "MAX_MODEL_LEN=200000" in msg and "262159" in msg and "BENCH_PREFILL_TOKENS" in msg


# ---------------------------------------------------------------- corpus and builder

def test_corpus_is_unique_natural_language():
    prose = corpus()["prose"]
    assert len(prose) >= 40
    assert len(set(prose)) == len(prose)
    for p in prose:
        words = p.split()
        assert len(words) >= 60, p[:60]
        assert p.rstrip().endswith("."), p[-40:]
        assert re.fullmatch(r"[\w ,.;:'\-!?]+", p), p[:60]       # plain sentences, no markup
    # enough distinct text that a 256-token prompt never needs a passage twice
    assert sum(len(p.split()) for p in prose) > 3000


def bpe_like(text: str) -> int:
    """A tokenizer with awkward boundaries: long words split in two, punctuation its own token."""
    n = 0
    for w in text.split():
        core = w.strip(".,;:!?'")
        n += (2 if len(core) > 7 else 1) + (len(w) - len(core))
    return n + 1                                               # BOS


def count_prompt(p) -> int:
    if isinstance(p, str):
        return bpe_like(p)
    return bpe_like(" ".join(m["content"] for m in p)) + 3 * len(p) + 1   # template tokens


@pytest.mark.parametrize("target", [40, 256, 1000, 32789, 262158])
def test_exact_length_prose_prompts(target):
    b = build_exact_prompt(count_prompt, target, "run1-decode-0-0", workload="prose", start=5)
    assert b.exact and b.tokens == count_prompt(b.prompt) == target, (b.tokens, target, b.tokenize_calls)
    assert b.tokenize_calls <= 14
    assert b.prompt[0] == {"role": "system", "content": "run1-decode-0-0"}
    user = b.prompt[1]["content"]
    assert user.startswith(WORKLOADS["prose"].instruction)
    assert user[len(WORKLOADS["prose"].instruction):].startswith(corpus()["prose"][5][:40])


def test_streams_get_different_passages_and_the_sync_and_async_drivers_agree():
    a = build_exact_prompt(count_prompt, 256, "n-0", workload="prose", start=0)
    b = build_exact_prompt(count_prompt, 256, "n-1", workload="prose", start=1)
    assert a.prompt[1]["content"] != b.prompt[1]["content"]

    async def acount(p):
        return count_prompt(p)
    c = asyncio.run(abuild_exact_prompt(acount, 256, "n-1", workload="prose", start=1))
    assert c.prompt == b.prompt and c.tokens == b.tokens == 256


def test_below_the_fixed_part_and_unknown_workload_are_errors():
    with pytest.raises(BenchError, match="shorter than its fixed part"):
        build_exact_prompt(count_prompt, 5, "nonce", workload="prose")
    with pytest.raises(BenchError, match="unknown bench workload"):
        build_exact_prompt(count_prompt, 50, "nonce", workload="poetry")
    with pytest.raises(BenchError, match="unknown bench workload"):
        run_benchmark("http://127.0.0.1:9", "m", BenchConfig(workload="poetry"))


def test_chat_template_kwargs_need_chat():
    with pytest.raises(BenchError, match="need the chat endpoint"):
        run_benchmark("http://127.0.0.1:9", "m", BenchConfig(chat_template_kwargs={"thinking": False}))


def test_builder_counts_with_the_requests_template_kwargs():
    """/tokenize must see the same chat_template_kwargs as the request (thinking off adds a token)."""
    with serve_in_thread(RefConfig(ttft_s=0.005, interval_s=0.002)) as srv:
        from runbook.benchmark.client import ServerAPI

        async def go():
            api = ServerAPI(srv.base_url, "ref-model")
            try:
                kw = {"thinking": False}
                with_kw = PromptBuilder(api.tokenize, "chat", workload="prose", chat_template_kwargs=kw)
                without = PromptBuilder(api.tokenize, "chat", workload="prose")
                b1, b2 = await with_kw.build(100, "x1"), await without.build(100, "x2")
                return (await api.tokenize(messages=b1.prompt, chat_template_kwargs=kw),
                        await api.tokenize(messages=b2.prompt, chat_template_kwargs=kw))
            finally:
                api.close()
        n_with, n_without = asyncio.run(go())
    assert n_with == 100 and n_without == 101


def test_seed_conditions_reach_the_server(tmp_path):
    """A run under seed conditions (sizes scaled down) sends chat, prose, temperature 0, thinking off,
    and the prompts are exact under that template."""
    with serve_in_thread(RefConfig(ttft_s=0.005, interval_s=0.002)) as srv:
        cfg = BenchConfig(endpoint="chat", workload="prose", temperature=0.0,
                          chat_template_kwargs={"enable_thinking": False}, prompt_tokens=120, decode_tokens=8,
                          concurrency=(2,), prefill_tokens=(300,), repeats=1, warmup_requests=1)
        res = run_benchmark(srv.base_url, "ref-model", cfg, tmp_path)
        log = list(srv.log)
    assert log and all(e.endpoint == "/v1/chat/completions" for e in log)
    assert all(e.temperature == 0.0 and e.chat_template_kwargs == {"enable_thinking": False} for e in log)
    assert all(e.text_head.startswith("Continue the following text") for e in log)
    measured = [e for e in log if "-warmup-" not in e.nonce]
    assert {e.prompt_tokens for e in measured} == {120, 300}
    assert len({e.text_head for e in measured if e.prompt_tokens == 120}) >= 1
    rows = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert rows and all(r["prompt_tokens"] == r["target_prompt_tokens"] for r in rows)
    assert res.config["workload"] == "prose" and res.config["chat_template_kwargs"] == {"enable_thinking": False}
    assert res.cases and all(c.status != "FAIL" for c in res.cases), [c.failures for c in res.cases]
