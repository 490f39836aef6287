"""The workload-class panel against the reference server: each class x thinking is its own case with
its own figures (never averaged), the requests carry the class's text, template kwargs and tools,
spec acceptance comes from that case's /metrics deltas, and thinking on shows its reasoning tax."""
from __future__ import annotations

import asyncio
import json

import pytest

from runbook.benchmark.client import RequestRecord, handle_event, stream_request, make_stream_client, build_payload
from runbook.api.prompts import CLASSES, build_exact_prompt, corpus
from runbook.benchmark.refserver import RefConfig, serve_in_thread
from runbook.benchmark.report import anchors_table, class_table, plot_comparison, results_table
from runbook.benchmark.result import BenchConfig
from runbook.benchmark.runner import run_benchmark
from runbook.errors import BenchError

# some cases time the reference server's answers: on the lab's xdist worker in `make test`, never niced
pytestmark = pytest.mark.timed

INTERVAL, THINK = 0.004, 6


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    out = tmp_path_factory.mktemp("classes")
    with serve_in_thread(RefConfig(ttft_s=0.01, interval_s=INTERVAL, tokens_per_chunk=2, spec_tokens=3,
                                   thinking_tokens=THINK)) as srv:
        cfg = BenchConfig(endpoint="chat", workload="prose", chat_template_kwargs={"thinking": False},
                          thinking_key="thinking", prompt_tokens=80, decode_tokens=16, concurrency=(1,),
                          prefill_tokens=(), repeats=2, warmup_requests=1, classes=CLASSES,
                          class_thinking=("off", "on"), recipe="dspark-v4")
        res = run_benchmark(srv.base_url, "ref-model", cfg, out)
        log = list(srv.log)
    return res, log, out


def test_each_class_and_thinking_is_its_own_case(panel):
    res, log, _ = panel
    cases = [c for c in res.cases if c.kind == "class"]
    assert len(cases) == 2 * len(CLASSES) == 8
    assert {(c.workload, c.thinking) for c in cases} == {(w, t) for w in CLASSES for t in ("off", "on")}
    for c in cases:
        assert c.status != "FAIL", (c.name, c.failures)
        assert c.name.startswith(f"decode-{c.workload}-think{c.thinking}-c1-")
        # 16-token cases on a loaded 2-core box: one late chunk moves the rate ~8 %; the rate's fidelity is
        # test_bench_fidelity's, this panel checks each class is measured as its own case
        assert c.median("decode_tok_s") == pytest.approx(1 / INTERVAL, rel=0.15), c.name
        assert c.figures["spec_acceptance_rate"]["median"] == pytest.approx(1 / 3)    # (k-1)/spec_tokens
        assert c.server["available"] and c.server["counters"]["vllm:spec_decode_num_drafts_total"] > 0
    assert [c.kind for c in res.cases].count("decode") == 1          # the run's own decode case stays apart


def test_requests_carry_the_class_text_kwargs_and_tools(panel):
    res, log, _ = panel
    by_case = {}
    for e in log:
        if "-decode-" in e.nonce and "-think" in e.nonce:
            by_case.setdefault(e.nonce.split("-decode-")[1].split("-c1-")[0], []).append(e)
    assert set(by_case) == {f"{w}-think{t}" for w in CLASSES for t in ("off", "on")}
    heads = {"prose": "Continue the following text", "code": "Continue this Python module",
             "structured": "Convert every record below", "tool": corpus()["tool"]["result_header"][:30]}
    for key, entries in by_case.items():
        wl, th = key.split("-think")
        assert all(e.endpoint == "/v1/chat/completions" for e in entries)
        assert all(e.chat_template_kwargs == {"thinking": th == "on"} for e in entries), entries[0].chat_template_kwargs
        assert all(e.text_head.startswith(heads[wl]) for e in entries), (wl, entries[0].text_head)
        assert all(e.prompt_tokens == 80 for e in entries)              # exact under that template


def test_reasoning_tax_and_panel_table(panel):
    res, _, out = panel
    t = class_table(res)
    assert len(t) == 8 and set(t["class"]) == set(CLASSES)
    for wl in CLASSES:
        off = t[(t["class"] == wl) & (t.thinking == "off")].iloc[0]
        on = t[(t["class"] == wl) & (t.thinking == "on")].iloc[0]
        assert off.ttfa_s == pytest.approx(off.ttft_s, abs=0.002)      # no reasoning: the answer is the first token
        # THINK reasoning tokens at 2 per chunk come first: 3 chunk intervals later
        assert on.reasoning_tax_s == pytest.approx(3 * 2 * INTERVAL, abs=0.006), (wl, on.reasoning_tax_s)
    assert (out / "requests.jsonl").exists()


def test_class_cases_meet_their_own_published_class(panel):
    res, _, _ = panel
    df = results_table(res)
    rows = df[df.case.str.startswith("decode-code-thinkoff") & (df.metric == "decode_tok_s")]
    assert 76.0 in set(rows.published)                                  # seed B's code figure, not prose's
    assert 37.3 not in set(rows.published)
    prose = df[df.case.str.startswith("decode-prose-thinkoff") & (df.metric == "decode_tok_s")]
    assert {37.3, 34.6} <= set(prose.published)
    assert anchors_table(res).ratio.notna().any()
    fig = plot_comparison(res)
    assert len(fig.axes) == 4 and "workload class" in fig.axes[3].get_title()
    assert len(fig.axes[3].patches) == 8


def test_time_to_first_answer_from_streamed_events():
    """Reasoning first, then content; a tool call counts as the answer; the fast path sees it too."""
    r = RequestRecord(id="x", t_sent=0.0)
    evs = [(b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}],"usage":{"completion_tokens":2}}', 0.1),
           (b'data: {"choices":[{"delta":{"reasoning_content":"so"}}],"usage":{"completion_tokens":4}}', 0.2),
           (b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}],'
            b'"usage":{"completion_tokens":6}}', 0.3)]
    for ev, t in evs:
        handle_event(r, ev, t)
    assert r.t_first_token == 0.1 and r.t_first_content == 0.3
    r2 = RequestRecord(id="y", t_sent=0.0)
    for ev, t in [(b'data: {"choices":[{"delta":{"content":"A"}}],"usage":{"completion_tokens":1}}', 0.1)]:
        handle_event(r2, ev, t)
    assert r2.t_first_content == 0.1


def test_bad_panel_entries_are_refused():
    with pytest.raises(BenchError, match="unknown class panel entry"):
        run_benchmark("http://127.0.0.1:9", "m", BenchConfig(classes=("poetry",)))
    with pytest.raises(BenchError, match="unknown class panel entry"):
        run_benchmark("http://127.0.0.1:9", "m", BenchConfig(classes=("code",), class_thinking=("maybe",)))
    with pytest.raises(BenchError, match="tool workload needs the chat endpoint"):
        build_exact_prompt(lambda p: len(p.split()), 50, "n", endpoint="completions", workload="tool")


def test_tool_turn_is_a_real_tools_api_request():
    """The tool class sends the tools and a prior call/result turn; the server accepts it."""
    with serve_in_thread(RefConfig(ttft_s=0.005, interval_s=0.002)) as srv:
        b = build_exact_prompt(lambda p: sum(len((m.get("content") or "").split()) + 2 for m in p) + 2, 60,
                               "n-tool", workload="tool")
        roles = [m["role"] for m in b.prompt]
        assert roles == ["system", "user", "assistant", "tool"]
        assert json.loads(b.prompt[2]["tool_calls"][0]["function"]["arguments"])["query"]
        assert b.prompt[3]["content"].startswith(corpus()["tool"]["result_header"] + "doc-001: ")

        async def go():
            http = make_stream_client(srv.base_url)
            r = RequestRecord(id="t")
            body = build_payload("chat", "ref-model", b.prompt, 4,
                                 extra={"tools": corpus()["tool"]["tools"], "tool_choice": "auto"})
            await stream_request(http, "chat", body, r, timeout_s=10)
            await http.close()
            return r
        r = asyncio.run(go())
    assert r.ok and r.completion_tokens == 4, r.error
