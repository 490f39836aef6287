"""``python -m runbook start`` starts the plan step 04 starts: with ``<NODE>_GID=auto`` a start outside a run
resolves each node's GID index from its RoCE GID table as 01_network does, so both render one fingerprint
(before, the command rendered without GID indexes and computed another one)."""
from __future__ import annotations

import pytest
from support.doubles import FakeCluster, FakeNode, NoLock, res
from test_network_step import spark_rules           # the two-rail Spark nodes' answers (GID 3 on both)

import runbook.launch
import runbook.remote
from runbook import cli
from runbook.launch.plan import launch_plan, render_plan
from runbook.network.verify import verify_network
from runbook.profile import REPO_ROOT, load_profile

HCAS = "rocep1s0f0,roceP2p1s0f0"
SPARK = {"HEAD_GID": "auto", "WORKER_GID": "auto", "HEAD_IP": "192.168.100.1", "WORKER_IP": "192.168.100.2",
         "HEAD_CX7_IF": "enp1s0f0np0", "WORKER_CX7_IF": "enp1s0f0np0", "HEAD_CX7_IB": HCAS, "WORKER_CX7_IB": HCAS}


@pytest.fixture
def spark(monkeypatch):
    """Recipe A's shipped profile on the fixtures' two Sparks, both GIDs ``auto``; an API key in the
    environment (nothing is generated into a secrets file)."""
    monkeypatch.setenv("VLLM_API_KEY", "test-key-start-fingerprint")
    profile = load_profile(REPO_ROOT / "env" / "exl3-v41.env", overrides=SPARK)
    plan_facts = [(r'^printf %s "\$HOME"$', res(0, "/home/spark")), (r"^test -s ", res(1))]
    nodes = [FakeNode(spec=spec, read_only=True,
                      rules=plan_facts + spark_rules(spec.name, gids=f"gids_{spec.name}_gid3.tsv"))
             for spec in profile.nodes]
    return profile, FakeCluster(nodes)


def test_start_outside_a_run_renders_step_04s_fingerprint(spark, monkeypatch):
    profile, cluster = spark
    net = verify_network(cluster, profile, traffic=False)               # what 01_network records
    assert net.record.gid_index == {"head": 3, "worker": 3}
    step_04 = launch_plan(cluster, profile, net.record)

    started = []
    monkeypatch.setattr(cli, "_server_cluster", lambda args: (profile, cluster))

    monkeypatch.setattr(runbook.remote, "ClusterLock", NoLock)   # the read-only node double refuses its mkdir
    monkeypatch.setattr(runbook.launch, "bring_up",
                        lambda cluster, profile, plan, **kw: started.append(plan) or runbook.launch.LaunchOutcome(plan))
    assert cli.main(["start", "--profile", str(profile.source)]) == 1           # nothing started (the double)
    assert len(started) == 1
    assert started[0].fingerprint == step_04.fingerprint
    assert {r.env.get("NCCL_IB_GID_INDEX") for r in step_04.ranks} == {"3"}
    # the check can fail: rendered without the GID indexes (the old `start`), the fingerprint differs
    assert render_plan(cluster, profile).fingerprint != step_04.fingerprint
