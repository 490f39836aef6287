"""One run per cluster: the head's lock (``remote.ClusterLock``, over a local bash standing in for the head), the run
folder's lock (``RunDir.hold``), run folders made at once, and ``commands.jsonl`` lines that stay whole."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from runbook.errors import BusyError, ExitStatus
from runbook.evidence import RunDir
from runbook.remote import LOCK_NAME, ClusterLock, append_line
from support.doubles import FakeCluster, LocalNode


@pytest.fixture
def head(tmp_path):
    return LocalNode("head", 0, home=tmp_path / "head home")


def _owner(head) -> dict:
    return json.loads((head.home / LOCK_NAME / "owner.json").read_text())


def test_a_second_caller_is_refused_naming_the_holder(head):
    first = ClusterLock(head, command="run", run_id="20261203-0700-lab").acquire()
    before = _owner(head)
    with pytest.raises(BusyError) as ei:
        ClusterLock(head, command="start").acquire()
    err = ei.value
    assert err.exit_code == ExitStatus.BUSY == 9
    assert f"pid {os.getpid()} on {socket.gethostname()}" in err.observed and "`run` of run 20261203-0700-lab" in \
        err.observed and f"rm -rf ~/{LOCK_NAME}" in err.fix
    assert _owner(head) == before                       # the holder's lock is untouched
    first.release()
    assert not (head.home / LOCK_NAME).exists()
    with ClusterLock(head, command="start"):
        assert _owner(head)["command"] == "start"
    assert not (head.home / LOCK_NAME).exists()


def test_a_stale_lock_of_a_dead_process_is_said_and_taken_over(head):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (head.home / LOCK_NAME).mkdir()
    (head.home / LOCK_NAME / "owner.json").write_text(json.dumps(
        {"pid": dead.pid, "pid_start": "1", "host": socket.gethostname(), "command": "run", "token": "old",
         "started": "2026-12-03T06:00:00+00:00"}))
    said: list[str] = []
    with ClusterLock(head, command="stop", echo=said.append):
        assert _owner(head)["command"] == "stop"
    assert len(said) == 1 and f"stale lock of pid {dead.pid}" in said[0] and "gone" in said[0]


def test_a_lock_held_from_another_machine_is_not_taken(head):
    (head.home / LOCK_NAME).mkdir()
    (head.home / LOCK_NAME / "owner.json").write_text(json.dumps(
        {"pid": 1, "host": "other-laptop", "user": "ops", "command": "run", "token": "theirs"}))
    with pytest.raises(BusyError) as ei:
        ClusterLock(head, command="run").acquire()
    assert "other-laptop" in ei.value.observed
    assert _owner(head)["token"] == "theirs"


def test_release_never_removes_someone_elses_lock(head):
    mine = ClusterLock(head, command="run").acquire()
    (head.home / LOCK_NAME / "owner.json").write_text(json.dumps({"pid": 1, "host": "x", "token": "someone"}))
    mine.release()
    assert (head.home / LOCK_NAME / "owner.json").exists()


def test_only_one_of_many_simultaneous_callers_gets_the_lock(head):
    got, busy = [], []

    def take():
        try:
            got.append(ClusterLock(head, command="run").acquire())
        except BusyError:
            busy.append(1)
    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 1 and len(busy) == 5


def test_cli_stop_refuses_cleanly_while_a_run_holds_the_cluster(head, tmp_path, monkeypatch, capsys):
    from runbook import cli
    from runbook.profile import load_profile
    worker = LocalNode("worker", 1, home=tmp_path / "worker home")
    profile = load_profile("env/lab.env", environ={})
    monkeypatch.setattr(cli, "_server_cluster", lambda args: (profile, FakeCluster([head, worker])))
    holder = ClusterLock(head, command="run").acquire()
    try:
        code = cli.main(["stop", "--profile", "env/lab.env"])
    finally:
        holder.release()
    err = capsys.readouterr().err
    assert code == 9 and "the cluster is in use" in err and "Traceback" not in err
    assert not [c for c in worker.calls]               # nothing was run on any node


# ----------------------------------------------------------------------------- the run folder

def test_a_run_folder_is_held_by_one_process(tmp_path):
    run = RunDir.create("lab", tmp_path)
    code = ("import sys, time; from runbook.evidence import RunDir; RunDir(sys.argv[1]).hold('run'); "
            "print('held', flush=True); time.sleep(30)")
    other = subprocess.Popen([sys.executable, "-c", code, str(run.path)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(BusyError) as ei:
            RunDir(run.path).hold("run --resume")
        assert f"pid {other.pid}" in ei.value.observed
    finally:
        other.kill()
        other.wait()
    RunDir(run.path).hold("run --resume").release()      # the kernel dropped the dead holder's lock


def test_run_folders_made_in_the_same_second_are_distinct(tmp_path):
    made: list[Path] = []
    errors: list[BaseException] = []

    def create():
        try:
            made.append(RunDir.create("lab", tmp_path).path)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)
    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(made)) == 8


# ----------------------------------------------------------------------------- commands.jsonl

def test_lines_appended_at_once_stay_whole(tmp_path):
    path = tmp_path / "commands.jsonl"
    big = "x" * 50_000                                   # longer than any stdio buffer

    def writer(n):
        for i in range(20):
            append_line(path, json.dumps({"writer": n, "i": i, "pad": big}))
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 80 and all(json.loads(line)["pad"] == big for line in lines)


def test_a_torn_last_line_is_ended_before_the_next(tmp_path):
    path = tmp_path / "commands.jsonl"
    path.write_text('{"whole": 1}\n{"torn": ')             # a writer killed mid-line (before this change)
    append_line(path, json.dumps({"next": 2}))
    lines = path.read_text().splitlines()
    assert lines == ['{"whole": 1}', '{"torn": ', '{"next": 2}']


def test_a_busy_cluster_stops_run_before_a_run_folder_or_a_step(tmp_path, monkeypatch):
    from runbook import runner
    from runbook.remote import ClusterLock as Lock
    steps: list[str] = []

    def busy(profile, *, command, echo):
        assert command == "run"
        raise BusyError("the cluster is in use: another run holds the lock on head")
    monkeypatch.setattr(runner, "check_kernel", lambda kernel: None)
    monkeypatch.setattr(Lock, "for_profile", staticmethod(busy))
    monkeypatch.setattr(runner, "execute_step", lambda name, *a, **k: steps.append(name))
    results = tmp_path / "results"
    with pytest.raises(BusyError) as ei:
        runner.run("env/lab.env", results_root=results, echo=lambda line: None)
    assert ei.value.exit_code == 9 and steps == [] and not results.exists()


def test_a_dry_run_takes_no_lock(tmp_path, monkeypatch):
    from runbook import runner
    from runbook.remote import ClusterLock as Lock
    monkeypatch.setattr(runner, "check_kernel", lambda kernel: None)
    monkeypatch.setattr(Lock, "for_profile", staticmethod(lambda *a, **k: pytest.fail("a dry run took the lock")))
    monkeypatch.setattr(runner, "execute_step",
                        lambda name, *a, **k: runner.StepRun(name, "passed", 0.0))
    run_dir, outcomes = runner.run("env/lab.env", only=["00"], dry_run=True, results_root=tmp_path / "results",
                                   echo=lambda line: None)
    assert [o.name for o in outcomes] == ["00_preflight"] and run_dir.manifest()["status"] == "passed"


def test_the_lock_names_its_run_once_the_run_folder_exists(head):
    """Issue 37 item 6: a refusal named a pid and `run`, never the run (the lock is taken before the folder)."""
    first = ClusterLock(head, command="run").acquire()
    first.name_run("20261205-0900-lab")
    assert _owner(head)["run"] == "20261205-0900-lab" and _owner(head)["token"] == first.token
    with pytest.raises(BusyError) as ei:
        ClusterLock(head, command="start").acquire()
    assert "`run` of run 20261205-0900-lab" in ei.value.observed
    first.release()
    assert not (head.home / LOCK_NAME).exists()


def test_the_lock_fix_on_the_lab_reaches_the_head_with_the_profiles_ssh_config():
    from runbook.remote import operator_ssh
    from support.profiles import profile_from
    line = operator_ssh(profile_from("env/lab.env"), "head")
    assert line.startswith("ssh -F .lab/ssh_config ") and line.endswith(" spark-head")


def test_a_busy_lab_is_refused_before_the_lab_is_touched(tmp_path, monkeypatch):
    """Issue 37 item 6: the lab came up (nodes restarted in place when their processes looked gone) before the lock
    was asked for, under the run that held it. Now a lab whose head answers is locked first."""
    from runbook import runner
    from runbook.remote import ClusterLock as Lock
    touched: list[str] = []

    def busy(profile, *, command, echo):
        raise BusyError("the cluster is in use: another run holds the lock on head")
    monkeypatch.setattr(runner, "check_kernel", lambda kernel: None)
    monkeypatch.setattr(Lock, "for_profile", staticmethod(busy))
    monkeypatch.setattr(runner, "execute_step", lambda name, *a, **k: touched.append(name))
    with pytest.raises(BusyError):
        runner.run("env/lab.env", results_root=tmp_path / "results", echo=lambda line: None,
                   lab_up=lambda profile: touched.append("lab up"))
    assert touched == []
