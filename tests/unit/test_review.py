"""The offline review (issue #22 item 4): `python -m runbook render --profile P` prints every command each step would
run on every node, in order, with SSH (and any network) impossible, secrets masked."""
from __future__ import annotations

import re
import socket
import subprocess

import pytest

from runbook import cli, review
from runbook.profile import REPO_ROOT, load_profile


@pytest.fixture
def no_network(monkeypatch):
    """Every way out refused: fabric's Connection.open, sockets, an ssh subprocess (the API's SSH forward)."""
    import fabric

    def refuse(*a, **k):
        raise AssertionError("the offline review tried to reach the network")

    monkeypatch.setattr(fabric.Connection, "open", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    popen = subprocess.Popen

    def no_ssh(args, *a, **k):
        first = args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]
        if str(first).endswith("ssh"):
            refuse()
        return popen(args, *a, **k)

    monkeypatch.setattr(subprocess, "Popen", no_ssh)


@pytest.mark.parametrize("name", ["exl3-v41", "dspark-v4", "tp3-dspark", "tp4-v41"])
def test_render_prints_every_steps_commands_offline(name, no_network, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_API_KEY", "sk-review-secret-0123456789")
    monkeypatch.setenv("HF_TOKEN", "hf_reviewsecret0123456789")
    assert cli.main(["render", "--profile", f"env/{name}.env", "--home", "/home/ops"]) == 0
    text = capsys.readouterr().out
    profile = load_profile(REPO_ROOT / "env" / f"{name}.env")
    sections = re.findall(r"^## (\d\d_\w+)$", text, re.MULTILINE)
    assert sections == [s for s, _ in review.STEPS]
    nodes = [n.name for n in profile.nodes]
    launch = text.split("## 04_launch", 1)[1].split("## 07_bench", 1)[0]
    entries = re.split(r"\n(?=\[\w+\] \[(?:read|run)\] )", launch)        # a command may span lines
    order = []
    for rank, node in enumerate(nodes):
        # the rendered vllm serve of every rank (in the plan) and its start command, recorded not run
        start = [e for e in entries if e.startswith(f"[{node}] [run] ") and "docker run -d" in e]
        assert len(start) == 1, node
        order.append(entries.index(start[0]))
        assert f"--node-rank {rank}" in start[0] and " serve " in start[0]
        assert "/home/ops/" in start[0]                            # ~ expanded with --home
    assert order == sorted(order, reverse=True)                             # workers first, the head last
    network = text.split("## 01_network", 1)[1].split("## 02_weights", 1)[0]
    assert all(f"[{n}] [read] ip -j addr show" in network for n in nodes)
    # with the fabric declared as the profile describes it, the traffic tests show too: ping, iperf3, perftest,
    # and nccl-tests with the GID setting the ranks get (unset under recipe B)
    for tool in ("ping -M do", "iperf3 -s", "ib_write_bw -d", "mpirun "):
        assert tool in network, tool
    mpirun = next(l for l in network.splitlines() if re.search(r"timeout \d+ mpirun ", l))
    assert ("NCCL_IB_GID_INDEX=3" in mpirun) == (profile.recipe == "exl3-v41")
    weights = text.split("## 02_weights", 1)[1].split("## 03_engram", 1)[0]
    assert f"node_download.py --repo {profile.hf_model_repo} --revision {profile.hf_revision}" in weights
    if profile.engram:                                   # recipe A: the Engram source is fetched in 02 too
        assert f"node_download.py --repo {profile.hf_engram_repo} --revision {profile.hf_engram_revision}" in weights
    if profile.weight_sync == "nfs":                     # the kernel NFS share, past the unanswered sudo probe
        assert "[head] [run] sudo -n exportfs -ra" in weights and "sudo -n mount -t nfs4" in weights
        assert f"{profile.worker_ip}(ro,sync,no_subtree_check,root_squash)" in weights
    assert "docker image inspect" in launch
    assert "sk-review-secret" not in text and "hf_reviewsecret" not in text
    head_start = next(e for e in entries if e.startswith("[head] [run] ") and "docker run -d" in e)
    assert "read -r VLLM_API_KEY" in head_start                             # the key by name, from stdin
    assert "no node is contacted" in text


def test_an_offline_node_never_connects():
    from runbook.errors import RemoteError
    from runbook.remote import Cluster, CommandLog
    profile = load_profile(REPO_ROOT / "env" / "dspark-v4.env")
    log = CommandLog(None)
    cluster = Cluster.offline(profile, facts={"head": {"hostname": "spark1\n"}}, log=log)
    assert cluster.head.read("hostname").stdout == "spark1\n"
    assert not cluster.worker.read("hostname").ok                       # undeclared: unknown, not run
    assert cluster.head.run("rm -rf /x").dry_run
    with pytest.raises(RemoteError, match="never connected"):
        cluster.head._connection()
    assert [e["kind"] for e in log.entries] == ["read", "read", "run"]
