"""The typed records between steps (``runbook.records``): what step 01 and step 04 leave for the later steps, written
with the sidecar and read back through their types; a missing or older-format record is an error naming the step
to re-run; one table of steps."""
from __future__ import annotations

import contextlib

import pytest
from support.doubles import res
from support.fake_vllm import make_step
from support.net import fx
from test_network_step import lab_cluster, lab_profile, spark_cluster, spark_profile

from runbook.benchmark.roofline_panel import allreduce_latency
from runbook.evidence import discover_steps
from runbook.network import verify as network
from runbook.records import (LAUNCH, NETWORK, STEPS, FabricEnd, FabricRail, LaunchRank, LaunchRecord, NetworkRecord,
                             RecordError, step_info)
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
    net = network.verify_network(spark_profile(), spark_cluster(), None)
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
    rec = network.verify_network(lab_profile(VLLM_BIN="/opt/lab/vllm-venv/bin/vllm"), cluster, None).record
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
    assert rec.fingerprint == outcome.plan.fingerprint and len(rec.fingerprint) == 64
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
    why = runbook.launch.state_left(profile_from("env/lab.env"), cluster, old)
    assert why.startswith("04_launch's sidecar holds no LaunchRecord") and "re-run 04_launch" in why
    assert all(not n.calls for n in cluster.nodes)
