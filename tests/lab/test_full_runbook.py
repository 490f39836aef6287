"""`make runbook` end to end on the lab: every step, the real multi-node vLLM server, the report;
then `stop` proves teardown. One run serves every assertion here (it takes minutes on 2 cores)."""
from __future__ import annotations

import json

import pytest

from runbook import runner
from runbook.checks import CheckList, Status
from runbook.lab.control import ensure_lab
from runbook.profile import load_profile
from runbook.remote import Cluster

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow]
PROFILE = "env/lab.env"
BENCH_IN_TESTS = {"BENCH_REPEATS": "1", "SOAK_SECONDS": "10"}


@pytest.fixture(scope="module")
def two_runs(lab, tmp_path_factory, vllm_venv):
    """`make runbook` twice in a row, as a user would: the second finds the first's server up."""
    profile = load_profile(PROFILE)
    results = tmp_path_factory.mktemp("results")
    try:
        # the benchmark's repeats and soak are shortened (not part of the server's fingerprint): `make test` runs
        # after `make runbook`, which measured in full; what these runs prove is the order and the reuse
        first = runner.run(PROFILE, results_root=results, lab_up=ensure_lab, overrides=BENCH_IN_TESTS)
        second = runner.run(PROFILE, results_root=results, lab_up=ensure_lab, overrides=BENCH_IN_TESTS)
        yield profile, first, second
    finally:
        from runbook.launch import stop
        with Cluster.from_profile(profile) as cluster:
            stop.stop(cluster, profile)


@pytest.fixture(scope="module")
def full_run(two_runs):
    profile, (run_dir, outcomes), _ = two_runs
    return profile, run_dir, outcomes


def _sidecar(run_dir, step):
    return json.loads((run_dir.path / "steps" / f"{step}.json").read_text())


def test_every_step_passed(full_run):
    _, run_dir, outcomes = full_run
    assert [(o.name, o.status) for o in outcomes] == [(n, "passed") for n in runner.discover_steps()], \
        [(o.name, o.status, o.error[:300]) for o in outcomes]
    assert run_dir.manifest()["status"] == "passed"


def test_no_check_failed_and_hardware_rows_are_na(full_run):
    _, run_dir, _ = full_run
    for step in runner.discover_steps():
        checks = CheckList.from_records(_sidecar(run_dir, step)["checks"])
        assert not checks.failures(), (step, [(c.name, c.observed) for c in checks.failures()])
    network = CheckList.from_records(_sidecar(run_dir, "01_network")["checks"])
    assert {c.status for c in network if c.name in ("net.rdma.bw", "net.nccl", "net.gid")} == {Status.NA}


def test_launch_recorded_readiness_and_rendered_commands(full_run):
    _, run_dir, _ = full_run
    data = _sidecar(run_dir, "04_launch")["data"]
    assert data["base_url"].startswith("http://")
    readiness = data["launch"]["readiness_s"]
    assert set(readiness) >= {"port_open", "health", "models", "first_token"}
    assert readiness["port_open"] <= readiness["health"] <= readiness["models"] <= readiness["first_token"]
    rendered = json.loads((run_dir.path / "raw/04_launch/rendered.json").read_text())
    text = json.dumps(rendered)
    assert "--headless" in text and "--nnodes" in text and "169.254.77.1" in text
    # the first run started the ranks, then started again while they ran: exit 3, nothing relaunched
    checks = CheckList.from_records(_sidecar(run_dir, "04_launch")["checks"])
    again = [c for c in checks if c.name == "a second start while the ranks run"]
    assert len(again) == 1 and again[0].status is Status.PASS and again[0].observed.startswith("exit 3 "), again


def test_report_written_and_self_contained(full_run):
    _, run_dir, _ = full_run
    html = (run_dir.path / "report.html").read_text()
    assert "04_launch" in html and "07_bench" in html
    assert "https://" not in html and "<script src=" not in html and "<link " not in html


def test_bench_roofline_panel_with_the_tiny_models_bytes_and_the_cpu_bandwidth(full_run):
    """Issue 26 on the lab: every rank's CPU memory bandwidth before and after the bench, the tiny model's
    bytes per step from its safetensors headers, measured/ceiling per class and thinking mode, the
    reconciliation with `vllm bench serve`; all of it on the report page."""
    _, run_dir, _ = full_run
    data = _sidecar(run_dir, "07_bench")["data"]
    membw = data["membw"]
    for phase in ("before", "after"):
        assert set(membw[phase]) == {"head", "worker"}, membw
        assert all(r.get("gbs", 0) > 0 and "CPU memory bandwidth (lab)" in r["label"] for r in membw[phase].values())
    assert membw["valid"] in (True, False)
    roof = data["roofline"]
    assert roof["step"]["source"].startswith("safetensors headers of"), roof.get("error")
    assert 1e6 < roof["plain_bytes_per_rank"] < 1e8 and roof["bandwidth"] > 0
    rows = roof["rows"]
    classes = {(r["class"], r["thinking"]) for r in rows}
    assert {(c, t) for c in ("prose", "code", "structured", "tool") for t in ("off", "on")} <= classes, classes
    assert all(r["tokens_per_step"] == 1.0 and 0 < r["measured_over_ceiling"] < 1 for r in rows), rows
    html = (run_dir.path / "report.html").read_text()
    assert "Roofline: how close to the memory-bandwidth limit" in html and "CPU memory bandwidth (lab)" in html
    assert "Memory bandwidth per rank" in html
    if (data.get("vllm_cross_check") or {}).get("reconciliation"):
        assert "Protocol reconciliation" in html


def test_a_second_start_while_the_ranks_run_exits_3(two_runs):
    """The seeds' contract: `start` on running ranks is not a failure, it is exit 3 (before the stop test)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "runbook", "start", "--profile", PROFILE], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 3, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "already run" in done.stderr and "NO-OP" in done.stdout


def test_resume_finds_intact_state_while_the_server_runs(two_runs):
    profile, _, (second_dir, _) = two_runs
    # before the stop test (file order): the second run's server is the first's, reused
    assert runner.first_state_gone(profile, second_dir, runner.discover_steps()) is None


def test_stop_leaves_nothing_behind(full_run):
    profile, _, _ = full_run
    from runbook.launch import status, stop
    with Cluster.from_profile(profile) as cluster:
        result = stop.stop(cluster, profile)
        assert result.ok, result.checks.to_text()
        state = status.status(cluster, profile)
    assert state["nodes"], state
    assert {name: (n.get("running"), n.get("vllm_processes")) for name, n in state["nodes"].items()} == \
        {name: (False, []) for name in state["nodes"]}, state


def test_second_run_reuses_the_running_server(two_runs):
    _, (first_dir, first), (second_dir, second) = two_runs
    assert [o.status for o in first] and all(o.status == "passed" for o in first), first
    assert second and all(o.status == "passed" for o in second), [(o.name, o.status, o.error[:300]) for o in second]
    pre = CheckList.from_records(_sidecar(second_dir, "00_preflight")["checks"])
    noop = {c.name for c in pre if c.status is Status.NOOP}
    assert {"no stale vLLM ranks", "API port 8000 free", "master port 29501 free"} <= noop, noop
    launch = CheckList.from_records(_sidecar(second_dir, "04_launch")["checks"])
    started = [c for c in launch if c.name == "server started"]
    assert started and started[0].status is Status.NOOP and "reused" in started[0].observed, started
    first_s = sum(o.seconds for o in first)
    second_s = sum(o.seconds for o in second)
    print(f"\n[rerun] first {first_s:.1f} s, second {second_s:.1f} s ({second_s / first_s:.0%}); "
          f"per step: " + ", ".join(f"{o.name} {o.seconds:.1f}" for o in second))
    assert second_s < first_s, (first_s, second_s)


def test_resume_notices_the_server_is_gone(full_run):
    """After the stop above, a resume of the first run must not skip 04: its server is gone."""
    profile, run_dir, _ = full_run
    gone = runner.first_state_gone(profile, run_dir, runner.discover_steps())
    assert gone is not None and gone[0] == "04_launch" and "gone" in gone[1], gone
