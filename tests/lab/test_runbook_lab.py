"""The runbook end to end on the real two-node lab: papermill, evidence, secrets, stop and resume."""
from __future__ import annotations

import json
import secrets as pysecrets
import shutil
from pathlib import Path

import pytest

from runbook import runner
from runbook.checks import CheckList, Status
from runbook.evidence import REPO_ROOT

pytestmark = pytest.mark.lab
PROFILE = "env/lab.env"


def _all_text(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in root.rglob("*") if p.is_file()}


def test_preflight_passes_and_leaves_evidence(lab, tmp_path):
    run_dir, outcomes = runner.run(PROFILE, only=["00"], results_root=tmp_path)
    assert [(o.name, o.status) for o in outcomes] == [("00_preflight", "passed")], outcomes
    root = run_dir.path
    for rel in ("manifest.json", "provenance.json", "profile.json", "commands.jsonl",
                "notebooks/00_preflight.ipynb", "steps/00_preflight.json"):
        assert (root / rel).is_file(), rel
    manifest = json.loads((root / "manifest.json").read_text())
    entry = manifest["steps"]["00_preflight"]
    assert entry["status"] == "passed" and entry["exit"] == 0 and len(entry["notebook_sha256"]) == 64
    assert manifest["status"] == "passed"
    checks = CheckList.from_records(json.loads((root / "steps/00_preflight.json").read_text())["checks"])
    assert not checks.failures()
    by_name = {(c.name, c.node): c for c in checks}
    assert by_name[("GPU present", "head")].status is Status.NA     # the lab has no GPU and says so
    assert by_name[("ssh reachable", "worker")].observed == "hostname spark-worker"
    assert by_name[("runtime image identical", "cluster")].status is Status.PASS
    commands = [json.loads(line) for line in (root / "commands.jsonl").read_text().splitlines()]
    assert {c["node"] for c in commands} == {"head", "worker"}
    assert all(isinstance(c["exit_code"], int) and c["duration_s"] >= 0 for c in commands)
    nb = json.loads((root / "notebooks/00_preflight.ipynb").read_text())
    assert any(cell.get("outputs") for cell in nb["cells"] if cell["cell_type"] == "code")
    provenance = json.loads((root / "provenance.json").read_text())
    assert provenance["packages"]["papermill"] and provenance["git"]["sha"]


def test_planted_secrets_never_reach_results(lab, tmp_path, monkeypatch):
    token = "hf_" + pysecrets.token_hex(17)
    api_key = "sk-test-" + pysecrets.token_hex(12)
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("VLLM_API_KEY", api_key)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    shutil.copy(REPO_ROOT / "notebooks/00_preflight.ipynb", notebooks)
    shutil.copy(Path(__file__).parent / "notebooks/01_leak.ipynb", notebooks)
    results = tmp_path / "results"
    run_dir, outcomes = runner.run(PROFILE, results_root=results, notebooks_dir=notebooks)
    assert [o.status for o in outcomes] == ["passed", "passed"], outcomes
    files = _all_text(results)
    leaks = [name for name, text in files.items() if token in text or api_key in text]
    assert not leaks, f"secrets found in {leaks}"
    # the leak really happened and was masked, in stdout, the raw file, the sidecar and the command log
    assert "***" in files[f"{run_dir.run_id}/notebooks/01_leak.ipynb"]
    assert "***" in files[f"{run_dir.run_id}/raw/01_leak/echo.txt"]
    assert "***" in files[f"{run_dir.run_id}/steps/01_leak.json"]
    assert "***" in files[f"{run_dir.run_id}/commands.jsonl"]


BUSY_PORT = 18555


def test_failed_step_stops_the_run_and_resume_continues(lab, tmp_path):
    # a process on the head listens on the API port, so preflight must fail (PORT=22, sshd's, was used until
    # validate learnt to refuse ports the nodes serve before anything runs)
    import subprocess
    ssh = ["ssh", "-F", str(REPO_ROOT / ".lab/ssh_config"), "spark-head"]
    listener = subprocess.Popen(ssh + [f"exec python3 -c 'import socket,time; s=socket.socket(); "
                                       f"s.bind((\"127.0.0.1\", {BUSY_PORT})); s.listen(); time.sleep(600)'"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time
        deadline = time.monotonic() + 30
        while f":{BUSY_PORT} " not in subprocess.run(ssh + ["ss -ltn"], capture_output=True, text=True,
                                                     timeout=30).stdout:
            assert time.monotonic() < deadline and listener.poll() is None, "the listener never bound its port"
            time.sleep(0.3)
        run_dir, outcomes = runner.run(PROFILE, overrides={"PORT": str(BUSY_PORT)}, results_root=tmp_path)
    finally:
        listener.kill()
        subprocess.run(ssh + [f"pkill -f 'bind..\"127.0.0.1\", {BUSY_PORT}' || true"], timeout=30)
    assert [(o.name, o.status) for o in outcomes] == [("00_preflight", "failed")]
    assert f"API port {BUSY_PORT} free" in outcomes[0].error
    nb = json.loads((run_dir.path / "notebooks/00_preflight.ipynb").read_text())
    errors = [c for c in nb["cells"] if c["cell_type"] == "code"
              and any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert errors and "step.finish()" in "".join(errors[0]["source"])   # the failing cell is kept, marked
    assert run_dir.manifest()["status"] == "failed"

    run_dir2, outcomes2 = runner.run(PROFILE, only=["00"], resume=run_dir.run_id, results_root=tmp_path)
    assert run_dir2.path == run_dir.path
    assert [(o.name, o.status) for o in outcomes2] == [("00_preflight", "passed")]
    assert run_dir.manifest()["steps"]["00_preflight"]["status"] == "passed"
