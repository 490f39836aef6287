"""TP=3 on the embedded lab with THREE nodes (env/lab-tp3.env): bring the 3-node lab up, run the real
steps 00_preflight, 01_network, 02_weights and 04_launch through runbook.runner (results in tmp), i.e.
real CPU vLLM tensor-parallel 3 across spark-head / spark-worker / spark-worker2 over the fabric bridge,
stop every rank, then restore the 2-node lab the other lab tests expect.

The model is the TP=3-shaped tiny model (runbook/lab/tinymodel_tp3.py): the 2-node tiny model's 4 heads,
2 KV heads and 2048-token vocabulary cannot be split three ways (see docs/tp3.md for the exact refusal).
Budget: about 8 minutes on 2 cores. Timings are printed at the end (-s to see them).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from runbook import runner
from runbook.launch import render as launch
from runbook.checks import CheckList, Status
from runbook.profile import REPO_ROOT, load_profile

PROFILE = "env/lab-tp3.env"
VENV = REPO_ROOT / ".lab" / "vllm-venv"
NODES = ("head", "worker", "worker2")
STEPS = ["00_preflight", "01_network", "02_weights", "04_launch"]
TIMINGS: dict[str, object] = {}

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the netns lab needs root"),
              pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                                 reason=f"{VENV} missing: make lab-vllm installs the lab's CPU vLLM")]


def _lab_dir() -> Path:
    from runbook.lab import netlab
    return Path(os.environ.get("RUNBOOK_LAB_DIR") or netlab.DEFAULT_LAB_DIR)


def _stop_all(profile) -> None:
    from runbook.launch import server
    from runbook.remote import Cluster
    with Cluster.from_profile(profile) as cluster:
        res = server.stop(cluster, profile, mem_settle_s=0)
    TIMINGS["stop"] = {n: i.get("stop_s") for n, i in res.per_node.items()}
    assert res.ok, res.checks.to_text()


@pytest.fixture(scope="module")
def lab3():
    from runbook.lab import control, netlab
    t0 = time.monotonic()
    info = netlab.up(_lab_dir(), nodes=3)
    TIMINGS["lab_up_3_nodes_s"] = round(time.monotonic() - t0, 1)
    assert [n.alias for n in info.nodes] == ["spark-head", "spark-worker", "spark-worker2"]
    try:
        yield info
    finally:
        try:
            _stop_all(load_profile(REPO_ROOT / PROFILE))
        finally:
            t0 = time.monotonic()
            control.stop_hub()
            netlab.down(_lab_dir())
            netlab.up(_lab_dir(), nodes=2)             # the 2-node lab the rest of the suite expects
            TIMINGS["restore_2_nodes_s"] = round(time.monotonic() - t0, 1)
            print("\n[tp3 lab timings] " + json.dumps(TIMINGS, indent=1))


def _checks(run_dir, step: str) -> CheckList:
    return CheckList.from_records(json.loads((run_dir.path / f"steps/{step}.json").read_text())["checks"])


def test_tp3_on_three_lab_nodes(lab3, tmp_path):
    from runbook.lab.control import ensure_lab
    profile = load_profile(REPO_ROOT / PROFILE)
    t0 = time.monotonic()
    run_dir, outcomes = runner.run(PROFILE, only=STEPS, results_root=tmp_path, lab_up=ensure_lab)
    TIMINGS["runner_total_s"] = round(time.monotonic() - t0, 1)
    manifest = json.loads((run_dir.path / "manifest.json").read_text())
    TIMINGS["steps_s"] = {k: round(v["end"] - v["start"], 1) for k, v in manifest["steps"].items()
                          if v.get("end") and v.get("start")}
    assert [(o.name, o.status) for o in outcomes] == [(s, "passed") for s in STEPS], \
        "\n".join(f"{o.name}: {o.status} {o.error}" for o in outcomes)

    # 00: every node reachable, ssh over the fabric in all six directions
    pre = {(c.name, c.node): c for c in _checks(run_dir, "00_preflight")}
    assert pre[("ssh reachable", "worker2")].observed == "hostname spark-worker2"
    fabric = [c for (name, _), c in pre.items() if name.startswith("ssh ") and "over fabric" in name]
    assert len(fabric) == 6 and all(c.status is Status.PASS for c in fabric)

    # 01: one rail (the bridge) with all three nodes; ping and TCP both ways for every pair
    net = _checks(run_dir, "01_network")
    pings = {c.name for c in net if c.name.startswith("net.ping.rail0.")}
    assert pings == {f"net.ping.rail0.{a}->{b}" for a in NODES for b in NODES if a != b}
    tcp = {c.name: c.data.get("gbps") for c in net if c.name.startswith("net.tcp.rail0.")}
    assert len(tcp) == 6
    TIMINGS["tcp_gbps"] = tcp

    # 02: the weights reached both workers, byte-identical
    w = _checks(run_dir, "02_weights")
    assert [c.status for c in w if c.name == "weights.parity"] == [Status.PASS, Status.PASS]

    # 04: real TP=3 across the three nodes, workers started first
    sidecar = json.loads((run_dir.path / "steps/04_launch.json").read_text())
    data = sidecar["data"]["launch"]
    TIMINGS["readiness_s"] = data["readiness_s"]
    TIMINGS["head_started_s"] = data["head_started_s"]
    TIMINGS["first_token"] = [data["first_token_text"], data["first_token_latency_s"]]
    assert data["readiness_s"]["first_token"] is not None
    startup = data["startup_log"]
    for rank, node in enumerate(NODES):
        world = startup[node]["world"]
        assert world and (world["world_size"], world["rank"]) == (3, rank), (node, world)
    assert startup["worker2"]["headless_master"] == "169.254.77.1:29501"
    TIMINGS["kv_tokens_head"] = startup["head"]["kv_tokens"]
    plan = launch.render(profile)
    assert [plan.rank(n).env["VLLM_CPU_OMP_THREADS_BIND"] for n in NODES] == ["0", "1", "1"]
