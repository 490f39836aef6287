"""`make rehearse` on a larger lab, then `make runbook`: the lab run finds the rehearsal's ranks on the lab's head and
stops them on the nodes the lab has now. Seen 2026-12-06: after `make rehearse PROFILE=env/tp4-v41.env` (four nodes)
`make runbook` (two) failed its preflight on the rehearsal's ranks, because only recipes of the lab profile's own node
count were asked."""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from runbook import runner
from runbook.facts import ranks
from runbook.profile import REPO_ROOT, load_profile


class _Cluster:
    """Stands for Cluster.from_profile: its head is the profile's head name; nothing else is reachable."""

    def __init__(self, profile):
        self.profile = profile
        self.head = ("head-of", Path(profile.source).name)

    def __getattr__(self, name):
        raise AssertionError(f"the set-aside asked the cluster for {name!r}")


def _run(monkeypatch, running: str):
    """The lab's run on env/lab.env while ``running`` (a recipe profile's file name) holds the lab's head."""
    stopped: list[tuple[str, list[str] | None]] = []
    asked: list[str] = []

    def rank_state(node, profile, home=None):
        kind, source = node
        assert kind == "head-of", node
        asked.append(source)
        if source == "lab.env":
            return ranks.RankState(node="head", processes=["13168 vllm_cli.py serve /model"])   # not ours
        rehearsed_here = source == running
        return ranks.RankState(node="head", runtime="docker", running=rehearsed_here, container_status="running"
                               if rehearsed_here else "")

    monkeypatch.setattr(ranks, "rank_state", rank_state)
    monkeypatch.setattr(runner.Cluster, "from_profile", classmethod(
        lambda cls, profile, **kw: contextlib.nullcontext(_Cluster(profile))))
    monkeypatch.setattr(runner, "_stop_aside", lambda cluster, profile, what, *, fix, nodes=None:
                        stopped.append((Path(profile.source).name, nodes)))
    said: list[str] = []
    got = runner.set_rehearsal_server_aside(load_profile(REPO_ROOT / "env" / "lab.env"), echo=said.append)
    return got, stopped, asked, said


@pytest.mark.parametrize("recipe", ["tp4-v41.env", "tp3-dspark.env", "exl3-v41.env"])
def test_a_rehearsal_of_any_node_count_is_set_aside_on_the_labs_nodes(monkeypatch, recipe):
    got, stopped, asked, said = _run(monkeypatch, recipe)
    assert got == f"env/{recipe}", (got, asked)
    assert stopped == [(recipe, ["head", "worker"])], stopped          # only the nodes the lab has now
    assert len(said) == 1 and f"start --rehearse --profile env/{recipe}" in said[0], said


def test_nothing_of_another_profile_running_sets_nothing_aside(monkeypatch):
    got, stopped, asked, _ = _run(monkeypatch, running="none.env")
    assert got == "" and stopped == []
    recipes = {p.name for p in (REPO_ROOT / "env").glob("*.env") if not load_profile(p).is_lab}
    assert recipes and {"tp4-v41.env", "tp3-dspark.env"} <= set(asked) <= recipes | {"lab.env"}, asked


@pytest.mark.parametrize("argv, lab_env, nodes", [
    # `make runbook` (two nodes) left env/lab.env's server; a four-node rehearsal comes: lab.env's ranks stop
    (".lab/vllm-venv/bin/python runbook/lab/vllm_cli.py serve /m --tensor-parallel-size 2 --nnodes 2 --node-rank 0",
     "lab.env", ["head", "worker"]),
    # env/lab-tp4.env's server on a four-node lab, a four-node rehearsal: all four
    ("python vllm_cli.py serve /m --nnodes 4 --node-rank 0", "lab-tp4.env", ["head", "worker", "worker2", "worker3"]),
    # a Ray head's serve shows no --nnodes: the rehearsal's own node count decides
    ("python vllm_cli.py serve /m --distributed-executor-backend ray", "lab-tp4.env",
     ["head", "worker", "worker2", "worker3"]),
])
def test_the_labs_own_server_is_told_by_its_ranks_count(monkeypatch, argv, lab_env, nodes):
    stopped, said = [], []
    monkeypatch.setattr(ranks, "rank_state", lambda node, profile, home=None: ranks.RankState(
        node="head", runtime="process", running=True, pid=15276, fingerprint="bb5b52fa4f97", argv=argv))
    monkeypatch.setattr(runner.Cluster, "from_profile", classmethod(
        lambda cls, profile, **kw: contextlib.nullcontext(_Cluster(profile))))
    monkeypatch.setattr(runner, "_stop_aside", lambda cluster, profile, what, *, fix, nodes=None:
                        stopped.append((Path(profile.source).name, nodes)))
    rehearsal = load_profile(REPO_ROOT / "env" / "lab-tp4.env")         # four nodes, as tp4-v41's rehearsal
    assert runner.set_lab_server_aside(rehearsal, echo=said.append) == "bb5b52fa4f97"
    assert stopped == [(lab_env, nodes)], stopped
    assert f"start --profile env/{lab_env}" in said[0], said


def test_lab_node_count_reads_nnodes_only():
    assert runner.lab_node_count("vllm serve /m --nnodes 3 --node-rank 0") == 3
    assert runner.lab_node_count("vllm serve /m --nnodes=4") == 4
    assert runner.lab_node_count("vllm serve /m --tensor-parallel-size 4") is None
