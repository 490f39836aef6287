"""The console of ``python -m runbook run`` (issue 38 item 1): each step one line, warnings and failures in full
with their fix, one summary table, the verdict and the report's path last; the full stream (papermill's cell
markers, every cell's output, the kernel's own stderr) in the run folder's console.log, and on the terminal
with -v. Runs the CLI for real over small notebooks executed by papermill in the ``runbook`` kernel (no nodes:
the cluster lock is ``NoLock``)."""
from __future__ import annotations

import functools
import io
import json
import re
from pathlib import Path

import pytest

from runbook import cli, runner
from runbook.console import Console, StepResult, parse_work
from support.doubles import NoLock
from support.step_notebooks import CHATTER, PASSING, notebook

ESC = "\x1b"


@pytest.fixture
def cli_run(tmp_path, monkeypatch):
    """``python -m runbook run`` through ``cli.main`` over the notebooks in tmp_path/notebooks."""
    books, results = tmp_path / "notebooks", tmp_path / "results"
    monkeypatch.setattr(runner, "ClusterLock", NoLock)
    monkeypatch.setattr(runner, "run", functools.partial(runner.run, notebooks_dir=books, results_root=results))
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "no-secrets.env"))
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):     # rich would treat the pipe as a terminal
        monkeypatch.delenv(name, raising=False)

    def go(*args: str) -> tuple[int, Path]:
        code = cli.main(["run", "--profile", "env/lab.env", "--no-lab", *args])
        (run,) = [p for p in results.iterdir() if p.is_dir()]
        return code, run
    return books, go


def test_a_passing_run_shows_steps_and_summary_and_archives_the_full_stream(cli_run, capsys):
    books, go = cli_run
    for name, *bodies in PASSING:
        notebook(books, name, *bodies)
    code, run = go()
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert code == 0, out
    assert ESC not in out.out + out.err                      # not a terminal: plain lines, no control codes
    assert not [line for line in lines if any(c in line for c in CHATTER)], out.out
    assert len(lines) <= 25, out.out
    assert lines[0].startswith("env/lab.env, 2 nodes (head spark-head, worker spark-worker): 00_alpha, 01_beta")
    # the warning in full with its fix, under its step's line
    step_line = lines.index(next(line for line in lines if line.startswith("00_alpha: passed in")))
    assert "(1 PASS, 1 WARN)" in lines[step_line]
    assert lines[step_line + 1:step_line + 3] == ["  WARN worker: alpha slow: 3 s (expected < 1 s)",
                                                  "    fix: give it time"]
    # the summary table, the verdict, the report's path last
    table = next(i for i, line in enumerate(lines) if re.match(r"step\s+status\s+time\s+checks$", line))
    assert [line.split()[:2] for line in lines[table + 1:table + 3]] == [["00_alpha", "passed"], ["01_beta", "passed"]]
    assert lines[table + 3].startswith("passed: 2 step(s) in ")
    assert lines[-1] == f"report: {run / 'report.html'}" and (run / "report.html").is_file()
    # everything printed before this change is in the run folder
    archive = (run / "console.log").read_text()
    for text in ("Executing Cell 1-", "Ending Cell 6-", "chatter line 39", "chatter line on stderr",
                 "Kernel is running over TCP without encryption", "kernel fd 2 says hello",
                 lines[-1]):
        assert text in archive, text
    assert re.search(r"^alpha slow\s+worker\s+WARN\s+3 s", archive, re.M)       # the step's own check table


COUNTING = ("from runbook import progress\n"
            "with progress.count('head weights download', 3 * 2 ** 20, 'B', every_s=0) as bar:\n"
            "    for done in range(0, 3 * 2 ** 20 + 1, 2 ** 16):\n"
            "        bar.update(done)")


def test_a_step_that_counts_work_adds_no_line_piped_and_keeps_its_final_counts(cli_run, capsys):
    """The progress channel under ``run``: the kernel's counts go to the file the console follows (not into the
    notebook, not a line per tick in a pipe); the final line is in the archived notebook and console.log, the
    final counts in the step's sidecar."""
    books, go = cli_run
    notebook(books, "02_gamma", COUNTING, "step.add(check('gamma ok', True, node='head', observed='fine'))\n"
                                           "step.finish()")
    code, run = go()
    out = capsys.readouterr().out
    assert code == 0, out
    assert [line for line in out.splitlines() if "weights download" in line] == []
    saved = json.loads((run / "notebooks" / "02_gamma.ipynb").read_text())
    outputs = [o for cell in saved["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    text = "".join("".join(o.get("text", "")) for o in outputs if o["output_type"] == "stream")
    assert re.search(r"^head weights download: 100\.0% 3\.00/3\.00 MiB in \d+\.\ds$", text, re.M), text
    assert text.count("head weights download") == 1            # the end only, not the 49 updates
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    assert "head weights download: 100.0% 3.00/3.00 MiB" in (run / "console.log").read_text()
    counted = json.loads((run / "steps" / "02_gamma.json").read_text())["data"]["progress"]
    assert {k: counted["head weights download"][k] for k in ("done", "total", "unit", "ended")} == \
        {"done": 3 * 2 ** 20, "total": 3 * 2 ** 20, "unit": "B", "ended": True}


def test_verbose_shows_the_full_stream(cli_run, capsys):
    books, go = cli_run
    notebook(books, *PASSING[1])
    code, run = go("-v")
    out = capsys.readouterr().out
    assert code == 0
    for text in ("Executing Cell 1-", "chatter line on stderr", "without encryption"):
        assert text in out, text
    assert out.splitlines()[-1] == f"report: {run / 'report.html'}"


def test_a_failing_step_prints_its_rows_with_the_fix_and_how_to_resume(cli_run, capsys):
    books, go = cli_run
    notebook(books, *PASSING[1])
    notebook(books, "02_gamma", "step.add(check('gamma link', False, node='worker', observed='down', expected='up', "
                                "fix='plug the cable in'))\nstep.finish()")
    notebook(books, "03_delta", "print('never runs')")
    code, run = go()
    lines = capsys.readouterr().out.splitlines()
    assert code == 5                                        # CheckFailed: the failing step's class
    at = lines.index(next(line for line in lines if line.startswith("02_gamma: failed in")))
    assert lines[at + 1:at + 3] == ["  FAIL worker: gamma link: down (expected up)", "    fix: plug the cable in"]
    assert lines[at + 3] == f"  the executed notebook: {run / 'notebooks' / '02_gamma.ipynb'}"
    assert not any(line.startswith("03_delta") for line in lines)     # the run stopped at the failure
    verdict = next(line for line in lines if line.startswith("failed at "))
    assert verdict.startswith("failed at 02_gamma (exit 5) after 2 step(s)")
    assert f"resume after fixing: python -m runbook run --profile env/lab.env --resume {run.name}" in lines
    assert lines[-1] == f"report: {run / 'report.html'}"


def test_a_secret_the_kernel_prints_is_masked_on_screen_and_in_the_archive(cli_run, capsys, monkeypatch):
    key = "sk-console-" + "7f3a9c2e" * 3
    monkeypatch.setenv("VLLM_API_KEY", key)
    books, go = cli_run
    notebook(books, "00_leak", "import os, sys\nprint(os.environ['VLLM_API_KEY'])\n"
                               "os.write(2, os.environ['VLLM_API_KEY'].encode() + b' on fd 2\\n')",
             "step.add(check('leak', True, observed='x'))\nstep.finish()")
    code, run = go("-v")
    out = capsys.readouterr().out
    archive = (run / "console.log").read_text()
    assert code == 0
    assert key not in out and key not in archive
    assert "*** on fd 2" in archive and "*** on fd 2" in out


# ----------------------------------------------------------------------------- the live line's counted work

def test_a_packer_progress_line_is_counted_work_with_its_eta():
    work = parse_work("[pack] engram.bin:  45.0% 1.20/2.70 GiB 512 MB/s eta 3s")
    assert (work.pct, work.done, work.total, work.unit, work.eta()) == (45.0, "1.20", "2.70", "GiB", 3.0)
    assert parse_work("bench: 3 cases done") is None and parse_work("line 40 of chatter") is None


def test_without_a_given_eta_the_rate_since_the_first_line_gives_it():
    first = parse_work("download: 10% 10/100 rows", now=100.0)
    assert first.eta() is None                              # one sample: no rate yet
    later = parse_work("download: 30% 30/100 rows", first, now=110.0)
    assert later.eta() == pytest.approx(35.0)               # 20 % in 10 s, 70 % left
    other = parse_work("upload: 50% 1/2 GiB", later, now=120.0)
    assert other.eta() is None                              # another work: its own samples


# ----------------------------------------------------------------------------- colour

def _step_line(monkeypatch, **env) -> str:
    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    buf = io.StringIO()
    console = Console(file=buf)
    console.step_done(StepResult("04_launch", "passed", 48.2, {"PASS": 3}))
    console.close()
    return buf.getvalue()


def test_no_color_is_honoured_on_a_terminal(monkeypatch):
    coloured = _step_line(monkeypatch, FORCE_COLOR="1", TERM="xterm-256color")
    assert "\x1b[32m" in coloured                           # a terminal: the passed step is green
    plain = _step_line(monkeypatch, FORCE_COLOR="1", TERM="xterm-256color", NO_COLOR="1")
    assert "04_launch: passed in 48.2 s (3 PASS)" in plain
    assert not re.search(r"\x1b\[[0-9;]*(3[0-9]|9[0-7])[0-9;]*m", plain), repr(plain)
    piped = _step_line(monkeypatch)
    assert ESC not in piped and piped == "04_launch: passed in 48.2 s (3 PASS)\n"


def test_what_the_lab_prints_while_it_comes_up_goes_to_the_archive(tmp_path, monkeypatch):
    """The lab's own lines (``[lab] ...`` on stderr, before the run folder exists) are kept for console.log, not
    shown; the run's notices are shown."""
    import sys
    monkeypatch.setattr(runner, "ClusterLock", NoLock)
    # no lab here (make check): the lab's bring-up is the stand-in below, so there is no rehearsal server to ask about
    monkeypatch.setattr(runner, "set_rehearsal_server_aside", lambda profile, echo=print: "")
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "no-secrets.env"))
    notebook(tmp_path / "notebooks", *PASSING[1])
    screen = io.StringIO()
    console = Console(file=screen)
    with console.capture_stdio():
        run_dir, outcomes = runner.run("env/lab.env", notebooks_dir=tmp_path / "notebooks",
                                       results_root=tmp_path / "results", echo=console.say, console=console,
                                       lab_up=lambda profile: print("[lab] nodes healthy, reused", file=sys.stderr))
    assert [o.status for o in outcomes] == ["passed"]
    shown = screen.getvalue()
    archive = (run_dir.path / "console.log").read_text()
    assert "[lab] nodes healthy, reused" not in shown and "[lab] nodes healthy, reused" in archive
    assert "01_beta: passed in" in shown and "01_beta: passed in" in archive
    assert archive.index("[lab] nodes healthy") < archive.index("01_beta: passed in")


def test_without_a_terminal_counted_work_says_where_it_is(monkeypatch):
    """No live line in CI: a step that counts work prints where it is (at most every PLAIN_EVERY_S; 0 here)."""
    from runbook import console as console_mod
    monkeypatch.setattr(console_mod, "PLAIN_EVERY_S", 0.0)
    buf = io.StringIO()
    console = Console(file=buf)
    with console.step("03_engram", cells=12):
        console.detail("Executing Cell 7---------------------------------------")
        console.detail("chatter line before the packer")
        console.detail("[pack] engram-tp0.bin:  45.0% 1.20/2.70 GiB 512 MB/s eta 3s")
    assert buf.getvalue().splitlines() == ["03_engram: running",
                                           "03_engram: [pack] engram-tp0.bin 45% 1.20/2.70 GiB, eta 3.0 s"]
    assert parse_work("[pack] engram-tp0.bin:  45.0% 1.20/2.70 GiB").label == "[pack] engram-tp0.bin"
