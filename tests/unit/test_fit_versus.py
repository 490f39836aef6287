"""``plan`` beside the same recipe on fewer nodes (issue 39 item 7): per-rank weights shrink, the KV pool and
the context it holds grow, each figure equal to what the fit model's own functions give for either profile."""
from __future__ import annotations

import argparse
import json

import pytest

from runbook.fit import budget, cli, facts as ff
from runbook.fit.figures import GB10_MEM_TOTAL, GIB
from runbook.fit.render import versus_text
from support.profiles import profile_from


def _model(p):
    """weights, KV pool and KV tokens per rank of ``p`` straight from the fit model."""
    w = budget.weights_per_rank(p, budget.checkpoint_size(p)).per_rank
    kv = budget.kv_pool(p, GB10_MEM_TOTAL, w)
    return w.value, kv.pool.value, int(kv.pool.value // budget.kv_bytes_per_token(p).value)


def test_three_nodes_against_the_two_node_recipe():
    three, two = profile_from("env/tp3-dspark.env"), profile_from("env/dspark-v4.env")
    v = budget.versus(three, two, GB10_MEM_TOTAL)
    (w2, kv2, t2), (w3, kv3, t3) = _model(two), _model(three)
    assert v.base == "env/dspark-v4.env" and v.nodes == (2, 3) and v.same_checkpoint
    assert v.weights_per_rank == (pytest.approx(w2), pytest.approx(w3)) and w3 < w2
    assert v.kv_pool == (pytest.approx(kv2), pytest.approx(kv3)) and v.kv_mode == ("util", "util")
    # the same GPU_MEM_UTIL budget: every GiB of weights a rank sheds is a GiB more KV
    assert kv3 - kv2 == pytest.approx(w2 - w3)
    assert v.kv_tokens == (t2, t3) and t3 > t2
    assert v.full_requests == (pytest.approx(t2 / two.max_model_len), pytest.approx(t3 / three.max_model_len))
    text = versus_text(v)
    assert text.startswith("3 nodes against the 2-node recipe (env/dspark-v4.env), per rank:")
    assert f"{w2 / GIB:,.2f} -> {w3 / GIB:,.2f} ({(w3 - w2) / GIB:+,.2f}, x{w3 / w2:.2f})" in text
    assert f"{t2:,} -> {t3:,}" in text


def test_a_pinned_pool_against_one_sized_by_gpu_mem_util():
    """The two-node recipe A pins 2.5 GiB; the same recipe with the pool left to GPU_MEM_UTIL (as the four-Spark
    recipe does) gets util x total - weights - runtime."""
    a = profile_from("env/exl3-v41.env")
    util = profile_from("env/exl3-v41.env", KV_CACHE_MEMORY_BYTES=0, GPU_MEM_UTIL=0.80)
    v = budget.versus(util, a, GB10_MEM_TOTAL)
    assert v.kv_mode == ("pinned", "util") and v.kv_pool[0] == a.kv_cache_memory_bytes
    w = v.weights_per_rank[1]
    runtime = budget.recipe_figures(util).runtime.value
    assert v.kv_pool[1] == pytest.approx(0.80 * GB10_MEM_TOTAL.value - w - runtime)


def _plan_cmd(capsys, *argv):
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def test_plan_prints_it_for_more_nodes_only(capsys):
    code, out = _plan_cmd(capsys, "--profile", "env/tp3-dspark.env")
    assert code == 0 and "3 nodes against the 2-node recipe (env/dspark-v4.env), per rank:" in out
    code, out = _plan_cmd(capsys, "--profile", "env/tp3-dspark.env", "--json")
    doc = json.loads(out)
    v = budget.versus(profile_from("env/tp3-dspark.env"), profile_from("env/dspark-v4.env"),
                      next(iter(ff.nominal_facts(profile_from("env/tp3-dspark.env")).values())).mem_total)
    assert doc["versus"] == json.loads(json.dumps(v.to_dict()))
    for same in ("env/exl3-v41.env", "env/dspark-v4.env"):      # the two-node recipes themselves
        code, out = _plan_cmd(capsys, "--profile", same)
        assert "nodes against the" not in out


def test_four_sparks_against_recipe_a():
    """The four-Spark profile (env/tp4-v41.env) against the two-node recipe it shares its engine and checkpoint
    with: a quarter of the checkpoint per rank instead of a half, and the pool GPU_MEM_UTIL leaves."""
    four, two = profile_from("env/tp4-v41.env"), profile_from("env/exl3-v41.env")
    assert (four.node_count, four.tp, two.node_count, two.tp) == (4, 4, 2, 2)
    v = budget.versus(four, two, GB10_MEM_TOTAL)
    assert v.base == "env/exl3-v41.env" and v.nodes == (2, 4) and v.same_checkpoint
    (w2, _, t2), (w4, kv4, t4) = _model(two), _model(four)
    assert v.weights_per_rank == (pytest.approx(w2), pytest.approx(w4))
    ckpt = budget.checkpoint_size(four).value
    assert w4 < w2 and w2 - w4 == pytest.approx(ckpt / 2 - ckpt / 4, rel=0.01)     # the replicated part stays
    assert v.kv_mode == ("pinned", "util") and v.kv_pool[1] == pytest.approx(kv4)
    assert v.kv_tokens == (t2, t4) and t4 > t2 and v.full_requests[1] > v.full_requests[0]
    assert "4 nodes against the 2-node recipe (env/exl3-v41.env), per rank:" in versus_text(v)
