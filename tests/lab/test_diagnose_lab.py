"""Failures injected for real on the lab, each detected and explained (issue 16)."""
from __future__ import annotations

import time

import pytest

from runbook.launch import server
from runbook.profile import load_profile
from runbook.remote import Cluster

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow]
PROFILE = "env/lab.env"


def test_firewall_dropping_the_master_port_is_named_within_a_minute(lab, vllm_venv):
    """An iptables DROP on the head for the master port: vLLM alone waits ~30 min for "clients joined";
    the launch's TCP probe from the worker says what it is while the head listens."""
    profile = load_profile(PROFILE)
    rule = f"INPUT -p tcp --dport {profile.master_port} -s {profile.worker_ip} -j DROP"
    with Cluster.from_profile(profile) as cluster:
        server.stop(cluster, profile, mem_settle_s=0)
        cluster.head.run(f"iptables -I {rule}", timeout=20)
        try:
            t0 = time.monotonic()
            result = server.start(cluster, profile, server.render_plan(cluster, profile), raise_on_failure=False)
            took = time.monotonic() - t0
        finally:
            cluster.head.run(f"iptables -D {rule}", timeout=20, warn=True)
            server.stop(cluster, profile, mem_settle_s=0)
    failed = result.checks.failures()
    print(f"\n[diagnose] master port firewalled: start ended after {took:.1f} s: "
          + "; ".join(f"{c.name}: {c.observed}" for c in failed))
    assert [c.name for c in failed] == ["workers reach the master port"], result.checks.to_text()
    assert "firewall" in failed[0].fix and str(profile.master_port) in failed[0].observed
    assert took < 60 + 30, took       # launch + the probe's polls; far from vLLM's own 1801 s


@pytest.fixture(scope="module")
def running(lab, vllm_venv):
    profile = load_profile(PROFILE)
    with Cluster.from_profile(profile) as cluster:
        result = server.start(cluster, profile, server.render_plan(cluster, profile))
        assert result.ok, result.checks.to_text()
        yield profile
        server.stop(cluster, profile, mem_settle_s=0)


def test_diagnose_names_a_port_answering_for_another_model(running, tmp_path):
    """The profile expects one model id; the port serves another: `python -m runbook diagnose` says so."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "runbook", "diagnose", "--profile", PROFILE,
                           "-p", "SERVED_MODEL_NAME=deepseek-v4-flash"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    assert "wrong-model-on-port" in done.stdout and "tiny" in done.stdout, done.stdout[-3000:]


def test_diagnose_of_a_healthy_lab_matches_nothing(running):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "runbook", "diagnose", "--profile", PROFILE],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 known failure(s) matched" in done.stdout
