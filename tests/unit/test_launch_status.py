"""``python -m runbook status`` (issue 25 item 5, issue 37 item 3): after the head's API was killed it printed
``stopped (? pid …, fingerprint ?)`` with no verdict, and a frozen worker (state T) was ``up``, exit 0. Now a
table per node and one verdict line (up, partial, frozen, orphaned, stopped, with what to do), each verdict
its own exit code; ``--json`` keeps one JSON document on stdout."""
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

    def go(nodes, health: int, *, as_json: bool = True):
        monkeypatch.setattr(cli, "_server_cluster", lambda args: (profile, FakeCluster(nodes)))
        monkeypatch.setattr(status, "base_url", lambda p: "http://127.0.0.1:8000")
        monkeypatch.setattr(status, "api_get", lambda url, path, key, timeout: (health, '{"data": []}'))
        code = cli.main(["status", "--profile", "env/lab.env"] + (["--json"] if as_json else []))
        out, err = capsys.readouterr()
        if not as_json:
            return code, out
        word = json.loads(out)["verdict"]                # stdout: one JSON document
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"verdict: {word}")
        assert code == status.VERDICT_EXIT[word]
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
    assert code == ExitStatus.SERVER_PARTIAL
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
    assert code == ExitStatus.SERVER_PARTIAL and line.startswith("verdict: partial") and "still loading" in line


RUNNING = "   {0}    {0} Sl   /v/bin/python /r/runbook/lab/vllm_cli.py serve /m\n"


def test_a_frozen_worker_with_health_200_is_frozen_not_up_and_says_how_to_continue_it(run_status):
    """The field case: the worker's three processes in state T, the head still answering /health 200."""
    profile, go = run_status
    worker_ps = ("   20    20 Tl   /v/bin/python /r/runbook/lab/vllm_cli.py serve /m --headless\n"
                 "   21    20 Tl   VLLM::Worker_TP1\n   22    20 T    VLLM::Worker_TP1\n")
    code, line = go([_node("head", 0, pid="10", ps=RUNNING.format(10)), _node("worker", 1, pid="20", ps=worker_ps)],
                    health=200)
    assert code == ExitStatus.SERVER_FROZEN and line.startswith("verdict: frozen")
    assert "worker: 3 process(es) (20 21 22)" in line
    assert "ssh -F .lab/ssh_config" in line and "spark-worker" in line and "kill -CONT 20 21 22" in line
    assert "TracerPid" in line


def test_engine_processes_left_with_no_rank_running_is_orphaned(run_status):
    profile, go = run_status
    head = _node("head", 0, ps="   11     7 Sl   VLLM::EngineCore\n")
    code, line = go([head, _node("worker", 1)], health=0)
    assert code == ExitStatus.SERVER_ORPHANED and line.startswith("verdict: orphaned")
    assert "head (1 vLLM process(es))" in line and f"stop --profile {profile.source}" in line


def test_a_killed_head_is_described_without_placeholders_in_the_table(run_status):
    """Was ``stopped (? pid 4711, fingerprint ?)``: now what the pid file names and that it is not alive."""
    _, go = run_status
    code, out = go([_node("head", 0, pid="4711"), _node("worker", 1, pid="20", ps=RUNNING.format(20))], health=0,
                   as_json=False)
    assert code == ExitStatus.SERVER_PARTIAL
    lines = out.strip().splitlines()
    assert lines[0].startswith("status of lab (") and lines[-1].startswith("verdict: partial")
    head_row = next(l for l in lines if l.startswith("head "))
    assert "pid file names 4711, which is not a live vLLM process" in head_row
    assert "?" not in "\n".join(lines[1:-1])
    assert not out.lstrip().startswith("{")          # the table, not JSON, without --json


def test_every_verdict_has_a_distinct_exit_code_in_the_readme_table():
    from pathlib import Path
    readme = Path(__file__).resolve().parents[2].joinpath("README.md").read_text()
    codes = list(status.VERDICT_EXIT.values())
    assert codes and len(set(codes)) == len(codes)
    for word, code in status.VERDICT_EXIT.items():
        assert f"| {int(code)} | `{ExitStatus(code).name}` |" in readme, word
