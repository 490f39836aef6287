"""01_network on the real lab, with the three faults the step must name: link down on one node, MTU
1500 on one end, a wrong interface name in the profile."""
from __future__ import annotations

import json

import pytest

from runbook.network import verify as network
from runbook.checks import Status
from runbook.profile import load_profile
from runbook.remote import Cluster

pytestmark = pytest.mark.lab
IF = "enp1s0f0np0"


@pytest.fixture()
def cluster(lab):
    profile = load_profile("env/lab.env")
    with Cluster.from_profile(profile) as c:
        yield profile, c


def _failed(checks):
    return [c for c in checks if c.status is Status.FAIL]


def test_healthy_fabric_passes_with_traffic(cluster):
    profile, c = cluster
    checks, raw = network.verify_network(profile, c, iperf_seconds=2)
    assert not _failed(checks), [(f.name, f.node, f.observed) for f in _failed(checks)]
    tcp = [ch for ch in checks if ch.data.get("kind") == "tcp"]
    assert len(tcp) == 2 and all(ch.data["gbps"] > profile.min_tcp_gbps for ch in tcp)
    assert any(name.startswith("iperf3_") for name in raw)
    # every raw sweep file is one JSON document (torch's warnings on stderr used to follow the JSON line)
    sweeps = [name for name in raw if name.startswith("allreduce_sweep_")]
    ran = [ch for ch in checks if ch.name == "net.allreduce" and ch.status is not Status.NA]
    assert len(sweeps) == len(ran), (sweeps, ran)
    for name in sweeps:
        doc = json.loads(raw[name])
        assert doc["tool"] == "allreduce_sweep" and doc["results"] and doc["exit_code"] == 0, name


def test_link_down_on_worker_is_named(cluster):
    profile, c = cluster
    try:
        c.worker.run(f"ip link set {IF} down", timeout=20)
        checks, _ = network.verify_network(profile, c, traffic=False)
        failed = _failed(checks)
        assert any(f.node == "worker" and IF in f.name + f.observed and "DOWN" in f.observed.upper()
                   for f in failed), [(f.name, f.node, f.observed) for f in failed]
    finally:
        c.worker.run(f"ip link set {IF} up", timeout=20)
        c.worker.run(f"for i in $(seq 50); do ip -br link show {IF} | grep -q UP && break; sleep 0.2; done",
                     timeout=30)


def test_mtu_mismatch_names_both_values(cluster):
    profile, c = cluster
    try:
        c.worker.run(f"ip link set {IF} mtu 1500", timeout=20)
        checks, _ = network.verify_network(profile, c, traffic=False)
        mismatch = [f for f in _failed(checks) if f.name.startswith("net.mtu.rail0")]
        assert mismatch and "9000" in mismatch[0].observed and "1500" in mismatch[0].observed
    finally:
        c.worker.run(f"ip link set {IF} mtu 9000", timeout=20)


def test_wrong_interface_name_is_named_before_any_traffic(cluster):
    profile, _ = cluster
    bad = profile.with_overrides({"WORKER_CX7_IF": "enp1s0f1np1"})
    with Cluster.from_profile(bad) as c:
        checks, raw = network.verify_network(bad, c)
        failed = _failed(checks)
        assert failed and failed[0].node == "worker" and "enp1s0f1np1" in failed[0].observed
        assert not any(name.startswith(("iperf3_", "ping_")) for name in raw)   # stopped before traffic
