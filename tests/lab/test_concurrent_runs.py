"""One run per cluster, on the real lab: two `python -m runbook run` at once on the same nodes. The second (and a
`stop` meanwhile) refuses cleanly with exit 9 (BUSY) naming the holder, before it makes a run folder or runs a
command on a node; the first is not disturbed (it ends as it would alone, its commands.jsonl whole) and leaves no
lock behind.

Budget: the first run covers steps 00-01 (preflight and network), a few minutes on 2 cores."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from runbook.evidence import RESULTS_ROOT
from runbook.profile import REPO_ROOT, load_profile
from runbook.remote import LOCK_NAME, Cluster

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the netns lab needs root")]
PROFILE = "env/lab.env"
RUN = ["run", "--profile", PROFILE, "--no-lab", "--to", "01"]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runbook", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


def _lock_on_head() -> str:
    """The lock's owner file on the head ("" when there is no lock)."""
    with Cluster.from_profile(load_profile(REPO_ROOT / PROFILE)) as cluster:
        return cluster.head.read(f'cat "$HOME"/{LOCK_NAME}/owner.json 2>/dev/null', timeout=30).stdout.strip()


def test_a_second_run_on_the_same_lab_refuses_cleanly(lab):
    assert _lock_on_head() == "", "a lock is left on the lab's head from before"
    before = {p.name for p in RESULTS_ROOT.iterdir()} if RESULTS_ROOT.exists() else set()
    first = subprocess.Popen([sys.executable, "-m", "runbook", *RUN], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 120
        owner = ""
        while not owner and time.monotonic() < deadline and first.poll() is None:
            time.sleep(1)
            owner = _lock_on_head()
        assert owner, "the first run never took the cluster lock"
        held = json.loads(owner)
        assert held["pid"] == first.pid and held["command"] == "run"

        second = _cli(*RUN)
        assert second.returncode == 9, (second.returncode, second.stdout[-2000:], second.stderr[-2000:])
        assert "the cluster is in use" in second.stderr and f"pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr + second.stdout

        stop = _cli("stop", "--profile", PROFILE)
        assert stop.returncode == 9 and "Traceback" not in stop.stderr, stop.stderr[-2000:]

        out, err = first.communicate(timeout=1200)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, (out[-3000:], err[-3000:])
    assert json.loads(owner)["pid"] == first.pid and _lock_on_head() == ""      # released at the end

    made = sorted({p.name for p in RESULTS_ROOT.iterdir()} - before)
    assert len(made) == 1, f"the refused run made a run folder too: {made}"      # only the first's
    run_dir = RESULTS_ROOT / made[0]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "passed" and set(manifest["steps"]) == {"00_preflight", "01_network"}
    lines = (run_dir / "commands.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["node"] for line in lines)            # whole lines only


def test_a_killed_run_leaves_a_stale_lock_the_next_run_says_and_takes_over(lab):
    assert _lock_on_head() == ""
    first = subprocess.Popen([sys.executable, "-m", "runbook", *RUN], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd=REPO_ROOT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not _lock_on_head() and time.monotonic() < deadline:
        time.sleep(1)
    os.killpg(first.pid, signal.SIGKILL)           # the runner and its notebook kernel: no release
    first.wait()
    assert json.loads(_lock_on_head())["pid"] == first.pid
    after = _cli("stop", "--profile", PROFILE)
    assert after.returncode == 0, after.stderr[-2000:]
    assert f"stale lock of pid {first.pid}" in after.stderr and _lock_on_head() == ""
