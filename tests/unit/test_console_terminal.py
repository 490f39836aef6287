"""``python -m runbook run`` as a person sees it (issue 38 item 7): in a real terminal (tmux, 100 columns) the
screen holds the steps' lines, the summary and the report's path last, no papermill cell lines and no kernel
transport warning. The notebooks run for real in the ``runbook`` kernel; no nodes (the cluster lock is NoLock)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.step_notebooks import CHATTER, PASSING, notebook

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import functools, sys
from pathlib import Path
sys.path[:0] = [{root!r}, {tests!r}]
from runbook import cli, runner
from support.doubles import NoLock
runner.ClusterLock = NoLock
runner.run = functools.partial(runner.run, notebooks_dir=Path({books!r}), results_root=Path({results!r}))
sys.exit(cli.main(["run", "--profile", "env/lab.env", "--no-lab"]))
"""


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30,
                          check=True).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_a_run_in_a_100_column_terminal_fits_and_ends_with_the_report(tmp_path):
    books, results = tmp_path / "notebooks", tmp_path / "results"
    for name, *bodies in PASSING:
        notebook(books, name, *bodies)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(root=str(ROOT), tests=str(ROOT / "tests"), books=str(books),
                                    results=str(results)))
    sock = f"runbook-console-{tmp_path.name}"
    command = (f"cd {ROOT} && env -u NO_COLOR RUNBOOK_SECRETS_FILE={tmp_path / 'none.env'} "
               f"{sys.executable} {driver}; echo EXIT=$?; sleep 600")
    _tmux(sock, "-f", "/dev/null", "new-session", "-d", "-s", "run", "-x", "100", "-y", "50", command)
    try:
        deadline = time.monotonic() + 600
        screen = ""
        while time.monotonic() < deadline and "EXIT=" not in screen:
            time.sleep(1)
            screen = _tmux(sock, "capture-pane", "-p", "-S", "-", "-t", "run")
        joined = _tmux(sock, "capture-pane", "-p", "-J", "-S", "-", "-t", "run")    # wrapped lines joined
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=30)
    rows = [line.rstrip() for line in screen.splitlines() if line.strip()]
    assert rows and rows[-1] == "EXIT=0", screen
    assert len(rows) - 1 <= 25, screen                      # screen rows at 100 columns, wrapped ones counted
    assert not [line for line in rows if any(c in line for c in CHATTER)], screen
    shown = [line.rstrip() for line in joined.splitlines() if line.strip()][:-1]
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    assert shown[0].startswith("env/lab.env, 2 nodes")
    assert [line.split()[:2] for line in shown if line.startswith("✓")] == [["✓", "00_alpha:"], ["✓", "01_beta:"]]
    header = next(i for i, line in enumerate(shown) if line.split() == ["step", "status", "time", "checks"])
    assert [line.split()[0] for line in shown[header + 2:header + 4]] == ["00_alpha", "01_beta"]
    assert shown[-2].startswith("passed: 2 step(s) in ")
    assert shown[-1] == f"report: {run / 'report.html'}"


COUNTING = """import os, time
from runbook import progress
with progress.count('head weights download', 100 * 2 ** 20, 'B', every_s=0) as bar:
    bar.update(20 * 2 ** 20)
    time.sleep(0.5)
    bar.update(40 * 2 ** 20)
    while not os.path.exists({mark!r}):
        time.sleep(0.1)
    bar.update(100 * 2 ** 20)"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_counted_work_is_a_live_bar_with_its_eta_in_a_terminal(tmp_path):
    """Issue 38 item 2 in a real terminal: while a step counts (runbook.progress in the kernel), its live line shows
    the bar, the figures and the ETA; when it ends the line goes and the screen is the usual one."""
    books, results = tmp_path / "notebooks", tmp_path / "results"
    mark = tmp_path / "go-on"
    notebook(books, "02_gamma", COUNTING.format(mark=str(mark)), "step.finish()")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(root=str(ROOT), tests=str(ROOT / "tests"), books=str(books),
                                    results=str(results)))
    sock = f"runbook-bar-{tmp_path.name}"
    command = (f"cd {ROOT} && env -u NO_COLOR RUNBOOK_SECRETS_FILE={tmp_path / 'none.env'} "
               f"{sys.executable} {driver}; echo EXIT=$?; sleep 600")
    _tmux(sock, "-f", "/dev/null", "new-session", "-d", "-s", "run", "-x", "100", "-y", "50", command)
    try:
        deadline = time.monotonic() + 300
        live = ""
        while time.monotonic() < deadline and "40.00/100.00 MiB" not in live and "EXIT=" not in live:
            time.sleep(0.5)
            live = _tmux(sock, "capture-pane", "-p", "-t", "run")
        mark.touch()
        screen = ""
        while time.monotonic() < deadline and "EXIT=" not in screen:
            time.sleep(1)
            screen = _tmux(sock, "capture-pane", "-p", "-S", "-", "-t", "run")
    finally:
        mark.touch()
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=30)
    (line,) = [row for row in live.splitlines() if "40.00/100.00 MiB" in row]
    print(f"[live line] {line}")
    assert "02_gamma" in line and "━" in line and "eta" in line, live
    rows = [row.rstrip() for row in screen.splitlines() if row.strip()]
    assert rows[-1] == "EXIT=0" and not [row for row in rows if "MiB" in row], screen
