"""Pure pieces of runbook.bench: formulas on synthetic records, Prometheus deltas, spreads, report."""
from __future__ import annotations

import math

import pytest

from runbook.bench import metrics as M
from runbook.bench.client import RequestRecord, handle_event, finalize
from runbook.facts.prom import MetricsSnapshot, delta, parse_prometheus
from runbook.bench.report import anchors_table, load_published, plot_comparison, results_table
from runbook.bench.result import SCHEMA_VERSION, BenchResult, CaseResult


def synthetic(n: int, k: int, t_first: float, interval: float, t_sent: float = 0.0, rid: str = "r") -> RequestRecord:
    """A stream whose truth is known: chunk j (k tokens) at t_first + j*k*interval."""
    r = RequestRecord(id=rid, t_sent=t_sent, max_tokens=n)
    sent, j = 0, 0
    while sent < n:
        sent = min(n, sent + k)
        t = t_first + j * k * interval
        r.ev_t.append(t); r.ev_cum.append(sent)
        j += 1
    r.t_first_chunk = r.t_first_token = r.ev_t[0]
    r.first_chunk_tokens, r.completion_tokens, r.continuous_usage = min(k, n), n, True
    r.t_last_token = r.t_end = r.ev_t[-1]
    r.n_token_events = len(r.ev_t)
    return r


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_decode_rate_exact_for_any_chunk_size(k):
    r = synthetic(32 * k, k, 0.5, 0.01)
    assert M.decode_tok_s(r) == pytest.approx(100.0, rel=1e-9)
    assert M.ttft_s(r) == pytest.approx(0.5)
    if k > 1:
        assert M.chunk_decode_tok_s(r) < 100.0 / (k - 0.5)      # chunk counting is wrong


def test_aggregate_steady_window_phase_independent():
    # 4 streams, 4 tokens/chunk, different phases and start offsets; truth = 4 x 100 tok/s
    recs = [synthetic(200, 4, 0.3 + 0.0037 * i, 0.01, t_sent=0.001 * i, rid=str(i)) for i in range(4)]
    agg = M.aggregate_figures(recs)
    assert agg["aggregate_tok_s"] == pytest.approx(400.0, rel=1e-9)
    assert agg["aggregate_method"] == "steady-window"
    assert agg["aggregate_span_tok_s"] < 400.0            # span includes the start skew
    assert agg["steady_coverage"] > 0.9
    assert agg["release_skew_s"] == pytest.approx(0.003)
    # wall: sum n / (max end - min sent)
    assert agg["aggregate_wall_tok_s"] == pytest.approx(800 / (max(r.t_end for r in recs)))


def test_sse_parsing_usage_only_counts():
    r = RequestRecord(id="x", t_sent=0.0)
    evs = [
        (b'data: {"choices":[{"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":5,"completion_tokens":0}}', 0.1),
        (b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}],"usage":{"prompt_tokens":5,"completion_tokens":3}}', 0.2),
        (b': ping', 0.25),
        (b'data: {"choices":[{"delta":{"content":"a b c"},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":6}}', 0.3),
        (b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens":0}}}', 0.31),
    ]
    for ev, t in evs:
        assert not handle_event(r, ev, t)
    assert handle_event(r, b"data: [DONE]", 0.32)
    finalize(r)
    assert (M.ttfr_s(r), M.ttft_s(r)) == (0.1, 0.2)        # role chunk = first chunk, not first token
    assert r.first_chunk_tokens == 3 and r.completion_tokens == 6 and r.cached_tokens == 0
    assert r.t_last_token == 0.3                           # not the trailing usage-only chunk
    assert M.decode_tok_s(r) == pytest.approx(3 / 0.1)
    assert r.finish_reason == "length" and not r.error


def test_sse_error_payload_is_a_failure():
    r = RequestRecord(id="x")
    handle_event(r, b'data: {"error":{"message":"boom"}}', 0.1)
    assert "boom" in r.error


PROM_A = """# HELP x
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 1.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 2
vllm:spec_decode_num_drafts_total{engine="0"} 10
vllm:spec_decode_num_draft_tokens_total{engine="0"} 30
vllm:spec_decode_num_accepted_tokens_total{engine="0"} 15
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 8
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 5
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="2"} 2
vllm:prefix_cache_hits_total{engine="0"} 0
"""
PROM_B = PROM_A.replace(" 100.0", " 8292.0").replace("seconds_sum{engine=\"0\",model_name=\"m\"} 1.0",
                                                     "seconds_sum{engine=\"0\",model_name=\"m\"} 9.0") \
    .replace("drafts_total{engine=\"0\"} 10", "drafts_total{engine=\"0\"} 110") \
    .replace("draft_tokens_total{engine=\"0\"} 30", "draft_tokens_total{engine=\"0\"} 330") \
    .replace("accepted_tokens_total{engine=\"0\"} 15", "accepted_tokens_total{engine=\"0\"} 215") \
    .replace('position="0"} 8', 'position="0"} 98').replace('position="1"} 5', 'position="1"} 75') \
    .replace('position="2"} 2', 'position="2"} 32')


def test_prometheus_delta_and_spec_figures():
    assert parse_prometheus('a_total{x="1"} 2\na_total{x="2"} 3\n# c\nb 1e3')[("b", ())] == 1000.0
    a, b = MetricsSnapshot.from_text(0.0, PROM_A), MetricsSnapshot.from_text(1.0, PROM_B)
    d = delta(a, b)
    assert d["counters"]["vllm:prompt_tokens_total"] == 8192
    assert d["server_prefill_time_s"] == 8.0
    assert d["spec_acceptance_rate"] == pytest.approx(200 / 300)
    assert d["spec_mean_acceptance_length"] == pytest.approx(1 + 200 / 100)
    assert d["spec_per_position_rate"] == pytest.approx({"0": 0.9, "1": 0.7, "2": 0.3})
    assert d["prefix_cache_hit_tokens"] == 0
    assert M.server_prefill_tok_s(8192, d["server_prefill_time_s"]) == 1024
    assert delta(a, MetricsSnapshot(t=1, ok=False)) == {"available": False}


def test_spread():
    s = M.spread([3, 1, 2, None, 4])
    assert (s.median, s.min, s.max, s.n) == (2.5, 1, 4, 4)
    assert s.iqr == pytest.approx(1.5)
    assert M.spread([]) is None


PROSE_OFF = {"recipe": "exl3-v41", "endpoint": "chat", "workload": "prose",
             "chat_template_kwargs": {"enable_thinking": False}}


def _result(scale: float = 1.0, config: dict | None = None) -> BenchResult:
    def fig(v):
        return {"median": v, "min": v * 0.98, "max": v * 1.02, "q1": v * 0.99, "q3": v * 1.01, "iqr": v * 0.02, "n": 3}
    cases = [CaseResult("decode-c1-p256-d400", "decode", 1, 256, 400, 3,
                        figures={"decode_tok_s": fig(30 * scale), "aggregate_tok_s": fig(30 * scale),
                                 "aggregate_span_tok_s": fig(30 * scale), "ttft_s": fig(0.25)}),
             CaseResult("decode-c2-p256-d400", "decode", 2, 256, 400, 3,
                        figures={"decode_tok_s": fig(21 * scale), "aggregate_tok_s": fig(42 * scale),
                                 "aggregate_span_tok_s": fig(41 * scale), "ttft_s": fig(0.3)}),
             CaseResult("prefill-p32789", "prefill", 1, 32789, 1, 3,
                        figures={"prefill_tok_s": fig(1000 * scale), "server_prefill_tok_s": fig(1050 * scale),
                                 "ttft_s": fig(32.0)})]
    return BenchResult(SCHEMA_VERSION, "run1", "http://127.0.0.1:8000", "m", dict(config or PROSE_OFF), {}, cases)


@pytest.mark.slow
def test_published_figures_and_table(tmp_path):
    pub = load_published()
    a = {(f["recipe"], f["metric"], f["concurrency"], f["prompt_tokens"]): f["value"] for f in pub["figures"]
         if f["variant"] == "default" and f["decode_tokens"] in (None, 8, 128, 400) and f["kind"] == "seed"
         and f["workload"] in ("prose", "filler", "structured")}
    assert a[("exl3-v41", "decode_tok_s", 1, 256)] == 31.6
    assert a[("exl3-v41", "prefill_tok_s", 1, 32789)] == 1054.7
    assert a[("exl3-v41", "prefill_tok_s", 1, 262158)] == 872.6
    assert a[("dspark-v4", "decode_tok_s", 1, 256)] == 82.6
    assert a[("dspark-v4", "aggregate_tok_s", 6, 256)] in (162, 191.2)
    indep = [f for f in pub["figures"] if f["kind"] == "independent"]
    assert {f["value"] for f in indep if f["metric"] == "decode_tok_s" and f["concurrency"] == 1} >= {34.6, 37.6, 66.4, 36.0}
    assert all(f["workload"] in pub["workloads"] and f["thinking"] in ("off", "on", "unknown") and f["source"]
               for f in pub["figures"])
    prev = _result(0.5)
    prev.save(tmp_path / "prev" / "result.json")
    df = results_table(_result(), previous=tmp_path / "prev")
    rows = df[(df.case == "decode-c1-p256-d400") & (df.metric == "decode_tok_s")]
    # seed default and spec=none; the independent prose figures (one does not state thinking: flagged)
    assert set(rows.published) == {31.6, 23.0, 34.6, 40.6, 37.6, 36.0}, set(rows.published)
    row = rows[rows.published == 31.6].iloc[0]
    assert row.previous == 15 and row.change_pct == pytest.approx(100)
    assert row.ratio == pytest.approx(30 / 31.6) and row.published_kind == "seed" and row.workload == "prose"
    assert "does not state thinking" in rows[rows.published == 36.0].iloc[0].match
    assert 66.4 not in set(df[df.case != "(no matching case)"].published)    # structured: another class
    span = df[(df.case == "decode-c2-p256-d400") & (df.metric == "aggregate_span_tok_s")].iloc[0]
    assert span.published == 42.5                         # sparkDash aggregate = our span definition
    pf = df[(df.case == "prefill-p32789") & (df.metric == "prefill_tok_s")]
    assert set(pf.published) == {1054.7, 2013.0}           # the seed's and the independent 32k figure
    assert (df.case == "(no matching case)").any()         # 256k, other classes etc. listed, not dropped
    assert 117.3 in set(df[df.case == "(no matching case)"].published)     # 4 nodes: shown, never matched
    fig = plot_comparison(_result(), previous=prev, path=tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 10_000
    assert len(fig.axes) == 3
    assert any(t.get_text() == f"x{30 / 31.6:.2f}" for t in fig.axes[0].texts)    # the ratio beside the anchor
    assert not math.isnan(df["median"].dropna().iloc[0])


def test_other_classes_are_never_set_beside_prose():
    """A filler (random words) run is not compared with prose decode figures; prefill still is."""
    df = results_table(_result(config={"recipe": "exl3-v41"}))
    decode = df[df.case.str.startswith("decode") & df.published.notna()]
    assert decode.empty, decode[["case", "published", "published_conditions"]]
    assert 1054.7 in set(df[df.case == "prefill-p32789"].published)


def test_anchors_table_side_by_side_and_for_the_lab():
    t = anchors_table(_result())
    assert len(t) > 40 and set(t.kind) == {"seed", "independent"}
    hit = t[(t.published == 34.6) & (t.metric == "decode_tok_s")].iloc[0]
    assert hit.ours == 30 and hit.ratio == pytest.approx(30 / 34.6) and hit.ours_case == "decode-c1-p256-d400"
    miss = t[t.published == 66.4].iloc[0]
    assert miss.ours is None or math.isnan(miss.ours)
    assert miss.match == "no matching case"
    lab = anchors_table(_result(config={"recipe": "lab"}))
    assert len(lab) > 10 and set(lab.kind) == {"independent"} and lab.ratio.isna().all()
    assert set(lab.match) == {"lab: tiny CPU model, not comparable"}


def test_foreign_result_is_refused():
    with pytest.raises(ValueError):
        BenchResult.from_dict({"schema_version": "other"})
