"""The published four-Spark figures (issue 39 item 8): matched only by a run on four nodes, shown with their
conditions and their engine (SGLang is not our vLLM), in the results table, the anchors table and the roofline
panel; a two-node run never meets them and a four-node run never meets the two-node seeds."""
from __future__ import annotations

import pytest

from runbook.benchmark.report import anchors_table, load_published, results_table
from runbook.benchmark.result import BenchResult
from runbook.benchmark.roofline_panel import panel_rows
from runbook.fit import roofline as R


def _case(name, kind, c, p, d, figures, wl="", th=""):
    return {"name": name, "kind": kind, "concurrency": c, "prompt_tokens": p, "decode_tokens": d, "repeats": 3,
            "figures": {m: {"median": v, "min": v, "max": v, "n": 3} for m, v in figures.items()},
            "server": {"available": True, "counters": {}}, "workload": wl, "thinking": th}


def _result(nodes=None, cases=None):
    cfg = {"recipe": "exl3-v41", "endpoint": "chat", "workload": "prose",
           "chat_template_kwargs": {"enable_thinking": False}}
    if nodes is not None:
        cfg["nodes"] = nodes
    cases = cases or [_case("decode-c1-p256-d400", "decode", 1, 256, 400, {"decode_tok_s": 30.0}),
                      _case("prefill-p46810", "prefill", 1, 46810, 1, {"prefill_tok_s": 1500.0})]
    return BenchResult.from_dict({"schema_version": "runbook.bench/1", "run_id": "r", "base_url": "http://x",
                                  "model": "m", "config": cfg, "environment": {}, "cases": cases})


FOUR = [f for f in load_published()["figures"] if f.get("nodes") == 4]


def test_four_spark_figures_carry_engine_and_conditions():
    assert FOUR
    engines = {f["engine"] for f in FOUR}
    assert {"sglang", "vllm"} <= engines
    values = {(f["engine"], f["workload"], f["value"]) for f in FOUR}
    # the V4.1 four-Spark record (MiaAI, SGLang) and the vLLM recipe's boot 10 (tonyd2wild)
    assert ("sglang", "prose", 90.2) in values and ("vllm", "prose", 24.4) in values
    assert all(f["conditions"] and f["source"] and f["thinking"] in ("off", "on", "unknown") for f in FOUR)


def test_a_four_node_run_meets_the_four_spark_figures_only():
    df = results_table(_result(nodes=4))
    dec = df[(df.case == "decode-c1-p256-d400") & (df.metric == "decode_tok_s")]
    assert set(dec.published) == {90.2, 24.4}                  # prose, c=1, four nodes; no two-node seed
    sg = dec[dec.published == 90.2].iloc[0]
    assert "4 nodes" in sg.match and "engine sglang, not vLLM" in sg.match
    assert "engine sglang" in sg.published_conditions and "4 nodes" in sg.published_conditions
    assert "engine" not in dec[dec.published == 24.4].iloc[0].match      # vLLM: like for like
    pf = df[(df.case == "prefill-p46810") & (df.metric == "prefill_tok_s")]
    assert set(pf.published) == {1539.0}                       # tonyd2wild's 32K target, 46,810 tokens
    assert 31.6 in set(df[df.case == "(no matching case)"].published)      # the two-node seed: shown only


def test_a_two_node_run_never_meets_them():
    for nodes in (None, 2):                                   # a result from before the field counts as 2
        df = results_table(_result(nodes=nodes))
        dec = df[(df.case == "decode-c1-p256-d400") & (df.metric == "decode_tok_s")]
        assert 31.6 in set(dec.published) and not ({90.2, 24.4} & set(dec.published))
        assert 90.2 in set(df[df.case == "(no matching case)"].published)


def test_anchors_table_of_a_four_node_run():
    t = anchors_table(_result(nodes=4))
    hit = t[(t.published == 90.2)].iloc[0]
    assert hit.ours == 30 and hit.ratio == pytest.approx(30 / 90.2) and "engine sglang" in hit.conditions
    assert t[t.published == 31.6].iloc[0].match == "no matching case"


def test_roofline_panel_shows_the_published_figures_of_its_node_count():
    roof = R.Roofline(R.checkpoint_step_bytes("v4.1-exl3-2.9"), R.V41_FLASH_CONFIG, 4, 0, "", 5)
    cases = [_case("decode-prose-thinkoff-c1-p1024-d128", "class", 1, 1024, 128, {"decode_tok_s": 30.0},
                   "prose", "off")]
    four = panel_rows(_result(4, cases), roof, bandwidth=230e9, allreduce_s=56e-6, recipe="exl3-v41")
    two = panel_rows(_result(2, cases), roof, bandwidth=230e9, allreduce_s=28e-6, recipe="exl3-v41")
    assert "90.2 tok/s (independent, engine sglang" in four[0]["published"] and "24.4 tok/s" in four[0]["published"]
    assert "31.6" not in four[0]["published"]
    assert "31.6 tok/s" in two[0]["published"] and "90.2" not in two[0]["published"]
