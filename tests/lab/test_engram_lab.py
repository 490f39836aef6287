"""Step 03_engram on the real two-node lab: both ranks packed over ssh in parallel, NO-OP re-run,
corruption caught on the worker, resume after SIGKILL, a too-small disk refused, ENGRAM=0 = N/A.

Everything runs in test-only dirs on the nodes' private /mnt/nvme (ENGRAM_SRC_DIR /
ENGRAM_PACKED_DIR overridden) and a test-only tools dir; the module fixture unmounts the tmpfs and
removes those dirs at the end, so the profile's own /mnt/nvme/engram-* (what 03_engram uses) are
never touched. The tests run in file order and build on each other (one source, one packing).
"""
from __future__ import annotations

import json
import shlex
import time

import pytest

from runbook import runner
from runbook.checks import CheckList, Status
from runbook.engram_tools import layout as L
from runbook.engram import facts as engram_facts
from runbook.engram import read_probe
from runbook.lab import engram_source as lab_source
from runbook.engram import precheck as engram_precheck
from runbook.engram import packing as engram
from runbook.profile import load_profile
from runbook.remote import Cluster

pytestmark = pytest.mark.lab
PROFILE = "env/lab.env"
SRC = "/mnt/nvme/engram-labtest-src"
PACKED = "/mnt/nvme/engram-labtest-packed"
TOOLS = "/tmp/spark-runbook-engram-labtest"


@pytest.fixture(scope="module")
def env(lab, tmp_path_factory):
    profile = load_profile(PROFILE, overrides={"ENGRAM_SRC_DIR": SRC, "ENGRAM_PACKED_DIR": PACKED})
    assert profile.engram and profile.is_lab
    cluster = Cluster.from_profile(profile, run_dir=tmp_path_factory.mktemp("engram-lab"))
    state: dict = {"results": {}}
    try:
        for node in cluster:                        # a crashed earlier session may have left these
            node.run(f"mountpoint -q {PACKED} && umount {PACKED}; rm -rf {SRC} {PACKED} {TOOLS}/{node.name}",
                     timeout=60, warn=True)
        yield profile, cluster, state
    finally:
        for node in cluster:
            node.run(f"mountpoint -q {PACKED} && umount {PACKED}; rm -rf {SRC} {PACKED} {TOOLS}/{node.name}",
                     timeout=60, warn=True)
        cluster.head.run(f"rmdir {TOOLS} 2>/dev/null; true", timeout=30, warn=True)
        cluster.close()


def _by(checks, name, node):
    found = [c for c in checks if c.name == name and c.node == node]
    assert found, f"no row {name}@{node}:\n{CheckList(checks).to_text()}"
    return found[0]


def _intervals(log, marker: str) -> dict[str, tuple[float, float]]:
    """(start, end) of the commands containing ``marker`` per node, from the command log."""
    out = {}
    for e in log.entries:
        if marker in e["command"] and not e["dry_run"]:
            out[e["node"]] = (e["time"] - e["duration_s"], e["time"])
    return out


def test_lab_fixture_then_both_ranks_packed_in_parallel(env):
    profile, cluster, state = env
    fixture = lab_source.prepare_lab_source(cluster, profile, tools_dir=TOOLS)
    assert not fixture.failures(), fixture.to_text()
    gen = _by(fixture, "lab fixture: synthetic Engram source", "head")
    shared = _by(fixture, "lab fixture: source shared to worker", "worker")
    assert gen.status is Status.PASS and "lab fixture: synthetic source generated" in gen.observed
    assert shared.status is Status.PASS and "rsync over ssh" in shared.observed
    assert profile.worker_ip in shared.observed                 # over the fabric address

    facts = engram_facts.gather_facts(cluster, profile)
    pre = engram_precheck.precheck(profile, facts)
    assert not pre.failures(), pre.to_text()
    assert _by(pre, "engram source parity", "worker").status is Status.PASS
    state["facts"] = facts

    results: dict = {}
    t0 = time.monotonic()
    checks = engram.run_pack(cluster, profile, facts, tools_dir=TOOLS, results=results, stream=True)
    print(f"[engram] first pack {time.monotonic() - t0:.1f} s")
    assert not checks.failures(), checks.to_text()
    config = engram_facts.config_of(facts)
    expected = engram_precheck.expected_files(profile, config)
    for node in cluster:
        for rr in expected[node.name]:
            row = _by(checks, f"engram pack L{rr.layer}", node.name)
            assert row.status is Status.PASS and row.data["status"] == "packed", row
            assert _by(checks, f"engram packed L{rr.layer} verify", node.name).status is Status.PASS
        summary = results[node.name]["pack"]
        assert summary["ok"] and summary["peak_rss_bytes"] < 1 << 30 and summary["mb_s"] > 0
    # each node holds only its own rank, with the exact size, in its private /mnt/nvme
    for node in cluster:
        listed = engram_facts.parse_stat_lines(node.read(f"cd {PACKED} && stat -c '%s %n' *").stdout)
        assert listed == {rr.file_name: rr.packed_bytes for rr in expected[node.name]}, (node.name, listed)
    # the two packers ran at the same time (one per node)
    spans = _intervals(cluster.log, "pack.py")
    (a0, a1), (b0, b1) = spans["head"], spans["worker"]
    assert a0 < b1 and b0 < a1, spans

    probe = read_probe.run_probe(cluster, profile, facts, tools_dir=TOOLS, seconds=0.5, results=results)
    assert {c.name for c in probe} == {"engram read probe QD1", "engram read probe QD64"}
    assert all(c.status is Status.PASS and c.data["iops"] > 0 for c in probe), probe.to_text()
    summary = engram.summarize(results)
    assert summary["worker"]["probe"]["qd1"]["iops"] > 0 and summary["head"]["pack"]["peak_rss_mib"] > 0
    state["results"] = results


def test_rerun_is_noop_in_seconds(env):
    profile, cluster, _ = env
    t0 = time.monotonic()
    fixture = lab_source.prepare_lab_source(cluster, profile, tools_dir=TOOLS)
    assert [c.status for c in fixture] == [Status.NOOP, Status.NOOP], fixture.to_text()
    facts = engram_facts.gather_facts(cluster, profile)
    pre = engram_precheck.precheck(profile, facts)
    assert "complete already" in _by(pre, "engram packed dir free space", "worker").observed
    checks = engram.run_pack(cluster, profile, facts, tools_dir=TOOLS)
    elapsed = time.monotonic() - t0
    assert not checks.failures(), checks.to_text()
    packs = [c for c in checks if c.name.startswith("engram pack L")]
    assert len(packs) == 4 and all(c.status is Status.NOOP for c in packs), checks.to_text()
    assert sum(c.name.endswith("verify") and c.status is Status.PASS for c in checks) == 4
    assert elapsed < 30, f"re-run took {elapsed:.1f} s"
    print(f"[engram] re-run (fixture + facts + pack + verify) {elapsed:.1f} s")


def test_corrupted_byte_on_worker_is_caught_naming_the_file(env):
    profile, cluster, state = env
    worker, facts = cluster.worker, state["facts"]
    rr = engram_precheck.expected_files(profile, engram_facts.config_of(facts))["worker"][1]      # layer 14, rank 1
    path = f"{PACKED}/{rr.file_name}"
    offset = L.HEADER_BYTES + 100          # row 0, weight byte 100 (the checker always compares row 0)
    flip = (f"python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDWR); b=os.pread(fd,1,{offset}); "
            f"os.pwrite(fd, bytes([b[0]^0xFF]), {offset}); os.fsync(fd)' {shlex.quote(path)}")
    worker.run(flip, timeout=30)
    checks = engram.run_pack(cluster, profile, facts, tools_dir=TOOLS)
    bad = checks.failures()
    assert [(c.name, c.node) for c in bad] == [("engram packed L14 verify", "worker")], checks.to_text()
    assert rr.file_name in bad[0].observed and "differ from the source" in bad[0].observed
    assert f"first global row {rr.lo}" in bad[0].observed and path in bad[0].fix
    assert _by(checks, "engram pack L14", "worker").status is Status.NOOP      # size/header still look right
    assert _by(checks, "engram packed L14 verify", "head").status is Status.PASS
    # the fix the row gives: delete the file and re-run
    worker.run(f"rm -f {shlex.quote(path)}", timeout=30)
    again = engram.run_pack(cluster, profile, facts, tools_dir=TOOLS)
    assert not again.failures(), again.to_text()
    assert _by(again, "engram pack L14", "worker").data["status"] == "packed"


def test_killed_packer_is_completed_by_a_rerun(env):
    profile, cluster, state = env
    worker, facts = cluster.worker, state["facts"]
    rr = engram_precheck.expected_files(profile, engram_facts.config_of(facts))["worker"][0]      # layer 1, rank 1
    final = f"{PACKED}/{rr.file_name}"
    worker.run(f"rm -f {final}", timeout=30)
    # small chunks and a sync every MiB so the kill lands mid-file; the node polls the packer's
    # durable-progress record and SIGKILLs it as soon as some rows are recorded
    cmd = engram.plan_pack(profile, facts, tools_dir=TOOLS, layers=[1],
                           extra_args=["--chunk-rows", "512", "--sync-mib", "1"])["worker"][1]
    script = (f"{cmd} > {TOOLS}/worker/kill-test.log 2>&1 & pid=$!; i=0; "
              f"while ! grep -qs '\"rows_done\": [1-9]' {final}.partial.json; do "
              f"sleep 0.02; i=$((i+1)); [ $i -gt 3000 ] && break; done; "
              f"kill -KILL $pid; wait $pid; echo rc=$?")
    res = worker.run(f"bash -c {shlex.quote(script)}", timeout=120)
    assert "rc=137" in res.stdout, res.stdout + worker.read(f"cat {TOOLS}/worker/kill-test.log").stdout
    left = engram_facts.parse_stat_lines(worker.read(f"cd {PACKED} && stat -c '%s %n' *").stdout)
    assert rr.file_name not in left and f"{rr.file_name}.partial" in left, left
    record = json.loads(worker.read(f"cat {final}.partial.json").stdout)
    assert 0 < record["rows_done"] < rr.rows, record

    results: dict = {}
    checks = engram.run_pack(cluster, profile, facts, tools_dir=TOOLS, results=results)
    assert not checks.failures(), checks.to_text()
    row = _by(checks, "engram pack L1", "worker")
    assert row.status is Status.PASS and row.data["status"] == "resumed"
    assert row.data["resumed_from_row"] >= record["rows_done"] > 0
    assert _by(checks, "engram packed L1 verify", "worker").status is Status.PASS
    left = engram_facts.parse_stat_lines(worker.read(f"cd {PACKED} && stat -c '%s %n' *").stdout)
    assert left.get(rr.file_name) == rr.packed_bytes and not any(k.endswith(".partial") for k in left)


def test_too_small_disk_is_refused(env):
    profile, cluster, _ = env
    worker = cluster.worker
    # a 4 MiB tmpfs over the worker's packed dir, inside the worker node's own mount namespace
    worker.run(f"mount -t tmpfs -o size=4m engram-labtest {PACKED}", timeout=30)
    try:
        assert cluster.head.read(f"mountpoint -q {PACKED}").exit_code != 0          # node-private
        facts = engram_facts.gather_facts(cluster, profile)
        pre = engram_precheck.precheck(profile, facts)
        space = _by(pre, "engram packed dir free space", "worker")
        assert space.status is Status.FAIL and "ENGRAM_PACKED_DIR" in space.fix, pre.to_text()
        assert f"free {space.data['need_bytes'] - space.data['free_bytes']} bytes" in space.fix
        assert space.data["free_bytes"] <= 4 << 20 < space.data["need_bytes"]
        assert _by(pre, "engram packed dir free space", "head").status is Status.PASS
        # the step does not start the worker's packer after that failure ...
        checks = engram.run_pack(cluster, profile, facts, tools_dir=TOOLS, skip=engram.blocked_nodes(pre))
        assert _by(checks, "engram pack", "worker").status is Status.NA
        assert not checks.failures()
        # ... and the packer itself refuses too (exit 3, bytes needed and free), writing nothing
        checks = engram.run_pack(cluster, profile, facts, tools_dir=TOOLS)
        (bad,) = checks.failures()
        assert bad.node == "worker" and "not enough free space" in bad.observed and "need" in bad.observed
        assert "ENGRAM_PACKED_DIR" in bad.fix
        assert worker.read(f"ls -A {PACKED}").stdout.strip() == ""
    finally:
        worker.run(f"umount {PACKED}", timeout=30)
    facts = engram_facts.gather_facts(cluster, profile)            # the real files are back
    assert len(facts["worker"]["packed_existing"]) == 2


def test_notebook_engram_off_is_all_na(lab, tmp_path):
    run_dir, outcomes = runner.run(PROFILE, only=["03"], overrides={"ENGRAM": "0"}, results_root=tmp_path)
    assert [(o.name, o.status) for o in outcomes] == [("03_engram", "passed")], outcomes
    sidecar = json.loads((run_dir.path / "steps/03_engram.json").read_text())
    checks = CheckList.from_records(sidecar["checks"])
    assert checks and all(c.status is Status.NA and "ENGRAM=0" in c.observed for c in checks)
    assert {c.node for c in checks} == {"head", "worker"}
