"""JupyterLab as a person uses it: headless Chromium (Debian's /usr/bin/chromium driven by npm
playwright-core in tests/browser/) against a real JupyterLab server. Screenshots land in test-artifacts/.

* The preflight (needs the lab): a copy of notebooks/00_preflight.ipynb, the `runbook` kernel, the profile form
  edited, Run -> Run All Cells, the summary table read from the DOM: every check PASS or N/A.
* A long cell's progress widget (no lab): a cell runs the bench against the reference server on loopback (a real
  producer of runbook.progress, about 17 s); while its prompt is [*] its output holds the channel's progress bar
  and the bar's count moves; when it ends the bar is complete (issue 38 item 7).

Needs `apt-get install -y --no-install-recommends chromium` and `npm ci` in tests/browser (the preflight also the
lab, root); `make test-browser` does all of it.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BROWSER_DIR = ROOT / "tests" / "browser"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
NODE = shutil.which("node")
ARTIFACTS = ROOT / "test-artifacts"
SCRATCH = ROOT / ".lab" / "ui"              # git-ignored; JupyterLab's root is the repo
NOTEBOOK = ROOT / "notebooks" / "00_preflight.ipynb"
PROFILE = ROOT / "env" / "lab.env"
INSTALL = ("make test-browser, or: apt-get install -y --no-install-recommends chromium && "
           "(cd tests/browser && npm ci)")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason=f"chromium not installed ({INSTALL})"),
    pytest.mark.skipif(NODE is None, reason="node not installed (Node.js >= 18)"),
    pytest.mark.skipif(not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir(),
                       reason=f"playwright-core not installed in tests/browser ({INSTALL})"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy_notebook(dest_dir: Path) -> Path:
    """A copy of the step notebook whose profile_path points at the repo's env/lab.env."""
    nb = json.loads(NOTEBOOK.read_text())
    params = next(c for c in nb["cells"] if c["cell_type"] == "code")
    src = "".join(params["source"])
    first, _, rest = src.partition("\n")
    assert first.startswith("profile_path ="), first
    params["source"] = f'profile_path = "{os.path.relpath(PROFILE, dest_dir)}"  # the repo\'s lab profile\n' + rest
    out = dest_dir / NOTEBOOK.name
    out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return out


def _settings(root: Path) -> Path:
    """User settings of the throw-away JupyterLab: no news/update checks, all cells in the DOM."""
    files = {
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
            {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(data))
    return root


class JupyterLab:
    def __init__(self, tmp: Path):
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "jupyterlab.log"
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"))
        argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
                f"--ServerApp.root_dir={ROOT}", f"--IdentityProvider.token={self.token}",
                "--MappingKernelManager.default_kernel_name=runbook",
                "--ServerApp.kernel_manager_class="
                "jupyter_server.services.kernels.kernelmanager.AsyncMappingKernelManager",
                f"--LabApp.user_settings_dir={_settings(tmp / 'settings')}",
                f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
                "--ContentsManager.allow_hidden=True",        # the scratch copy lives in .lab/ui/
                "--LabApp.news_url=", "--LabApp.extension_manager=readonly",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        if os.geteuid() == 0:
            argv.append("--allow-root")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait(self, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        req = urllib.request.Request(f"{self.url}/api/kernelspecs", headers={"Authorization": f"token {self.token}"})
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return json.load(r)
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"JupyterLab did not answer in {timeout} s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)        # the server shuts its kernels down
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: only what it started
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def scratch():
    d = SCRATCH / f"run-{os.getpid()}-{secrets.token_hex(3)}"
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _browser(script: str, server: JupyterLab, notebook: Path, run_timeout_s: int) -> tuple[dict, str]:
    """Run tests/browser/<script> on ``notebook`` in ``server``; what it saw (its RESULT line) and its log."""
    env = dict(os.environ, JUPYTER_URL=server.url, JUPYTER_TOKEN=server.token, NOTEBOOK=str(notebook.relative_to(ROOT)),
               ARTIFACTS=str(ARTIFACTS), CHROMIUM=CHROMIUM, RUN_TIMEOUT_S=str(run_timeout_s))
    proc = subprocess.run([NODE, script], cwd=BROWSER_DIR, env=env, capture_output=True, text=True,
                          timeout=run_timeout_s + 70)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no result from the browser (rc {proc.returncode}):\n{proc.stderr[-3000:]}\n{server.tail()}"
    return json.loads(lines[-1][len("RESULT "):]), proc.stderr


@pytest.mark.lab
@pytest.mark.timeout(300)
def test_preflight_run_all_in_jupyterlab(lab, scratch, tmp_path):
    nb = _copy_notebook(scratch)
    for old in ARTIFACTS.glob("jupyter_ui_*.png"):     # screenshots of this run only
        old.unlink()
    original = NOTEBOOK.read_bytes()
    server = JupyterLab(tmp_path)
    evidence = ""
    try:
        specs = server.wait()
        assert "runbook" in specs["kernelspecs"] and specs["default"] == "runbook", specs
        result, log = _browser("jupyter_ui.mjs", server, nb, 170)
        evidence = result.get("evidence", "")
        print(log)
        print(json.dumps({k: v for k, v in result.items() if k != "table"}, indent=1))
        assert not result.get("failure"), f"{result['failure']}\n{log[-2000:]}\n{server.tail()}"
        assert result["kernel"] == "Python (runbook)"
        assert not result["errors"], "a cell raised:\n" + "\n".join(result["errors"])
        assert result["prompts"] and all(p.startswith("[") and p[1:-2].isdigit() for p in result["prompts"]), \
            result["prompts"]
        # the profile form rendered in the browser and showed the CLI's message under the key
        form = result["form"]
        assert form["present"] and form["status"].startswith("valid"), form
        assert "runtime and serve" in form["sections"], form
        assert "out of range" in form["error"] and form["status_after_edit"].startswith("1 problem"), form
        assert any("problem" in t for t in form["sections_after_edit"]), form
        assert form["status_after_undo"].startswith("valid"), form
        # the summary table, read from the DOM
        table = result["table"]
        assert table, "no summary table in the last cell's output"
        statuses = {row["status"] for row in table}
        bad = [row for row in table if row["status"] not in ("PASS", "N/A")]
        assert not bad, f"checks not PASS or N/A: {bad}"
        assert "PASS" in statuses and len(table) >= 10, table
        names = {(row["name"], row["node"]) for row in table}
        assert ("ssh reachable", "worker") in names, names
        assert any(Path(p).name == "jupyter_ui_summary.png" and Path(p).is_file() for p in result["screenshots"])
    finally:
        server.stop()
        assert NOTEBOOK.read_bytes() == original, "the stored notebook was modified"
        # the interactive run opened results/<run-id>/ of its own; it is this test's, remove it
        if evidence:
            run = Path(evidence)
            run = run if run.is_absolute() else ROOT / run
            if run.is_dir() and run.resolve().parent == (ROOT / "results").resolve():
                shutil.rmtree(run, ignore_errors=True)


# A real producer of the progress channel, long enough to watch: the bench (runbook.benchmark.runner counts
# "bench requests") against the reference server in the kernel, 16 requests of 40 tokens 50 ms apart, one case
# after another: about 17 s, the count rising every 2 s. Nothing leaves loopback.
BENCH_REQUESTS = 16
BENCH_CELL = f"""\
import runbook
from runbook.benchmark.refserver import RefConfig, serve_in_thread
from runbook.benchmark.result import BenchConfig
from runbook.benchmark.runner import case_requests, run_benchmark

cfg = BenchConfig(prompt_tokens=40, decode_tokens=40, concurrency=(1, 2), prefill_tokens=(50,), repeats=4,
                  warmup_requests=1)
assert case_requests(cfg) == {BENCH_REQUESTS}
with serve_in_thread(RefConfig(interval_s=0.05)) as srv:
    res = run_benchmark(srv.base_url, "ref-model", cfg)
print("runbook from", runbook.__file__)
print("bench", res.status)
"""
FIGURES = re.compile(r"(\d+)/(\d+) requests")


def _one_cell_notebook(dest: Path, source: str) -> Path:
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "runbook", "display_name": "Python (runbook)", "language": "python"}},
          "cells": [{"cell_type": "code", "id": "long-cell", "metadata": {}, "execution_count": None,
                     "outputs": [], "source": source}]}
    out = dest / "long_cell.ipynb"
    out.write_text(json.dumps(nb, indent=1) + "\n")
    return out


def _count(bar: dict) -> tuple[int, int]:
    m = FIGURES.search(bar["figures"])
    assert m, f"no 'done/total requests' next to the bar: {bar}"
    return int(m[1]), int(m[2])


@pytest.mark.timeout(300)
def test_a_long_cell_shows_its_progress_widget_moving_while_it_runs(scratch, tmp_path):
    """Issue 38 item 7: JupyterLab by hand shows the channel's bar (progress.WidgetSink) in the running cell's
    output, its count rises while the prompt is [*], and it ends complete (full, success style, N/N)."""
    nb = _one_cell_notebook(scratch, BENCH_CELL)
    for old in ARTIFACTS.glob("jupyter_progress_*.png"):     # screenshots of this run only
        old.unlink()
    server = JupyterLab(tmp_path)
    try:
        specs = server.wait()
        assert specs["default"] == "runbook", specs
        result, log = _browser("jupyter_progress.mjs", server, nb, 150)
        print(log)
        print(json.dumps(result, indent=1))
        assert not result.get("failure"), f"{result['failure']}\n{log[-2000:]}\n{server.tail()}"
        assert result["kernel"] == "Python (runbook)"
        final = result["final"]
        assert not result["errors"], "the cell raised:\n" + "\n".join(result["errors"])
        assert f"runbook from {ROOT / 'runbook' / '__init__.py'}" in final["text"], final["text"]  # this checkout
        assert "bench PASS" in final["text"], final["text"]
        # while the cell ran: its output held the bar, read twice with the prompt [*], and the count moved
        running = result["running"]
        assert len(running) == 2, f"no progress bar seen moving while the cell ran ([*]): {running}\n{log}"
        for reading in running:
            assert reading["prompt"] == "[*]:" and [b["label"] for b in reading["bars"]] == ["bench requests"], reading
        (first,), (second,) = running[0]["bars"], running[1]["bars"]
        (d1, t1), (d2, t2) = _count(first), _count(second)
        assert t1 == t2 == BENCH_REQUESTS and d1 < d2 < BENCH_REQUESTS, (first, second)
        assert not first["success"] and not second["success"], (first, second)
        # the end: the cell numbered, the same bar full in the success style with all requests done
        assert re.fullmatch(r"\[\d+\]:", final["prompt"]), final["prompt"]
        (bar,) = final["bars"]
        assert bar["label"] == "bench requests" and bar["success"] and bar["width"] == "100%", bar
        assert _count(bar) == (BENCH_REQUESTS, BENCH_REQUESTS), bar
        assert f"bench requests: 100.0% {BENCH_REQUESTS}/{BENCH_REQUESTS} requests in " in final["text"]
        shots = {Path(p).name for p in result["screenshots"] if Path(p).is_file()}
        assert {"jupyter_progress_running.png", "jupyter_progress_done.png"} <= shots, shots
    finally:
        server.stop()
