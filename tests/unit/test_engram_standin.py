"""The lab recipe's stand-in for recipe A's file-backed Engram (runbook/lab/recipe/overlay/engram_standin.py),
run as start.sh runs it (``python3 -I``, the rank's vLLM argv) on files step 03's packer really wrote: the same
boot-log lines as recipe A, which step 04's ``engram attached`` row reads."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from runbook.checks import Status
from runbook.engram_tools import layout as L
from runbook.engram_tools import synth
from runbook.engram_tools.ship import TOOL_FILES
from runbook.facts import engram_log
from runbook.launch import engram_attach
from runbook.launch.checkout import LAB_SOURCE
from runbook.launch.render import NodeFacts, render
from runbook.profile import REPO_ROOT, load_profile
from support.engram import ENGRAM_DIR, config, run_tool

STANDIN = LAB_SOURCE / "overlay" / "engram_standin.py"
VOCAB = 2000


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, Path]:
    """A synthetic V4.1-style source and both TP=2 ranks packed by the shipped packer."""
    root = tmp_path_factory.mktemp("standin")
    src, out, tools = root / "src", root / "packed", root / "tools"
    synth.make_source(str(src), vocab_size=VOCAB)
    tools.mkdir()
    for name in TOOL_FILES:
        shutil.copy(ENGRAM_DIR / name, tools / name)
    for rank in (0, 1):
        _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", rank)
        assert summary["ok"]
    return src, out


def _run(src: Path, packed_dir: Path | None, node_rank: int, tp: int = 2, nnodes: int = 2, pp: int = 1):
    env = {"PATH": os.environ.get("PATH", ""), "DSV41_SOURCE": str(src)}
    if packed_dir is not None:
        env["DSV41_PACKED_DIR"] = str(packed_dir)
    argv = ["vllm", "serve", "/m", "--tensor-parallel-size", str(tp), "--nnodes", str(nnodes),
            "--node-rank", str(node_rank)] + (["--pipeline-parallel-size", str(pp)] if pp > 1 else [])
    return subprocess.run([sys.executable, "-I", str(STANDIN), *argv], env=env, capture_output=True, text=True,
                          timeout=60)


def test_both_ranks_attach_what_the_packer_wrote_with_the_packers_row_ranges(packed):
    src, out = packed
    lay = L.EngramLayout.from_config(config(src), 2)
    for rank in (0, 1):
        res = _run(src, out, rank)
        assert res.returncode == 0, res.stderr
        rep = engram_log.parse_engram_log(res.stdout + res.stderr)
        assert sorted(rep.layers) == [(1, rank), (14, rank)] and not rep.ignored
        for layer in (1, 14):
            a, rr = rep.layers[(layer, rank)], lay.rank_ranges(layer)[rank]
            assert (a.lo, a.hi, a.tp, a.packed) == (rr.lo, rr.hi, 2, True)


def test_its_layout_is_the_packers_for_tp3():
    """An independent layout (as recipe A's reader has its own): equal to layout.py's for another TP split."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("engram_standin", STANDIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = synth.engram_text_config(VOCAB)
    lay = L.EngramLayout.from_params(layer_ids=cfg["engram_layer_ids"], vocab_size=VOCAB, n_heads=8,
                                     max_ngram_size=4, tp=3)
    assert [list(c) for c in lay.columns] == mod.head_sizes(cfg)
    assert [sum(c) for c in mod.head_sizes(cfg)] == cfg["engram_num_embeddings"]


def test_a_mismatched_header_prints_the_fallback_line_and_fails_the_row(packed, tmp_path):
    src, out = packed
    bad = tmp_path / "packed"
    shutil.copytree(out, bad)
    path = bad / L.packed_name(14, 1, 2)
    with open(path, "r+b") as f:            # the header version the issue text names: the literal b"DSV41EN1"
        f.write(b"DSV41EN1")
    res = _run(src, bad, 1)
    assert res.returncode == 0, res.stderr
    assert f"Engram: packed shard {path} does not match this rank (layer=14 " in res.stderr
    assert "ignoring, using checkpoint" in res.stderr
    rep = engram_log.parse_engram_log(res.stdout + res.stderr)
    assert rep.layers[(14, 1)].packed is False and rep.layers[(1, 1)].packed is True

    profile = load_profile(REPO_ROOT / "env" / "lab.env")
    plan = render(profile, {n: NodeFacts(home="/root", packed_engram=True) for n in ("head", "worker")})
    head = _run(src, out, 0)
    rows = {c.node: c for c in engram_attach.attach_checks(profile, plan, {"head": head.stdout + head.stderr,
                                                                           "worker": res.stdout + res.stderr})}
    assert rows["head"].status is Status.PASS
    assert rows["worker"].status is Status.FAIL and "engram-l14-r1of2.bin" in rows["worker"].fix


def test_no_packed_dir_is_packed_false_and_a_truncated_file_aborts(packed, tmp_path):
    src, out = packed
    res = _run(src, None, 0)
    assert res.returncode == 0
    rep = engram_log.parse_engram_log(res.stdout)
    assert rep.layers and not any(a.packed for a in rep.layers.values())
    short = tmp_path / "short"
    shutil.copytree(out, short)
    path = short / L.packed_name(1, 0, 2)
    os.truncate(path, os.path.getsize(path) - 264)
    res = _run(src, short, 0)
    assert res.returncode == 134 and "Engram retrieval failed: packed Engram shard is truncated" in res.stderr
    os.truncate(path, 100)
    res = _run(src, short, 0)
    assert res.returncode == 134 and engram_log.parse_engram_log(res.stderr).aborts == [
        "packed Engram shard has no header"]


def test_no_source_says_so_and_attaches_nothing(tmp_path):
    res = _run(tmp_path / "nothing", None, 0)
    assert res.returncode == 0 and "no Engram source at DSV41_SOURCE" in res.stdout
    assert not engram_log.parse_engram_log(res.stdout).said_anything


def test_header_fields_are_the_readers():
    """The stand-in compares exactly layout.py's header (MAGIC little-endian, then layer, lo, hi, rows, 264)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("engram_standin", STANDIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (mod.MAGIC, mod.HEADER, mod.ROW_BYTES) == (L.MAGIC, L.HEADER_BYTES, 264)
    assert struct.unpack_from("<6Q", L.pack_header(1, 0, 5, 9, 264)) == (mod.MAGIC, 1, 0, 5, 9, 264)


def test_tp2_pp2_stage_one_nodes_attach_their_stage_zero_twins_shards(packed):
    """TP2 x PP2 on four nodes (env/lab-tp2pp2.env): node ranks 2 and 3 are TP ranks 0 and 1 of stage 1 (vLLM
    numbers TP innermost), so they attach r0of2 and r1of2 -- the files the packer wrote for stage 0 -- and step
    04's row passes on every node."""
    src, out = packed
    lay = L.EngramLayout.from_config(config(src), 2)
    logs = {}
    for node_rank, name in enumerate(("head", "worker", "worker2", "worker3")):
        res = _run(src, out, node_rank, tp=2, nnodes=4, pp=2)
        assert res.returncode == 0, res.stderr
        rep = engram_log.parse_engram_log(res.stdout + res.stderr)
        tp_rank = node_rank % 2
        assert sorted(rep.layers) == [(1, tp_rank), (14, tp_rank)] and not rep.ignored, (name, res.stdout)
        assert all(a.packed and (a.lo, a.hi) == (lay.rank_ranges(a.layer)[tp_rank].lo,
                                                   lay.rank_ranges(a.layer)[tp_rank].hi) for a in rep.layers.values())
        logs[name] = res.stdout + res.stderr
    profile = load_profile(REPO_ROOT / "env" / "lab-tp2pp2.env")
    plan = render(profile, {n.name: NodeFacts(home="/root", packed_engram=True) for n in profile.nodes})
    rows = {c.node: c for c in engram_attach.attach_checks(profile, plan, logs)}
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(logs, Status.PASS), rows
    assert "engram-l1-r0of2.bin" in rows["worker2"].expected and "engram-l1-r1of2.bin" in rows["worker3"].expected
    assert not (out / "engram-l1-r2of2.bin").exists()    # the stand-in once looked for node rank 2's own file
