"""One NCCL environment for the serving ranks and step 01's nccl-tests (facts.nccl.nccl_env).

Step 01 used to pass nccl-tests only NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_DISABLE and the GID index, so
TP=3 ran without the ranks' NCCL_IB_MERGE_NICS=0 / NCCL_IB_SUBNET_AWARE_ROUTING=1 / NCCL_IB_SUBNET_PREFIX_LEN=24
(and without NCCL_CROSS_NIC, NCCL_IB_ADDR_FAMILY, NCCL_IB_ROCE_VERSION_NUM, seed A's buffer settings): 01 could
fail on a healthy mesh or pass with a configuration the serve never uses. These tests compare, for every shipped
profile, each rank's NCCL_* variables as launch renders them with what nccl-tests' mpirun line gives that node.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from runbook.facts import nccl as fn
from runbook.launch.render import NodeFacts, render
from runbook.network import collectives
from runbook.profile import load_profile
from runbook.review import review

ROOT = Path(__file__).resolve().parents[2]
PROFILES = sorted((ROOT / "env").glob("*.env"))


def nccl_of(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("NCCL_")}


def mpirun_apps(cmd: str) -> dict[str, dict[str, str]]:
    """mpirun line -> {host: the ``-x K=V`` of its app context}."""
    argv = shlex.split(cmd[cmd.index("mpirun"):])
    apps, cur, host = {}, {}, ""
    for i, a in enumerate(argv):
        if a == ":":
            apps[host], cur = cur, {}
        elif a == "-H":
            host = argv[i + 1].split(":", 1)[0]
        elif a == "-x" and "=" in argv[i + 1]:
            k, v = argv[i + 1].split("=", 1)
            cur[k] = v
    apps[host] = cur
    return apps


def launch_envs(text: str, profile) -> dict[str, dict[str, str]]:
    """The review's ``docker run -d`` of each rank -> {node: its ``-e`` NCCL variables}; the rank's node is the one
    whose address its ``VLLM_HOST_IP`` is (seed B names every rank's container alike)."""
    by_ip = {n.host_ip: n.name for n in profile.nodes}
    out: dict[str, dict[str, str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        if "docker run" not in line or " -d " not in line:
            continue
        try:
            argv = shlex.split(line[line.index("docker run"):])
        except ValueError:          # a probe's multi-line script, not a rank
            continue
        env = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv[:-1]) if a == "-e" and "=" in argv[i + 1])
        node = by_ip.get(env.get("VLLM_HOST_IP", ""))
        if node is not None:
            out[node] = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    return out


@pytest.mark.parametrize("gid", [3, None])
def test_every_profile_nccl_tests_rank_gets_the_serving_ranks_nccl_environment(gid):
    assert PROFILES, "no shipped profile under env/"
    seen = 0
    for path in PROFILES:
        profile = load_profile(path)
        plan = render(profile, {n.name: NodeFacts(home="/home/spark", gid_index=gid) for n in profile.nodes})
        ranks = [collectives.nccl_rank(profile, spec, gid_index=gid, tests_dir="/opt/nccl-tests/build")
                 for spec in profile.nodes]
        assert len(ranks) == len(profile.nodes) >= 2
        apps = mpirun_apps(collectives.nccl_tests_cmd(ranks, mpi_include=["10.0.0.0/24"]))
        for spec, rank in zip(profile.nodes, ranks):
            served = nccl_of(plan.rank(spec.name).env)
            assert served and rank.env == served, (path.name, spec.name)
            assert apps[str(spec.fabric_ip)] == {**served, **fn.NCCL_TESTS_DIAG}, (path.name, spec.name)
            seen += 1
    assert seen >= 2 * len(PROFILES)


def test_tp3_nccl_tests_carry_the_ranks_subnet_routing():
    profile = load_profile(ROOT / "env" / "tp3-dspark.env")
    ranks = [collectives.nccl_rank(profile, spec, gid_index=None, tests_dir="t") for spec in profile.nodes]
    cmd = collectives.nccl_tests_cmd(ranks, mpi_include=["192.168.1.0/24"])
    assert " mpirun --tag-output " in cmd
    apps = mpirun_apps(cmd)
    assert len(apps) == 3
    for env in apps.values():
        assert {k: env.get(k) for k in ("NCCL_IB_MERGE_NICS", "NCCL_IB_SUBNET_AWARE_ROUTING",
                                        "NCCL_IB_SUBNET_PREFIX_LEN", "NCCL_CROSS_NIC", "NCCL_IB_ADDR_FAMILY",
                                        "NCCL_IB_ROCE_VERSION_NUM")} == {
            "NCCL_IB_MERGE_NICS": "0", "NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_SUBNET_PREFIX_LEN": "24",
            "NCCL_CROSS_NIC": "1", "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ROCE_VERSION_NUM": "2"}
        assert env["NCCL_IB_HCA"] == "rocep1s0f0,rocep1s0f1" and "NCCL_IB_GID_INDEX" not in env


def test_mesh_routing_is_a_property_of_the_topology_not_of_tp3():
    """Two nodes share one cable and four on a switch share one /24 (no routing knobs); the triangle and a
    switchless ring are a mesh of /24s: every node gets them."""
    two = load_profile(ROOT / "env" / "dspark-v4.env")
    three = load_profile(ROOT / "env" / "tp3-dspark.env")
    assert not any("NCCL_IB_SUBNET_AWARE_ROUTING" in e for e in fn.nccl_envs(two).values())
    envs = fn.nccl_envs(three)
    assert three.topology == "triangle" and list(envs) == ["head", "worker", "worker2"]
    assert all(e["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1" for e in envs.values())
    four = {"NNODES": "4", "TP": "4", "WEIGHT_SYNC": "rsync", "BOOTSTRAP_IF": "", "HEAD_BOOTSTRAP_IP": "",
            "WORKER_BOOTSTRAP_IP": "", "WORKER2_BOOTSTRAP_IP": ""}
    for rank, name in enumerate(("HEAD", "WORKER", "WORKER2", "WORKER3")):
        four[f"{name}_IP"] = f"10.0.40.{rank + 1}"
        four[f"{name}_CX7_IF"] = "enp1s0f0np0"
        four[f"{name}_CX7_IB"] = "rocep1s0f0"
    four["WORKER3_SSH"] = "spark4"
    switch = load_profile(ROOT / "env" / "tp3-dspark.env", overrides=four)
    assert switch.topology == "switch" and len(fn.nccl_envs(switch)) == 4     # no BOOTSTRAP_IF needed on a switch
    assert not any("NCCL_IB_SUBNET_AWARE_ROUTING" in e for e in fn.nccl_envs(switch).values())


def test_the_reviewed_mpirun_line_and_the_reviewed_ranks_agree():
    """End to end on the offline review's own text: step 01's mpirun line and step 04's docker run lines."""
    checked = []
    for path in PROFILES:
        profile = load_profile(path)
        text = review(path, home="/home/spark")
        mp = [line for line in text.splitlines() if "] [read] timeout " in line and " mpirun " in line]
        if not mp:          # no GPU or no RDMA: nccl-tests is N/A on this profile
            continue
        apps = mpirun_apps(mp[0])
        ranks = launch_envs(text, profile)
        assert set(ranks) == {n.name for n in profile.nodes}, path.name
        for spec in profile.nodes:
            got = dict(apps[str(spec.fabric_ip)])
            for k in fn.NCCL_TESTS_DIAG:
                got.pop(k)
            want = {k: v for k, v in ranks[spec.name].items() if k not in fn.NCCL_TESTS_DIAG}
            assert got == want, (path.name, spec.name)
        checked.append(path.name)
    assert {"exl3-v41.env", "dspark-v4.env", "tp3-dspark.env"} <= set(checked)
