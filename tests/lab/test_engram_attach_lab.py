"""Step 04's ``engram attached`` row on the two-node lab (issue 34 item 2): step 03 packs both ranks, the lab
recipe's Engram stand-in (runbook/lab/recipe/overlay/engram_standin.py) attaches them in every rank and prints recipe
A's lines, and the row passes; a packed header of another version on the worker makes that rank fall back to the
checkpoint ("ignoring, using checkpoint"): the server still comes up, and the row FAILS on the worker naming the
file and step 03; step 03 replaces the file and the next start passes.

Test-only source, packed and tools dirs on the nodes' private /mnt/nvme (removed at the end), the tiny model in its
own dir, so neither the profile's own Engram files nor the other lab tests' servers are touched.
"""
from __future__ import annotations

import shlex

import pytest

from runbook.checks import CheckList, Status
from runbook.engram import facts as engram_facts
from runbook.lab import engram_source as lab_source
from runbook.engram import packing as engram
from runbook.engram import precheck as engram_precheck
from runbook.launch import engram_attach, server, stop
from runbook.launch.plan import render_plan
from runbook.profile import REPO_ROOT, load_profile
from runbook.remote import Cluster
from support.tiny import tiny_model_on

VENV = REPO_ROOT / ".lab" / "vllm-venv"
SRC = "/mnt/nvme/engram-attachtest-src"
PACKED = "/mnt/nvme/engram-attachtest-packed"
TOOLS = "/tmp/spark-runbook-engram-attachtest"
MODEL_DIR = "/mnt/nvme/models/tiny-engram-attach"
OVERRIDES = {"MODEL_DIR": MODEL_DIR, "WEIGHTS_DIR": MODEL_DIR, "READY_TIMEOUT": "900", "HANG_SECONDS": "300",
             "ENGRAM": "1", "ENGRAM_SRC_DIR": SRC, "ENGRAM_PACKED_DIR": PACKED}

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                                 reason=f"{VENV} missing: make lab-vllm installs the lab's CPU vLLM")]


def _profile():
    profile = load_profile(REPO_ROOT / "env" / "lab.env", OVERRIDES)
    assert profile.engram and profile.is_lab and profile.recipe == "lab"
    return profile


def _clean(cluster):
    for node in cluster:
        node.run(f"rm -rf {SRC} {PACKED} {TOOLS}/{node.name}", timeout=60, warn=True)


@pytest.fixture(scope="module")
def cluster(lab, tmp_path_factory):
    profile = _profile()
    c = Cluster.from_profile(profile, run_dir=tmp_path_factory.mktemp("engram-attach"))
    stop.stop(c, profile, mem_settle_s=0)
    _clean(c)
    try:
        yield c
    finally:
        try:
            stop.stop(c, profile, mem_settle_s=0)
        finally:
            _clean(c)
            c.head.run(f"rmdir {TOOLS} 2>/dev/null; true", timeout=30, warn=True)
            c.close()


@pytest.fixture(scope="module")
def tiny_model(cluster, tmp_path_factory):
    return tiny_model_on(cluster, MODEL_DIR, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def packed(cluster):
    """Step 03 on both nodes: the lab's synthetic source, then pack + verify (every row PASS)."""
    profile = _profile()
    fixture = lab_source.prepare_lab_source(cluster, profile, tools_dir=TOOLS)
    assert not fixture.failures(), fixture.to_text()
    facts = engram_facts.gather_facts(cluster, profile)
    checks = engram.run_pack(cluster, profile, facts, tools_dir=TOOLS)
    assert not checks.failures(), checks.to_text()
    return facts


@pytest.fixture
def stop_after(cluster):
    yield
    stop.stop(cluster, _profile(), mem_settle_s=0)


def _start(cluster):
    profile = _profile()
    plan = render_plan(cluster, profile)
    for r in plan.ranks:                          # the lab recipe's stand-in is told where to look, as seed A's
        assert r.env["DSV41_SOURCE"] == SRC and r.env["DSV41_PACKED_DIR"] == PACKED, r.env
    return server.start(cluster, profile, plan, raise_on_failure=False)


def _rows(result):
    rows = {c.node: c for c in result.checks if c.name == engram_attach.ROW}
    assert set(rows) == {"head", "worker"}, CheckList(result.checks).to_text()
    return rows


def test_every_rank_attaches_what_step_03_packed(cluster, tiny_model, packed, stop_after):
    result = _start(cluster)
    assert result.ok, result.checks.to_text()
    rows = _rows(result)
    for node, row in rows.items():
        assert row.status is Status.PASS, row
        rank = 0 if node == "head" else 1
        assert f"File-backed Engram layer=1 rank={rank}/2" in row.observed and "packed=True" in row.observed
        assert "packed=False" not in row.observed


def test_a_mismatched_header_on_the_worker_fails_04_naming_the_file(cluster, tiny_model, packed, stop_after):
    profile = _profile()
    rr = engram_precheck.expected_files(profile, engram_facts.config_of(packed))["worker"][1]     # L14, rank 1
    assert rr.layer == 14 and rr.rank == 1
    path = f"{PACKED}/{rr.file_name}"
    # another header version: the literal bytes b"DSV41EN1" where the reader compares the u64 (docs/engram.md)
    corrupt = (f"python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDWR); os.pwrite(fd, b\"DSV41EN1\", 0); "
               f"os.fsync(fd)' {shlex.quote(path)}")
    cluster.worker.run(corrupt, timeout=30)

    result = _start(cluster)
    assert result.readiness.first_token is not None          # the fallback boots and serves: only this row says so
    rows = _rows(result)
    assert rows["head"].status is Status.PASS, rows["head"]
    bad = rows["worker"]
    assert bad.status is Status.FAIL, bad
    assert f"Engram: packed shard {path} does not match this rank (layer=14 lo={rr.lo} hi={rr.hi})" in bad.observed
    assert "ignoring, using checkpoint" in bad.observed
    assert rr.file_name in bad.fix and "step 03" in bad.fix and "header" in bad.fix
    assert not result.ok and [c.name for c in result.checks.failures()] == [engram_attach.ROW]


def test_step_03_replaces_the_file_and_the_next_start_attaches_it(cluster, tiny_model, packed, stop_after):
    profile = _profile()
    checks = engram.run_pack(cluster, profile, engram_facts.gather_facts(cluster, profile), tools_dir=TOOLS)
    assert not checks.failures(), checks.to_text()
    redone = [c for c in checks if c.name == "engram pack L14" and c.node == "worker"]
    assert redone and redone[0].data["status"] == "replaced", checks.to_text()
    result = _start(cluster)
    assert result.ok, result.checks.to_text()
    assert all(c.status is Status.PASS for c in _rows(result).values())
