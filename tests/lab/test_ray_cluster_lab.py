"""EXECUTOR=ray for real up to `ray status`: the launch's own Ray commands (render → ``launch.ray_cluster``) on three
bare network-namespace nodes on a switch (``lab.switchlab``, prefix ``ray``, 10.80.0.0/24: never the embedded lab),
with PyPI's Ray (``make lab-ray``: <repo>/.lab/ray-site) run by the lab venv's python. Only read-only status and
logs and the Ray stop run here: the launcher's full ``stop`` also ends vLLM processes it finds in the node's process
table, and these namespaces share this host's, where the embedded lab's ranks may run.

Serving through Ray on the lab (with the lab-only substitution runbook/lab/ray_cpu_site) is proven by the runbook's
own run of env/lab-ray.env (docs/four-nodes.md, "Ray serving on the lab": about 8 minutes, too long for a test);
here: a worker that cannot reach the head is named after the timeout, then every node joins with its GPU, the node
table names them, and the stop leaves no Ray process. Needs root, the lab venv and the Ray site; about
1 GiB and a minute.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from runbook.facts import ray as ray_facts
from runbook.lab import switchlab, vllm_lab
from runbook.launch import ray_cluster, status
from runbook.remote import Cluster, CommandLog
from runbook.launch.render import LAB_RAY_SITE, NodeFacts, render
from runbook.profile import REPO_ROOT, load_profile

# own_netns: its switch is its own (10.80.0.0/24), so `make test` runs it beside the lab group, not in it
pytestmark = [pytest.mark.vllm, pytest.mark.own_netns]

VENV = vllm_lab.lab_vllm_venv()
RAY_SITE = REPO_ROOT / LAB_RAY_SITE
NAMES = ["head", "worker", "worker2"]


@pytest.fixture
def switch():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not (VENV / "bin" / "python").exists() or not (RAY_SITE / "bin" / "ray").exists():
        pytest.skip(f"needs the lab venv ({VENV}) and Ray ({RAY_SITE}): make lab-ray")
    sw = switchlab.Switch("ray", "10.80.0")
    switchlab.up(sw, len(NAMES))
    try:
        yield sw
    finally:
        switchlab.down(sw)
        for n in NAMES:
            shutil.rmtree(ray_facts.temp_dir(n), ignore_errors=True)


def _plan(sw, tmp_path):
    ov = {"EXECUTOR": "ray", "RECIPE_REPO": "", "RECIPE_COMMIT": "", "RECIPE_DIR": "",
          "BOOTSTRAP_IF": "", "VLLM_BIN": f"{VENV}/bin/python runbook/lab/vllm_cli.py"}
    for k, n in enumerate(NAMES, start=1):
        ov[f"{n.upper()}_IP"] = sw.node_ip(k)
        ov[f"{n.upper()}_CX7_IF"] = switchlab.NODE_PORT
        ov[f"{n.upper()}_BOOTSTRAP_IP"] = ""
    profile = load_profile(REPO_ROOT / "env" / "lab-tp3.env", ov)
    plan = render(profile, {n: NodeFacts(home=str(tmp_path / n)) for n in NAMES})
    nodes = {n: switchlab.NetnsNode(sw, k, n, home=str(tmp_path / n), spec=profile.node(n)) for k, n in enumerate(NAMES, start=1)}
    return profile, plan, nodes


def _ns_pids(sw) -> list[str]:
    return [p for k in range(1, len(NAMES) + 1)
            for p in subprocess.run(["ip", "netns", "pids", sw.netns(k)], capture_output=True, text=True).stdout.split()]


def test_ray_cluster_names_a_worker_that_never_joined_then_comes_up_with_every_node_and_stops(switch, tmp_path):
    sw = switch
    profile, plan, nodes = _plan(sw, tmp_path)
    # worker2's switch port down: its `ray start` cannot reach the head's GCS
    subprocess.run(["ip", "link", "set", sw.port(3), "down"], check=True)
    up = ray_cluster.start_cluster(nodes, plan, timeout=60)
    assert [c.name for c in up.checks] == [ray_cluster.GCS_ROW, ray_cluster.JOIN_ROW], [c.observed for c in up.checks]
    row = up.checks[1]
    # (the healthy worker joins too, unless this shared machine is too slow for it within the timeout)
    assert row.failed and row.data["missing"][-1:] == ["worker2"] and row.data["joined"][:1] == ["head"]
    assert "never joined: " in row.observed and "worker2" in row.observed and "worker2" in row.fix
    rows = ray_cluster.stop_cluster(nodes, plan, grace=10)
    assert not any(c.failed for c in rows), [(c.node, c.observed) for c in rows]
    assert not _ns_pids(sw), "a Ray process outlived the stop"

    subprocess.run(["ip", "link", "set", sw.port(3), "up"], check=True)
    up = ray_cluster.start_cluster(nodes, plan, timeout=120)
    print(f"\n[ray] {up.seconds} {[c.observed for c in up.checks]}")
    assert up.ok, [c.observed for c in up.checks]
    assert up.status.joined(NAMES) == NAMES and up.status.gpus == len(NAMES) and len(up.status.active) == 3
    table, text = ray_cluster.node_table(nodes, plan)
    assert table.complete(NAMES), text
    # what `status` and `logs` show (read-only; the launcher's own functions over these nodes)
    cluster = Cluster(list(nodes.values()), log=CommandLog(None))
    ray = status.ray_table(cluster, profile)
    assert ray["joined"] == NAMES and not ray["missing"] and ray["gpus"] == 3
    assert "ray: 3 active node(s), 3 GPU; joined: head, worker, worker2" in status.table({"nodes": {}, "ray": ray})
    logs = status.logs(cluster, profile, "worker", tail_lines=20)
    assert "==> Ray on worker <==" in logs and f"==> {ray_facts.logs_dir('worker')}/raylet.out <==" in logs
    assert "Ray runtime started" in logs or "Local node IP" in logs, logs[-2000:]
    rows = ray_cluster.stop_cluster(nodes, plan, grace=15)
    assert [c.node for c in rows] == NAMES and not any(c.failed for c in rows), [c.observed for c in rows]
    assert not _ns_pids(sw), "a Ray process outlived the stop"
