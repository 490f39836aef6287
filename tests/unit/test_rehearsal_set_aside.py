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
