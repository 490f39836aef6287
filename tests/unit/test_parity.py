"""The parity tables (docs/parity/<profile>.json + .md): every rendered env var, docker option, mount and serve flag
of the three recipe profiles has a row, every *same* row holds on every rank, an *n/a* row does not render, and
the markdown is what the JSON and the render produce (issue #22 item 1)."""
from __future__ import annotations

import copy

import pytest

from runbook.launch import parity

TABLES = ["exl3-v41", "dspark-v4", "tp3-dspark"]


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
