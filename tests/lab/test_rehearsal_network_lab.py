"""Rehearsal of 00_preflight and 01_network on the embedded lab for env/exl3-v41.env (2 nodes) and
env/tp3-dspark.env (3 nodes), through runbook.runner exactly as `python -m runbook run --rehearse` runs them
(the substitutions of runbook.lab.rehearsal; results in tmp).

What it proves on the real lab: the simulators are installed on every node's private /mnt/nvme, every node
command carries the rehearsal PATH prefix, each rank of nccl-tests is started on its own node over the fabric
(ssh) and accepted there with its own NCCL_SOCKET_IFNAME / NCCL_IB_HCA / GID index, perftest's TCP exchange
crosses the fabric, and every row read from a simulator says SIMULATED while ping / iperf3 / ethtool / the
gloo sweep stay real PASS rows.

Rows that fail: none, except where the published DGX Spark figures the simulators print cannot meet the
profile's own thresholds (one twin per node: 92.57 Gb/s of RDMA, 12.25 GB/s of NCCL busbw). Those rows are
computed from the figures and the profile below, so the test asserts "no FAIL" once the profile's
MIN_RDMA_GBPS_TOTAL / MIN_NCCL_BUSBW_GBS match its cabling.
Budget: about 2 minutes per profile on 2 cores, plus the 3-node lab and the 2-node restore for tp3.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from runbook import runner
from runbook.checks import CheckList, Status
from runbook.lab import sim
from runbook.lab.rehearsal import load_rehearsal
from runbook.profile import REPO_ROOT
from runbook.remote import REHEARSAL_SIM_DIR, Cluster

VENV = REPO_ROOT / ".lab" / "vllm-venv"       # the gloo sweep of 01 runs with the lab vLLM venv's torch
pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0, reason="the netns lab needs root"),
              pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                                 reason=f"{VENV} missing: make lab-vllm installs the lab's CPU vLLM")]
STEPS = ["00_preflight", "01_network"]
SIM_PREFIXES = ("net.gid", "net.tools", "net.rdma.", "net.nccl.")
REAL_PREFIXES = ("net.ping.", "net.tcp.", "net.link.", "net.mtu.", "net.allreduce")


def _lab_dir() -> Path:
    from runbook.lab import netlab
    return Path(os.environ.get("RUNBOOK_LAB_DIR") or netlab.DEFAULT_LAB_DIR)


def _checks(run_dir, step: str) -> CheckList:
    return CheckList.from_records(json.loads((run_dir.path / f"steps/{step}.json").read_text())["checks"])


def _threshold_findings(profile, checks: CheckList) -> set[tuple[str, str]]:
    """Rows the published figures cannot meet under this profile's thresholds (see the module docstring)."""
    used = min(len(n.ib_devs) for n in profile.nodes)
    rdma = sim.FIGURES["rdma_gbps"]["rocep1s0f0"]
    busbw = sim.FIGURES["nccl_busbw_gbs"][str(min(used, 2))]
    out = set()
    if rdma < profile.min_rdma_gbps_total:
        out |= {(c.name, c.node) for c in checks if c.name.startswith("net.rdma.bw.total.")}
    if busbw < profile.min_nccl_busbw_gbs:
        out.add(("net.nccl.busbw", "cluster"))
    return out


def _rehearse(path: str, tmp_path: Path):
    profile, overrides, subs = load_rehearsal(REPO_ROOT / path)
    t0 = time.monotonic()
    run_dir, outcomes = runner.run(REPO_ROOT / path, only=STEPS, overrides=overrides, results_root=tmp_path,
                                   lab_up=None, rehearsal=[s.to_dict() for s in subs])
    print(f"\n[rehearsal {path}] 00+01 in {time.monotonic() - t0:.0f} s: "
          + ", ".join(f"{o.name}={o.status}" for o in outcomes))
    pre, net = _checks(run_dir, "00_preflight"), _checks(run_dir, "01_network")
    print(pre.to_text() + "\n" + net.to_text())
    return profile, run_dir, outcomes, pre, net


def _assert_rehearsal(profile, run_dir, outcomes, pre: CheckList, net: CheckList) -> None:
    names = [n.name for n in profile.nodes]
    # 00: simulators installed on every node, the GPU row simulated on every node, nothing failed
    assert outcomes[0].name == "00_preflight" and outcomes[0].status == "passed", outcomes[0].error
    assert not pre.failures(), pre.to_text()
    installed = {c.node: c for c in pre if c.name == "rehearsal simulators"}
    assert sorted(installed) == sorted(names)
    assert all(c.status in (Status.PASS, Status.NOOP) for c in installed.values())
    gpu = {c.node: c for c in pre if c.name == "GPU present"}
    assert sorted(gpu) == sorted(names)
    assert all(c.status is Status.SIMULATED and "NVIDIA GB10" in c.observed for c in gpu.values())

    # 01: hardware rows simulated (or a threshold finding), real rows real
    findings = _threshold_findings(profile, net)
    assert {(c.name, c.node) for c in net.failures()} == findings, net.to_text()
    assert outcomes[1].status == ("failed" if findings else "passed")
    hw = [c for c in net if c.name.startswith(SIM_PREFIXES)]
    assert hw
    for c in hw:
        assert c.status is not Status.PASS, (c.name, c.node)
        assert c.status in (Status.SIMULATED, Status.FAIL, Status.WARN), (c.name, c.status)
        assert "[simulated:" in c.observed, (c.name, c.observed)
    for prefix in ("net.gid", "net.tools", "net.rdma.bw.rail0.", "net.rdma.lat.", "net.nccl.transport", "net.nccl.hcas"):
        assert any(c.name.startswith(prefix) and c.status is Status.SIMULATED for c in net), prefix
    real = [c for c in net if c.name.startswith(REAL_PREFIXES)]
    assert real and all(c.status is Status.PASS for c in real), [(c.name, c.status) for c in real]
    hcas = {c.node: c for c in net if c.name == "net.nccl.hcas"}
    assert sorted(hcas) == sorted(names)
    for node in profile.nodes:
        assert all(h in hcas[node.name].observed for h in node.ib_devs), hcas[node.name].observed

    # every rank ran on its own node: nccl-tests lists one host per rank; each NET/IB line is that node's HCAs
    text = (run_dir.path / "raw/01_network/nccl_all_reduce_perf.txt").read_text()
    for rank, node in enumerate(profile.nodes):
        assert f"Rank  {rank} Group  0" in text and f"on spark-{node.name}" in text
    # the commands ran with the rehearsal PATH prefix (recorded) and mpirun got per-rank environments
    cmds = [json.loads(line) for line in (run_dir.path / "commands.jsonl").read_text().splitlines()]
    mpirun = [c for c in cmds if "mpirun" in c["command"] and "all_reduce_perf" in c["command"]]
    assert mpirun and mpirun[-1]["command"].startswith(f'export PATH={REHEARSAL_SIM_DIR}/bin:"$PATH"; ')
    for node in profile.nodes:
        assert f"NCCL_IB_HCA={','.join(node.ib_devs)}" in mpirun[-1]["command"]

    # each node's private /mnt/nvme holds its own simulated Spark
    with Cluster.from_profile(profile) as cluster:
        for node in cluster.nodes:
            cfg = json.loads(node.read(f"cat {sim.SIM_DIR}/node.json", timeout=20).stdout)
            assert cfg["node"] == node.name and cfg["hostname"] == f"spark-{node.name}"
            up = {h["name"] for h in cfg["hcas"] if h["up"]}
            assert up == set(node.spec.ib_devs)


def test_rehearsal_exl3_v41_preflight_and_network(lab, tmp_path):
    profile, run_dir, outcomes, pre, net = _rehearse("env/exl3-v41.env", tmp_path)
    _assert_rehearsal(profile, run_dir, outcomes, pre, net)
    # recipe A: one rail, head rocep1s0f1 <-> worker rocep1s0f0, pinned GID 3 on both
    assert {c.node: c.data.get("pinned") for c in net if c.name == "net.gid"} == {"head": 3, "worker": 3}


@pytest.fixture()
def lab3():
    from runbook.lab import control, netlab
    info = netlab.up(_lab_dir(), nodes=3)
    assert [n.alias for n in info.nodes] == ["spark-head", "spark-worker", "spark-worker2"]
    try:
        yield info
    finally:
        control.stop_hub()
        netlab.down(_lab_dir())
        netlab.up(_lab_dir(), nodes=2)             # the 2-node lab the rest of the suite expects


def test_rehearsal_tp3_dspark_preflight_and_network(lab3, tmp_path):
    profile, run_dir, outcomes, pre, net = _rehearse("env/tp3-dspark.env", tmp_path)
    _assert_rehearsal(profile, run_dir, outcomes, pre, net)
    # seed B TP3: the head lists both CX ports, each worker its facing one
    hcas = {c.node: c.observed for c in net if c.name == "net.nccl.hcas"}
    assert "rocep1s0f0" in hcas["head"] and "rocep1s0f1" in hcas["head"]
