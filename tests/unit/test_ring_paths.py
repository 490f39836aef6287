"""The TP=3 triangle (issue #23 item 5): every place that reasons about which fabric path two nodes share uses the
one per-pair model of 01_network's rails (:func:`runbook.facts.net.pair_path`): the server-health fabric rows,
the diagnose bundle's pings and the offline review's declared fabric; the profile refuses a 3-node dspark node
given one CX port twice; the all_reduce_perf simulator fails as NCCL does when two ranks share no path.

The triangle: head enp1s0f0np0 <-> worker enp1s0f0np0 (10.0.22/24), head enp1s0f1np1 <-> worker2 enp1s0f1np1
(10.0.23/24), worker enp1s0f1np1 <-> worker2 enp1s0f0np0 (10.0.24/24), as recipe B cables three Sparks.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from runbook import review
from runbook.api import health
from runbook.checks import Status
from runbook.diagnose import collect as dcollect
from runbook.diagnose.bundle import PING_MTU_PREFIX, PING_PREFIX, collect_commands
from runbook.errors import ProfileError
from runbook.facts import nccl as fn
from runbook.facts import net as fnet
from runbook.network import collectives
from runbook.profile import REPO_ROOT, load_profile
from support.doubles import FakeCluster, FakeNode, exact
from test_rehearsal_sim import load as _load_rehearsal, needs_openmpi, sim_cluster     # the simulator's lab nodes

ENV = REPO_ROOT / "env"
NO_ENV: dict[str, str] = {}
PING_OK = ("2 packets transmitted, 2 received, 0% packet loss, time 1001ms\n"
           "rtt min/avg/max/mdev = 0.050/0.060/0.070/0.010 ms\n")
BOTH = "rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)\nrocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n"
TRIANGLE = {"head": [("enp1s0f0np0", "10.0.22.1/24"), ("enp1s0f1np1", "10.0.23.1/24"), ("enP7s7", "192.168.1.11/24")],
            "worker": [("enp1s0f0np0", "10.0.22.2/24"), ("enp1s0f1np1", "10.0.24.2/24"), ("enP7s7", "192.168.1.12/24")],
            "worker2": [("enp1s0f1np1", "10.0.23.2/24"), ("enp1s0f0np0", "10.0.24.3/24"), ("enP7s7", "192.168.1.13/24")]}


def tp3(**ov):
    return load_profile(ENV / "tp3-dspark.env", {k: str(v) for k, v in ov.items()}, environ=NO_ENV)


def ip_addr(entries) -> str:
    out = [{"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536, "operstate": "UNKNOWN",
            "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]}]
    for k, (name, cidr) in enumerate(entries):
        ip, plen = cidr.split("/")
        out.append({"ifindex": k + 2, "ifname": name, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
                    "mtu": 9000, "operstate": "UP", "addr_info": [{"family": "inet", "local": ip, "prefixlen": int(plen)}]})
    return json.dumps(out)


def ends(name, given=("enp1s0f0np0", "enp1s0f1np1")):
    return fnet.fabric_ends(given, fnet.parse_ip_addr(ip_addr(TRIANGLE[name])))


# ----------------------------------------------------------------------------- the pure pair model

def test_pair_path_on_the_triangle_takes_each_pairs_own_cable():
    paths = {(a, b): fnet.pair_path(ends(a), ends(b)) for a in TRIANGLE for b in TRIANGLE if a != b}
    assert len(paths) == 6
    got = {k: (p.iface, p.peer_ip) for k, p in paths.items()}
    assert got == {("head", "worker"): ("enp1s0f0np0", "10.0.22.2"), ("worker", "head"): ("enp1s0f0np0", "10.0.22.1"),
                   ("head", "worker2"): ("enp1s0f1np1", "10.0.23.2"), ("worker2", "head"): ("enp1s0f1np1", "10.0.23.1"),
                   ("worker", "worker2"): ("enp1s0f1np1", "10.0.24.3"),
                   ("worker2", "worker"): ("enp1s0f0np0", "10.0.24.2")}
    # a worker given only its head-facing port has no path to worker2 (the cable exists, it is not given)
    assert fnet.pair_path(ends("worker", ("enp1s0f0np0",)), ends("worker2")) is None


def test_pair_path_two_nodes_is_the_profiles_interface_and_address():
    """Two nodes: <NODE>_CX7_IF to the peer's <NODE>_IP, also before anything was read (declared only)."""
    p = load_profile(ENV / "lab.env", environ=NO_ENV)
    head, worker = p.nodes
    path = fnet.pair_path(fnet.node_fabric_ends(head), fnet.node_fabric_ends(worker))
    assert (path.iface, path.peer_ip) == (head.fabric_if, worker.fabric_ip)
    # the twin listed too, on its own /24: the profile's interface still goes first
    twin = {"enp1s0f1np1": [f"{head.fabric_ip}/24"], "enP2p1s0f1np1": ["10.0.1.1/24"]}
    peer = {"enp1s0f0np0": [f"{worker.fabric_ip}/24"], "enP2p1s0f0np0": ["10.0.1.2/24"]}
    assert fnet.pair_path(twin, peer).peer_ip == worker.fabric_ip


# ----------------------------------------------------------------------------- server health: fabric rows

def _health_node(name, rank, spec, ping_log):
    def ping(cmd):
        ping_log.append((name, cmd))
        return PING_OK
    return FakeNode(spec=spec, read_only=True,
                    rules=[(r"^ip -j addr show( dev \S+)?$", ip_addr(TRIANGLE[name])), (exact("ibdev2netdev"), BOTH),
                           (r"^ping ", ping)])


def test_health_fabric_rows_ping_each_pair_over_its_cable():
    """Before: every node pinged each peer's <NODE>_IP over its own CX7_IF, so worker -> worker2 pinged 10.0.23.2
    over the head-facing enp1s0f0np0 and failed on a healthy triangle."""
    p = tp3()
    log: list = []
    cluster = FakeCluster([_health_node(n.name, n.rank, n, log) for n in p.nodes])
    rows = health.fabric_rows(cluster, p)
    pings = {r.name: r for r in rows if r.name.startswith("fabric ping")}
    assert len(pings) == 6 and all(r.status == Status.PASS for r in pings.values()), [r.observed for r in rows]
    assert len(log) == 6
    w = [c for n, c in log if n == "worker" and c.endswith("10.0.24.3")]
    assert w and "-I enp1s0f1np1" in w[0]
    assert not [c for n, c in log if n == "worker" and c.endswith("10.0.23.2")]


def test_health_fabric_rows_two_nodes_unchanged():
    p = load_profile(ENV / "lab.env", environ=NO_ENV)
    log: list = []
    addrs = {"head": [(p.nodes[0].fabric_if, f"{p.nodes[0].fabric_ip}/24")],
             "worker": [(p.nodes[1].fabric_if, f"{p.nodes[1].fabric_ip}/24")]}

    def node(spec):
        def ping(cmd):
            log.append(cmd)
            return PING_OK
        return FakeNode(spec=spec, read_only=True, rules=[(r"^ip -j addr show( dev \S+)?$", ip_addr(addrs[spec.name])),
                                                         (r"^ping ", ping)])
    rows = health.fabric_rows(FakeCluster([node(n) for n in p.nodes]), p)
    assert [r.name for r in rows] == ["fabric link up", "fabric ping head→worker", "fabric link up",
                                      "fabric ping worker→head"]
    assert log == [fnet.ping_cmd(p.nodes[1].fabric_ip, size=56, count=2, iface=p.nodes[0].fabric_if, deadline_s=4),
                   fnet.ping_cmd(p.nodes[0].fabric_ip, size=56, count=2, iface=p.nodes[1].fabric_if, deadline_s=4)]


def test_health_fabric_rows_worker_with_one_port():
    """A worker given only its head-facing port: with RDMA a FAIL naming the keys; without RDMA (the lab's
    lab-tp3) N/A, their traffic crosses BOOTSTRAP_IF -- never a ping at a head-facing address."""
    for rdma, want in ((1, Status.FAIL), (0, Status.NA)):
        p = tp3(EXPECT_RDMA=rdma)
        p_nodes = [dataclasses.replace(n, ib_devs=["rocep1s0f0"]) if n.name == "worker" else n for n in p.nodes]
        log: list = []
        rows = health.fabric_rows(FakeCluster([_health_node(n.name, n.rank, n, log) for n in p_nodes]), p)
        row = next(r for r in rows if r.name == "fabric ping worker→worker2")
        assert row.status == want, row
        if want == Status.FAIL:
            assert "WORKER_CX7_IB" in row.fix and "WORKER2_CX7_IB" in row.fix
        assert not [c for n, c in log if n == "worker" and "10.0.23.2" in c]


# ----------------------------------------------------------------------------- diagnose bundle

def test_bundle_pings_each_pair_over_its_cable():
    p = tp3()
    fabric = {n: fnet.fabric_ends([i for i, _ in TRIANGLE[n] if i != "enP7s7"],
                                  fnet.parse_ip_addr(ip_addr(TRIANGLE[n])),
                                  {p.nodes[k].fabric_if: str(p.nodes[k].fabric_ip)})
              for k, n in enumerate(["head", "worker", "worker2"])}
    cmds = collect_commands(p, fabric=fabric)
    pings = {(node, c.name): c.cmd for node, cs in cmds.items() for c in cs if c.name.startswith(PING_PREFIX)}
    assert len(pings) == 12                                            # small + MTU, six directions
    assert pings[("worker", f"{PING_PREFIX}worker2.txt")].endswith("-I enp1s0f1np1 10.0.24.3")
    assert pings[("worker2", f"{PING_MTU_PREFIX}worker.txt")].endswith("-I enp1s0f0np0 10.0.24.2")
    assert pings[("head", f"{PING_PREFIX}worker2.txt")].endswith("-I enp1s0f1np1 10.0.23.2")


def test_bundle_collect_reads_the_fabric_first():
    p = tp3()
    nodes = [FakeNode(spec=n, read_only=True, rules=[(exact("ip -j addr show"), ip_addr(TRIANGLE[n.name])),
                                                     (exact("ibdev2netdev"), BOTH)]) for n in p.nodes]
    fabric = dcollect.fabric_ends(FakeCluster(nodes))
    assert sorted(fabric) == ["head", "worker", "worker2"]
    assert fabric["worker"] == {"enp1s0f0np0": ["10.0.22.2/24"], "enp1s0f1np1": ["10.0.24.2/24"]}


def test_bundle_without_facts_two_nodes_unchanged_and_no_wrong_triangle_ping():
    p = load_profile(ENV / "lab.env", environ=NO_ENV)
    cmds = {c.name: c.cmd for c in collect_commands(p)["head"]}
    assert cmds[f"{PING_PREFIX}worker.txt"] == fnet.ping_cmd(p.nodes[1].fabric_ip, size=56, count=3,
                                                              iface=p.nodes[0].fabric_if, deadline_s=6)
    # the triangle known only by its profile: no ping of worker2's head-facing address from the worker
    worker = [c.cmd for c in collect_commands(tp3())["worker"] if c.name.startswith(PING_PREFIX)]
    assert worker and not [c for c in worker if "10.0.23.2" in c]


# ----------------------------------------------------------------------------- the offline review

def test_review_declares_the_worker_to_worker2_cable():
    """Before: only the head's second port had an address, so the review's 01_network had no worker<->worker2
    rail (net.path FAIL offline) and tested nothing between the workers."""
    def declared(profile):
        return {n.name: {name: i.ipv4_addresses for name, i in fnet.parse_ip_addr(
            review.declared_network_facts(profile, n)[fnet.IP_ADDR_CMD]).items() if name not in ("lo", n.bootstrap_if)}
            for n in profile.nodes}
    addrs = declared(tp3())
    assert addrs["head"] == {"enp1s0f0np0": ["10.0.22.1"], "enp1s0f1np1": ["10.0.23.1"]}
    assert addrs["worker"]["enp1s0f1np1"] == ["10.0.24.2"] and addrs["worker2"]["enp1s0f0np0"] == ["10.0.24.3"]
    given = {n: {i: [f"{a}/24" for a in ips] for i, ips in v.items()} for n, v in addrs.items()}
    assert all(fnet.pair_path(given[a], given[b]) for a in given for b in given if a != b)
    two = load_profile(ENV / "dspark-v4.env", environ=NO_ENV)          # two nodes: only the profile's addresses
    assert declared(two) == {n.name: {n.fabric_if: [n.fabric_ip]} for n in two.nodes}


# ----------------------------------------------------------------------------- the profile rule

@pytest.mark.parametrize("key,value,why", [
    ("WORKER_CX7_IB", "rocep1s0f0,roceP2p1s0f0", "twins of one CX port"),
    ("WORKER2_CX7_IB", "rocep1s0f1,rocep1s0f1", "twice"),
    ("HEAD_CX7_IB", "roceP2p1s0f1,rocep1s0f1", "twins of one CX port"),
])
def test_three_node_dspark_refuses_one_port_twice(key, value, why):
    with pytest.raises(ProfileError) as ei:
        tp3(**{key: value})
    iss = ei.value.issues
    assert [i.key for i in iss] == [key], iss
    node = key.split("_")[0].lower()
    assert why in iss[0].message and f" on {node} " in iss[0].message
    assert f"both CX ports on {node}" in iss[0].fix and "rocep1s0f0,rocep1s0f1" in iss[0].fix
    assert tp3(**{key: "rocep1s0f0,roceP2p1s0f1"})       # one HCA of each port is fine


# ----------------------------------------------------------------------------- the NCCL simulator

def test_simulator_pairs_without_a_path():
    from runbook.lab.sim import simtools
    ib = [{"rank": 0, "transport": "IB", "nets": ["10.0.22.0/24", "10.0.23.0/24"], "oob": "192.168.1.11"},
          {"rank": 1, "transport": "IB", "nets": ["10.0.22.0/24", "10.0.24.0/24"], "oob": "192.168.1.12"},
          {"rank": 2, "transport": "IB", "nets": ["10.0.23.0/24", "10.0.24.0/24"], "oob": "192.168.1.13"}]
    assert simtools.unreachable(ib) == []
    ib[2]["nets"] = ["10.0.23.0/24"]                      # worker2 given only its head-facing port
    assert simtools.unreachable(ib) == [(1, 2)]
    sock = [{"rank": 0, "transport": "Socket", "oob": "10.0.22.1", "socket_nets": ["10.0.22.0/24"]},
            {"rank": 1, "transport": "Socket", "oob": "10.0.22.2", "socket_nets": ["10.0.22.0/24"]},
            {"rank": 2, "transport": "Socket", "oob": "10.0.23.2", "socket_nets": ["10.0.23.0/24"]}]
    assert simtools.unreachable(sock) == [(0, 2), (1, 2)]


@needs_openmpi
def test_all_reduce_perf_worker2_with_one_port_fails_like_nccl(tmp_path):
    """The rehearsal of tp3-dspark on the lab's triangle, worker2 given only its head-facing HCA: before, the
    simulator passed (only net.path caught it); now the ranks time out in QP RTR as on hardware and the nccl
    parser reports the failure."""
    profile = _load_rehearsal("env/tp3-dspark.env")
    cluster = sim_cluster(profile, tmp_path)
    ranks = [collectives.nccl_rank(profile, n, gid_index=3, tests_dir="/mnt/nvme/.rehearsal/sim/nccl-tests/build")
             for n in profile.nodes]
    ok = cluster.nodes[0].read(collectives.nccl_tests_cmd(ranks, mpi_include=["10.77.0.0/16"],
                                                          as_root=os.geteuid() == 0), timeout=200)
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    assert fn.parse_nccl_tests(ok.stdout).avg_busbw_gbs
    ranks[2].env["NCCL_IB_HCA"] = "rocep1s0f1"                                # its port toward the head only
    assert ranks[2].hcas == ["rocep1s0f1"]
    bad = cluster.nodes[0].read(collectives.nccl_tests_cmd(ranks, mpi_include=["10.77.0.0/16"],
                                                           as_root=os.geteuid() == 0), timeout=200)
    text = fn.split_mpirun_output(bad.stdout + bad.stderr).text
    assert bad.exit_code != 0, text
    parsed = fn.parse_nccl_tests(bad.stdout)
    assert parsed.avg_busbw_gbs is None and "Test NCCL failure" in parsed.error
    assert re.search(r"ibv_modify_qp failed with 110 Connection timed out, on dev \w+:1, curr state INIT, "
                     r"next state RTR", text)
    # mpirun stops the job at the first rank that exits non-zero: at least one rank of the pair has printed why
    logs = collectives.rank_logs(bad.stdout, cluster.nodes)
    named = collectives.rank_failures(ranks, logs)
    pair = [f for f in named if re.match(r"(worker|worker2): NCCL_IB_HCA=\S+ gives \w+ no RoCE path", f)]
    assert pair and all(f"{f.split(':')[0].upper()}_CX7_IB" in f for f in pair), named
