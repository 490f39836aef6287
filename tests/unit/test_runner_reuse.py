"""``run --only smoke`` / ``--only bench`` after a passed 04 in ANOTHER run (issue 25 item 5): the new run had no
04 record and failed in ~1 s ("no server to talk to"); it now reuses the server the earlier run's 04 launched
when its ranks still run that fingerprint and the profile renders the same one, and says why not otherwise."""
from __future__ import annotations

import json

import pytest

import runbook.launch.plan
from runbook import runner
from runbook.api.server_info import find_server
from runbook.errors import RunbookError
from runbook.evidence import RunDir
from runbook.records import LaunchRecord
from support.doubles import FakeCluster, FakeNode, NoLock, rank_node
from support.profiles import ROOT, profile_from

FP = "f" * 64


def _rank_node(name: str, rank: int, *, running: bool, fingerprint: str = FP) -> FakeNode:
    pid = 100 + rank
    ps = f"  {pid}  {pid} Sl   /v/bin/python /r/runbook/lab/vllm_cli.py serve /m\n" if running else ""
    return rank_node(name, rank, pid=pid, fingerprint=fingerprint, ps=ps)


@pytest.fixture
def earlier(tmp_path, monkeypatch):
    """An earlier run of env/lab.env whose 04 passed and whose 07 then failed (the run as a whole failed), and
    the hooks that keep the runner off the lab: no kernel check, no cluster lock, nodes from ``cluster``."""
    results = tmp_path / "results"
    run = RunDir.create("lab", results)
    run.write_sidecar("04_launch", [], {"fingerprint": FP, "base_url": "http://127.0.0.1:8000",
                                        "served_model_name": "tiny", "launch": {"reused": False}}, "passed",
                      LaunchRecord(fingerprint=FP, ranks=(), served_model_name="tiny", max_model_len=4096,
                                   base_url="http://127.0.0.1:8000"))
    run.record_step("04_launch", status="passed")
    run.record_step("07_bench", status="failed")
    run.update_manifest(status="failed")

    state = {"nodes": [_rank_node("head", 0, running=True), _rank_node("worker", 1, running=True)],
             "renders": FP, "ran": []}
    monkeypatch.setattr(runner, "check_kernel", lambda kernel: None)
    monkeypatch.setattr(runner, "ClusterLock", NoLock)
    monkeypatch.setattr(runner.Cluster, "from_profile", classmethod(lambda cls, p, **kw: FakeCluster(state["nodes"])))
    monkeypatch.setattr(runbook.launch.plan, "launch_plan",
                        lambda cluster, profile, network=None, *, site: type("Plan", (), {"fingerprint": state["renders"]})())

    from runbook.api import server_info
    monkeypatch.setattr(server_info.endpoint, "base_url", lambda p: "http://127.0.0.1:18000")   # no SSH forward

    def fake_step(name, run_dir, **kw):          # what 05 does first: find the server through 04's record
        try:
            server = find_server(profile_from("env/lab.env"), run_dir.path, api_key="")
        except RunbookError as err:
            return runner.StepRun(name, "failed", 0.0, err.what)
        state["ran"].append((name, server.source))
        return runner.StepRun(name, "passed", 0.0)
    monkeypatch.setattr(runner, "execute_step", fake_step)
    return run, results, state


def test_only_smoke_reuses_the_server_an_earlier_runs_04_launched(earlier):
    run_a, results, state = earlier
    said = []
    run_b, outcomes = runner.run(ROOT / "env/lab.env", only=["smoke"], results_root=results, echo=said.append,
                                 lab_up=None)
    assert [(o.name, o.status) for o in outcomes] == [("05_smoke", "passed")]
    assert state["ran"] == [("05_smoke", "steps/04_launch.json")]
    sidecar = run_b.read_sidecar("04_launch")
    assert sidecar["status"] == "reused" and sidecar["data"]["reused_from"] == run_a.run_id
    assert sidecar["data"]["base_url"] == "http://127.0.0.1:8000"
    assert run_b.read_record(LaunchRecord) == run_a.read_record(LaunchRecord).model_copy(
        update={"reused_from": run_a.run_id})                   # 05 finds the server through the copied record
    assert [r["status"] for r in sidecar["checks"]] == ["NO-OP"] and run_a.run_id in sidecar["checks"][0]["name"]
    manifest = json.loads((run_b.path / "manifest.json").read_text())
    assert manifest["steps"]["04_launch"]["status"] == "reused" and manifest["status"] == "passed"
    assert any(f"reusing the server run {run_a.run_id} launched" in line for line in said), said


@pytest.mark.parametrize("change,why", [
    ("gone", "the server 04_launch started is gone"),
    ("other", "runs another configuration"),
    ("renders", "the profile now renders fingerprint"),
])
def test_no_reuse_when_the_server_is_gone_or_another_configuration(earlier, change, why):
    _, results, state = earlier
    if change == "gone":
        state["nodes"][1] = _rank_node("worker", 1, running=False)
    elif change == "other":
        state["nodes"] = [_rank_node(n, i, running=True, fingerprint="e" * 64) for i, n in enumerate(("head", "worker"))]
    else:
        state["renders"] = "d" * 64
    said = []
    run_b, outcomes = runner.run(ROOT / "env/lab.env", only=["smoke"], results_root=results, echo=said.append,
                                 lab_up=None)
    assert run_b.read_sidecar("04_launch") is None
    assert (outcomes[0].status, outcomes[0].error) == ("failed", "no server to talk to") and state["ran"] == []
    assert any("not reusing the server" in line and why in line for line in said), said


def test_an_earlier_04_without_a_record_is_not_reused(earlier):
    """A 04 sidecar of a runbook older than typed records: its fingerprint is not read out of ``data`` by name;
    the run says why it does not reuse it (before: reused through data.fingerprint)."""
    run_a, results, state = earlier
    side = run_a.read_sidecar("04_launch")
    run_a.write_sidecar("04_launch", side["checks"], side["data"], side["status"])
    said = []
    run_b, outcomes = runner.run(ROOT / "env/lab.env", only=["smoke"], results_root=results, echo=said.append,
                                 lab_up=None)
    assert run_b.read_sidecar("04_launch") is None and outcomes[0].error == "no server to talk to"
    assert any("04_launch's sidecar holds no LaunchRecord" in line for line in said), said


def test_a_run_that_launches_itself_reuses_nothing(earlier):
    _, results, state = earlier
    run_b, _ = runner.run(ROOT / "env/lab.env", only=["04", "smoke"], results_root=results, echo=lambda _: None,
                          lab_up=None)
    assert run_b.read_sidecar("04_launch") is None              # the fake 04 wrote none; nothing was copied


def test_no_earlier_launch_says_so(tmp_path, earlier):
    _, _, state = earlier
    said = []
    run_b, _ = runner.run(ROOT / "env/lab.env", only=["bench"], results_root=tmp_path / "empty", echo=said.append,
                          lab_up=None)
    assert run_b.read_sidecar("04_launch") is None
    assert any("no earlier run of lab whose 04_launch passed" in line for line in said), said


def test_a_node_that_does_not_answer_means_no_reuse_not_a_crash(earlier, monkeypatch):
    from runbook.errors import RemoteError
    _, results, state = earlier

    def unreachable(cluster, profile, network=None, *, site):
        raise RemoteError("ssh: connect to host spark-worker port 22: No route to host", node="worker")
    monkeypatch.setattr(runbook.launch.plan, "launch_plan", unreachable)
    said = []
    run_b, outcomes = runner.run(ROOT / "env/lab.env", only=["smoke"], results_root=results, echo=said.append,
                                 lab_up=None)
    assert run_b.read_sidecar("04_launch") is None and outcomes[0].error == "no server to talk to"
    assert any("cannot read the nodes (ssh: connect to host" in line for line in said), said
