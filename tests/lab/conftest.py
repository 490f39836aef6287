"""Fixtures for tests that need the embedded netns lab (runbook.lab.netlab).

`lab` (session): brings the lab up (or reuses a healthy running one) and takes it down at the end of
the session only if this session brought it up; set RUNBOOK_KEEP_LAB=1 to keep it anyway.
`lab_server` (function): the lab profile's server running, shared (the user's when `make runbook` left it up).
RUNBOOK_LAB_DIR overrides the lab directory (default <repo>/.lab).
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from runbook.lab import netlab


def lab_dir() -> Path:
    return Path(os.environ.get("RUNBOOK_LAB_DIR") or netlab.default_lab_dir())


@pytest.fixture(scope="session")
def lab() -> netlab.LabInfo:
    if os.geteuid() != 0:
        pytest.skip("the netns lab needs root")
    info = netlab.up(lab_dir())
    print(f"\n[lab] up: reused={info.reused} timings={info.timings}")
    with users_server_kept(info.reused):
        yield info
    if not info.reused and os.environ.get("RUNBOOK_KEEP_LAB") != "1":
        netlab.down(lab_dir())


REPO = Path(__file__).resolve().parents[2]
USER_PROFILE = REPO / "env" / "lab.env"


@dataclass
class ServerState:
    """The lab profile's server (env/lab.env) across the session: the fingerprint the user's server ran with
    when the session began ('' none), and whether it is known to be set aside (stopped) now."""
    before: str = ""
    aside: bool = False


SERVER = ServerState()


def lab_profile_server(profile, *, raise_on_failure: bool = True):
    """The lab profile's server running with the fingerprint it renders now: reused when the head runs exactly
    that (``server.start`` re-probes health, models and a streamed token), else whatever a test left on these
    ports (another configuration, a lone worker rank) is stopped and the server started. Returns (plan, result)."""
    from runbook.facts import ranks
    from runbook.launch import server, stop
    from runbook.launch.plan import render_plan
    from runbook.remote import Cluster
    with Cluster.from_profile(profile) as cluster:
        plan = render_plan(cluster, profile)
        head = ranks.rank_state(cluster.head, profile)
        if not (head.running and head.fingerprint == plan.fingerprint):
            stop.stop(cluster, profile, mem_settle_s=0)
        return plan, server.start(cluster, profile, plan, raise_on_failure=raise_on_failure)


@contextlib.contextmanager
def users_server_kept(lab_reused: bool):
    """The README's order is `make runbook`, then `make test`: the server the user's runbook left running
    (env/lab.env) is the one the shared-server tests use (``lab_server``, run first); it is set aside only when
    the first test that needs the lab's ports comes (``lab_ports``), and at the end it is running again with the
    same fingerprint (reused when it still runs, started again otherwise), or the session fails."""
    SERVER.before, SERVER.aside = "", False
    if not lab_reused:
        SERVER.aside = True          # a lab just built runs no server
        yield
        return
    from runbook.facts import ranks
    from runbook.profile import load_profile
    from runbook.remote import Cluster
    profile = load_profile(USER_PROFILE)
    with Cluster.from_profile(profile) as cluster:
        head = ranks.rank_state(cluster.head, profile)
    SERVER.before = head.fingerprint if head.running else ""
    SERVER.aside = not head.running
    if SERVER.before:
        print(f"\n[lab] the runbook's server ({head.describe()}) is kept for the shared-server tests")
    try:
        yield
    finally:
        if SERVER.before:
            plan, restored = lab_profile_server(profile, raise_on_failure=False)
            print(f"[lab] the runbook's server {'kept' if restored.reused else 'started again'}: ok={restored.ok} "
                  f"fingerprint {plan.fingerprint[:12]}")
            assert restored.ok and plan.fingerprint == SERVER.before, (
                "the user's server was not restored as it was: "
                + restored.checks.to_text() + f"\nfingerprint before {SERVER.before} after {plan.fingerprint}")


@pytest.fixture
def lab_server(lab, vllm_venv):
    """The lab profile's own server (env/lab.env as ``make runbook`` starts it) running and answering, shared by
    the tests that need only a healthy TP=2 server: reused when it runs (the user's, or the one an earlier test
    used; ``server.start`` re-probes health, models and a streamed token), started otherwise. A test that breaks
    it leaves the next one to start it again. These tests run first (``pytest_collection_modifyitems``)."""
    from runbook.profile import load_profile
    profile = load_profile(USER_PROFILE)
    _, result = lab_profile_server(profile)
    assert result.ok, result.checks.to_text()
    print(f"\n[lab] lab server {'reused' if result.reused else 'started'}")
    SERVER.aside = False
    return profile


def pytest_collection_modifyitems(config, items):
    """The shared-server tests first, in their files' order (the user's server, when `make runbook` left it up,
    serves them without a boot; the last of them may end it), then every other test as collected."""
    items.sort(key=lambda item: "lab_server" not in getattr(item, "fixturenames", ()))


@pytest.fixture(autouse=True, scope="module")
def lab_ports(request):
    """A lab test that does not share the lab profile's server gets the lab's ports as `make test` always gave
    them: the server (the user's, or the shared-server tests') is set aside once, before the module's fixtures
    start anything (autouse: set up first in its scope). Modules of lab_server tests skip this."""
    if SERVER.aside or "lab" not in request.fixturenames or "lab_server" in request.fixturenames:
        yield
        return
    request.getfixturevalue("lab")
    from runbook import runner
    from runbook.profile import load_profile
    runner.set_lab_server_aside(load_profile(USER_PROFILE), echo=lambda m: print(f"\n[lab] {m}"),
                                needed_by="the lab tests")
    SERVER.aside = True
    yield


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The lab's CPU vLLM build (make lab-vllm); tests that serve a model skip without it."""
    from runbook.lab.control import VLLM_PYTHON
    if not VLLM_PYTHON.exists():
        pytest.skip(f"the lab's CPU vLLM venv is missing ({VLLM_PYTHON}); run `make lab-vllm`")
    return VLLM_PYTHON


@contextlib.contextmanager
def port_held(node, port: int, ip: str = "0.0.0.0", seconds: int = 120):
    """Something else listening on ``ip:port`` inside ``node`` (a plain python listener) for the
    duration; SO_REUSEADDR because an earlier test's connections may leave the port in TIME_WAIT."""
    from runbook.remote import quote
    holder = ("import socket, time; s = socket.socket(); "
              "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              f"s.bind(('{ip}', {port})); s.listen(); time.sleep({seconds})")
    pid = node.run(f"setsid nohup python3 -c {quote(holder)} </dev/null >/dev/null 2>&1 & echo $!",
                   timeout=15).stdout.strip()
    try:
        deadline = time.monotonic() + 15
        while f":{port} " not in node.read("ss -ltn").stdout and time.monotonic() < deadline:
            time.sleep(0.2)
        assert f":{port} " in node.read("ss -ltn").stdout, f"the test's holder of port {port} did not start"
        yield
    finally:
        node.run(f"kill {int(pid)}", timeout=10, warn=True)


@pytest.fixture
def hold_port():
    """``with hold_port(node, port[, ip]):`` -- see ``port_held``."""
    return port_held



@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """The rigged tiny Llama (runbook.lab.tinymodel), made once for the session's loopback servers
    ($LAB_TINY_MODEL_DIR reuses one made earlier)."""
    import subprocess
    from runbook.lab import vllm_lab
    given = os.environ.get("LAB_TINY_MODEL_DIR")
    if given:
        assert (Path(given) / "model.safetensors").is_file(), f"LAB_TINY_MODEL_DIR={given} has no model"
        return Path(given)
    out = tmp_path_factory.mktemp("models") / "tiny-llama-rigged"
    res = subprocess.run([str(vllm_lab.lab_python()), "-m", "runbook.lab.tinymodel", "--out", str(out), "--arch", "llama"],
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1"),
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    return out


@dataclass
class LoopbackServer:
    """A TP=1 vLLM on 127.0.0.1 and what its tests read: its base URL, its API key, seconds to /health."""
    srv: object
    base: str
    key: str
    ready_s: float
    processes: int


@pytest.fixture(scope="session")
def tiny_tp1_server(tiny_llama, tmp_path_factory):
    """One TP=1 vLLM on loopback serving the tiny Llama as the smoke test expects it (served name `tiny`,
    max_model_len 4096, hermes tools with `--tool-strict-level parameter`, `--api-key` with a generated key),
    shared by test_smoke_vllm's text test and test_vllm_cpu's TP=1 test (a CPU boot costs ~35 s on 2 cores).
    test_vllm_cpu's test stops it and checks its process tree is gone; the session's end stops it otherwise."""
    import secrets
    import socket
    from runbook.lab import vllm_lab
    from runbook.secrets import register_secret
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key = "lab-" + secrets.token_urlsafe(18)
    register_secret(key)
    cmd = vllm_lab.serve_command(tiny_llama, port=port, served_model_name="tiny", max_model_len=4096, tools=True,
                                 extra=["--api-key", key])
    srv = vllm_lab.VllmServer.start(cmd, vllm_lab.serve_env(host_ip="127.0.0.1"),
                                    tmp_path_factory.mktemp("tp1") / "vllm-tp1.log", cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        ready = srv.wait_ready(base, timeout=float(os.environ.get("LAB_VLLM_READY_TIMEOUT", "420")))
        yield LoopbackServer(srv=srv, base=base, key=key, ready_s=ready, processes=len(srv.processes()))
    finally:
        if srv.alive() or srv._live_tracked():
            srv.stop()
