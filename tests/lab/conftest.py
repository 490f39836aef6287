"""Fixtures for tests that need the embedded netns lab (runbook.lab.netlab).

`lab` (session): brings the lab up (or reuses a healthy running one) and takes it down at the end of
the session only if this session brought it up; set RUNBOOK_KEEP_LAB=1 to keep it anyway.
RUNBOOK_LAB_DIR overrides the lab directory (default <repo>/.lab).
"""
from __future__ import annotations

import contextlib
import os
import time
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
    with users_server_set_aside(info.reused):
        yield info
    if not info.reused and os.environ.get("RUNBOOK_KEEP_LAB") != "1":
        netlab.down(lab_dir())


USER_PROFILE = Path(__file__).resolve().parents[2] / "env" / "lab.env"


@contextlib.contextmanager
def users_server_set_aside(lab_reused: bool):
    """The README's order is `make runbook`, then `make test`: the lab tests need the lab's ports, so a
    server the user's runbook left running (env/lab.env) is stopped for the session and started again
    afterwards with the same profile, and the test fails if it does not come back with the same
    fingerprint."""
    if not lab_reused:
        yield
        return
    from runbook import runner
    from runbook.launch import server, stop
    from runbook.launch.plan import render_plan
    from runbook.profile import load_profile
    from runbook.remote import Cluster
    profile = load_profile(USER_PROFILE)
    # the runbook's own way (a rehearsal sets the lab's server aside the same way): stopped, its fingerprint kept
    before = runner.set_lab_server_aside(profile, echo=lambda m: print(f"\n[lab] {m}"), needed_by="the lab tests")
    try:
        yield
    finally:
        if before:
            with Cluster.from_profile(profile) as cluster:
                stop.stop(cluster, profile, mem_settle_s=0)      # whatever a test left on these ports
                plan = render_plan(cluster, profile)
                restored = server.start(cluster, profile, plan, raise_on_failure=False)
            print(f"[lab] the runbook's server started again: ok={restored.ok} fingerprint {plan.fingerprint[:12]}")
            assert restored.ok and plan.fingerprint == before, (
                "the user's server was not restored as it was: "
                + restored.checks.to_text() + f"\nfingerprint before {before} after {plan.fingerprint}")


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
