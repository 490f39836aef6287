"""The typed records between steps (``runbook.records``): what step 01 and step 04 leave for the later steps, written
with the sidecar and read back through their types; a missing or older-format record is an error naming the step
to re-run; one table of steps."""
from __future__ import annotations

import contextlib
import json

import pytest
from support.doubles import res
from support.fake_vllm import make_step
from support.net import fx
from test_network_step import lab_cluster, lab_profile, spark_cluster, spark_profile

from runbook.benchmark.roofline_panel import allreduce_latency
from runbook.evidence import discover_steps
from runbook.network import verify as network
from runbook.records import (LAUNCH, NETWORK, STEPS, BenchRecord, DiskFree, EngramRank, EngramRecord, EngramSource,
                             FabricEnd, FabricRail, LaunchRank, LaunchRecord, NetworkRecord, PreflightNode,
                             PreflightRecord, RecordError, SmokeRecord, VisionToolsRecord, WeightsCopy, WeightsRecord,
                             record_to_sidecar, step_info)
from runbook.report.model import STEP_TITLES
from runbook.review import STEPS as REVIEWED



def launch_record(**kw) -> LaunchRecord:
    return LaunchRecord(**{"fingerprint": "f" * 64, "served_model_name": "tiny", "max_model_len": 4096,
                           "ranks": (LaunchRank(node="head", rank=0, headless=False),
                                     LaunchRank(node="worker", rank=1, headless=True)),
                           "base_url": "http://10.0.0.1:8000", **kw})


# -- the table ------------------------------------------------------------------------------------------------

def test_the_table_is_the_notebooks_and_the_step_packages():
    assert [s.id for s in STEPS] == discover_steps()          # notebooks/NN_name.ipynb, in order
    assert len(STEPS) == 9
    import importlib.util
    assert all(importlib.util.find_spec(f"runbook.{s.package}") is not None for s in STEPS)
    assert [step_info(k).id for k in ("04_launch", "launch", "04", LaunchRecord)] == ["04_launch"] * 4
    with pytest.raises(KeyError, match="no step 'nope'"):
        step_info("nope")


def test_the_other_step_tables_come_from_it():
    assert STEP_TITLES == {s.id: s.title for s in STEPS} and STEP_TITLES["06_vision_tools"] == "Vision and tools"
    reviewed = [name for name, _ in REVIEWED]
    assert reviewed and set(reviewed) <= {s.id for s in STEPS}
    assert [e.__module__ for _, e in REVIEWED] == [f"runbook.{step_info(n).package}" for n in reviewed]


# -- written with the sidecar, read back through the type -----------------------------------------------------

def test_a_step_writes_its_record_and_a_later_step_reads_it_typed(tmp_path):
    step = make_step(tmp_path, name="04_launch")
    step.record = launch_record()
    step.finish(display=False)
    side = step.run.read_sidecar("04_launch")
    assert side["record"]["type"] == "LaunchRecord" and side["record"]["version"] == LaunchRecord.VERSION
    back = step.run.read_record(LaunchRecord)
    assert back == launch_record() and isinstance(back.ranks[1], LaunchRank)


def test_a_step_cannot_write_another_steps_record(tmp_path):
    step = make_step(tmp_path, name="05_smoke")
    with pytest.raises(TypeError, match="08_report writes no record, not LaunchRecord"):
        step.run.write_sidecar("08_report", [], {}, "passed", launch_record())
    with pytest.raises(TypeError, match="05_smoke writes SmokeRecord, not LaunchRecord"):
        step.run.write_sidecar("05_smoke", [], {}, "passed", launch_record())
    with pytest.raises(TypeError, match="01_network writes NetworkRecord, not LaunchRecord"):
        step.run.write_sidecar("01_network", [], {}, "passed", launch_record())


def test_a_missing_record_names_the_step_to_rerun(tmp_path):
    run = make_step(tmp_path).run
    with pytest.raises(RecordError, match="01_network has no sidecar in this run") as err:
        run.read_record(NetworkRecord)
    assert "re-run 01_network" in err.value.fix
    assert run.read_record(NetworkRecord, missing_ok=True) is None    # the step did not run here: the reader's call


@pytest.mark.parametrize("record,status,why", [
    (None, "passed", "holds no NetworkRecord (written by a runbook older than typed records)"),
    (None, "failed", "holds no NetworkRecord (the step ended before it wrote its record)"),
    ({"type": "NetworkRecord", "version": 0, "fields": {"gid_index": {}}}, "passed", "not the one this runbook reads"),
    ({"type": "LaunchRecord", "version": 1, "fields": {}}, "passed", "not the one this runbook reads"),
    ({"type": "NetworkRecord", "version": 1, "fields": {"gid_index": {"head": "three"}}}, "passed", "does not validate"),
    ({"type": "NetworkRecord", "version": 1, "fields": {"gid_index": {}, "gid": 3}}, "passed", "does not validate"),
])
def test_an_old_or_wrong_record_is_an_error_naming_the_step(tmp_path, record, status, why):
    run = make_step(tmp_path).run
    side = {"step": "01_network", "status": status, "checks": [
        {"name": "net.gid", "node": "head", "data": {"resolved": 3}}], "data": {}}
    if record is not None:
        side["record"] = record
    run.write_json("steps/01_network.json", side)
    with pytest.raises(RecordError, match=f"01_network's .*{why.split('(')[0].strip()}") as err:
        run.read_record(NetworkRecord, missing_ok=True)           # present but unreadable: never None
    assert why in str(err.value) and "re-run 01_network" in err.value.fix


# -- step 01's record from a real verification ---------------------------------------------------------------

def test_network_record_of_two_sparks():
    net = network.verify_network(spark_cluster(), spark_profile(), None)
    assert not net.checks.failures(), net.checks.to_text()
    rec = net.record
    assert rec.gid_index == {"head": 3, "worker": 3} and rec.gid_common == 3
    assert [r.index for r in rec.rails] == [0, 1]
    assert rec.rails[0].ends == (FabricEnd(node="head", iface="enp1s0f0np0", ip="192.168.100.1", hca="rocep1s0f0"),
                                 FabricEnd(node="worker", iface="enp1s0f0np0", ip="192.168.100.2", hca="rocep1s0f0"))
    assert rec.pairs() == [("head", "worker")]
    nccl = next(c for c in net.checks if c.name == "net.nccl.busbw")
    assert rec.nccl_busbw_gbs == nccl.data["avg_busbw_gbs"] and rec.nccl_busbw_gbs > 0
    checks, raw = net                                          # the callers that show rows only
    assert checks is net.checks and raw is net.raw


def test_network_record_keeps_the_sweep_the_bench_reads():
    cluster = lab_cluster()
    for n in cluster.nodes:
        n.rules.append((r"allreduce_sweep|RUNBOOK_SWEEP_EOF", res(0, fx("allreduce_sweep_rank0.json"))))
    rec = network.verify_network(cluster, lab_profile(VLLM_BIN="/opt/lab/vllm-venv/bin/vllm"), None).record
    assert rec.gid_index == {} and rec.gid_common is None            # EXPECT_RDMA=0: no GID resolved
    assert [s.node for s in rec.allreduce] == ["head", "worker"]
    assert [p.bytes for p in rec.allreduce[0].points] == [1024, 4096, 1048576, 16777216]
    assert rec.allreduce[0].backend == "gloo"
    seconds, note = allreduce_latency(rec)
    assert seconds == pytest.approx(212.4e-6) and "1024 bytes" in note


def test_network_record_round_trips_through_the_sidecar(tmp_path):
    step = make_step(tmp_path, name="01_network")
    step.record = NetworkRecord(gid_index={"head": 3}, gid_common=3, rails=(FabricRail(index=0, ends=(
        FabricEnd(node="head", iface="a"), FabricEnd(node="worker", iface="b"))),))
    step.finish(display=False)
    assert step.run.read_record(NetworkRecord) == step.record
    assert NETWORK.record is NetworkRecord and LAUNCH.record is LaunchRecord


# -- step 04's record from its run ----------------------------------------------------------------------------

def test_launch_writes_its_record_and_the_smoke_step_finds_the_server_through_it(tmp_path, monkeypatch):
    """Step 04 in a dry run on the offline review's nodes (nothing connects): its record holds the fingerprint
    and ranks of the plan it rendered and the API it started; ``find_server`` reads exactly that."""
    import posixpath

    import runbook.launch
    from runbook.api import server_info
    from runbook.errors import CheckFailed
    from runbook.facts.node_paths import USER_CMD
    from runbook.remote import Cluster, CommandLog
    from runbook.review import declared_network_facts
    monkeypatch.setenv("VLLM_API_KEY", "test-key-records")
    step = make_step(tmp_path, profile="exl3-v41", name="04_launch", dry_run=True)
    facts = {s.name: {'printf %s "$HOME"': "/home/spark", USER_CMD: f"/home/spark\n1000\n{posixpath.basename('/home/spark')}\n",
                      **declared_network_facts(step.profile, s)} for s in step.profile.nodes}
    step._cluster = Cluster.offline(step.profile, facts=facts, log=CommandLog(None, step.run.redactor))
    outcome = runbook.launch.run(step, action="start")
    with pytest.raises(CheckFailed) if step.checks.failures() else contextlib.nullcontext():
        step.finish(display=False)
    rec = step.run.read_record(LaunchRecord)
    assert rec.fingerprint == outcome.shown.plan.fingerprint and len(rec.fingerprint) == 64
    assert outcome.record == step.record and outcome.step == "04_launch"
    assert [(r.node, r.rank, r.headless) for r in rec.ranks] == [("head", 0, False), ("worker", 1, True)]
    assert (rec.served_model_name, rec.max_model_len) == (step.profile.served_model_name, step.profile.max_model_len)
    assert rec.base_url == runbook.launch.api_address(step.profile)
    monkeypatch.setattr(server_info.endpoint, "base_url", lambda p: "http://127.0.0.1:18000")   # no SSH forward
    found = server_info.find_server(step.profile, step.run.path)
    assert (found.model, found.source) == (rec.served_model_name, "steps/04_launch.json")


def test_a_resume_runs_an_old_04_again_without_reading_its_data(tmp_path):
    """A resume keeps a passed 04 only while every rank runs its record's fingerprint; an older runbook's sidecar
    (fingerprint only in ``data``) is run again, said why, and no node is read (before: data.fingerprint was
    taken by name and the nodes were asked)."""
    from support.doubles import FakeCluster, FakeNode
    from support.profiles import profile_from

    import runbook.launch
    cluster = FakeCluster([FakeNode("head", 0, read_only=True), FakeNode("worker", 1, read_only=True)])
    old = {"step": "04_launch", "status": "passed", "checks": [], "data": {"fingerprint": "f" * 64}}
    why = runbook.launch.state_left(cluster, profile_from("env/lab.env"), old)
    assert why.startswith("04_launch's sidecar holds no LaunchRecord") and "re-run 04_launch" in why
    assert all(not n.calls for n in cluster.nodes)


# -- the records of 00, 02, 03 and 05-07 ------------------------------------------------------------------------

SAMPLES = [
    PreflightRecord(nodes={"head": PreflightNode(hostname="spark-a", kernel="6.17.0", docker="28.1",
                                                 image_id="sha256:" + "a" * 64, mem_available=113 << 30,
                                                 disk_free={"weights": DiskFree(mount="/mnt/nvme", free_bytes=1 << 40)})}),
    WeightsRecord(repo="org/model", revision="c" * 40, files=3, total_bytes=1 << 30, layout="local_dir", mode="nfs",
                  copies=(WeightsCopy(node="head", weights_dir="/mnt/nvme/models/m", tree="/mnt/nvme/models/m"),
                          WeightsCopy(node="worker", weights_dir="/mnt/nvme/models/m", tree="/mnt/nvme/models/m",
                                      own_copy=False)),
                  engram=EngramSource(repo="org/v41", revision="e" * 40, files=("config.json",),
                                      paths={"head": "/mnt/nvme/engram-src"})),
    EngramRecord(enabled=True, tp=2, ranks=(EngramRank(node="head", rank=0, packed_dir="/mnt/nvme/engram-packed",
                                                       files=("engram-l1-r0of2.bin",), verified=True),)),
    SmokeRecord(base_url="http://127.0.0.1:8000", server_id="run@1.000"),
    VisionToolsRecord(base_url="http://127.0.0.1:8000", server_id="run@1.000"),
    BenchRecord(base_url="http://127.0.0.1:8000", server_id="run@1.000", result="raw/07_bench/bench/result.json"),
]


@pytest.mark.parametrize("rec", SAMPLES, ids=lambda r: type(r).__name__)
def test_each_step_record_round_trips_through_its_sidecar(tmp_path, rec):
    step_id = step_info(type(rec)).id
    step = make_step(tmp_path, name=step_id)
    step.record = rec
    step.finish(display=False)
    assert step.run.read_record(type(rec)) == rec
    assert step_info(step_id).record is type(rec)


@pytest.mark.parametrize("rec", SAMPLES, ids=lambda r: type(r).__name__)
def test_a_renamed_or_missing_field_of_each_record_fails_naming_its_step(tmp_path, rec):
    """A reader never gets a record whose field was renamed or dropped (by an older or newer runbook, or a hand
    edit): each field renamed, each required field removed, is a RecordError that names the step to re-run."""
    cls, step_id = type(rec), step_info(type(rec)).id
    run = make_step(tmp_path, name=step_id).run
    fields = rec.model_dump(mode="json")
    required = [k for k, f in cls.model_fields.items() if f.is_required()]
    assert fields and required
    broken = [{**{k: v for k, v in fields.items() if k != name}, f"{name}_old": fields[name]} for name in fields]
    broken += [{k: v for k, v in fields.items() if k != name} for name in required]
    for bad in broken:
        run.write_json(f"steps/{step_id}.json", {"step": step_id, "status": "passed", "checks": [], "data": {},
                                                 "record": {"type": cls.__name__, "version": cls.VERSION,
                                                            "fields": bad}})
        with pytest.raises(RecordError, match=f"{step_id}'s {cls.__name__} does not validate") as err:
            run.read_record(cls)
        assert f"re-run {step_id}" in err.value.fix


def test_preflight_writes_its_record_from_the_facts_it_read():
    from runbook.preflight.verify import preflight_record
    data = {"nodes": {"head": {"hostname": "spark-a", "kernel": "6.17", "docker": "28.1", "image_id": None,
                               "mem_available": 5, "mem_total": 9,
                               "disk_free": {"weights": {"mount": "/mnt/nvme", "free_bytes": 7}}}},
            "fit": {"facts": {"head": {"name": "head"}}}}
    rec = preflight_record(data)
    assert rec.nodes["head"] == PreflightNode(hostname="spark-a", kernel="6.17", docker="28.1", image_id="",
                                              mem_available=5, mem_total=9,
                                              disk_free={"weights": DiskFree(mount="/mnt/nvme", free_bytes=7)})
    assert rec.capacity == {"head": {"name": "head"}}
    assert preflight_record({"reach": {"head": "refused"}}) == PreflightRecord(nodes={})   # no node reached


@pytest.mark.parametrize("mode,own", [("nfs", [True, False, False]), ("rsync", [True, True, True])])
def test_weights_record_says_where_each_node_holds_its_copy(mode, own):
    from support.profiles import profile_from

    from runbook.weights.transfer import weights_record
    profile = profile_from("env/lab.env", WEIGHT_SYNC=mode)
    paths = {n: {"weights_dir": f"/w/{n}", "shared": f"/w/{n}", "tree": f"/w/{n}/tree"}
             for n in ("head", "worker", "worker2")}
    data = {"repo": "org/m", "revision": "c" * 40, "files": 2, "total_bytes": 9, "layout": "local_dir",
            "mode": mode, "paths": paths, "engram": {"enabled": False}}
    rec = weights_record(profile, data)
    assert [(c.node, c.tree, c.own_copy) for c in rec.copies] == [
        (n, f"/w/{n}/tree", o) for n, o in zip(("head", "worker", "worker2"), own)]
    assert rec.engram is None and (rec.repo, rec.mode) == ("org/m", mode)
    lab = weights_record(profile, {**data, "engram": {"enabled": True, "source": "lab fixture (03_engram)"}})
    assert lab.engram == EngramSource(source="lab fixture (03_engram)")


def test_engram_record_names_each_packing_rank_and_its_files():
    from support.profiles import profile_from

    from runbook.engram.packing import engram_record
    profile = profile_from("env/lab.env", ENGRAM="1")
    facts = {"head": {"rank": 0, "engram_packed_dir": "/p/head"}, "worker": {"rank": 1}}
    summary = {"head": {"pack": {"files": {"engram-l14-r0of2.bin": {}, "engram-l1-r0of2.bin": {}}},
                        "verify": {"ok": True}},
               "worker": {"pack": {"files": {}}}}
    rec = engram_record(profile, facts, summary)
    assert rec.enabled and rec.tp == int(profile.tp) == 2
    assert rec.ranks == (EngramRank(node="head", rank=0, packed_dir="/p/head",
                                    files=("engram-l1-r0of2.bin", "engram-l14-r0of2.bin"), verified=True),
                         EngramRank(node="worker", rank=1, packed_dir=profile.engram_packed_dir, files=(),
                                    verified=None))
    assert engram_record(profile_from("env/lab.env", ENGRAM="0"), {}, {}) == EngramRecord(enabled=False, tp=2)


# -- the readers ------------------------------------------------------------------------------------------------

def test_a_resume_checks_the_weights_manifest_where_02_recorded_it(tmp_path):
    """The tree comes from 02's record, not from the profile read again (a profile whose WEIGHTS_DIR points
    elsewhere would check the wrong place); an old 02 without a record runs again."""
    from support.doubles import FakeCluster, local_pair
    from support.profiles import profile_from

    from runbook.runner import _weights_state
    from runbook.weights import MANIFEST_NAME
    head, worker = local_pair(tmp_path)
    trees = {n: tmp_path / f"{n}-weights" / "tree" for n in ("head", "worker")}
    for t in trees.values():
        t.mkdir(parents=True)
        (t / MANIFEST_NAME).write_text('{"files": {}}')
    rec = WeightsRecord(repo="org/m", revision="c" * 40, files=0, total_bytes=0, layout="local_dir", mode="rsync",
                        copies=tuple(WeightsCopy(node=n, weights_dir=str(t.parent), tree=str(t))
                                     for n, t in trees.items()))
    side = {"step": "02_weights", "status": "passed", "record": record_to_sidecar("02_weights", rec)}
    cluster = FakeCluster([head, worker])
    profile = profile_from("env/lab.env")          # its WEIGHTS_DIR is not where these trees are
    assert _weights_state(cluster, profile, side) == ""
    (trees["worker"] / MANIFEST_NAME).unlink()
    assert _weights_state(cluster, profile, side) == f"no verified weights manifest on worker in {trees['worker']}"
    nfs = rec.model_copy(update={"copies": (rec.copies[0], rec.copies[1].model_copy(update={"own_copy": False}))})
    assert _weights_state(cluster, profile, {**side, "record": record_to_sidecar("02_weights", nfs)}) == ""
    why = _weights_state(cluster, profile, {k: v for k, v in side.items() if k != "record"})
    assert why.startswith("02_weights's sidecar holds no WeightsRecord") and "re-run 02_weights" in why


def test_the_server_a_serve_step_measured_comes_from_its_record(tmp_path):
    """05's record names the server start it measured; its data (an older runbook's only source) is not read
    when a record is there."""
    run = make_step(tmp_path).run
    run.write_sidecar("04_launch", [], {}, "passed", launch_record(server_id="runB@2.000"))
    run.write_sidecar("05_smoke", [], {"server": {"server_id": "runB@2.000"}}, "passed",
                      SmokeRecord(base_url="http://h:8000", server_id="runA@1.000"))
    other = run.evidence_of_other_servers()
    assert list(other) == ["05_smoke"] and other["05_smoke"].startswith("05_smoke was measured on server start runA@1.000")
    run.write_sidecar("05_smoke", [], {"server": {"server_id": "runA@1.000"}}, "passed")     # a run before records
    assert len(run.evidence_of_other_servers()) == 1


def test_the_verdict_reads_the_revisions_and_image_ids_from_the_records_and_old_runs_from_their_data():
    from runbook.report import verdict
    from runbook.report.model import ReportModel
    model = ReportModel(run_id="r", run_path="", generated="", manifest={}, provenance={}, steps=[],
                        profile={"HF_REVISION": "c" * 40, "HF_ENGRAM_REVISION": "e" * 40, "ENGRAM": "1",
                                 "RUNTIME": "docker", "IMAGE": "img:tag"})
    weights = SAMPLES[1].model_copy(update={"revision": "d" * 40})
    new = {"02_weights": {"status": "passed", "data": {"revision": "c" * 40},
                          "record": record_to_sidecar("02_weights", weights)},
           "00_preflight": {"status": "passed", "data": {"nodes": {}},
                            "record": record_to_sidecar("00_preflight", SAMPLES[0])}}
    ok, why = verdict.model_revision(model, None, new)
    assert not ok and why == f"steps/02_weights.json fetched {'d' * 40}, HF_REVISION={'c' * 40}"
    assert verdict.engram_revision(model, None, new) == (True, "e" * 40)
    ok, why = verdict.image(model, None, new)
    assert ok and why.startswith("img:tag: image id sha256:aaaa") and why.endswith("on head")
    old = {"02_weights": {"status": "passed", "data": {"revision": "c" * 40}}}       # a run made before records
    assert verdict.model_revision(model, None, old) == (True, "c" * 40)


def test_the_report_finds_07s_result_through_its_record(tmp_path):
    from runbook.report.recompute_bench import find_bench_result
    result = {"schema_version": "runbook.bench/3", "cases": []}
    (tmp_path / "raw/07_bench/bench").mkdir(parents=True)
    (tmp_path / "raw/07_bench/bench/result.json").write_text(json.dumps(result))
    (tmp_path / "raw/07_bench/old").mkdir(parents=True)
    (tmp_path / "raw/07_bench/old/result.json").write_text(json.dumps({**result, "cases": [{"kind": "old"}]}))
    rec = SAMPLES[-1]                               # result: raw/07_bench/bench/result.json
    data = {"bench": {"result": "raw/07_bench/old/result.json"}}
    side = {"07_bench": {"status": "passed", "data": data, "record": record_to_sidecar("07_bench", rec)}}
    assert find_bench_result(tmp_path, side) == ("07_bench", tmp_path / rec.result, result)
    del side["07_bench"]["record"]                  # a run made before records: the path in its data
    assert find_bench_result(tmp_path, side)[1] == tmp_path / "raw/07_bench/old/result.json"


def test_engram_step_with_engram_off_writes_its_record(tmp_path):
    import runbook.engram
    step = make_step(tmp_path, name="03_engram", overrides={"ENGRAM": "0"})
    outcome = runbook.engram.run(step, echo=lambda *a, **k: None)
    assert (outcome.shown, outcome.status, outcome.record) == ({}, "passed", step.record)
    step.finish(display=False)
    assert step.run.read_record(EngramRecord) == EngramRecord(enabled=False, tp=int(step.profile.tp))
