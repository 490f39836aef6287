"""The cluster-facing step functions, against a fake cluster whose nodes run commands locally."""
from __future__ import annotations

import json
import pytest

from runbook.checks import Status
from runbook.engram import facts, precheck, read_probe
from runbook.engram import packing as step
from runbook.engram_tools import ship as tools
from runbook.engram_tools import synth
from runbook.engram_tools import layout as L
from support.doubles import FakeCluster
from support.engram import tool_node
from support.profiles import profile_from


def profile(tmp_path, src, env="env/lab.env", **keys):
    """The shipped lab profile (two nodes, TP=2; ``env/lab-tp3.env``: three) with its Engram dirs in tmp_path."""
    return profile_from(env, ENGRAM_SRC_DIR=src, ENGRAM_PACKED_DIR=tmp_path / "packed", **keys)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("stepsrc")
    synth.make_source(str(d), vocab_size=300)
    return d


def test_plan_pack_commands_per_node(tmp_path, src):
    prof = profile(tmp_path, src, "env/lab-tp3.env")
    plans = step.plan_pack(prof, {"worker": {"engram_src_dir": "/mnt/nfs/engram src", "python": "sudo -n python3"}},
                           layers=[1, 14])
    head, worker = plans["head"], plans["worker"]
    assert "--rank 2" in plans["worker2"][1] and plans["worker2"][1].startswith("python3 ")   # one rank per node
    assert head[0].startswith("mkdir -p") and "--rank 0" in head[1] and "--tp 3" in head[1]
    assert "--layers 1,14" in head[1] and head[1].startswith("python3 ")
    assert worker[1].startswith("sudo -n python3 ") and "'/mnt/nfs/engram src'" in worker[1]
    assert "check.py" in worker[2] and "--rank 1" in worker[2]
    probes = read_probe.plan_probe(prof)
    assert set(probes) == {"head", "worker", "worker2"} and "engram-l1-r1of3.bin" in probes["worker"]


def test_expected_files_and_space_checks(tmp_path, src):
    prof = profile(tmp_path, src)
    cfg = synth.engram_text_config(300)
    exp = precheck.expected_files(prof, {"text_config": cfg})
    assert [r.file_name for r in exp["worker"]] == ["engram-l1-r1of2.bin", "engram-l14-r1of2.bin"]
    need = sum(r.packed_bytes for r in exp["head"])
    checks = precheck.space_checks(prof, {"head": {"packed_free_bytes": need},
                                          "worker": {"packed_free_bytes": need - 1}}, {"text_config": cfg})
    assert [c.status for c in checks] == [Status.PASS, Status.FAIL]
    assert precheck.space_checks(prof, {}, {"text_config": cfg})[0].status is Status.NA


def test_run_pack_on_fake_cluster_then_noop(tmp_path, src):
    prof = profile(tmp_path, src)
    cluster = FakeCluster([tool_node("head", 0), tool_node("worker", 1)])
    tdir = str(tmp_path / "tools")
    checks = step.run_pack(cluster, prof, tools_dir=tdir)
    assert not checks.failures(), checks.to_text()
    names = [c.name for c in checks]
    assert names.count("engram pack L1") == 2 and names.count("engram packed L14 verify") == 2
    puts = [c for c in cluster.nodes[0].runs() if c.startswith("put ")]
    assert {p.rsplit("/", 1)[1] for p in puts} == set(tools.TOOL_FILES)
    expected = precheck.expected_files(prof, L.load_config(str(src)))
    assert sorted(expected) == ["head", "worker"] and all(expected.values()), expected
    for name, ranges in expected.items():
        for rr in ranges:
            assert (tmp_path / "packed" / rr.file_name).stat().st_size == rr.packed_bytes
    again = step.run_pack(cluster, prof, tools_dir=tdir)
    assert [c.status for c in again if c.name.startswith("engram pack L")] == [Status.NOOP] * 4
    probe = read_probe.run_probe(cluster, prof, tools_dir=tdir, seconds=0.2)
    assert len(probe) == 4 and all(c.data.get("iops", 0) > 0 for c in probe)


def test_run_pack_failure_becomes_a_failed_check_with_fix(tmp_path):
    bad = tmp_path / "bad"
    synth.make_source(str(bad), vocab_size=200, overrides={"layers.1.engram.embed.scale": {"dtype": "U8"}})
    prof = profile(tmp_path, bad)
    cluster = FakeCluster([tool_node("head", 0), tool_node("worker", 1)])
    checks = step.run_pack(cluster, prof, tools_dir=str(tmp_path / "tools"))
    assert len(checks.failures()) == 2
    first = checks.failures()[0]
    assert "layers.1.engram.embed.scale" in first.observed and "ENGRAM_SRC_DIR" in first.fix


def test_parsers():
    out = "[engram-pack] 50%\nnoise {not json\n" + '{"tool": "engram-pack", "ok": false, "exit_code": 3, "error": "need 5 bytes"}\n'
    summary = tools.parse_tool_json(out, "engram-pack")
    assert summary["exit_code"] == 3 and tools.parse_tool_json(out, "engram-check") == {}
    (c,) = step.pack_checks("worker", summary)
    assert c.status is Status.FAIL and "need 5 bytes" in c.observed and "free space" in c.fix
    (c,) = step.pack_checks("head", {}, exit_code=137)
    assert c.status is Status.FAIL
    (c,) = step.check_checks("head", {"tool": "engram-check", "ok": False, "error": "boom"}, 2)
    assert c.status is Status.FAIL and "boom" in c.observed
    assert read_probe.probe_checks("head", {})[0].status is Status.WARN


def test_space_check_counts_only_rows_a_partial_record_keeps(tmp_path, src):
    prof = profile(tmp_path, src)                            # the worker's facts are not given: its row is N/A
    config = {"text_config": synth.engram_text_config(300)}
    rr, rr14 = precheck.expected_files(prof, config)["head"]
    shards = {"model-00047-of-00048.safetensors": 1000, "model-00048-of-00048.safetensors": 2000}
    record = {"layer": rr.layer, "lo": rr.lo, "hi": rr.hi, "total_rows": rr.total_rows, "row_bytes": 264,
              "rows_done": 1000, "weight": {"shard": "model-00047-of-00048.safetensors", "size": 1000},
              "scale": {"shard": "model-00047-of-00048.safetensors", "size": 1000}}
    text = (f"{rr.file_name}.partial.json {json.dumps(record)}    \n"
            f"{rr14.file_name}.partial.json {{torn\n")             # an unreadable record: nothing kept
    records = facts.parse_records(text)
    assert list(records) == [rr.file_name] and records[rr.file_name]["rows_done"] == 1000
    existing = {f"{rr.file_name}.partial": 4096 + 1000 * 264 + 77, f"{rr14.file_name}.partial": 50000}
    kept = 4096 + 512 * 264                 # 1000 recorded rows restart at row 512 (page alignment)
    assert precheck.partial_kept_bytes([rr, rr14], existing, records, shards) == kept
    assert precheck.partial_kept_bytes([rr], existing, records, {**shards, "model-00047-of-00048.safetensors": 999}) == 0
    assert precheck.partial_kept_bytes([rr], {f"{rr.file_name}.partial": 4096 + 999 * 264}, records, shards) == 0
    assert precheck.partial_kept_bytes([rr], {**existing, rr.file_name: rr.packed_bytes}, records, shards) == 0
    total = rr.packed_bytes + rr14.packed_bytes
    node_facts = {"head": {"packed_free_bytes": total - kept, "packed_existing": existing, "packed_records": records,
                      "src_files": shards, "packed_fs": "/mnt/nvme"}}
    c, worker = precheck.space_checks(prof, node_facts, config)
    assert worker.node == "worker" and worker.status is Status.NA and "not probed" in worker.observed
    assert c.node == "head" and c.status is Status.PASS and c.data["need_bytes"] == total - kept and c.data["partial_kept_bytes"] == kept
    assert "kept in .partial" in c.observed and "/mnt/nvme" in c.observed
    node_facts["head"]["packed_free_bytes"] -= 1
    c, _ = precheck.space_checks(prof, node_facts, config)
    assert c.status is Status.FAIL and c.fix.startswith("free 1 bytes on ")
    assert step.exit_fix(143) == step.STOPPED_FIX and step.exit_fix(3) == step.EXIT_FIX[3]


def test_tp4_packs_every_rank_and_the_verifier_names_a_corrupted_rank3_file(tmp_path, src):
    """TP = 4 on four nodes (issue 39): each node packs its own rank's rows of the lab's synthetic source, check.py
    verifies every rank's files, and a flipped byte in rank 3's file fails worker3's verify row naming the file.
    The profile: env/lab.env grown to four nodes on one /24 (a switch), TP = 4."""
    names = ["head", "worker", "worker2", "worker3"]
    four = {"NNODES": "4", "TP": "4", "HEAD_IP": "169.254.77.1", "WORKER_IP": "169.254.77.2"}
    for rank, name in enumerate(names[2:], start=2):
        four.update({f"{name.upper()}_SSH": f"spark-{name}", f"{name.upper()}_IP": f"169.254.77.{rank + 1}",
                     f"{name.upper()}_CX7_IF": "enp1s0f0np0"})
    prof = profile(tmp_path, src, **four)
    assert [n.name for n in prof.nodes] == names and prof.tp == 4
    cluster = FakeCluster([tool_node(n, k) for k, n in enumerate(names)])
    tdir = str(tmp_path / "tools")
    checks = step.run_pack(cluster, prof, tools_dir=tdir)
    assert not checks.failures(), checks.to_text()
    verified = [c for c in checks if c.name.startswith("engram packed L") and c.name.endswith(" verify")]
    assert sorted({c.node for c in verified}) == sorted(names) and len(verified) == 4 * 2      # 4 ranks x 2 layers
    expected = precheck.expected_files(prof, L.load_config(str(src)))
    assert sorted(expected) == sorted(names)
    for layer in (1, 14):                      # the four ranks' rows cover the table once, in rank order
        ranges = [next(r for r in expected[n] if r.layer == layer) for n in names]
        assert [r.file_name for r in ranges] == [f"engram-l{layer}-r{k}of4.bin" for k in range(4)]
        assert ranges[0].lo == 0 and all(a.hi == b.lo for a, b in zip(ranges, ranges[1:]))
        for r in ranges:
            assert (tmp_path / "packed" / r.file_name).stat().st_size == r.packed_bytes

    bad = tmp_path / "packed" / "engram-l14-r3of4.bin"
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF                               # the last row: always among the verifier's samples
    bad.write_bytes(bytes(data))
    again = step.run_pack(cluster, prof, tools_dir=tdir)
    (failed,) = again.failures()
    assert failed.node == "worker3" and failed.name == "engram packed L14 verify"
    assert "engram-l14-r3of4.bin" in failed.observed and "differ from the source" in failed.observed
    assert str(bad) in failed.fix
