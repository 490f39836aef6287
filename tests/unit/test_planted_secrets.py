"""Planted secrets on every path that writes or shows text outside the run folder's own writer: a step's streamed
cell output (the console), network raw files, bench outputs, and what a diagnose bundle collects on a node (the
rank's environment, the process list). Zero hits of any planted value."""
from __future__ import annotations

import base64
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest

from runbook import secrets as S
from runbook.facts import procs
from runbook.runner import RedactingFilter

# some cases time the reference server's answers: on the lab's xdist worker in `make test`, never niced
pytestmark = pytest.mark.timed

HF = "hf_PlantedConsoleToken0123456789ab"
API = "sk-planted-key-5e4d3c2b1a"
PLANTED = (HF, API, base64.b64encode(HF.encode()).decode()[:24], "s3cr3tpw")


def _leaks(text: str) -> list[str]:
    return [s for s in PLANTED if s in text]


def _noisy_text() -> str:
    return (f"downloading with HF_TOKEN={HF}\nAuthorization: Bearer {API}\nkey {API} again\n"
            f"proxy https://ops:s3cr3tpw@mirror.internal/x\n{base64.b64encode(HF.encode()).decode()}\n"
            f"X-Api-Key: {API}\n")


@pytest.fixture
def registered():
    """The process-wide redactor knows the planted values (as when they come from the environment)."""
    S.reset_default_redactor()
    S.register_secret(HF)
    S.register_secret(API)
    yield
    S.reset_default_redactor()


def test_streamed_cell_output_is_masked_before_any_handler(tmp_path, monkeypatch):
    """papermill logs each cell's stdout/stderr through logging.getLogger("papermill") (log_output=True);
    the runner's filter masks the record before the console handler formats it."""
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "none.env"))
    logger = logging.getLogger("papermill")
    seen: list[str] = []

    class Console(logging.Handler):
        def emit(self, record):
            seen.append(self.format(record))
    handler = Console()
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    flt = RedactingFilter(S.Redactor([HF, API]))
    logger.addFilter(flt)
    try:
        logger.info(_noisy_text())
        logger.warning("stderr: %s", HF)
    finally:
        logger.removeFilter(flt)
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert len(seen) == 2 and all("***" in s for s in seen)
    assert _leaks("\n".join(seen)) == []


def test_a_key_generated_during_the_step_is_masked_in_the_stream(tmp_path, monkeypatch):
    """Step 04 may generate an API key into the secrets file mid-step: the filter picks it up."""
    secrets = tmp_path / "secrets.env"
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(secrets))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    flt = RedactingFilter(S.Redactor(), refresh_s=0.0)
    secrets.write_text(f"VLLM_API_KEY={API}\n")
    secrets.chmod(0o600)
    record = logging.LogRecord("papermill", logging.INFO, __file__, 1, f"generated {API}", None, None)
    assert flt.filter(record) and record.getMessage() == "generated ***"


def test_network_raw_files_are_written_masked(tmp_path, registered):
    from runbook.network.context import Verification
    from runbook.profile import load_profile
    from support.doubles import FakeCluster
    ctx = Verification(FakeCluster([]), load_profile("env/lab.env", environ={}), tmp_path / "raw")
    ref = ctx.save("head/ip_addr.txt", _noisy_text())
    files = list((tmp_path / "raw").rglob("*"))
    assert ref.endswith("head/ip_addr.txt") and any(f.is_file() for f in files)
    for f in files:
        if f.is_file():
            assert _leaks(f.read_text()) == [] and "***" in f.read_text()
    assert not [f for f in files if f.name.endswith(".partial")]      # atomic: no temporary left


def test_bench_outputs_are_written_masked(tmp_path, registered):
    from runbook.benchmark.report import write_report
    from runbook.benchmark.result import BenchResult, CaseResult, write_jsonl
    case = CaseResult(name="decode-c1", kind="decode", concurrency=1, prompt_tokens=8, decode_tokens=8, repeats=1,
                      status="FAIL", failures=[f"HTTP 401 for Bearer {API}"], warnings=[f"token {HF}"],
                      figures={"decode_tok_s": {"median": 10.0, "min": 9.0, "max": 11.0, "q1": 9.5, "q3": 10.5,
                                                "iqr": 1.0, "n": 1}})
    result = BenchResult(schema_version="runbook.bench/1", run_id="r", base_url="https://ops:s3cr3tpw@h:8000/v1",
                         model="m", config={"api_key": API}, environment={"HF_TOKEN": HF}, cases=[case],
                         status="FAIL")
    out = tmp_path / "bench"
    result.save(out / "result.json")
    write_jsonl(out / "raw" / "requests.jsonl", [{"headers": {"Authorization": f"Bearer {API}"}, "err": HF}])
    write_report(result, out, plot=False)          # a crash here is a failure, never a skip
    files = [f for f in out.rglob("*") if f.is_file()]
    assert {"result.json", "requests.jsonl", "summary.txt"} <= {f.name for f in files}
    for f in files:
        assert _leaks(f.read_text(errors="replace")) == [], f.name


# ----------------------------------------------------------------------------- what diagnose collects on a node

def _spawn(env: dict[str, str], argv: list[str], *prefix: str) -> subprocess.Popen:
    return subprocess.Popen([*prefix, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_diagnose_keeps_only_allowed_variables_of_the_rank(tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HF_TOKEN": HF, "VLLM_API_KEY": API,
           "HUGGING_FACE_HUB_TOKEN": HF, "NCCL_IB_HCA": "rocep1s0f1", "VLLM_HOST_IP": "10.0.0.1",
           "VLLM_MY_PASSWORD": "s3cr3tpw", "DSV41_PREFILL_EMPTY_CACHE_TOKENS": "8192", "AWS_SECRET": API,
           "OTHER": "s3cr3tpw"}
    proc = _spawn(env, ["sleep", "30"])
    try:
        pidf = tmp_path / "head.pid"
        pidf.write_text(str(proc.pid))
        out = subprocess.run(["bash", "-c", procs.proc_environ_cmd(str(pidf))], capture_output=True, text=True,
                             timeout=20).stdout
    finally:
        proc.kill()
        proc.wait()
    kept = procs.parse_environ(out)
    assert kept.get("NCCL_IB_HCA") == "rocep1s0f1" and kept.get("VLLM_HOST_IP") == "10.0.0.1"
    assert kept.get("DSV41_PREFILL_EMPTY_CACHE_TOKENS") == "8192"
    assert _leaks(out) == [] and not {"HF_TOKEN", "VLLM_API_KEY", "VLLM_MY_PASSWORD", "OTHER"} & set(kept)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to run as another user")
def test_diagnose_process_list_leaves_other_users_command_lines_out(tmp_path):
    marker = "planted-arg-s3cr3tpw"
    mine = _spawn(dict(os.environ), ["bash", "-c", "exec -a vllm-serve-fake sleep 30"])
    other = _spawn(dict(os.environ), [sys.executable, "-c", "import time; time.sleep(30)", "vllm", marker],
                   "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    try:
        time.sleep(0.3)
        out = subprocess.run(["bash", "-c", procs.PS_CMD], capture_output=True, text=True, timeout=20).stdout
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()
    assert "vllm-serve-fake" in out                      # the runbook's own (this user's) vLLM process is listed
    assert f"{marker} " not in out + " " and f"{marker}\n" not in out    # nobody's command line is not
    assert str(other.pid) not in out.split()
