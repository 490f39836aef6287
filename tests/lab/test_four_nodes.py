"""`make runbook PROFILE=env/lab-tp4.env` end to end (issue 39): four lab nodes on the switch (the bridge nlsw0, MTU
9000), every step for real, CPU vLLM at TP=4 with one rank per node. The lab joins worker2 and worker3 under the
running head and worker, and goes back to its two nodes at the end. One run serves every assertion."""
from __future__ import annotations

import json

import pytest

from runbook import runner
from runbook.checks import CheckList, Status
from runbook.lab import netlab
from runbook.lab.control import ensure_lab
from runbook.profile import load_profile
from runbook.remote import Cluster

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow]
PROFILE = "env/lab-tp4.env"
# the bench's repeats, levels and soak shortened (not part of the server's fingerprint): what this run proves is
# four ranks through every step, not the figures
SHORT_BENCH = {"BENCH_REPEATS": "1", "BENCH_CONCURRENCY": "1", "SOAK_SECONDS": "0", "BENCH_DECODE_TOKENS": "32",
               "BENCH_PREFILL_TOKENS": "256"}


@pytest.fixture(scope="module")
def four(lab, vllm_venv, tmp_path_factory):
    profile = load_profile(PROFILE)
    before = netlab.status(lab.lab_dir)
    try:
        run_dir, outcomes = runner.run(PROFILE, results_root=tmp_path_factory.mktemp("results"), lab_up=ensure_lab,
                                       overrides=SHORT_BENCH)
        yield profile, before, run_dir, outcomes
    finally:
        from runbook.launch import stop
        with Cluster.from_profile(profile) as cluster:
            stop.stop(cluster, profile)
        netlab.up(lab.lab_dir, nodes=2)


def _checks(run_dir, step):
    return CheckList.from_records(json.loads((run_dir.path / "steps" / f"{step}.json").read_text())["checks"])


def test_four_nodes_on_a_switch_pass_every_step_at_tp4(four, lab):
    profile, before, run_dir, outcomes = four
    assert [n.name for n in profile.nodes] == ["head", "worker", "worker2", "worker3"] and profile.tp == 4
    assert [(o.name, o.status) for o in outcomes] == [(n, "passed") for n in runner.discover_steps()], \
        [(o.name, o.status, o.error[:300]) for o in outcomes]
    st = netlab.status(lab.lab_dir)
    assert st["topology"] == "switch" and st["node_count"] == 4 and st["nodes_healthy"], st
    # worker2 and worker3 joined: the head and the worker kept their sshd (PID 1)
    assert {n: st["nodes"][n]["sshd_pid"] for n in ("head", "worker")} == \
        {n: before["nodes"][n]["sshd_pid"] for n in ("head", "worker")}
    # 01: every pair of the four through the switch, DF at MTU 9000, both ways; TCP and gloo across all ranks
    net = _checks(run_dir, "01_network")
    pings = [c for c in net if c.name.startswith("net.ping.rail0.")]
    assert len(pings) == 12 and all(c.status is Status.PASS for c in pings), [(c.name, c.observed) for c in pings]
    assert next(c for c in net if c.name == "net.switch.rail0").status is Status.PASS
    assert len([c for c in net if c.name.startswith("net.tcp.rail0.") and c.status is Status.PASS]) == 12
    # 04: four ranks, each its node's switch address, the head's the master address
    ranks = json.loads((run_dir.path / "raw/04_launch/rendered.json").read_text())["ranks"]
    assert [r["node"] for r in ranks] == ["head", "worker", "worker2", "worker3"]
    for r, rank in enumerate(ranks):
        argv = rank["serve_argv"]
        assert argv[argv.index("--nnodes") + 1] == "4" and argv[argv.index("--node-rank") + 1] == str(r)
        assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
        assert argv[argv.index("--master-addr") + 1] == "169.254.30.1"
        assert rank["env"]["VLLM_HOST_IP"] == f"169.254.30.{r + 1}"
