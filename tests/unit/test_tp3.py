"""Three nodes / TP=3: the seed B TP3 lane (env/tp3-dspark.env), the 3-node lab profile (env/lab-tp3.env),
and every step's N-node handling (launch render, TP pad check, weights to every worker, network rails
per pair, preflight pairs, Engram rank per node).

Seed facts transcribed from /work/shared/reference/seeds-repos.md §B.11 and repo B docs/TP3.md: TP=3 /
NNODES=3, TP3_MAX_NUM_SEQS 16, TP3_BOOTSTRAP_IFNAME (never lo) carries Gloo / NCCL socket / TP TCP,
NCCL_IB_HCA = both CX ports on the head, NCCL_IB_MERGE_NICS=0 NCCL_IB_SUBNET_AWARE_ROUTING=1
NCCL_IB_SUBNET_PREFIX_LEN=24, the head pad "DSv4 TP pad: heads 64 -> 72 for TP=3", capture size x8.
Regenerate the golden files with UPDATE_GOLDEN=1 after an intended change and review the diff.
"""
from __future__ import annotations

import dataclasses

import json
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from runbook.launch import render as launch
from runbook.network import verify as network
from runbook.preflight import verify as preflight
from runbook.checks import Status
from runbook.errors import ProfileError
from runbook.facts import vllm_log
from runbook.launch.render import NodeFacts, check_consistency, render
from runbook.profile import KEYS, REPO_ROOT, absent_node_keys, load_profile
from support.doubles import FakeCluster, FakeNode, exact
from support.golden import check_golden
from support.net import by, fx, lab_node_addr

ENV = REPO_ROOT / "env"
GOLDEN = Path(__file__).parent / "golden" / "launch"
HOME = "/home/spark"
NODES = ("head", "worker", "worker2")
FACTS = {n: NodeFacts(home=HOME) for n in NODES}
NO_ENV: dict[str, str] = {}


def tp3(**ov):
    return load_profile(ENV / "tp3-dspark.env", {k: str(v) for k, v in ov.items()}, environ=NO_ENV)


def labtp3(**ov):
    return load_profile(ENV / "lab-tp3.env", {k: str(v) for k, v in ov.items()}, environ=NO_ENV)


def issues(path, **ov) -> list:
    with pytest.raises(ProfileError) as ei:
        load_profile(path, {k: str(v) for k, v in ov.items()}, environ=NO_ENV)
    return ei.value.issues


def flag_value(argv, name):
    return launch.flag_value(argv, name)


# ----------------------------------------------------------------------------- the profiles

@pytest.mark.parametrize("name", ["tp3-dspark.env", "lab-tp3.env"])
def test_tp3_profiles_load_set_every_key_with_a_comment(name):
    p = load_profile(ENV / name, environ=NO_ENV)
    # every key but the per-node keys of nodes the profile does not have (WORKER3_* ... WORKER7_*)
    optional = set(absent_node_keys(p.node_count))
    assert optional and set(KEYS) - optional <= set(p.key_lines) <= set(KEYS), set(KEYS) - optional - set(p.key_lines)
    lines = (ENV / name).read_text().splitlines()
    assert lines, name
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert i > 0 and lines[i - 1].startswith("# "), f"{name}:{i + 1} {line} has no comment above"
    assert p.tp == p.nnodes == p.node_count == 3 and [n.name for n in p.nodes] == list(NODES)


def test_tp3_dspark_values_follow_the_seed_lane():
    p = tp3()
    assert p.recipe == "dspark-v4" and p.max_num_seqs == 16                    # TP3_MAX_NUM_SEQS
    assert p.cudagraph_capture_size == 112 and p.cudagraph_capture_size % 8 == 0   # 16 x (6+1), x8
    assert p.head_cx7_ib == ["rocep1s0f0", "rocep1s0f1"]                      # both CX ports on the head
    assert p.bootstrap_if == "enP7s7" and p.master_addr == "192.168.1.11"
    assert [n.host_ip for n in p.nodes] == ["192.168.1.11", "192.168.1.12", "192.168.1.13"]
    assert {n.socket_if for n in p.nodes} == {"enP7s7"}
    assert p.worker2_ip == "10.0.23.2" and p.head_ip == "10.0.22.1"           # its own /24 to worker2
    assert p.weight_sync == "rsync" and p.spec_tokens == 6


def test_lab_tp3_values():
    p = labtp3()
    assert p.lab and len(p.nodes) == 3 and p.worker2_ssh == "spark-worker2" and p.worker2_ip == "169.254.23.3"
    assert [p.cpu_bind(r, cpus=16) for r in range(3)] == ["0", "1", "1"]       # pinned: whatever the host has
    # the triangle: the head's fabric address is on the worker's cable only; the rendezvous is on the LAN port
    assert p.hf_model_repo == "spark-runbook/tiny-tp3" and p.master_addr == "10.77.0.11"
    assert {n.socket_if for n in p.nodes} == {"enP7s7"}
    two = load_profile(ENV / "lab.env", environ=NO_ENV)
    assert [two.cpu_bind(r, cpus=2) for r in range(2)] == ["0", "1"]          # derived: the rank, ranks <= CPUs


# ----------------------------------------------------------------------------- validation rules

def test_bootstrap_if_lo_is_refused():
    iss = issues(ENV / "tp3-dspark.env", BOOTSTRAP_IF="lo")
    assert any(i.key == "BOOTSTRAP_IF" and "Do not use lo" in i.message for i in iss), iss


def test_bootstrap_addresses_required_distinct_and_not_orphaned():
    iss = issues(ENV / "tp3-dspark.env", WORKER2_BOOTSTRAP_IP="")
    assert any(i.key == "WORKER2_BOOTSTRAP_IP" and "empty" in i.message for i in iss), iss
    iss = issues(ENV / "tp3-dspark.env", WORKER2_BOOTSTRAP_IP="192.168.1.12")
    assert any(i.key == "WORKER2_BOOTSTRAP_IP" and "equals WORKER_BOOTSTRAP_IP" in i.message for i in iss), iss
    iss = issues(ENV / "lab.env", HEAD_BOOTSTRAP_IP="10.9.9.9")
    assert any(i.key == "HEAD_BOOTSTRAP_IP" and "BOOTSTRAP_IF is empty" in i.message for i in iss), iss


def test_dspark_three_nodes_need_bootstrap_if_and_both_head_hcas():
    iss = issues(ENV / "tp3-dspark.env", BOOTSTRAP_IF="", HEAD_BOOTSTRAP_IP="", WORKER_BOOTSTRAP_IP="",
                 WORKER2_BOOTSTRAP_IP="")
    assert [i.key for i in iss] == ["BOOTSTRAP_IF"] and "TP3" in iss[0].message
    iss = issues(ENV / "tp3-dspark.env", HEAD_CX7_IB="rocep1s0f0")
    assert [i.key for i in iss] == ["HEAD_CX7_IB"] and "QP RTR" in iss[0].fix
    for key in ("WORKER_CX7_IB", "WORKER2_CX7_IB"):           # every node: both ports (recipe B TP=3)
        iss = issues(ENV / "tp3-dspark.env", **{key: "rocep1s0f1"})
        assert [i.key for i in iss] == [key] and "both CX ports" in iss[0].fix


def test_three_nodes_must_be_tp3_and_nnodes3():
    iss = issues(ENV / "tp3-dspark.env", TP="2")
    assert any(i.key in ("TP", "NNODES") and "TP=2" in i.message for i in iss), iss
    iss = issues(ENV / "tp3-dspark.env", NNODES="2", TP="2")
    assert any(i.key == "NNODES" and "3 nodes" in i.message for i in iss), iss


def test_nfs_with_three_real_nodes_is_refused():
    iss = issues(ENV / "tp3-dspark.env", WEIGHT_SYNC="nfs")
    assert [i.key for i in iss] == ["WEIGHT_SYNC"] and "WORKER2_NFS_SERVER_IP" in iss[0].message
    assert "triangle" in iss[0].message and "HEAD_IP=10.0.22.1" in iss[0].message


def test_lab_cpu_bind_needs_one_item_per_rank_and_the_lab():
    iss = issues(ENV / "lab-tp3.env", LAB_CPU_BIND="0,1")
    assert [i.key for i in iss] == ["LAB_CPU_BIND"] and "2 item(s) for 3 ranks" in iss[0].message
    iss = issues(ENV / "dspark-v4.env", LAB_CPU_BIND="0,1")
    assert [i.key for i in iss] == ["LAB_CPU_BIND"]
    iss = issues(ENV / "lab-tp3.env", LAB_CPU_BIND="0;1;1")
    assert [i.key for i in iss] == ["LAB_CPU_BIND"]
    assert labtp3(LAB_CPU_BIND="0-1,0,1").cpu_bind(0, cpus=2) == "0-1"


def test_seed_tp3_names_point_at_runbook_keys(tmp_path):
    d = tmp_path / "env"
    d.mkdir()
    path = d / "p.env"
    path.write_text((ENV / "lab-tp3.env").read_text() + "TP3_MAX_NUM_SEQS=16\nTP3_BOOTSTRAP_IFNAME=enP7s7\n")
    iss = issues(path)
    assert {i.key: i.message for i in iss} == {
        "TP3_MAX_NUM_SEQS": "unknown key (a seed-recipe name); did you mean MAX_NUM_SEQS?",
        "TP3_BOOTSTRAP_IFNAME": "unknown key (a seed-recipe name); did you mean BOOTSTRAP_IF?"}


# ----------------------------------------------------------------------------- launch render

def test_tp3_render_every_rank_agrees_and_workers_start_first():
    plan = render(tp3(), FACTS)
    assert [r.node for r in plan.ranks] == list(NODES) and check_consistency(plan) == []
    assert [r.node for r in plan.workers] == ["worker", "worker2"]
    text = plan.to_text()
    assert text.index("rank 2 on worker2") < text.index("rank 1 on worker") < text.index("rank 0 on head")
    for r in plan.ranks:
        a = r.serve_argv
        assert flag_value(a, "--tensor-parallel-size") == "3" and flag_value(a, "--nnodes") == "3"
        assert flag_value(a, "--node-rank") == str(r.rank) and flag_value(a, "--master-addr") == "192.168.1.11"
        assert flag_value(a, "--max-num-seqs") == "16" and flag_value(a, "--max-cudagraph-capture-size") == "112"
        assert ("--headless" in a) == (r.rank > 0)
        e = r.env
        assert e["TP_SIZE"] == "3" and e["NNODES"] == "3" and e["NODE_RANK"] == str(r.rank)
        assert (e["NCCL_IB_MERGE_NICS"], e["NCCL_IB_SUBNET_AWARE_ROUTING"], e["NCCL_IB_SUBNET_PREFIX_LEN"]) == \
            ("0", "1", "24")
        assert e["NCCL_SOCKET_IFNAME"] == e["GLOO_SOCKET_IFNAME"] == e["TP_SOCKET_IFNAME"] == "enP7s7"
        assert e["MASTER_ADDR"] == "192.168.1.11"
    # recipe B's TP=3 path: both CX ports on every rank (issue 22 defect 4: a4d36a1 gave each worker one port)
    assert [plan.rank(n).env["NCCL_IB_HCA"] for n in NODES] == ["rocep1s0f0,rocep1s0f1"] * 3
    assert [plan.rank(n).env["VLLM_HOST_IP"] for n in NODES] == ["192.168.1.11", "192.168.1.12", "192.168.1.13"]
    assert plan.expect_log == ["DSv4 TP pad: heads 64 -> 72 for TP=3"]
    assert "# boot log must show: DSv4 TP pad: heads 64 -> 72 for TP=3" in text
    assert plan.to_record()["expect_log"] == plan.expect_log


def test_two_node_dspark_render_has_no_tp3_knobs():
    plan = render(load_profile(ENV / "dspark-v4.env", environ=NO_ENV), FACTS)
    assert plan.expect_log == [] and len(plan.ranks) == 2
    for r in plan.ranks:
        assert not {"NCCL_IB_MERGE_NICS", "NCCL_IB_SUBNET_AWARE_ROUTING"} & set(r.env)
        assert r.env["VLLM_HOST_IP"] in ("10.0.0.1", "10.0.0.2")


def test_lab_tp3_render_binds_three_ranks_on_two_cores():
    plan = render(labtp3(), FACTS)
    assert [plan.rank(n).env["VLLM_CPU_OMP_THREADS_BIND"] for n in NODES] == ["0", "1", "1"]
    assert [plan.rank(n).env["VLLM_HOST_IP"] for n in NODES] == ["10.77.0.11", "10.77.0.12", "10.77.0.13"]
    assert check_consistency(plan) == [] and plan.expect_log == []
    assert len(plan.ranks) == 3 and all(flag_value(r.serve_argv, "--tensor-parallel-size") == "3" for r in plan.ranks)


@pytest.mark.parametrize("tp,want", [(1, None), (2, None), (3, (64, 72)), (4, None), (6, (64, 96))])
def test_tp_pad_arithmetic(tp, want):
    got = launch.head_pad("dspark-v4", tp)            # any TP; a profile holds only TP = nodes (2 or 3)
    assert (got and (got["heads"], got["padded"])) == (want or None)
    if want:
        assert got["line"] == f"DSv4 TP pad: heads {want[0]} -> {want[1]} for TP={tp}"
    assert launch.head_pad("exl3-v41", tp) is None and launch.head_pad("lab", tp) is None


def test_tp_pad_of_the_profiles():
    assert launch.tp_pad(tp3()) == launch.head_pad("dspark-v4", 3)
    assert launch.tp_pad(load_profile(ENV / "dspark-v4.env", environ=NO_ENV)) is None     # TP=2
    assert launch.tp_pad(labtp3()) is None                                              # recipe lab at TP=3


CASES = [("tp3-dspark", "default"), ("lab-tp3", "default")]


@pytest.mark.parametrize("name,variant", CASES)
@pytest.mark.parametrize("node", NODES)
def test_golden_tp3(name, variant, node):
    plan = render(load_profile(ENV / f"{name}.env", environ=NO_ENV), FACTS)
    r = plan.rank(node)
    rec = {"serve_argv": r.serve_argv, "env": r.env, "secret_env": r.secret_env, "docker_argv": r.docker_argv}
    got = json.loads(json.dumps(rec).replace(str(REPO_ROOT), "<repo>"))
    # a missing golden fails (it is never written by the test that reads it); UPDATE_GOLDEN=1 writes it on request
    check_golden(GOLDEN / f"{name}-{variant}-{node}.json", json.dumps(got, indent=1) + "\n")


# ----------------------------------------------------------------------------- the pad check (boot log)

PAD_LOG = ("(EngineCore pid=311) INFO 12-01 05:40:02 [dsv4_tp_pad.py:88] DSv4 TP pad: heads 64 -> 72 for TP=3\n"
           "(EngineCore pid=311) INFO 12-01 05:44:40 [kv_cache_utils.py:1] GPU KV cache size: 3,101,312 tokens\n")


def test_pad_line_parsed_and_checked():
    want = launch.tp_pad(tp3())
    log = vllm_log.parse_startup_log(PAD_LOG)
    assert log.tp_pad == {"heads": 64, "padded": 72, "tp": 3} and log.kv_tokens == 3_101_312
    assert vllm_log.tp_pad_check(want, log).status == Status.PASS
    missing = vllm_log.tp_pad_check(want, vllm_log.parse_startup_log("INFO ... GPU KV cache size: 9 tokens\n"))
    assert missing.status == Status.FAIL and "no 'DSv4 TP pad' line" in missing.observed
    assert "apply_tp3_patch.py" in missing.fix
    wrong = vllm_log.tp_pad_check(want, vllm_log.parse_startup_log(PAD_LOG.replace("-> 72", "-> 64")))
    assert wrong.status == Status.FAIL
    assert vllm_log.tp_pad_check(None, log).status == Status.NA
    # the dict round trip the launch step uses (sidecar -> StartupLog)
    assert vllm_log.StartupLog(**log.to_dict()).tp_pad == log.tp_pad


# ----------------------------------------------------------------------------- weights: every worker

def test_weights_step_shares_to_every_worker(monkeypatch):
    from runbook.checks import check
    from runbook.facts import node_paths, system
    from runbook.weights import transfer as wstep
    from runbook.weights.sharing import ShareResult

    calls = []
    snap = SimpleNamespace(repo="spark-runbook/tiny-tp3", revision="r" * 40, files=[1], total_bytes=10,
                           expected=lambda: {"files": []})
    monkeypatch.setattr(wstep, "fetch_metadata", lambda *a, **k: snap)
    monkeypatch.setattr(wstep, "download_on_node", lambda node, *a, **k: ShareResult(
        "download-both", checks=[check("weights.verified", True, node=node.name)], data={"node": node.name}))
    monkeypatch.setattr(wstep, "read_node_manifest", lambda node, d: {"files": []})

    both = threading.Barrier(2, timeout=30)      # each share waits for the other: one after the other, it breaks

    def fake_rsync(head, worker, src, dst, **k):
        calls.append((head.name, worker.name, dst))
        both.wait()
        return ShareResult("rsync", checks=[check("weights.parity", True, node="cluster")],
                           data={"seconds": 1.0, "to": worker.name})

    monkeypatch.setattr(wstep, "rsync_to_worker", fake_rsync)
    rules = [(r"; df -B1 --output=avail,size,target ", "/mnt/nvme\n1099511627776 3998614986752 /mnt/nvme\n"),
             (exact(node_paths.USER_CMD), "/home/spark\n1000\nspark\n"),
             (exact(system.MOUNTS_CMD), "/dev/nvme0n1p2 /mnt/nvme ext4 rw,relatime 0 0\n")]  # no network mount
    cluster = FakeCluster([FakeNode(n, k, read_only=True, rules=rules) for k, n in enumerate(NODES)])
    from runbook.lab.site import site_for
    profile = labtp3()
    checks, data = wstep.download_verify_share(cluster, profile, compare_sha256sum=False, site=site_for(profile))
    assert sorted(c[1] for c in calls) == ["worker", "worker2"]        # both at once
    assert data["share"] == {"seconds": 1.0, "to": "worker"} and list(data["shares"]) == ["worker", "worker2"]
    assert not checks.failures()


# ----------------------------------------------------------------------------- preflight: every pair

def _ssh_node(spec):
    """Answers the fabric ssh probe ``ssh ... root@<ip> hostname`` with ``host-<ip>`` and ``ip -j addr show`` with the
    3-node lab's (the triangle); refuses anything else."""
    def hostname(cmd):
        return "host-" + re.search(r"root@([\d.]+)", cmd).group(1) + "\n"
    return FakeNode(spec=spec, read_only=True, rules=[(r"root@[\d.]+ ", hostname),
                                                      (exact("ip -j addr show"), lab_node_addr(spec.name, 3))])


def test_preflight_fabric_ssh_covers_all_six_directions_and_parity_all_nodes():
    """On the triangle every direction is listed: ssh runs from the head to both workers and from the worker to the
    head (HEAD_IP is on its cable); worker2 is on no cable with HEAD_IP or WORKER_IP, and the worker on none with
    WORKER2_IP: those directions are N/A with the reason (no route exists; the runbook's ssh starts on the head)."""
    p = labtp3()
    nodes = [_ssh_node(n) for n in p.nodes]
    checks = preflight.fabric_ssh_checks(nodes, p)
    assert sorted(c.name for c in checks) == sorted(f"ssh {a}→{b} over fabric" for a in NODES for b in NODES if a != b)
    status = {c.name: c.status for c in checks}
    assert [n for n, s in status.items() if s == Status.PASS] == [
        "ssh head→worker over fabric", "ssh head→worker2 over fabric", "ssh worker→head over fabric"], status
    na = [c for c in checks if c.status == Status.NA]
    assert len(na) == 3 and all("is on a cable" in c.observed for c in na), [c.observed for c in na]
    facts = {n: {"os": SimpleNamespace(pretty_name="Ubuntu", kernel="6.8", machine="aarch64"),
                 "driver": "580" if n != "worker2" else "575"} for n in NODES}
    parity = {c.name: c for c in preflight.parity_checks(facts)}
    assert parity["driver parity"].status == Status.FAIL and "worker2=575" in parity["driver parity"].observed
    assert parity["OS parity"].status == Status.PASS


# ----------------------------------------------------------------------------- network: rails per pair

def _ifaces(entries):
    """ip -j addr show JSON for [(ifname, ipv4/prefix), ...]."""
    out = [{"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536, "operstate": "UNKNOWN",
            "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]}]
    for k, (name, cidr) in enumerate(entries):
        ip, plen = cidr.split("/")
        out.append({"ifindex": k + 2, "ifname": name, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
                    "mtu": 9000, "operstate": "UP",
                    "addr_info": [{"family": "inet", "local": ip, "prefixlen": int(plen)}]})
    return json.dumps(out)


PING_OK = ("5 packets transmitted, 5 received, 0% packet loss, time 4004ms\n"
           "rtt min/avg/max/mdev = 0.050/0.060/0.070/0.010 ms\n")


def _net_node(name, rank, fabric_ip, fabric_if, ifaces):
    return FakeNode(name, rank, fabric_ip=fabric_ip, fabric_if=fabric_if, read_only=True,
                    rules=[(exact("ip -j addr show"), _ifaces(ifaces)), (exact("ip -j route show"), "[]"),
                           (r"^ping ", PING_OK), (r"^sysctl ", "net.ipv4.conf.all.rp_filter = 2\n"),
                           (r"iperf3 -s -1 -B ", fx("iperf3_server.json")), (r"iperf3 -c ", fx("iperf3_client.json"))])


def _net_profile():
    """The TP3 lane's profile without RDMA/GPU expectations (the canned nodes have neither); master address
    HEAD_BOOTSTRAP_IP 192.168.1.11."""
    return tp3(EXPECT_RDMA=0, EXPECT_GPU=0, EXPECT_LINK_GBPS=0, MIN_TCP_GBPS=0.1, COMMAND_TIMEOUT=20)


def _verify(cluster):
    """01_network's public entry over canned nodes: every rail's static facts, ping and TCP per pair."""
    checks, _ = network.verify_network(cluster, _net_profile(), None)
    return checks


def test_network_three_node_bridge_is_one_rail_with_every_pair():
    nodes = [_net_node(n, k, f"169.254.77.{k + 1}", "enp1s0f0np0", [("enp1s0f0np0", f"169.254.77.{k + 1}/24")])
             for k, n in enumerate(NODES)]
    checks = _verify(FakeCluster(nodes))
    every_pair = sorted(f"rail0.{a}->{b}" for a in NODES for b in NODES if a != b)      # one rail, every pair
    assert sorted(c.name[len("net.ping."):] for c in checks if c.name.startswith("net.ping.")) == every_pair
    assert sorted(c.name[len("net.tcp."):] for c in checks if c.name.startswith("net.tcp.")) == every_pair
    assert not checks.failures(), checks.to_text()


def test_network_tp3_links_each_on_its_own_subnet_are_rails_per_pair():
    head = _net_node("head", 0, "10.0.22.1", "enp1s0f0np0,enp1s0f1np1",
                     [("enp1s0f0np0", "10.0.22.1/24"), ("enp1s0f1np1", "10.0.23.1/24"), ("enP7s7", "192.168.1.11/24")])
    worker = _net_node("worker", 1, "10.0.22.2", "enp1s0f0np0",
                       [("enp1s0f0np0", "10.0.22.2/24"), ("enP7s7", "192.168.1.12/24")])
    worker2 = _net_node("worker2", 2, "10.0.23.2", "enp1s0f1np1",
                        [("enp1s0f1np1", "10.0.23.2/24"), ("enP7s7", "192.168.1.13/24")])
    checks = _verify(FakeCluster([head, worker, worker2]))
    rails = by(checks, "net.rails")
    assert rails.status == Status.PASS and rails.observed == (
        "per-subnet rails: rail0: head enp1s0f0np0 10.0.22.1, worker enp1s0f0np0 10.0.22.2; "
        "rail1: head enp1s0f1np1 10.0.23.1, worker2 enp1s0f1np1 10.0.23.2"), rails.observed
    pings = sorted(c.name for c in checks if c.name.startswith("net.ping."))
    assert pings == ["net.ping.rail0.head->worker", "net.ping.rail0.worker->head",
                     "net.ping.rail1.head->worker2", "net.ping.rail1.worker2->head"]
    assert by(checks, "net.path.worker-worker2").status == Status.NA
    assert not checks.failures(), checks.to_text()


def _triangle(worker2_ports=2):
    """Three Sparks cabled as recipe B's TP=3 ring: head p0<->worker p0 (10.0.22/24), head p1<->worker2 p1
    (10.0.23/24), worker p1<->worker2 p0 (10.0.24/24); every node lists both CX ports."""
    def node(name, rank, fabric_ip, fabric_if, ifaces):
        n = _net_node(name, rank, fabric_ip, fabric_if, ifaces)
        n.spec = dataclasses.replace(n.spec, ib_devs=["rocep1s0f0", "rocep1s0f1"])
        n.rules[2:2] = [(exact("ibdev2netdev"), "rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)\n"
                                                "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n"),
                        (r"^grep -r -H \. /sys/class/infiniband", "")]
        return n
    head = node("head", 0, "10.0.22.1", "enp1s0f0np0", [("enp1s0f0np0", "10.0.22.1/24"),
                                                       ("enp1s0f1np1", "10.0.23.1/24"), ("enP7s7", "192.168.1.11/24")])
    worker = node("worker", 1, "10.0.22.2", "enp1s0f0np0", [("enp1s0f0np0", "10.0.22.2/24"),
                                                           ("enp1s0f1np1", "10.0.24.1/24"), ("enP7s7", "192.168.1.12/24")])
    w2 = [("enp1s0f1np1", "10.0.23.2/24"), ("enP7s7", "192.168.1.13/24")]
    if worker2_ports == 2:
        w2.insert(0, ("enp1s0f0np0", "10.0.24.2/24"))
    worker2 = node("worker2", 2, "10.0.23.2", "enp1s0f1np1", w2)
    return FakeCluster([head, worker, worker2])


def _rails_of(cluster):
    from runbook.network import rails as net_rails
    from runbook.network.context import Verification
    ctx = Verification(cluster,
                       tp3(EXPECT_RDMA=1, EXPECT_GPU=0, EXPECT_LINK_GBPS=0, MIN_TCP_GBPS=0.1, COMMAND_TIMEOUT=20), None)
    net_rails.collect_base(ctx)
    assert net_rails.early_validation(ctx), ctx.checks.to_text()
    return ctx, net_rails.build_rails(ctx)


def test_network_tp3_triangle_checks_worker_to_worker2():
    """Issue 22 defect 4: both CX ports on every node make three equal rail counts; the rails are still the
    three point-to-point subnets, and worker<->worker2 is a checked path (a4d36a1: positional rails mixing
    10.0.22/10.0.23/10.0.24, or N/A)."""
    ctx, rails = _rails_of(_triangle())
    assert rails is not None and len(rails) == 3, ctx.checks.to_text()
    assert [sorted(r.ends) for r in rails] == [["head", "worker"], ["head", "worker2"], ["worker", "worker2"]]
    assert {e.ip for e in rails[2].ends.values()} == {"10.0.24.1", "10.0.24.2"}
    assert not [c for c in ctx.checks if c.name.startswith("net.path.")]
    assert by(ctx.checks, "net.rails").status == Status.PASS


def test_network_tp3_worker2_with_one_port_fails_the_path_with_rdma():
    ctx, rails = _rails_of(_triangle(worker2_ports=1))
    path = by(ctx.checks, "net.path.worker-worker2")
    assert path.status == Status.FAIL and "WORKER2_CX7_IB" in path.fix and "QP RTR" in path.fix


def test_network_two_nodes_with_unequal_rails_still_fail_clearly():
    head = _net_node("head", 0, "10.0.22.1", "enp1s0f0np0,enp1s0f1np1",
                     [("enp1s0f0np0", "10.0.22.1/24"), ("enp1s0f1np1", "10.0.23.1/24")])
    worker = _net_node("worker", 1, "10.0.22.2", "enp1s0f0np0", [("enp1s0f0np0", "10.0.22.2/24")])
    checks = _verify(FakeCluster([head, worker]))
    assert [c.name for c in checks.failures()] == ["net.rails"], checks.to_text()
    assert not [c for c in checks if c.name.startswith(("net.ping.", "net.tcp."))]     # stopped before traffic


# ----------------------------------------------------------------------------- engram: a rank per node

def test_engram_plan_packs_one_rank_per_node_of_three():
    from runbook.engram import packing as es
    plans = es.plan_pack(labtp3())
    assert set(plans) == set(NODES)
    for rank, node in enumerate(NODES):
        text = " ".join(map(str, plans[node]))
        assert f"--tp 3 --rank {rank}" in text, (node, text)


# ----------------------------------------------------------------------------- a real TP=3 CPU boot (loopback)

LOGS = Path(__file__).parent / "data" / "vllm_logs"


def test_real_tp3_cpu_boot_logs_parse():
    """Logs of CPU vLLM 0.32 TP=3 (tiny-tp3, three processes on 127.0.0.1, ranks bound 0,1,1; docs/tp3.md)."""
    head = vllm_log.parse_startup_log((LOGS / "cpu032_tp3_loopback_head.log").read_text())
    rank2 = vllm_log.parse_startup_log((LOGS / "cpu032_tp3_loopback_rank2.log").read_text())
    assert head.startup_complete and head.kv_device == "CPU" and head.kv_tokens
    assert rank2.world == {"world_size": 3, "rank": 2, "init_method": "tcp://127.0.0.1:29597", "backend": "gloo"}
    assert rank2.headless_master == "127.0.0.1:29597" and head.tp_pad is None


def test_tiny_model_shapes_why_tp3_needs_the_variant():
    from runbook.lab import tinymodel
    from runbook.lab import tinymodel_tp3 as t3
    why = t3.shardable(tinymodel.TEXT_DIMS, tinymodel.VOCAB_SIZE, 3)
    assert len(why) == 4 and why[0] == "num_attention_heads 4 % TP 3 != 0"
    assert t3.shardable(tinymodel.TEXT_DIMS, tinymodel.VOCAB_SIZE, 2) == []
    assert t3.shardable(t3.TP3_TEXT_DIMS, t3.TP3_VOCAB_SIZE, 3) == []
    assert t3.shardable(t3.TP3_TEXT_DIMS, t3.TP3_VOCAB_SIZE, 1) == []
    cfg = json.loads((REPO_ROOT / ".lab" / "models" / "tiny-tp3" / "config.json").read_text()) \
        if (REPO_ROOT / ".lab" / "models" / "tiny-tp3" / "config.json").is_file() else None
    if cfg:     # the variant made on this machine (control.ensure_tiny_repo)
        assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (6, 3, 1920)
