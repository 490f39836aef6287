"""Trust boundaries (issue 24): what ``validate`` shows a reviewer, ``-p`` values held to the file's rules, the HF
token from the secrets file and never to a foreign mirror, and the redactor's forms of a secret."""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runbook.errors import ProfileError
from runbook.profile import executing_keys_changed, load_profile
from runbook.secrets import Redactor
from runbook.weights import hf_token, hf_token_for

REPO = Path(__file__).resolve().parents[2]
EXL3 = REPO / "env" / "exl3-v41.env"
TOKEN = "hf_" + "Tr7uSt9xK2mP4vL8nR1wB6cD"


def _secrets(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "secrets.env"
    path.write_text(text)
    path.chmod(0o600)
    return path


# ----------------------------------------------------------------------------- validate shows what executes

def test_shipped_profiles_change_nothing_that_executes():
    for name in ("exl3-v41.env", "dspark-v4.env", "lab.env"):
        assert executing_keys_changed(load_profile(REPO / "env" / name, environ={})) == []


def test_changed_executing_keys_are_listed_with_the_shipped_value():
    p = load_profile(EXL3, {"EXTRA_ARGS": "--seed 7", "HF_ENDPOINT": "https://hf-mirror.internal",
                            "HF_ENDPOINT_TRUSTED": "1"}, environ={})
    changed = {k: (v, ref) for k, v, ref in executing_keys_changed(p)}
    assert changed == {"EXTRA_ARGS": ("--seed 7", ""), "HF_ENDPOINT": ("https://hf-mirror.internal", ""),
                       "HF_ENDPOINT_TRUSTED": ("1", "0")}


def _validate(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    return subprocess.run([sys.executable, "-m", "runbook", "validate", "--profile", str(EXL3), "-p",
                           "EXTRA_ARGS=--seed 7", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_cli_validate_says_valid_and_prints_the_review_list():
    """Issue 38 item 4: validate reads like the other commands: what it acted on and "valid", then the review
    list; no JSON unless asked for."""
    r = _validate()
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{EXL3}: valid (profile exl3-v41, recipe exl3-v41, 2 nodes: head spark1, worker spark2; topology cable)",
        "review: 1 key(s) that execute or fetch differ from env/exl3-v41.env:",
        "  EXTRA_ARGS=--seed 7   (shipped: (empty))"]
    assert "{" not in r.stdout and r.stderr == ""


def test_cli_validate_json_keeps_stdout_one_document():
    r = _validate("--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["EXTRA_ARGS"] == "--seed 7"
    assert "review: 1 key(s) that execute or fetch differ from env/exl3-v41.env" in r.stderr
    assert "EXTRA_ARGS=--seed 7   (shipped: (empty))" in r.stderr and ": valid (" in r.stderr


# ----------------------------------------------------------------------------- -p values

@pytest.mark.parametrize("value,code", [("8\u202e888", "U+202E"), ("88\u206688", "U+2066"), ("88\n88", "U+000A"),
                                        ("88\x1b88", "U+001B"), ("8\u200f888", "U+200F")])
def test_override_with_control_characters_is_refused_naming_the_key(value, code):
    with pytest.raises(ProfileError) as ei:
        load_profile(EXL3, {"PORT": value}, environ={})
    (issue,) = ei.value.issues
    assert issue.key == "PORT" and issue.path == "<override>" and code in issue.message
    assert ei.value.exit_code == 2


# ----------------------------------------------------------------------------- the HF token

def test_token_comes_from_the_secrets_file(tmp_path):
    f = _secrets(tmp_path, f"HF_TOKEN={TOKEN}\n")
    assert hf_token({"RUNBOOK_SECRETS_FILE": str(f)}) == TOKEN
    assert hf_token({"RUNBOOK_SECRETS_FILE": str(tmp_path / "none.env")}) is None


def test_environment_wins_over_the_file(tmp_path):
    f = _secrets(tmp_path, f"HF_TOKEN={TOKEN}\n")
    assert hf_token({"RUNBOOK_SECRETS_FILE": str(f), "HF_TOKEN": "hf_" + "e" * 30}) == "hf_" + "e" * 30


def test_a_foreign_endpoint_gets_no_token_unless_trusted(tmp_path):
    env = {"RUNBOOK_SECRETS_FILE": str(_secrets(tmp_path, f"HF_TOKEN={TOKEN}\n"))}
    hub = load_profile(EXL3, environ={})
    mirror = load_profile(EXL3, {"HF_ENDPOINT": "https://hf-mirror.example"}, environ={})
    trusted = load_profile(EXL3, {"HF_ENDPOINT": "https://hf-mirror.example", "HF_ENDPOINT_TRUSTED": "1"},
                           environ={})
    official = load_profile(EXL3, {"HF_ENDPOINT": "https://huggingface.co"}, environ={})
    lab = load_profile(REPO / "env" / "lab.env", environ={})
    assert hf_token_for(hub, env) == TOKEN and hf_token_for(official, env) == TOKEN
    assert hf_token_for(mirror, env) is None
    assert hf_token_for(trusted, env) == TOKEN
    assert hf_token_for(lab, env) == TOKEN        # the lab's own hub


def test_a_secrets_file_others_can_read_is_refused(tmp_path):
    f = _secrets(tmp_path, f"HF_TOKEN={TOKEN}\n")
    f.chmod(0o644)
    with pytest.raises(ProfileError) as ei:
        hf_token({"RUNBOOK_SECRETS_FILE": str(f)})
    assert "chmod 600" in str(ei.value) and TOKEN not in str(ei.value)


# ----------------------------------------------------------------------------- the redactor's forms

KEY = 'sk-"quoted\\back-7f3a'


@pytest.mark.parametrize("text", [
    "https://ops:hunter2@hf-mirror.internal/api",
    "X-Api-Key: abcdef123456",
    "Authorization: Basic b3BzOmh1bnRlcjI=",
    "GET /v1/models?token=abcdef123456&x=1",
    "password=hunter2",
    "passwd: hunter2",
    "ghp_" + "A" * 36,
    "api_org_" + "B" * 30,
    base64.b64encode(TOKEN.encode()).decode(),
    json.dumps({"key": KEY}),                              # a notebook's JSON escapes " and \
    base64.b64encode(KEY.encode()).decode(),
])
def test_redactor_masks_the_other_forms_of_a_secret(text):
    red = Redactor([KEY])
    out = red(text)
    assert "***" in out
    for secret in ("hunter2", "abcdef123456", "b3BzOmh1bnRlcjI", "A" * 36, "B" * 30, "quoted", TOKEN[3:],
                   base64.b64encode(KEY.encode()).decode()[:20], base64.b64encode(TOKEN.encode()).decode()[:20]):
        assert secret not in out, (text, out)


def test_redactor_keeps_ordinary_words():
    red = Redactor([KEY])
    text = "max_tokens: 128, prompt_tokens=5, Basic checks passed, tokens=3 https://github.com/a/b"
    assert red(text) == text


# ----------------------------------------------------------------------------- exit codes

def _readme_exit_rows() -> dict[int, tuple[str, str]]:
    """README's exit-code table: code -> (name, meaning)."""
    text = (REPO / "README.md").read_text()
    start = text.index("Exit codes of `python -m runbook`")
    rows = {}
    for line in text[start:].splitlines()[1:]:
        m = re.match(r"\|\s*(\d+)\s*\|\s*`(\w+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[int(m.group(1))] = (m.group(2), m.group(3).strip())
        elif rows and not line.startswith("|"):
            break
    return rows


def _readme_exit_table() -> dict[int, str]:
    return {code: name for code, (name, _) in _readme_exit_rows().items()}


def test_readme_exit_code_table_matches_the_enum():
    from runbook.errors import ExitStatus
    table = _readme_exit_table()
    assert len(table) >= 10
    assert table == {int(s): s.name for s in ExitStatus}


def _cli(*argv: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env.update(PYTHONPATH=str(REPO), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "runbook", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)


def test_readme_diagnose_rows_hold_for_real_invocations(tmp_path):
    """What the README's table says of `diagnose`, run for real: offline exits 0 matched or not, a bad input 2."""
    from runbook.errors import ExitStatus
    rows = _readme_exit_rows()
    assert "live `diagnose`" in rows[ExitStatus.FAILED][1] and "offline `diagnose --log/--text` exits 0" in \
        rows[ExitStatus.FAILED][1]
    assert "`diagnose --log`" in rows[ExitStatus.INVALID][1] and "/dev/zero" in rows[ExitStatus.INVALID][1]
    log = tmp_path / "rank.log"
    log.write_text("sh: 1: ray: not found\n")
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\0\0\1")
    cases = [(("--log", str(log)), ExitStatus.OK), (("--text", "my cat sat on the keyboard"), ExitStatus.OK),
             (("--log", str(tmp_path / "missing.log")), ExitStatus.INVALID), (("--log", "/dev/zero"), ExitStatus.INVALID),
             (("--log", str(binary)), ExitStatus.INVALID), (("--top",), ExitStatus.INVALID)]
    got = {args: _cli("diagnose", *args).returncode for args, _ in cases}
    assert got == {args: int(code) for args, code in cases}


def test_live_diagnose_exits_1_when_something_matched_and_masks_what_it_prints(tmp_path, monkeypatch, capsys):
    """The live path (nodes) keeps its codes: 0 nothing matched, 1 something did; a finding's text is masked."""
    from types import SimpleNamespace
    from runbook import cli, evidence, remote
    from runbook.launch import diagnosis, plan
    from support.doubles import FakeCluster, FakeNode
    profile = load_profile(REPO / "env" / "lab.env", environ={})
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "none.env"))
    monkeypatch.setattr(evidence, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr(cli, "_server_cluster", lambda args: (profile, FakeCluster([FakeNode("head", 0),
                                                                                    FakeNode("worker", 1)])))

    class Lock:                       # the cluster lock's contract here: entered once around the collection
        entered = 0

        def __init__(self, node, *, command, echo):
            assert command == "diagnose"

        def __enter__(self):
            Lock.entered += 1

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(remote, "ClusterLock", Lock)
    monkeypatch.setattr(plan, "launch_plan", lambda cluster, profile, *, site: None)      # the CLI passes its site
    for findings, code in (([], 0), ([SimpleNamespace(to_text=lambda: f"worker-not-running: HF_TOKEN={TOKEN}")], 1)):
        monkeypatch.setattr(diagnosis, "diagnose_server",
                            lambda *a, findings=findings, **k: (tmp_path / "diagnose-x.tar.gz", findings))
        assert cli.main(["diagnose", "--profile", "env/lab.env"]) == code
        out = capsys.readouterr().out
        assert f"{len(findings)} known failure(s) matched" in out and TOKEN not in out and TOKEN[3:] not in out
    assert Lock.entered == 2


def test_error_classes_exit_with_their_status():
    from runbook.errors import (ActionError, BenchError, BusyError, CheckFailed, ExitStatus, LabError,
                                ProfileError, RemoteError, UsageError, exit_status_of)
    assert {c.__name__: exit_status_of(c.__name__) for c in (ActionError, BenchError, BusyError, CheckFailed,
                                                             LabError, ProfileError, RemoteError, UsageError)} == {
        "ActionError": ExitStatus.ACTION_FAILED, "BenchError": ExitStatus.BENCH_FAILED, "BusyError": ExitStatus.BUSY,
        "CheckFailed": ExitStatus.CHECKS_FAILED, "LabError": ExitStatus.LAB_FAILED,
        "ProfileError": ExitStatus.INVALID, "RemoteError": ExitStatus.REMOTE_FAILED, "UsageError": ExitStatus.INVALID}
    assert exit_status_of("SecretsError") == ExitStatus.INVALID          # a subclass, found by name
    assert exit_status_of("ZeroDivisionError") == ExitStatus.FAILED


def test_a_bad_override_exits_2():
    from runbook.cli import main
    assert main(["validate", "--profile", str(EXL3), "-p", "PORT"]) == 2
    assert main(["validate", "--profile", str(EXL3), "-p", "PORT=x"]) == 2


@pytest.mark.parametrize("ename,code", [("CheckFailed", 5), ("ActionError", 4), ("RemoteError", 8),
                                        ("BenchError", 6), ("LabError", 7), ("KeyError", 1)])
def test_a_failed_step_records_its_class(tmp_path, monkeypatch, ename, code):
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError
    from runbook import runner
    from runbook.evidence import RunDir

    def fails(src, dst, **kw):
        Path(dst).write_text("{}")
        raise PapermillExecutionError(0, 1, "x", ename, "it failed", [])
    monkeypatch.setattr(pm, "execute_notebook", fails)
    monkeypatch.setattr(runner, "write_failure_sidecar", lambda *a, **k: None)
    run = RunDir.create("lab", tmp_path)
    nb = tmp_path / "nb"
    nb.mkdir()
    (nb / "05_smoke.ipynb").write_text("{}")
    out = runner.execute_step("05_smoke", run, profile_path="env/lab.env", dry_run=True, overrides=None,
                              kernel="runbook", step_timeout=10, notebooks_dir=nb, echo=lambda s: None)
    assert (out.status, out.exit) == ("failed", code)
    assert run.manifest()["steps"]["05_smoke"]["exit"] == code


def test_run_exits_with_the_failing_steps_class(monkeypatch, capsys):
    from runbook import cli, runner

    class Done:
        run_id, path = "r1", Path("/tmp/r1")
    monkeypatch.setattr(runner, "run", lambda *a, **k: (Done, [runner.StepRun("00_preflight", "passed", 1),
                                                               runner.StepRun("01_network", "failed", 1, "x", 5)]))
    assert cli.main(["run", "--profile", str(REPO / "env" / "lab.env"), "--no-lab"]) == 5


# ----------------------------------------------------------------------------- --resume

def test_resume_accepts_only_run_folders_the_runbook_made(tmp_path):
    from runbook.errors import UsageError
    from runbook.evidence import RunDir
    from runbook.runner import run_folder
    results = tmp_path / "results"
    made = RunDir.create("lab", results)
    assert run_folder(made.run_id, results) == made.path.resolve()
    assert run_folder(str(made.path), results) == made.path.resolve()
    elsewhere = RunDir.create("lab", tmp_path / "elsewhere")              # a real run, not under results/
    forged = results / "forged"
    forged.mkdir()
    (forged / "manifest.json").write_text('{"steps": {}}')               # not written by the runbook
    for bad in (str(elsewhere.path), "forged", "../elsewhere/" + elsewhere.run_id, "missing", str(tmp_path)):
        with pytest.raises(UsageError) as ei:
            run_folder(bad, results)
        assert ei.value.exit_code == 2


# ----------------------------------------------------------------------------- private tool directories

def _sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=20)


def test_private_tool_dir_is_made_0700_and_ours(tmp_path):
    from runbook.remote import private_dir_command
    top, sub = tmp_path / "spark-runbook-engram", tmp_path / "spark-runbook-engram" / "head"
    (tmp_path / "spark-runbook-engram").mkdir(mode=0o777)
    os.chmod(top, 0o777)                                   # pre-existing and world-writable: tightened
    r = _sh(private_dir_command(str(top), str(sub)))
    assert r.returncode == 0, r.stderr
    assert [oct(os.stat(p).st_mode & 0o777) for p in (top, sub)] == ["0o700", "0o700"]


def test_private_tool_dir_refuses_a_symlink(tmp_path):
    from runbook.remote import private_dir_command
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "spark-runbook-weights"
    link.symlink_to(tmp_path / "elsewhere")
    r = _sh(private_dir_command(str(link)))
    assert r.returncode == 1 and "is a symlink" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_private_tool_dir_refuses_another_users_dir(tmp_path):
    from runbook.remote import private_dir_command
    planted = tmp_path / "spark-runbook-weights"
    planted.mkdir()
    os.chown(planted, 65534, 65534)
    r = _sh(private_dir_command(str(planted), str(planted / "head")))
    assert r.returncode == 1 and "belongs to uid 65534" in r.stderr
    assert not (planted / "head").exists()


# ----------------------------------------------------------------------------- status / logs say whether the server is up

@pytest.mark.parametrize("state,code", [
    ({"nodes": {"head": {"running": True}, "worker": {"running": True}}, "health": 200}, 0),
    ({"nodes": {"head": {"running": True}, "worker": {"running": False}}, "health": 200}, 11),
    ({"nodes": {"head": {"running": True}, "worker": {"running": True}}, "health": 0}, 11),
    ({"nodes": {"head": {"error": "ssh: connection refused"}, "worker": {"running": True}}, "health": 0}, 8),
    ({"nodes": {}, "health": 200}, 11),
    ({"nodes": {"head": {"running": False}, "worker": {"running": False}}, "health": 0}, 10),
    ({"nodes": {"head": {"running": True}, "worker": {"running": True, "frozen": ["21 VLLM::Worker"]}},
      "health": 200}, 12),
    ({"nodes": {"head": {"running": False, "vllm_processes": ["11 VLLM::EngineCore"]}, "worker": {"running": False}},
      "health": 0}, 13),
])
def test_status_exit_code_says_whether_the_server_is_up(monkeypatch, capsys, state, code):
    from runbook import cli
    from runbook.launch import status
    from support.doubles import FakeCluster, FakeNode
    profile = load_profile(REPO / "env" / "lab.env", environ={})
    monkeypatch.setattr(cli, "_server_cluster", lambda args: (profile, FakeCluster([FakeNode("head", 0),
                                                                                    FakeNode("worker", 1)])))
    monkeypatch.setattr(status, "status", lambda cluster, profile: state)
    assert cli.main(["status", "--profile", "env/lab.env", "--json"]) == code
    assert json.loads(capsys.readouterr().out) == state


@pytest.mark.parametrize("running,code", [({"head": True, "worker": True}, 0), ({"head": True, "worker": False}, 10)])
def test_logs_exit_code_says_whether_every_rank_runs(monkeypatch, capsys, running, code):
    from runbook import cli
    from runbook.facts import ranks
    from runbook.launch import status
    from support.doubles import FakeCluster, FakeNode
    profile = load_profile(REPO / "env" / "lab.env", environ={})
    monkeypatch.setattr(cli, "_server_cluster", lambda args: (profile, FakeCluster([FakeNode("head", 0),
                                                                                    FakeNode("worker", 1)])))
    monkeypatch.setattr(status, "logs", lambda cluster, profile, node, tail_lines: f"log of {node}")
    monkeypatch.setattr(ranks, "rank_state", lambda node, profile: ranks.RankState(node.name, running=running[node.name]))
    assert cli.main(["logs", "--profile", "env/lab.env"]) == code
    captured = capsys.readouterr()
    assert "log of head" in captured.out and "log of worker" in captured.out
    assert ("not running: worker" in captured.err) == (code == 10)
