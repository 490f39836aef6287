"""``python -m runbook status`` (issue 25 item 5): after the head's API was killed it printed
``stopped (? pid …, fingerprint ?)`` with no verdict; now the JSON is followed by one verdict line (up, stopped,
partial with what to do), and the exit is 10 unless every rank runs and /health is 200."""
from __future__ import annotations

import json

import pytest

from runbook import cli
from runbook.errors import ExitStatus
from runbook.launch import status
from support.doubles import FakeCluster, FakeNode, rank_node
from support.profiles import profile_from


def _node(name: str, rank: int, *, pid: str = "", ps: str = "") -> FakeNode:
    return rank_node(name, rank, pid=pid, fingerprint="fp-1" if pid else "", ps=ps)


@pytest.fixture
def run_status(monkeypatch, capsys):
    profile = profile_from("env/lab.env")

    def go(nodes, health: int):
        monkeypatch.setattr(cli, "_server_cluster", lambda args: (profile, FakeCluster(nodes)))
        monkeypatch.setattr(status, "base_url", lambda p: "http://127.0.0.1:8000")
        monkeypatch.setattr(status, "api_get", lambda url, path, key, timeout: (health, '{"data": []}'))
        code = cli.main(["status", "--profile", "env/lab.env"])
        out, err = capsys.readouterr()
        word = json.loads(out)["verdict"]                # stdout: one JSON document
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"verdict: {word}") or (word == "partial" and line.startswith("verdict: unknown"))
        return code, line
    return profile, go


def test_the_field_case_a_stale_pid_file_and_nothing_running_is_stopped_exit_10(run_status):
    profile, go = run_status
    code, line = go([_node("head", 0, pid="4711"), _node("worker", 1)], health=0)
    assert code == ExitStatus.SERVER_DOWN
    assert line.startswith("verdict: stopped") and f"python -m runbook start --profile {profile.source}" in line


def test_a_killed_api_with_orphaned_engine_and_a_running_worker_is_partial(run_status):
    profile, go = run_status
    head = _node("head", 0, pid="10", ps="   11    10 Sl   VLLM::EngineCore\n")
    worker = _node("worker", 1, pid="20", ps="   20    20 Sl   /v/bin/python /r/runbook/lab/vllm_cli.py serve /m --headless\n")
    code, line = go([head, worker], health=0)
    assert code == ExitStatus.SERVER_DOWN
    assert line.startswith("verdict: partial") and "running: worker" in line and "not running: head" in line
    assert "head (1 vLLM process(es))" in line
    assert f"fix: python -m runbook stop --profile {profile.source}, then" in line


def test_every_rank_running_and_health_200_is_up_exit_0(run_status):
    _, go = run_status
    ps = "   {0}    {0} Sl   /v/bin/python /r/runbook/lab/vllm_cli.py serve /m\n"
    code, line = go([_node("head", 0, pid="10", ps=ps.format(10)), _node("worker", 1, pid="20", ps=ps.format(20))],
                    health=200)
    assert code == ExitStatus.OK and line.startswith("verdict: up")


def test_every_rank_running_while_the_api_does_not_answer_says_to_wait_then_stop(run_status):
    _, go = run_status
    ps = "   {0}    {0} Sl   /v/bin/python /r/runbook/lab/vllm_cli.py serve /m\n"
    code, line = go([_node("head", 0, pid="10", ps=ps.format(10)), _node("worker", 1, pid="20", ps=ps.format(20))],
                    health=0)
    assert code == ExitStatus.SERVER_DOWN and line.startswith("verdict: partial") and "still loading" in line
