"""Parallel layouts in the profile (issue 39 item 2): the PP key, validate's refusals (TP x PP against the nodes,
the model's shape, the engine) with their exact messages, and the launch's --pipeline-parallel-size."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from runbook.errors import ProfileError
from runbook.launch.render import NodeFacts, check_consistency, flag_value, render
from runbook.profile import REPO_ROOT, load_profile
from runbook.profile.layouts import (KNOWN_SHAPES, ModelShape, lab_config_path, layout_problems, model_shape,
                                     valid_tps)

ENV = REPO_ROOT / "env"
SHIPPED = sorted(ENV.glob("*.env"))
FACTS = {n: NodeFacts(home="/home/spark") for n in ("head", "worker", "worker2")}


def profile_copy(tmp_path: Path, name: str, config: dict | None = None, **changes: str) -> Path:
    """env/<name>.env copied to tmp_path/env/ with keys replaced in place; with ``config``, the lab Hub's copy of
    its model (tmp_path/.lab/hub/<repo>/<revision>/config.json) holds that config."""
    (tmp_path / "env").mkdir(parents=True, exist_ok=True)
    out, seen = [], set()
    for line in (ENV / f"{name}.env").read_text().splitlines():
        key = line.split("=", 1)[0] if "=" in line and not line.startswith("#") else None
        if key in changes:
            line = f"{key}={changes[key]}"
            seen.add(key)
        out.append(line)
    assert seen == set(changes), set(changes) - seen
    path = tmp_path / "env" / f"{name}.env"
    path.write_text("\n".join(out) + "\n")
    if config is not None:
        cfg = lab_config_path(load_profile(path, environ={}))
        cfg.parent.mkdir(parents=True)
        cfg.write_text(json.dumps(config))
    return path


def issues(path: Path, overrides=None) -> list:
    with pytest.raises(ProfileError) as ei:
        load_profile(path, overrides, environ={})
    return ei.value.issues


TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048}


# ----------------------------------------------------------------------------- the key and the shipped profiles

def test_every_shipped_profile_validates_with_one_pp_line_and_its_comment():
    assert len(SHIPPED) >= 5
    for path in SHIPPED:
        p = load_profile(path, environ={})
        lines = path.read_text().splitlines()
        at = [i for i, ln in enumerate(lines) if ln.startswith("PP=")]
        assert len(at) == 1 and lines[at[0] - 1].startswith("# Pipeline parallel size"), path
        assert p.pp == (2 if path.name == "lab-tp2pp2.env" else 1), path      # the one pipeline profile
        assert p.tp * p.pp == p.nnodes


def test_tp1_pp2_on_two_nodes_is_a_layout():
    p = load_profile(ENV / "lab.env", {"TP": "1", "PP": "2", "ENFORCE_EAGER": "0"}, environ={})
    assert (p.tp, p.pp, p.nnodes) == (1, 2, 2)


def test_product_not_nodes_is_refused_at_nnodes_with_the_fix(tmp_path):
    (iss,) = issues(profile_copy(tmp_path, "lab", TP="2", PP="2", ENFORCE_EAGER="0"))
    assert iss.key == "NNODES"
    assert iss.message == ("TP=2 x PP=2 = 4 but NNODES=2: each Spark has one GPU (the lab one CPU rank per node), "
                           "so TP x PP = nodes x 1")
    assert iss.fix == "set TP=2 and PP=1, or TP x PP = 2 (e.g. TP=2 PP=2 on four nodes)"


def test_tp_alone_not_nodes_keeps_its_message(tmp_path):
    (iss,) = issues(profile_copy(tmp_path, "lab", TP="1"))
    assert iss.key == "NNODES" and iss.message.startswith("TP=1 but NNODES=2: each Spark has one GPU")


def test_pp_range_is_the_types(tmp_path):
    (iss,) = issues(profile_copy(tmp_path, "lab", PP="0"))
    assert iss.key == "PP" and "out of range" in iss.message


def test_extra_args_pipeline_flag_names_the_pp_key(tmp_path):
    (iss,) = issues(profile_copy(tmp_path, "lab", EXTRA_ARGS="--pipeline-parallel-size 2"))
    assert iss.key == "EXTRA_ARGS" and "set PP=2" in iss.message + iss.fix, str(iss)


# ----------------------------------------------------------------------------- the engine

def test_pp_with_dspark_is_refused_citing_the_vllm_issue(tmp_path):
    (iss,) = issues(profile_copy(tmp_path, "dspark-v4", TP="1", PP="2"))
    assert iss.key == "PP"
    assert iss.message == (
        "PP=2 with SPEC_METHOD=dspark: vLLM cannot run pipeline parallel together with DSpark/MTP speculative "
        "decoding (vllm-project/vllm#52761 (open): \"Pipeline parallelism is not supported for this model\" once the "
        "DSpark draft inherits the PP size; also 1CatAI/1Cat-vLLM#516: speculative decoding under PP \"is not usable "
        "end to end on main\" (four-sparks.md §0.4))")
    assert iss.fix == "set PP=1 and TP=2 (every published four-Spark line is TP4), or SPEC_METHOD=none"
    load_profile(profile_copy(tmp_path, "dspark-v4", TP="1", PP="2", SPEC_METHOD="none", SPEC_TOKENS="0"), environ={})


def test_lab_pp_in_eager_mode_is_refused(tmp_path):
    (iss,) = issues(profile_copy(tmp_path, "lab", TP="1", PP="2"))
    assert iss.key == "ENFORCE_EAGER"
    assert iss.message == (
        "PP=2 with ENFORCE_EAGER=1 on the lab's CPU vLLM: the engine boots, then dies on the first request (a later "
        "stage never allocates its receive buffer: the CPU runner skips the warm-up in eager mode; "
        "vllm/v1/worker/cpu_model_runner.py:84-86, docs/four-nodes.md)")
    assert iss.fix.startswith("set ENFORCE_EAGER=0")


# ----------------------------------------------------------------------------- the model (lab: its config.json)

@pytest.mark.parametrize("change, tp, pp, message", [
    ({"num_attention_heads": 3, "num_key_value_heads": 1}, 2, 1,
     "num_attention_heads 3 is not divisible by TP=2 (vLLM: \"Total number of attention heads (3) must be divisible "
     "by tensor parallel size (2)\")"),
    ({"num_attention_heads": 6, "num_key_value_heads": 3}, 2, 1,
     "num_key_value_heads 3 is not divisible by TP=2 (vLLM splits KV heads when there are at least TP of them)"),
    ({"intermediate_size": 513}, 2, 1, "intermediate_size 513 is not divisible by TP=2 (column-parallel MLP)"),
    ({"num_hidden_layers": 1}, 1, 2, "num_hidden_layers 1 < PP=2: a pipeline stage would hold no layer"),
])
def test_lab_model_that_cannot_split_is_refused_from_its_config(tmp_path, change, tp, pp, message):
    path = profile_copy(tmp_path, "lab", {**TINY, **change}, TP=str(tp), PP=str(pp), ENFORCE_EAGER="0")
    (iss,) = issues(path)
    key = "PP" if "PP=" in message.split(":")[0] else "TP"
    cfg = tmp_path / ".lab/hub/spark-runbook/tiny" / load_profile(ENV / "lab.env", environ={}).hf_revision
    assert iss.key == key
    assert iss.message == (f"spark-runbook/tiny cannot run at TP={tp} x PP={pp}: {message} "
                           f"[shape: {cfg / 'config.json'}]")


def test_lab_single_kv_head_is_replicated_not_refused(tmp_path):
    p = load_profile(profile_copy(tmp_path, "lab", {**TINY, "num_key_value_heads": 1}), environ={})
    assert model_shape(p).kv_heads == 1 and p.tp == 2


def test_lab_vocab_at_tp3_is_refused_and_the_fix_names_the_tps_that_split(tmp_path):
    path = profile_copy(tmp_path, "lab-tp3", {**TINY, "num_attention_heads": 6, "num_key_value_heads": 3,
                                              "intermediate_size": 768})
    (iss,) = issues(path)
    assert iss.key == "TP" and ("vocab_size 2048 (padded to 2048, a multiple of 64) is not divisible by TP=3 "
                                "(VocabParallelEmbedding)") in iss.message
    assert iss.fix == "use a TP the model splits into (1 on 3 node(s), with PP = 3 / TP)"


def test_lab_experts_under_expert_parallel(tmp_path):
    moe = {**TINY, "n_routed_experts": 1, "num_experts_per_tok": 1, "moe_intermediate_size": 64}
    (iss,) = issues(profile_copy(tmp_path, "lab", moe, EXTRA_ARGS="--enable-expert-parallel"))
    assert iss.key == "TP" and ("1 routed experts over an expert-parallel group of TP=2 ranks: a rank would hold no "
                                "expert") in iss.message
    load_profile(profile_copy(tmp_path / "b", "lab", moe), environ={})      # TP-sharded experts: fine


def test_lab_without_the_model_checks_only_the_product(tmp_path):
    p = load_profile(profile_copy(tmp_path, "lab"), environ={})
    assert model_shape(p) is None


def test_lab_config_path_is_the_lab_hubs_layout():
    from runbook.lab import control
    p = load_profile(ENV / "lab.env", environ={})
    assert lab_config_path(p) == control.HUB_ROOT / "spark-runbook" / "tiny" / p.hf_revision / "config.json"


# ----------------------------------------------------------------------------- the recipes' shapes

def test_v41_at_tp3_cannot_split_but_tp4_and_tp2xpp2_can():
    v41 = KNOWN_SHAPES["Mia-AiLab/DeepSeek-V4.1-Flash-EXL3-2.9bpw"]
    assert [x.message for x in layout_problems(v41, 3)] == [
        "num_attention_heads 64 is not divisible by TP=3 (vLLM: \"Total number of attention heads (64) must be "
        "divisible by tensor parallel size (3)\")",
        "o_groups 8 (the grouped output projection) is not divisible by TP=3, and this recipe does not pad them",
        "vocab_size 129280 (padded to 129280, a multiple of 64) is not divisible by TP=3 (VocabParallelEmbedding)"]
    assert layout_problems(v41, 4) == layout_problems(v41, 2, 2) == layout_problems(v41, 8) == []
    assert valid_tps(v41) == [1, 2, 4, 8]
    assert [x.message for x in layout_problems(v41, 4, 41)] == [
        "num_hidden_layers 40 < PP=41: a pipeline stage would hold no layer"]


def test_v4_padded_by_its_recipe_at_tp3():
    v4 = KNOWN_SHAPES["deepseek-ai/DeepSeek-V4-Flash-Vision-Exp"]
    assert layout_problems(v4, 3) and layout_problems(v4, 3, pads=True) == []
    assert load_profile(ENV / "tp3-dspark.env", environ={}).tp == 3      # the shipped TP=3 lane still validates


def test_v4_table_matches_the_rooflines_config():
    from runbook.fit.roofline import V4_FLASH_CONFIG
    shape = ModelShape.from_config(V4_FLASH_CONFIG, "roofline")
    assert dataclasses.replace(shape, source="") == dataclasses.replace(
        KNOWN_SHAPES["deepseek-ai/DeepSeek-V4-Flash"], source="")


@pytest.mark.parametrize("module", ["tinymodel", "tinymodel_tp3", "tinymodel_tp4"])
def test_tiny_models_agree_with_the_labs_own_rule(module):
    import importlib
    from runbook.lab.tinymodel_tp3 import shardable
    mod = importlib.import_module(f"runbook.lab.{module}")
    dims = {"tinymodel": "TEXT_DIMS", "tinymodel_tp3": "TP3_TEXT_DIMS", "tinymodel_tp4": "TP4_TEXT_DIMS"}[module]
    vocab = {"tinymodel": "VOCAB_SIZE", "tinymodel_tp3": "TP3_VOCAB_SIZE", "tinymodel_tp4": "TP4_VOCAB_SIZE"}[module]
    d, v = getattr(mod, dims), getattr(mod, vocab)
    shape = ModelShape.from_config({**d, "vocab_size": v}, module)
    for tp in range(1, 9):
        assert bool(layout_problems(shape, tp)) == bool(shardable(d, v, tp)), (module, tp)


# ----------------------------------------------------------------------------- the launch

def test_launch_passes_pipeline_parallel_size_to_every_rank_only_when_above_one():
    plan = render(load_profile(ENV / "lab.env", {"TP": "1", "PP": "2", "ENFORCE_EAGER": "0"}, environ={}), FACTS)
    assert plan.ranks and all(flag_value(r.serve_argv, "--pipeline-parallel-size") == "2" for r in plan.ranks)
    assert all(flag_value(r.serve_argv, "--tensor-parallel-size") == "1" for r in plan.ranks)
    plain = render(load_profile(ENV / "lab.env", environ={}), FACTS)
    assert plain.ranks and all("--pipeline-parallel-size" not in r.serve_argv for r in plain.ranks)
    dspark = render(load_profile(ENV / "dspark-v4.env", {"TP": "1", "PP": "2", "SPEC_METHOD": "none",
                                                         "SPEC_TOKENS": "0"}, environ={}), FACTS)
    assert all(flag_value(r.serve_argv, "--pipeline-parallel-size") == "2" for r in dspark.ranks)


def test_consistency_check_covers_the_pipeline_size():
    plan = render(load_profile(ENV / "lab.env", {"TP": "1", "PP": "2", "ENFORCE_EAGER": "0"}, environ={}), FACTS)
    argv = plan.workers[0].serve_argv
    argv[argv.index("--pipeline-parallel-size") + 1] = "1"
    assert any("--pipeline-parallel-size" in x for x in check_consistency(plan))


def test_kv_heads_that_tp_is_no_multiple_of():
    shape = ModelShape(heads=6, kv_heads=2, layers=2, vocab=1920)
    assert [x.message for x in layout_problems(shape, 3)] == [
        "TP=3 is not a multiple of num_key_value_heads 2 (vLLM replicates KV heads when TP exceeds them: "
        "num_kv_head_replicas = TP / 2 must be whole)"]
    assert layout_problems(ModelShape(heads=8, kv_heads=1, layers=2, vocab=2048), 8) == []   # one KV head: copied
