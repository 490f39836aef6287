"""plan --layouts (issue 39 item 2): per-rank memory and the decode ceiling at TP x PP, on the roofline's own bytes
and constants: ring all-reduce cost over N ranks, pipeline hops without speed-up, the largest stage's memory."""
from __future__ import annotations

import json

import pytest

from runbook.cli import main
from runbook.errors import RunbookError
from runbook.fit import roofline as R
from runbook.fit.facts import nominal_facts
from runbook.fit.figures import GIB
from runbook.fit.layouts import (LINK_BW, Layout, layout_rows, parse_layouts, ring_allreduce_s, roofline_or_fallback,
                                 stage_layers)
from runbook.profile import REPO_ROOT, load_profile

ENV = REPO_ROOT / "env"
SPARK = {"best": (R.GB10_PEAK_BW.value, R.ALLREDUCE_FAST.value),
         "decode-shaped": (R.GB10_DECODE_BW.value, R.ALLREDUCE_SLOW.value)}


def rows(name: str, layouts: str):
    p = load_profile(ENV / f"{name}.env", environ={})
    return {r.layout.name: r for r in layout_rows(p, parse_layouts(layouts), roof=roofline_or_fallback(p, None),
                                                  facts=nominal_facts(p), checkpoint=None, ceilings=SPARK)}


def test_ring_allreduce_is_the_published_figure_at_two_ranks_and_grows_with_n():
    b, link = 10240, LINK_BW.value
    assert ring_allreduce_s(1, b, link, 28e-6) == 0.0
    assert ring_allreduce_s(2, b, link, 28e-6) == pytest.approx(28e-6)
    alpha = 28e-6 - b / link
    assert ring_allreduce_s(4, b, link, 28e-6) == pytest.approx(1.5 * b / link + 3 * alpha)
    assert ring_allreduce_s(8, b, link, 77e-6) > ring_allreduce_s(4, b, link, 77e-6) > 77e-6


def test_stages_split_like_vllm_get_pp_indices():
    # vllm/distributed/utils.py:153-158: the remainder goes to the stages before the last
    assert stage_layers(43, 2) == [22, 21] and stage_layers(40, 2) == [20, 20] and stage_layers(5, 4) == [1, 1, 2, 1]


def test_parse_layouts_and_its_error():
    assert parse_layouts("tp2, TP4,tp2xpp2,2x2") == [Layout(2), Layout(4), Layout(2, 2), Layout(2, 2)]
    with pytest.raises(RunbookError) as ei:
        parse_layouts("tp2,pp")
    assert "--layouts" in ei.value.what and "tp2xpp2" in ei.value.fix


def test_two_ranks_reproduce_the_rooflines_own_ceiling():
    p = load_profile(ENV / "dspark-v4.env", environ={})
    want = R.spark_ceilings(R.roofline_for(p))
    got = rows("dspark-v4", "tp2")["TP2"].ceilings
    assert got and {k: round(v["tok_s"], 6) for k, v in got.items()} == {k: round(c.tok_s, 6) for k, c in want.items()}


def test_v41_layouts_memory_and_ceiling():
    r = rows("exl3-v41", "tp2,tp3,tp4,tp2xpp2")
    assert r["TP3"].problems and r["TP3"].ceilings is None
    assert r["TP2"].weights == pytest.approx(99.5 * GIB)                   # WEIGHT_BUDGET_GIB, seed A's per-rank figure
    replicated = 99.5 * GIB - 196.2 * GIB / 2
    assert r["TP4"].weights == pytest.approx(196.2 * GIB / 4 + replicated)
    assert abs(r["TP2xPP2"].weights - r["TP4"].weights) < 1 * GIB
    # weights shrink, so the KV room grows; PP halves the KV per token per rank (one KV head: TP does not)
    assert r["TP4"].kv_room > r["TP2"].kv_room + 40 * GIB
    assert r["TP2xPP2"].kv_tokens > 1.9 * r["TP4"].kv_tokens
    for name in ("best", "decode-shaped"):
        tp2, pp2, tp4 = (r[k].ceilings[name] for k in ("TP2", "TP2xPP2", "TP4"))
        assert pp2["bytes_per_token_path"] == tp2["bytes_per_token_path"]   # a token reads every stage in turn
        assert pp2["tok_s"] < tp2["tok_s"] and pp2["allreduces"] == tp2["allreduces"] == 80
        assert tp4["read_ms"] == pytest.approx(tp2["read_ms"] / 2, rel=0.01)
    assert r["TP4"].ceilings["best"]["tok_s"] > r["TP2"].ceilings["best"]["tok_s"]


def test_plan_prints_the_layouts_table_and_json(capsys):
    assert main(["plan", "--profile", "env/exl3-v41.env", "--layouts", "tp2,tp3,tp4,tp2xpp2"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("parallel layouts of"):]
    assert "TP3      3      cannot split" in section and "layers per stage 20/20" in section
    assert "no speed at one stream" in section
    assert main(["plan", "--profile", "env/exl3-v41.env", "--layouts", "tp4,tp2xpp2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [x["layout"] for x in d["layouts"]] == ["TP4", "TP2xPP2"] and d["layouts"][1]["stage_layers"] == [20, 20]


def test_docs_fit_table_is_plans_output():
    """docs/fit.md's V4.1 layouts table is what `plan --layouts` prints today (regenerate it when this fails)."""
    doc = (REPO_ROOT / "docs" / "fit.md").read_text()
    r = rows("exl3-v41", "tp2,tp4,tp2xpp2")
    table = {"TP2 (2 nodes)": r["TP2"], "TP4": r["TP4"], "TP2 x PP2": r["TP2xPP2"]}
    for label, row in table.items():
        c = row.ceilings
        line = (f"| {label} | {row.layout.ranks} | {row.weights / GIB:.1f} | {row.kv_room / GIB:.1f} | "
                f"{row.kv_tokens:,} | {c['best']['allreduce_us']:.0f} / {c['decode-shaped']['allreduce_us']:.0f} | "
                f"{c['best']['step_ms']:.2f} / {c['decode-shaped']['step_ms']:.2f} | "
                f"{c['best']['tok_s']:.1f} / {c['decode-shaped']['tok_s']:.1f} |")
        assert line in doc, line


def test_fit_weights_per_rank_split_over_every_rank_of_the_layout():
    from runbook.fit.budget import checkpoint_size, weights_per_rank
    p = load_profile(ENV / "exl3-v41.env", {"TP": "1", "PP": "2", "SPEC_METHOD": "none", "SPEC_TOKENS": "0",
                                            "WEIGHT_BUDGET_GIB": "0"}, environ={})
    w = weights_per_rank(p, checkpoint_size(p)).per_rank
    assert w.value == pytest.approx(196.2 * GIB / 2) and "/ TP=1 x PP=2" in w.note
