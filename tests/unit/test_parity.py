"""The parity tables (docs/parity/<profile>.json + .md): every rendered env var, docker option, mount and serve flag
of the recipe profiles has a row, every *same* row holds on every rank, an *n/a* row does not render, and
the markdown is what the JSON and the render produce (issue #22 item 1)."""
from __future__ import annotations

import copy

import pytest

from runbook.launch import parity

TABLES = ["exl3-v41", "dspark-v4", "tp3-dspark", "tp4-v41"]


@pytest.mark.parametrize("name", TABLES)
def test_the_table_holds_for_the_render(name):
    table = parity.load_table(name)
    plan = parity.parity_plan(table)
    items = parity.rendered_items(plan)
    assert len(items) > 100 and len(table["rows"]) >= len(items)
    assert {k for k, _ in items} == set(parity.RENDERED_KINDS)
    assert parity.check_table(table, plan) == []


@pytest.mark.parametrize("name", TABLES)
def test_the_markdown_is_generated_from_the_table(name):
    table = parity.load_table(name)
    text = (parity.PARITY_DIR / f"{name}.md").read_text()
    assert text == parity.to_markdown(table, parity.parity_plan(table)), \
        "docs/parity is stale: python -m runbook.launch.parity"
    assert text.count("\n| ") == len(table["rows"]) + 1


@pytest.mark.parametrize("name", TABLES)
def test_every_row_that_differs_says_why(name):
    rows = parity.load_table(name)["rows"]
    assert rows
    for r in rows:
        assert r["verdict"] == "same" or len(r.get("why", "")) > 30, r


def test_the_check_catches_a_changed_value_a_missing_row_and_a_rendered_na():
    table = parity.load_table("dspark-v4")
    plan = parity.parity_plan(table)
    changed = copy.deepcopy(table)
    util = next(r for r in changed["rows"] if r["name"] == "--gpu-memory-utilization")
    util["recipe"] = "0.80"
    assert any("--gpu-memory-utilization on head" in p for p in parity.check_table(changed, plan))
    dropped = copy.deepcopy(table)
    dropped["rows"] = [r for r in dropped["rows"] if r["name"] != "VLLM_B12X_W4A16_FORCE_BLOCKS_MAX_M"]
    assert parity.check_table(dropped, plan) == [
        "env VLLM_B12X_W4A16_FORCE_BLOCKS_MAX_M: rendered ('16') but the table has no row"]
    na = copy.deepcopy(table)
    next(r for r in na["rows"] if r["name"] == "DSPARK_SKIP_HOTFIX").update(verdict="n/a", why="x" * 40)
    assert any("n/a in the table but rendered" in p for p in parity.check_table(na, plan))
    gid = copy.deepcopy(table)
    next(r for r in gid["rows"] if r["name"] == "NCCL_IB_GID_INDEX")["recipe"] = "3"
    assert any("NCCL_IB_GID_INDEX on worker" in p for p in parity.check_table(gid, plan))


def test_a_row_without_a_reason_is_refused(tmp_path):
    import json
    (tmp_path / "x.json").write_text(json.dumps({"name": "x", "title": "x", "profile": "env/lab.env", "rows": [
        {"kind": "env", "name": "A", "ref": "f", "recipe": "1", "verdict": "deviation"}]}))
    with pytest.raises(ValueError, match="says why"):
        parity.load_table("x", tmp_path)


# what the four-Spark recipe's RECIPE.md@458fadec sets (its flags table, lines 90-103, and the rank table 16-21):
# each has a row of its own in the four-Spark table, citing that file at that commit
FOUR_SPARK_SETS = [("serve", "--compilation-config"), ("serve", "--cudagraph-capture-sizes"),
                   ("env", "VLLM_USE_BREAKABLE_CUDAGRAPH"), ("serve", "--speculative-config"),
                   ("serve", "--gpu-memory-utilization"), ("serve", "--max-model-len"), ("serve", "--max-num-seqs"),
                   ("serve", "--max-num-batched-tokens"), ("serve", "--block-size"), ("serve", "--engram-config"),
                   ("env", "DSV41_ENGRAM_DISK"), ("serve", "--limit-mm-per-prompt"),
                   ("serve", "--mm-processor-cache-gb"), ("serve", "--tool-call-parser"),
                   ("serve", "--reasoning-parser"), ("serve", "--enable-auto-tool-choice"),
                   ("serve", "--default-chat-template-kwargs"), ("env", "MAX_JOBS"), ("env", "FLASHINFER_NVCC_THREADS"),
                   ("env", "VLLM_USE_FLASHINFER_SAMPLER"), ("env", "TILELANG_CACHE_DIR"), ("env", "TRITON_CACHE_DIR"),
                   ("env", "NCCL_NET"), ("env", "NCCL_IB_HCA"), ("env", "NCCL_IB_GID_INDEX"),
                   ("env", "NCCL_SOCKET_IFNAME"), ("serve", "--node-rank"), ("env", "VLLM_HOST_IP"),
                   ("serve", "--port"), ("serve", "--tensor-parallel-size")]


def test_the_four_spark_table_cites_its_recipe_and_names_the_engines_rows():
    import json
    own = json.loads((parity.PARITY_DIR / "tp4-v41.json").read_text())
    table = parity.load_table("tp4-v41")
    assert own["recipe"]["repo"] == "tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark"
    commit = own["recipe"]["commit"][:8]
    mine = {(r["kind"], r["name"]): r for r in own["rows"]}
    assert mine and FOUR_SPARK_SETS
    for key in FOUR_SPARK_SETS:
        assert key in mine, key
        assert "docs/RECIPE.md:" in mine[key]["ref"] and f"@{commit}" in mine[key]["ref"], mine[key]
    # every row of its own cites that recipe (RECIPE.md, its tools/launch.sh or README at a named commit)
    for r in own["rows"]:
        assert any(f in r["ref"] for f in ("docs/RECIPE.md:", "tools/launch.sh:", "launch/dsv41-tp4.sh@",
                                            "README.md@")), r
    # a row it keeps from the engine's table says whose it is
    kept = [r for r in table["rows"] if (r["kind"], r["name"]) not in mine]
    assert kept and all(r["ref"].startswith("recipe A (the engine): ") for r in kept)
    # the rank-dependent rows cover all four nodes
    plan = parity.parity_plan(table)
    assert [r.node for r in plan.ranks] == ["head", "worker", "worker2", "worker3"]
    assert mine[("serve", "--node-rank")]["recipe"] == {"head": "0", "worker": "1", "worker2": "2", "worker3": "3"}
