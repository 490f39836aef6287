"""Parsers of runbook.facts.{net,rdma,nccl} against byte-faithful fixtures (tests/unit/facts/net/)."""
from pathlib import Path

import pytest

from runbook.facts import nccl as fn
from runbook.facts import net as fnet
from runbook.facts import rdma as fr

FIX = Path(__file__).parent / "net"


def fx(name: str) -> str:
    return (FIX / name).read_text()


def test_ip_addr_lab_capture():
    ifs = fnet.parse_ip_addr(fx("ip_addr_lab.json"))
    e = ifs["enp1s0f0np0"]
    assert e.up and e.mtu == 9000 and e.ipv4 == ["169.254.77.1/24"]
    assert e.ipv4_addresses == ["169.254.77.1"]
    assert str(e.ipv4_networks[0]) == "169.254.77.0/24"
    assert ifs["lo"].ipv4 == ["127.0.0.1/8"]


def test_ip_link_has_no_addresses():
    ifs = fnet.parse_ip_link(fx("ip_link_lab.json"))
    assert ifs["enp1s0f0np0"].mtu == 9000 and ifs["enp1s0f0np0"].ipv4 == []


def test_ip_addr_spark_twins_and_down_port():
    ifs = fnet.parse_ip_addr(fx("ip_addr_spark_head.json"))
    assert ifs["enP2p1s0f0np0"].ipv4_addresses == ["192.168.101.1"]
    assert not ifs["enp1s0f1np1"].up and ifs["enp1s0f1np1"].ipv4 == []
    assert ifs["enp1s0f0np0"].ipv6 == ["fe80::7ec2:55ff:fe12:3401/64"]


def test_ip_addr_garbage():
    assert fnet.parse_ip_addr("") == {} and fnet.parse_ip_addr("Device does not exist") == {}


def test_routes_default_on_fabric():
    ok = fnet.parse_ip_route(fx("ip_route_spark_head.json"))
    assert [r.dev for r in fnet.default_routes(ok)] == ["enP7s7"]
    assert fnet.default_routes(ok, "enp1s0f0np0") == []
    bad = fnet.parse_ip_route(fx("ip_route_fabric_default.json"))
    assert fnet.default_routes(bad, "enp1s0f0np0")[0].gateway == "192.168.100.254"
    lab = fnet.parse_ip_route(fx("ip_route_lab.json"))
    assert lab[0].dst == "169.254.77.0/24" and not lab[0].is_default


def test_ethtool_veth_cx7_and_down():
    v = fnet.parse_ethtool(fx("ethtool_veth.txt"))
    assert (v.iface, v.speed_mbps, v.link_detected) == ("enp1s0f0np0", 10000, True)
    c = fnet.parse_ethtool(fx("ethtool_cx7_200g.txt"))
    assert c.speed_mbps == 200000 and c.speed_gbps == 200 and c.port == "Direct Attach Copper"
    d = fnet.parse_ethtool(fx("ethtool_cx7_down.txt"))
    assert d.speed_mbps is None and d.link_detected is False


def test_rp_filter():
    lab = fnet.parse_rp_filter(fx("rp_filter_lab.txt"))
    assert lab == {"all": 0, "enp1s0f0np0": 0}
    spark = fnet.parse_rp_filter(fx("rp_filter_spark.txt"))
    assert fnet.effective_rp_filter(spark, "enp1s0f0np0") == 2
    assert fnet.effective_rp_filter(spark, "enP2p1s0f0np0") == 1      # max(all=1, if=0)
    assert fnet.effective_rp_filter({}, "x") is None


def test_pcie_x2_twin():
    p = fnet.parse_pcie(fx("pcie_spark_x2.tsv"))
    assert p["enp1s0f0np0"].gen == 5 and p["enp1s0f0np0"].width == 4
    assert p["enP2p1s0f0np0"].width == 2 and p["enP2p1s0f0np0"].max_width == 4
    assert fnet.parse_pcie("") == {}


def test_sysfs_dump_accepts_colon_form():
    d = fnet.parse_sysfs_dump("/sys/a/b:4: ACTIVE\n/sys/a/c\tRoCE v2\njunk\n")
    assert d == {"/sys/a/b": "4: ACTIVE", "/sys/a/c": "RoCE v2"}
    assert "grep -r -H ." in fr.GID_DUMP_CMD and "sed 's/:/\\t/'" in fr.GID_DUMP_CMD


def test_ping_ok_toolong_loss():
    ok = fnet.parse_ping(fx("ping_ok.txt"))
    assert ok.ok and ok.loss_pct == 0 and (ok.rtt_min_ms, ok.rtt_avg_ms, ok.rtt_max_ms) == (0.050, 0.058, 0.069)
    tl = fnet.parse_ping(fx("ping_toolong.txt"))
    assert not tl.ok and tl.errors == 2 and tl.local_mtu == 9000 and "message too long" in tl.error
    loss = fnet.parse_ping(fx("ping_loss.txt"))
    assert loss.loss_pct == 100 and loss.rtt_avg_ms is None
    cmd = fnet.ping_cmd("169.254.77.2", size=8972, iface="enp1s0f0np0")
    assert "-M do -s 8972" in cmd and "-I enp1s0f0np0" in cmd


def test_iperf3_client_server_refused():
    c = fnet.parse_iperf3(fx("iperf3_client.json"))
    assert c.error == "" and c.receiver_gbps == pytest.approx(11.5788, rel=1e-3)
    assert c.sender_gbps == pytest.approx(11.6346, rel=1e-3) and not c.reverse
    s = fnet.parse_iperf3(fx("iperf3_server.json"))
    assert s.receiver_bps is not None
    r = fnet.parse_iperf3(fx("iperf3_refused.json"))
    assert r.receiver_bps is None and "Connection refused" in r.error
    two = fx("iperf3_refused.json") + "\n" + fx("iperf3_client.json")
    assert fnet.parse_iperf3(two).receiver_bps is not None       # client retry printed twice
    assert fnet.parse_iperf3("bash: iperf3: command not found").error


def test_ibdev2netdev():
    ports = fr.parse_ibdev2netdev(fx("ibdev2netdev_spark.txt"))
    assert [(p.hca, p.netdev, p.up) for p in ports] == [
        ("rocep1s0f0", "enp1s0f0np0", True), ("rocep1s0f1", "enp1s0f1np1", False),
        ("roceP2p1s0f0", "enP2p1s0f0np0", True), ("roceP2p1s0f1", "enP2p1s0f1np1", False)]


def test_gid_dump_head():
    ports = fr.parse_gid_dump(fx("gids_head_gid3.tsv"))
    p = ports["rocep1s0f0"]
    assert p.active and p.link_layer == "Ethernet"
    assert p.entry(3).roce_v2 and p.entry(3).ipv4 == "192.168.100.1" and p.entry(3).ndev == "enp1s0f0np0"
    assert p.entry(2).type == "IB/RoCE v1" and p.entry(1).ipv4 is None   # link-local v6
    assert p.entry(7).zero and p.entry(200).zero
    assert "3=RoCE v2 ::ffff:192.168.100.1 (enp1s0f0np0)" in p.describe()


# --------------------------------------------------------------------------- resolver

HEAD_IPS = {"enp1s0f0np0": ["192.168.100.1"], "enP2p1s0f0np0": ["192.168.101.1"]}
WORKER_IPS = {"enp1s0f0np0": ["192.168.100.2"], "enP2p1s0f0np0": ["192.168.101.2"]}
MAP = {"rocep1s0f0": "enp1s0f0np0", "roceP2p1s0f0": "enP2p1s0f0np0"}
HCAS = ["rocep1s0f0", "roceP2p1s0f0"]


def _node(name, fixture, ips, match):
    ports = fr.parse_gid_dump(fx(fixture))
    return fr.resolve_node_gid(name, ports, HCAS, ips, MAP, match_ip=match), ports


def test_resolver_common_index_3():
    h, _ = _node("head", "gids_head_gid3.tsv", HEAD_IPS, "192.168.100.1")
    w, _ = _node("worker", "gids_worker_gid3.tsv", WORKER_IPS, "192.168.100.2")
    assert (h.index, h.via) == (3, "match IP 192.168.100.1")
    cg = fr.resolve_cluster_gid([h, w])
    assert cg.common == 3 and cg.resolved


def test_resolver_gid3_zero_on_worker_gives_per_rank_and_pin_fails():
    h, _ = _node("head", "gids_head_gid3.tsv", HEAD_IPS, "192.168.100.1")
    w, wports = _node("worker", "gids_worker_gid3_zero.tsv", WORKER_IPS, "192.168.100.2")
    assert w.index == 5
    cg = fr.resolve_cluster_gid([h, w])
    assert cg.common is None and cg.per_node == {"head": 3, "worker": 5}
    why = fr.check_pinned_gid(3, w, wports)
    assert "rocep1s0f0: index 3 is 3=<all-zero>" in why
    assert fr.check_pinned_gid(3, h, fr.parse_gid_dump(fx("gids_head_gid3.tsv"))) == ""


def test_resolver_twins_share_no_index():
    w, _ = _node("worker", "gids_worker_no_common.tsv", WORKER_IPS, "192.168.100.2")
    assert w.index is None and "share no RoCE v2 IPv4 GID index" in w.problem
    assert "rocep1s0f0 usable [3]" in w.problem and "roceP2p1s0f0 usable [5]" in w.problem
    cg = fr.resolve_cluster_gid([w])
    assert not cg.resolved and "worker:" in cg.problem


def test_resolver_ipv6_only():
    ports = fr.parse_gid_dump(fx("gids_worker_ipv6_only.tsv"))
    w = fr.resolve_node_gid("worker", ports, ["rocep1s0f0"], {"enp1s0f0np0": []}, MAP, match_ip="192.168.100.2")
    assert w.index is None and "no RoCE v2 IPv4-mapped GID" in w.problem and "IPv4 none" in w.problem


def test_resolver_missing_hca_and_inactive():
    ports = fr.parse_gid_dump(fx("gids_head_gid3.tsv"))
    n = fr.resolve_node_gid("head", ports, ["rocep1s0f1"], HEAD_IPS, MAP)
    assert n.index is None and "not in /sys/class/infiniband" in n.problem
    ports["rocep1s0f0"].state = "1: DOWN"
    n = fr.resolve_node_gid("head", ports, ["rocep1s0f0"], HEAD_IPS, MAP)
    assert "not ACTIVE" in n.problem


def test_resolver_ignores_ipv4_of_other_host():
    # a v2 IPv4 GID whose address is not on this netdev nor the match IP is not usable
    ports = fr.parse_gid_dump(fx("gids_head_gid3.tsv"))
    n = fr.resolve_node_gid("head", ports, ["rocep1s0f0"], {"enp1s0f0np0": ["10.9.9.9"]}, MAP, match_ip="10.9.9.9")
    assert n.index is None


# --------------------------------------------------------------------------- perftest


def test_ib_write_bw():
    b = fr.parse_ib_write_bw(fx("ib_write_bw_rail0.txt"))
    assert b.avg_gbps == 92.57 and b.header.gid_index == 3 and b.header.mtu == 4096
    assert b.header.device == "rocep1s0f0" and b.header.qps == 4 and b.header.link_type == "Ethernet"
    assert b.bytes == 1048576 and b.error == ""
    d = fr.parse_ib_write_bw(fx("ib_write_bw_degraded.txt"))
    assert d.avg_gbps == 24.21
    n = fr.parse_ib_write_bw(fx("ib_write_bw_no_server.txt"))
    assert n.avg_gbps is None and "Couldn't connect to 192.168.100.2:18515" in n.error


def test_ib_write_lat():
    lat = fr.parse_ib_write_lat(fx("ib_write_lat_rail0.txt"))
    assert (lat.t_min_us, lat.t_typical_us, lat.p99_us, lat.p999_us) == (1.42, 1.47, 1.57, 1.93)
    assert lat.iterations == 5000 and lat.header.test == "RDMA_Write Latency Test"


def test_perftest_commands_bounded():
    s = fr.ib_write_bw_cmd("rocep1s0f0", 18515, gid_index=3)
    assert s.startswith("timeout 30 ib_write_bw -d rocep1s0f0") and "--report_gbits" in s and "-x 3" in s
    c = fr.ib_write_bw_cmd("rocep1s0f0", 18515, server_ip="192.168.100.2")
    assert "192.168.100.2" in c and "Couldn't connect" in c


# --------------------------------------------------------------------------- nccl


def test_all_reduce_perf():
    t = fn.parse_nccl_tests(fx("all_reduce_perf_2node.txt"))
    assert t.test == "" or t.test.endswith("_perf")
    assert len(t.rows) == 5 and t.ranks == 2 and t.avg_busbw_gbs == 19.178
    assert t.rows[-1].oop_busbw == 23.75 and t.max_busbw_gbs == 23.76 and not t.wrong
    assert t.out_of_bounds == 0


def test_all_gather_perf_old_columns():
    t = fn.parse_nccl_tests(fx("all_gather_perf_old.txt"))
    assert len(t.rows) == 1 and t.rows[0].size == 17179869184
    assert (t.rows[0].oop_busbw, t.rows[0].ip_busbw) == (18.94, 20.95) and t.avg_busbw_gbs == 19.9448
    assert not t.wrong      # N/A = validation disabled


def test_nccl_tests_failure():
    t = fn.parse_nccl_tests("spark-head: Test NCCL failure common.cu:1030 'unhandled system error'\n")
    assert t.rows == [] and "unhandled system error" in t.error


def test_mpirun_tagged_output_split_into_whole_lines():
    """mpirun --tag-output as OpenMPI 4.1 prints it: a tag on every chunk and after every newline inside one; a
    chunk that ends mid-line runs on into the next (another rank's, or mpirun's own message)."""
    raw = ("[1,0]<stdout>:# nThread 1\n[1,0]<stdout>:#  Rank  0 on spark-head\n[1,0]<stdout>:spark-head:1:1 [0] NCCL "
           "INFO NET/IB : Us[1,1]<stdout>:spark-worker:2:2 [0] NCCL INFO Using network IB\n[1,1]<stderr>:warn: x\n"
           "[1,0]<stdout>:ing [0]rocep1s0f1:1/RoCE\n[1,0]<stdout>:     8388608 row\n"
           "--------------------------------------------------------------------------\n"
           "mpirun detected that one or more processes exited with non-zero status\n[1,1]<stdout>:last")
    out = fn.split_mpirun_output(raw)
    assert out.tagged
    assert out.ranks == {0: ["# nThread 1", "#  Rank  0 on spark-head",
                             "spark-head:1:1 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE", "     8388608 row"],
                         1: ["spark-worker:2:2 [0] NCCL INFO Using network IB", "warn: x", "last"]}
    assert out.own == ["-" * 74, "mpirun detected that one or more processes exited with non-zero status"]
    assert out.text.splitlines()[2:4] == ["spark-worker:2:2 [0] NCCL INFO Using network IB", "warn: x"]
    plain = "spark-head: Test NCCL failure common.cu:1030 'unhandled system error'\nsecond\n"
    untagged = fn.split_mpirun_output(plain)              # mpirun failed before a rank ran / an older archive
    assert not untagged.tagged and untagged.ranks == {} and untagged.text == plain
    assert fn.split_mpirun_output("").lines == []


def test_captured_mpirun_output_cut_mid_line_split_by_rank():
    """A capture of step 01's line under load: rank 0's '#  Rank  0' line is cut and rank 1's chunk runs on from it
    (before --tag-output such a run lost rank 0's '# Rank' line and with it the head's whole NCCL log)."""
    raw = fx("all_reduce_perf_mpirun_tagged.txt")
    assert "NVIDIA GB10[1,1]<stdout>:spark-worker" in raw                  # the cut, as OpenMPI printed it
    out = fn.split_mpirun_output(raw)
    assert out.own == ['[vm:05320] Warning: could not find environment variable "LD_LIBRARY_PATH"'] * 2
    assert out.ranks[1] == [
        "spark-worker:5325:5325 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to enp1s0f0np0",
        "spark-worker:5325:5325 [0] NCCL INFO Bootstrap : Using enp1s0f0np0:169.254.77.2<0>",
        "spark-worker:5325:5325 [0] NCCL INFO cudaDriverVersion 13000",
        "spark-worker:5325:5325 [0] NCCL INFO NCCL_IB_HCA set to rocep1s0f0",
        "spark-worker:5325:5325 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:169.254.77.2<0>",
        "spark-worker:5325:5325 [0] NCCL INFO Using network IB",
        "spark-worker:5325:5343 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/IB/0"]
    head = out.ranks[0]
    assert "#  Rank  0 Group  0 Pid   5324 on spark-head device  0 [000f:01:00] NVIDIA GB10" in head
    assert "spark-head:5324:5324 [0] NCCL INFO cudaDriverVersion 13000" in head and len(head) == 25
    assert all(l.startswith(("#", "spark-head:5324:", "NCCL version ", "    ", "   1")) for l in head), head
    t = fn.parse_nccl_tests(raw)
    assert t.ranks == 2 and len(t.rows) == 5 and t.avg_busbw_gbs == 12.25 and not t.wrong
    assert fn.parse_nccl_log("\n".join(head)).hca_names == ["rocep1s0f1"]
    assert fn.parse_nccl_log("\n".join(out.ranks[1])).hca_names == ["rocep1s0f0"]


def test_nccl_tests_and_log_read_through_mpirun_tags():
    """The archived nccl_all_reduce_perf.txt is mpirun's tagged output: report.recompute parses it as it is."""
    def tagged(text, rank=0):
        return "".join(f"[1,{rank}]<stdout>:{l}" for l in text.splitlines(keepends=True))
    t = fn.parse_nccl_tests(tagged(fx("all_reduce_perf_2node.txt")))
    assert len(t.rows) == 5 and t.ranks == 2 and t.avg_busbw_gbs == 19.178 and t.rows[0].size == 8388608
    ib = fn.parse_nccl_log(tagged(fx("nccl_log_ib.txt"), 1))
    assert ib.transport == "IB" and ib.hca_names == ["rocep1s0f0", "roceP2p1s0f0"] and ib.version == "2.28.9+cuda13.0"


def test_nccl_log_ib_and_socket():
    ib = fn.parse_nccl_log(fx("nccl_log_ib.txt"))
    assert ib.transport == "IB" and ib.hca_names == ["rocep1s0f0", "roceP2p1s0f0"]
    assert ib.hcas[0] == "rocep1s0f0:1/RoCE" and ib.oob_if == "enp1s0f0np0"
    assert ib.version == "2.28.9+cuda13.0" and not ib.gdr and ib.via == ["NET/IB/0", "NET/IB/1"]
    so = fn.parse_nccl_log(fx("nccl_log_socket.txt"))
    assert so.transport == "Socket" and so.hcas == [] and so.socket_ifs == ["enp1s0f0np0"]


def test_allreduce_sweep_json():
    s = fn.parse_allreduce_sweep("some warning\n" + fx("allreduce_sweep_rank0.json"))
    assert s.correct and s.rank == 0 and s.world_size == 2 and len(s.points) == 4
    assert s.points[-1].bytes == 16 << 20 and s.peak_busbw_gbs == pytest.approx(0.790148)
    e = fn.parse_allreduce_sweep('{"tool": "allreduce_sweep", "error": "RuntimeError: Gloo connectFullMesh failed"}')
    assert "connectFullMesh" in e.error
    assert fn.parse_allreduce_sweep("Traceback ...\nModuleNotFoundError: torch").error.startswith("no sweep JSON")
