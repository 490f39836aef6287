"""runbook.network step logic against FakeNodes that map command regexes to canned results and
refuse any command they do not know."""
import dataclasses
import json

import pytest

from runbook.network import bandwidth
from runbook.profile import load_profile
from runbook.network import verify as network
from runbook.checks import Status
from runbook.facts.node_paths import vllm_python
from support.doubles import FakeCluster, FakeNode, res
from support.net import by, fx, iof_tagged, lab_rules, mpirun_apps, mpirun_tagged
from support.profiles import profile_from


def lab_profile(**keys):
    """The shipped lab profile with the thresholds these tests were written for (a real, validated Profile)."""
    base = {"EXPECT_RDMA": 0, "EXPECT_GPU": 0, "EXPECT_LINK_GBPS": 0, "FABRIC_MTU": 9000, "MAX_RTT_MS": 1.0,
            "MIN_TCP_GBPS": 0.1, "MIN_RDMA_GBPS_RAIL": 90, "MIN_RDMA_GBPS_TOTAL": 180, "DEGRADED_GBPS": 25,
            "MIN_NCCL_BUSBW_GBS": 21.875, "COMMAND_TIMEOUT": 20, "VLLM_BIN": "vllm"}
    return profile_from("env/lab.env", **{**base, **keys})


def lab_cluster(head_kw=None, worker_kw=None, worker_if="enp1s0f0np0"):
    head = FakeNode("head", 0, fabric_ip="169.254.77.1", fabric_if="enp1s0f0np0", rules=lab_rules(1, **(head_kw or {})),
                    read_only=True)
    worker = FakeNode("worker", 1, fabric_ip="169.254.77.2", fabric_if=worker_if, rules=lab_rules(2, **(worker_kw or {})),
                      read_only=True)
    return FakeCluster([head, worker])


# --------------------------------------------------------------------------- lab


def test_lab_happy_path(tmp_path):
    cluster = lab_cluster()
    checks, raw = network.verify_network(cluster, lab_profile(), tmp_path)
    assert not checks.failures(), checks.to_text()
    assert by(checks, "net.gid", "cluster").status is Status.NA
    assert "not applicable on this profile" in by(checks, "net.gid", "cluster").observed
    assert by(checks, "net.rdma.bw").status is Status.NA and by(checks, "net.nccl").status is Status.NA
    assert by(checks, "net.speed.enp1s0f0np0", "head").status is Status.NA
    assert by(checks, "net.pcie.enp1s0f0np0", "head").status is Status.NA
    assert by(checks, "net.allreduce").status is Status.NA
    tcp = by(checks, "net.tcp.rail0.head->worker")
    assert tcp.status is Status.PASS and tcp.data["gbps"] == pytest.approx(11.5788, rel=1e-3)
    assert by(checks, "net.tcp.rail0.worker->head").status is Status.PASS
    assert by(checks, "net.ping.rail0.head->worker").status is Status.PASS
    assert "head/ip_addr.json" in raw and (tmp_path / "iperf3_rail0_head_to_worker_client.json").exists()
    assert tcp.evidence[0] == "raw/01_network/iperf3_rail0_head_to_worker_client.json"
    # every PASS is real: no N/A row claims PASS
    assert all(c.status is not Status.PASS for c in checks if "not applicable" in c.observed)
    # commands are bounded: servers under timeout, client pings DF
    head = cluster.nodes[1]   # worker ran the server for head->worker
    assert any(c.startswith("timeout ") and "iperf3 -s -1" in c for c in head.commands)


def test_link_down_on_worker_named():
    down = fx("ethtool_veth.txt").replace("Link detected: yes", "Link detected: no")
    cluster = lab_cluster(worker_kw={"state": "DOWN", "ethtool": down},)
    checks, _ = network.verify_network(cluster, lab_profile(), None, traffic=False)
    c = by(checks, "net.link.enp1s0f0np0", "worker")
    assert c.status is Status.FAIL and "enp1s0f0np0" in c.observed and "DOWN" in c.observed
    assert "link detected no" in c.observed and "worker" in c.fix
    assert by(checks, "net.link.enp1s0f0np0", "head").status is Status.PASS


def test_mtu_mismatch_named_with_both_values():
    def too_long(cmd):
        return res(1, fx("ping_toolong.txt").replace("mtu=9000", "mtu=1500"))
    cluster = lab_cluster(worker_kw={"mtu": 1500, "ping": too_long})
    checks, _ = network.verify_network(cluster, lab_profile(), None)
    m = by(checks, "net.mtu.rail0.match", "cluster")
    assert m.status is Status.FAIL
    assert m.observed == "head enp1s0f0np0=9000, worker enp1s0f0np0=1500"
    assert by(checks, "net.mtu.enp1s0f0np0", "worker").status is Status.FAIL
    p = by(checks, "net.ping.rail0.worker->head")
    assert p.status is Status.FAIL and "local MTU is 1500" in p.fix


def test_wrong_interface_named_before_anything_runs():
    cluster = lab_cluster(worker_if="enp1s0f1np1")
    checks, _ = network.verify_network(cluster, lab_profile(), None)
    c = by(checks, "net.fabric_if", "worker")
    assert c.status is Status.FAIL
    assert "enp1s0f1np1 does not exist on worker" in c.observed and "enp1s0f0np0" in c.observed and "lo" in c.observed
    assert "WORKER_CX7_IF" in c.fix
    for node in cluster.nodes:      # only the two fact probes ran: no ethtool, ping, iperf3
        assert node.commands and all(cmd.startswith("ip -j ") for cmd in node.commands), node.commands
    assert len(checks.failures()) == 1


def test_high_rtt_warns_not_fails():
    slow = fx("ping_ok.txt").replace("0.050/0.058/0.069/0.007", "0.950/1.016/1.100/0.040")
    cluster = lab_cluster(head_kw={"ping": lambda cmd: res(0, slow)})
    checks, _ = network.verify_network(cluster, lab_profile(MAX_RTT_MS=0.5), None)
    c = by(checks, "net.ping.rail0.head->worker")
    assert c.status is Status.WARN and "1.016" in c.observed


def test_tcp_below_threshold_fails():
    checks, _ = network.verify_network(lab_cluster(), lab_profile(MIN_TCP_GBPS=50), None)
    assert by(checks, "net.tcp.rail0.head->worker").status is Status.FAIL


def test_unknown_command_is_refused_and_becomes_a_failure():
    cluster = lab_cluster()
    cluster.nodes[1].rules = [r for r in cluster.nodes[1].rules if "iperf3 -c" not in r[0]]
    checks, _ = network.verify_network(cluster, lab_profile(), None)
    c = by(checks, "net.tcp.rail0.worker->head")
    assert c.status is Status.FAIL and "refused unknown command" in c.observed


def test_sweep_runs_on_both_nodes_with_lab_python():
    cluster = lab_cluster()
    for n in cluster.nodes:
        n.rules.append((r"allreduce_sweep|RUNBOOK_SWEEP_EOF", res(0, fx("allreduce_sweep_rank0.json"))))
    prof = lab_profile(VLLM_BIN="/opt/lab/vllm-venv/bin/vllm")
    checks, raw = network.verify_network(cluster, prof, None)
    for n in cluster.nodes:
        cmd = next(c for c in n.commands if "RUNBOOK_SWEEP_EOF" in c)
        assert cmd.startswith("timeout 120 /opt/lab/vllm-venv/bin/python - --rank ")
        assert "--master-addr 169.254.77.1" in cmd and "--iface enp1s0f0np0" in cmd
        assert f"--rank {0 if n.name == 'head' else 1}" in cmd
        assert by(checks, "net.allreduce", n.name).status is Status.PASS
    assert "allreduce_sweep_head.json" in raw


def test_sweep_raw_files_are_valid_json_with_the_warnings_kept():
    """torch prints warnings on stderr after the JSON line: the raw .json file must still parse (issue 25)."""
    cluster = lab_cluster()
    warn = "/x/torch/distributed/distributed_c10d.py:4807: UserWarning: No device id is provided\n  warnings.warn("
    cluster.nodes[0].rules.append((r"RUNBOOK_SWEEP_EOF", res(0, fx("allreduce_sweep_rank0.json"), warn)))
    cluster.nodes[1].rules.append((r"RUNBOOK_SWEEP_EOF", res(1, "", "Traceback (most recent call last):\nRuntimeError: x")))
    checks, raw = network.verify_network(cluster, lab_profile(VLLM_BIN="/opt/lab/vllm-venv/bin/vllm"), None)
    head, worker = json.loads(raw["allreduce_sweep_head.json"]), json.loads(raw["allreduce_sweep_worker.json"])
    assert head["results"] and head["exit_code"] == 0 and "UserWarning" in head["stderr"]
    assert worker["exit_code"] == 1 and "no sweep JSON" in worker["error"] and "RuntimeError" in worker["stderr"]
    assert by(checks, "net.allreduce", "head").status is Status.PASS
    assert by(checks, "net.allreduce", "worker").status is Status.FAIL
    # the report recomputes the figure from the archived file: the parser reads it back whole
    from runbook.facts.nccl import parse_allreduce_sweep
    again = parse_allreduce_sweep(raw["allreduce_sweep_head.json"])
    assert not again.error and again.raw["results"] == head["results"]
    assert parse_allreduce_sweep(raw["allreduce_sweep_worker.json"]).error


def test_sweep_python_derivation():
    assert vllm_python(lab_profile(VLLM_BIN="/x/bin/vllm")) == "/x/bin/python"
    assert vllm_python(lab_profile(VLLM_BIN="/x/bin/python3 -m vllm.entrypoints")) == "/x/bin/python3"
    assert vllm_python(lab_profile(VLLM_BIN="vllm")) is None


# --------------------------------------------------------------------------- Spark (RDMA)


TOOLS_FOUND = ("tool ib_write_bw /usr/bin/ib_write_bw\ntool ib_write_lat /usr/bin/ib_write_lat\n"
               "tool mpirun /usr/bin/mpirun\ntool iperf3 /usr/bin/iperf3\ntool ethtool /usr/sbin/ethtool\n"
               "nccl /home/spark/nccl-tests/build\nncclhome /usr\n")


def spark_rules(side, *, gids, bw_fixture="ib_write_bw_rail0.txt", tools=TOOLS_FOUND):
    addr = fx(f"ip_addr_spark_{side}.json")
    return [
        (r'^printf "%s\\n" "\$HOME"; id -u; id -un$', res(0, "/home/spark\n1000\nspark\n")),
        (r"^for t in ib_write_bw ib_write_lat mpirun iperf3 ethtool; ", res(0, tools)),
        (r"^ip -j addr show$", res(0, addr)),
        (r"^ip -j route show$", res(0, fx("ip_route_spark_head.json"))),
        (r"^ibdev2netdev$", res(0, fx("ibdev2netdev_spark.txt"))),
        (r"^grep -r -H \. /sys/class/infiniband", res(0, fx(gids))),
        (r"^ethtool ", res(0, fx("ethtool_cx7_200g.txt"))),
        (r"^grep -r -H \. /sys/class/net/", res(0, fx("pcie_spark_x2.tsv").replace("\t2\n", "\t4\n"))),
        (r"^sysctl ", res(0, "net.ipv4.conf.all.rp_filter = 0\nnet.ipv4.conf.enp1s0f0np0.rp_filter = 2\n"
                                "net.ipv4.conf.enP2p1s0f0np0.rp_filter = 2\n")),
        (r"^ping ", res(0, fx("ping_ok.txt"))),
        (r"iperf3 -s", res(0, fx("iperf3_server.json"))),
        (r"iperf3 -c", res(0, fx("iperf3_client.json").replace("11578842108.840954", "98000000000.0"))),
        (r"ib_write_bw .*192\.168\.", res(0, fx(bw_fixture))),
        (r"ib_write_bw ", res(0, fx("ib_write_bw_rail0.txt"))),
        (r"ib_write_lat .*192\.168\.", res(0, fx("ib_write_lat_rail0.txt"))),
        (r"ib_write_lat ", res(0, fx("ib_write_lat_rail0.txt"))),
        (r"mpirun .*all_reduce_perf", res(0, mpirun_tagged(fx("nccl_log_ib.txt") + fx("all_reduce_perf_2node.txt")))),
    ]


def spark_cluster(worker_gids="gids_worker_gid3.tsv", worker_gid="auto", bw="ib_write_bw_rail0.txt"):
    hcas = ["rocep1s0f0", "roceP2p1s0f0"]
    head = FakeNode("head", 0, fabric_ip="192.168.100.1", fabric_if="enp1s0f0np0", ib_devs=hcas, read_only=True,
                    rules=spark_rules("head", gids="gids_head_gid3.tsv", bw_fixture=bw))
    worker = FakeNode("worker", 1, fabric_ip="192.168.100.2", fabric_if="enp1s0f0np0", ib_devs=hcas, gid=worker_gid,
                      read_only=True, rules=spark_rules("worker", gids=worker_gids, bw_fixture=bw))
    return FakeCluster([head, worker])


def spark_profile(**keys):
    """Recipe A's profile describing the fake Sparks of :func:`spark_cluster` (addresses, both HCAs)."""
    hcas = "rocep1s0f0,roceP2p1s0f0"
    return profile_from("env/exl3-v41.env", **{
        "HEAD_IP": "192.168.100.1", "WORKER_IP": "192.168.100.2", "HEAD_CX7_IF": "enp1s0f0np0",
        "WORKER_CX7_IF": "enp1s0f0np0", "HEAD_CX7_IB": hcas, "WORKER_CX7_IB": hcas, "HEAD_GID": "auto",
        "WORKER_GID": "auto", "MIN_RDMA_GBPS_TOTAL": 180, "MIN_NCCL_BUSBW_GBS": 19.0, "COMMAND_TIMEOUT": 20,
        **keys})


def test_spark_two_rails_all_pass():
    cluster = spark_cluster()
    checks, _ = network.verify_network(cluster, spark_profile(), None)
    fails = [(c.name, c.node, c.observed) for c in checks.failures()]
    assert not fails, checks.to_text()
    assert by(checks, "net.gid.plan").data["common"] == 3
    assert by(checks, "net.rdma.bw.rail1.head->worker").data["gbps"] == 92.57
    tot = by(checks, "net.rdma.bw.total.head->worker")
    assert tot.status is Status.PASS and tot.data["gbps"] == pytest.approx(185.14)
    assert by(checks, "net.speed.enP2p1s0f0np0", "worker").status is Status.PASS
    assert by(checks, "net.addr.twin_subnets", "head").status is Status.PASS
    assert by(checks, "net.nccl.transport").status is Status.PASS
    assert by(checks, "net.nccl.hcas").status is Status.PASS
    mp = next(c for c in cluster.nodes[0].commands if c.startswith("timeout 180 mpirun"))
    ranks = mpirun_apps(mp)
    assert [r["host"] for r in ranks] == ["192.168.100.1", "192.168.100.2"]
    for r in ranks:
        assert r["env"]["NCCL_IB_GID_INDEX"] == "3" and r["env"]["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
        assert r["binary"] == "/home/spark/nccl-tests/build/all_reduce_perf"
    assert "--allow-run-as-root" not in mp                      # uid 1000 on these nodes
    assert "--mca btl_tcp_if_include 192.168.100.0/24 " in mp   # a subnet: valid on every node
    assert " mpirun --tag-output " in mp                        # each rank's lines come back whole
    assert [c.status for c in checks if c.name == "net.tools"] == [Status.PASS, Status.PASS]
    bwcmds = [c for c in cluster.nodes[0].commands if "ib_write_bw -d" in c]
    assert bwcmds and all(" -x 3" in c for c in bwcmds)


def test_nccl_ranks_get_their_own_interface_hca_and_gid():
    """Defect 5: recipe A is cabled head enp1s0f1np1/rocep1s0f1 <-> worker enp1s0f0np0/rocep1s0f0; each rank of
    nccl-tests must get its own node's NCCL_SOCKET_IFNAME, NCCL_IB_HCA and GID index (the head's interface does
    not exist on the worker)."""
    ranks, mp, nodes, checks = _recipe_nccl_run("env/exl3-v41.env")
    assert by(checks, "net.gid", "worker").status is Status.PASS, checks.to_text()
    assert [(r["host"], r["env"]["NCCL_SOCKET_IFNAME"], r["env"]["NCCL_IB_HCA"], r["env"]["NCCL_IB_GID_INDEX"])
            for r in ranks] == [("10.0.0.1", "enp1s0f1np1", "rocep1s0f1", "3"),
                                ("10.0.0.2", "enp1s0f0np0", "rocep1s0f0", "3")]
    assert "--mca btl_tcp_if_include 10.0.0.0/24 " in mp and "--mca oob_tcp_if_include 10.0.0.0/24 " in mp
    # nccl-tests under CACHE_DIR (~ expanded with each node's home) is looked for first
    probe = next(c for c in nodes[1].commands if c.startswith("for t in ib_write_bw"))
    assert "/home/spark/.cache/vllm-dsv41-flash-exl3/nccl-tests/build" in probe


@pytest.mark.parametrize("name", ["exl3-v41", "dspark-v4"])
def test_nccl_tests_use_the_gid_index_setting_the_ranks_get(name):
    """Issue #22 defect 9: step 01 ran nccl-tests with NCCL_IB_GID_INDEX=<resolved> while the dspark launch
    leaves it unset (seed B's NCCL_IB_GID_AUTO=1: NCCL picks the GID per HCA), so 01 proved a configuration the
    ranks do not use. Each nccl-tests rank now gets exactly the GID setting the launch renders for that node."""
    from runbook.launch.render import NodeFacts, render
    ranks, _, _, checks = _recipe_nccl_run(f"env/{name}.env")
    assert by(checks, "net.gid", "worker").status is Status.PASS, checks.to_text()
    resolved = {n: by(checks, "net.gid", n).data["resolved"] for n in ("head", "worker")}
    plan = render(load_profile(f"env/{name}.env"), {n: NodeFacts(home="/home/spark", gid_index=g)
                                                    for n, g in resolved.items()})
    assert ranks
    for node, r in zip(("head", "worker"), ranks):
        assert r["env"].get("NCCL_IB_GID_INDEX") == plan.rank(node).env.get("NCCL_IB_GID_INDEX"), node
    assert ("NCCL_IB_GID_INDEX" in ranks[0]["env"]) == (name == "exl3-v41")


def _recipe_nccl_run(path: str):
    """Step 01 on two recipe-cabled nodes (head enp1s0f1np1/rocep1s0f1, worker enp1s0f0np0/rocep1s0f0, GID 3):
    the nccl-tests ranks as mpirun got them, the mpirun line, the nodes and the checks."""
    profile = load_profile(path)
    specs = {n.name: n for n in profile.nodes}
    assert specs["head"].fabric_if != specs["worker"].fabric_if        # the premise of the defect

    def recipe_addr(side, iface, ip):
        data = json.loads(fx("ip_addr_lab.json"))
        for item in data:
            if item["ifname"] == "enp1s0f0np0":
                item["ifname"] = iface
                for a in item["addr_info"]:
                    if a["family"] == "inet":
                        a["local"], a["label"] = ip, iface
        return json.dumps(data)

    def recipe_gids(hca, netdev, ip_hex):
        return fx("gids_head_gid3.tsv").replace("rocep1s0f0", hca).replace("enp1s0f0np0", netdev) \
            .replace("c0a8:6401", ip_hex).split("/sys/class/infiniband/roceP2")[0]

    nodes = []
    for name, ip_hex in (("head", "0a00:0001"), ("worker", "0a00:0002")):
        spec = specs[name]
        iface, hca = spec.fabric_if, spec.ib_devs[0]
        rules = [(r"^ip -j addr show$", res(0, recipe_addr(name, iface, spec.fabric_ip))),
                 (r"^ip -j route show$", res(0, fx("ip_route_lab.json"))),
                 (r"^ibdev2netdev$", res(0, f"{hca} port 1 ==> {iface} (Up)\n")),
                 (r"^grep -r -H \. /sys/class/infiniband", res(0, recipe_gids(hca, iface, ip_hex)))]
        rules += spark_rules(name, gids="gids_head_gid3.tsv")
        nodes.append(FakeNode(spec=spec, rules=rules, read_only=True))
    checks, _ = network.verify_network(FakeCluster(nodes), profile, None)
    mp = next(c for c in nodes[0].commands if c.startswith("timeout 180 mpirun"))
    return mpirun_apps(mp), mp, nodes, checks


def test_missing_tools_fail_with_the_exact_commands():
    cluster = spark_cluster()
    cluster.nodes[1].rules.insert(0, (r"^for t in ib_write_bw", res(0, "missing ib_write_bw\nmissing ib_write_lat\n"
                                                                       "tool mpirun /usr/bin/mpirun\nmissing iperf3\n"
                                                                       "tool ethtool /usr/sbin/ethtool\n")))
    checks, _ = network.verify_network(cluster, spark_profile(), None)
    c = by(checks, "net.tools", "worker")
    assert c.status is Status.FAIL
    assert "iperf3, ib_write_bw, ib_write_lat, all_reduce_perf, nccl.h" in c.observed
    assert "/home/spark/nccl-tests/build" in c.observed
    # one apt-get for every missing package (the tool table's order), then nccl-tests against NCCL_HOME
    assert "sudo -n apt-get install -y perftest iperf3 libnccl-dev && set -e;" in c.fix
    assert "NCCL_HOME=/usr;" in c.fix
    assert "INSTALL_NET_TOOLS=1" in c.fix
    src = "/home/spark/.cache/vllm-dsv41-flash-exl3/nccl-tests"        # built under the profile's CACHE_DIR
    assert f"git clone --quiet https://github.com/NVIDIA/nccl-tests.git {src}" in c.fix
    assert "checkout --quiet --detach v2.18.3" in c.fix and f"make -C {src} -j4 MPI=1" in c.fix
    assert by(checks, "net.tools", "head").status is Status.PASS
    assert not any(cmd.startswith("sudo") for n in cluster.nodes for cmd in n.commands)   # nothing installed


def test_missing_tools_are_installed_when_allowed():
    cluster = spark_cluster()
    worker = cluster.nodes[1]
    state = {"installed": False}

    def probe(cmd):
        if state["installed"]:
            return res(0, TOOLS_FOUND)
        return res(0, "missing ib_write_bw\nmissing ib_write_lat\ntool mpirun /usr/bin/mpirun\n"
                      "tool iperf3 /usr/bin/iperf3\ntool ethtool /usr/sbin/ethtool\nncclhome /home/spark/nccl/build\n")
    worker.rules.insert(0, (r"^for t in ib_write_bw", probe))

    def build(cmd):                             # nccl_build_cmd: clone, make, print the commit
        state["installed"] = True
        return res(0, "0123456789abcdef0123\n")
    worker.read_only = False                    # installing is what this test allows
    worker.rules[1:1] = [(r"^sudo -n -l apt-get install -y perftest$", res(0, "/usr/bin/apt-get install -y perftest\n")),
                         (r"^sudo -n apt-get install -y perftest$", ""),
                         (r"^set -e; .*git clone .*nccl-tests.*make -C ", build)]
    checks, _ = network.verify_network(cluster, spark_profile(), None, install_tools=True)
    ran = worker.runs()
    assert ran and ran[0] == "sudo -n apt-get install -y perftest" and "v2.18.3" in ran[1], ran
    # sudo was asked first (read-only), for exactly the command that then ran
    assert "sudo -n -l apt-get install -y perftest" in worker.commands
    assert "NCCL_HOME=/home/spark/nccl/build;" in ran[1]          # the headers the probe found
    assert all(c.timeout >= 600 and c.warn for c in worker.calls if c.kind == "run")
    c = by(checks, "net.tools", "worker")
    assert c.status is Status.PASS and "commit 0123456789ab" in c.observed and "perftest" in c.observed


def test_install_refused_by_sudo_fails_before_anything_runs_with_the_drop_in():
    """A non-root SSH user whose sudo rules do not cover step 01's apt-get: the row FAILs before any install with
    the drop-in for exactly that command (not after it, as `installing … failed: a password is required`)."""
    cluster = spark_cluster()
    worker = cluster.nodes[1]
    worker.rules.insert(0, (r"^for t in ib_write_bw", res(0, "missing ib_write_bw\nmissing ib_write_lat\n"
                                                             "tool mpirun /usr/bin/mpirun\ntool iperf3 /usr/bin/iperf3\n"
                                                             "tool ethtool /usr/sbin/ethtool\nncclhome /usr\n")))
    worker.rules.insert(0, (r"^sudo -n -l apt-get install -y perftest$",
                            res(1, "", "")))                 # what sudo -l answers for a command it does not allow
    worker.read_only = False
    checks, _ = network.verify_network(cluster, spark_profile(), None, install_tools=True)
    c = by(checks, "net.tools", "worker")
    assert c.status is Status.FAIL and "sudo refuses `apt-get install -y perftest`" in c.observed
    assert "`sudo -n -l apt-get install -y perftest`: exit 1" in c.observed
    assert ("spark ALL=(root) NOPASSWD: /usr/bin/apt-get install -y perftest' | sudo tee "
            "/etc/sudoers.d/spark-runbook-net-tools") in c.fix and "INSTALL_NET_TOOLS=0" in c.fix
    assert worker.runs() == []                 # nothing installed, nothing built


def test_a_failed_install_shows_apts_error_not_its_progress():
    """apt-get prints progress on stdout and its error on stderr: the row's tail ends with the error."""
    cluster = spark_cluster()
    worker = cluster.nodes[1]
    worker.rules.insert(0, (r"^for t in ib_write_bw", res(0, "missing ib_write_bw\nmissing ib_write_lat\n"
                                                             "tool mpirun /usr/bin/mpirun\ntool iperf3 /usr/bin/iperf3\n"
                                                             "tool ethtool /usr/sbin/ethtool\nncclhome /usr\n")))
    worker.rules[1:1] = [(r"^sudo -n -l apt-get install -y perftest$", res(0, "/usr/bin/apt-get install -y perftest\n")),
                         (r"^sudo -n apt-get install -y perftest$",
                          res(100, "Reading package lists...\nBuilding dependency tree...\nReading state information...\n",
                              "E: Unable to locate package perftest\n"))]
    worker.read_only = False
    checks, _ = network.verify_network(cluster, spark_profile(), None, install_tools=True)
    c = by(checks, "net.tools", "worker")
    assert c.status is Status.FAIL and c.observed.endswith("E: Unable to locate package perftest"), c.observed


def test_degraded_rdma_fails_hard():
    checks, _ = network.verify_network(spark_cluster(bw="ib_write_bw_degraded.txt"), spark_profile(), None)
    c = by(checks, "net.rdma.bw.rail0.head->worker")
    assert c.status is Status.FAIL and "24.21" in c.observed
    assert "degraded ConnectX-7" in c.fix and "link reports 200G" in c.fix and "cold boot" in c.fix
    assert by(checks, "net.speed.enp1s0f0np0", "head").status is Status.PASS   # link claims 200G
    assert by(checks, "net.rdma.bw.total.head->worker").status is Status.FAIL


def test_pinned_gid3_zero_on_worker_fails_with_fix():
    checks, _ = network.verify_network(spark_cluster("gids_worker_gid3_zero.tsv", worker_gid=3), spark_profile(),
                                       None, traffic=False)
    c = by(checks, "net.gid", "worker")
    assert c.status is Status.FAIL and "index 3 is 3=<all-zero>" in c.observed
    assert "WORKER_GID=5" in c.fix
    assert by(checks, "net.gid", "head").status is Status.PASS
    plan = by(checks, "net.gid.plan")
    assert plan.status is Status.WARN and plan.data["per_node"] == {"head": 3, "worker": 5}


def test_twins_without_common_index_fail():
    checks, _ = network.verify_network(spark_cluster("gids_worker_no_common.tsv"), spark_profile(), None, traffic=False)
    c = by(checks, "net.gid", "worker")
    assert c.status is Status.FAIL and "share no RoCE v2 IPv4 GID index" in c.observed


def test_missing_hca_named_before_traffic():
    cluster = spark_cluster()
    worker = cluster.nodes[1]
    worker.spec = dataclasses.replace(worker.spec, ib_devs=["rocep1s0f0", "roceP9p1s0f0"])
    checks, _ = network.verify_network(cluster, spark_profile(), None)
    c = by(checks, "net.hca", "worker")
    assert c.status is Status.FAIL and "roceP9p1s0f0 not found" in c.observed
    assert not any("ping" in cmd or "iperf3" in cmd for n in cluster.nodes for cmd in n.commands)


def test_nccl_socket_fallback_fails():
    cluster = spark_cluster()
    cluster.nodes[0].rules.insert(0, (r"mpirun", res(0, mpirun_tagged(fx("nccl_log_socket.txt") + fx("all_reduce_perf_2node.txt")))))
    checks, _ = network.verify_network(cluster, spark_profile(), None)
    assert by(checks, "net.nccl.transport").status is Status.FAIL
    assert by(checks, "net.nccl.hcas").status is Status.FAIL


def test_plot_bandwidth():
    import matplotlib
    matplotlib.use("Agg")
    checks, _ = network.verify_network(spark_cluster(), spark_profile(), None)
    rows = bandwidth.bandwidth_rows(checks)
    assert {r["kind"] for r in rows} == {"tcp", "rdma"} and len(rows) == 8
    fig = bandwidth.plot_bandwidth(checks)
    assert fig.axes and len(fig.axes[0].patches) == 8
    empty = bandwidth.plot_bandwidth([])
    assert empty is not None


def test_install_net_tools_is_a_real_profile_key(monkeypatch, tmp_path):
    """Issue 22 defect 5: the fix names INSTALL_NET_TOOLS, a key a4d36a1's loader rejected; now every shipped
    profile sets it (0) and step 01 takes the profile's value."""
    from pathlib import Path

    import runbook.network as step01
    from runbook.site import SPARKS_SITE
    from runbook.profile import load_profile
    env = Path(__file__).resolve().parents[2] / "env"
    shipped = sorted(env.glob("*.env"))
    assert shipped and all(load_profile(p).install_net_tools is False for p in shipped)
    assert all("\nINSTALL_NET_TOOLS=0\n" in p.read_text() for p in shipped)
    profile = load_profile(env / "dspark-v4.env", {"INSTALL_NET_TOOLS": "1"})
    assert profile.install_net_tools is True
    seen = {}

    def fake_verify(cluster, prof, **kw):
        seen.update(kw)
        raise RuntimeError("stop after the call")
    monkeypatch.setattr(step01, "verify_network", fake_verify)
    from types import SimpleNamespace
    added = []
    step = SimpleNamespace(profile=profile, cluster=None, site=SPARKS_SITE, add=added.extend)   # what run() reads first
    with pytest.raises(RuntimeError, match="stop after the call"):
        step01.run(step)
    assert seen["install_tools"] is True and seen["site"] is SPARKS_SITE and added == []   # no simulator on Sparks


def test_rank_failures_name_the_setting_of_the_failing_rank():
    from runbook.network import collectives
    ranks = [collectives.NcclRank("head", "169.254.77.1", {"NCCL_SOCKET_IFNAME": "enp1s0f0np0",
                                                             "NCCL_IB_HCA": "rocep1s0f1", "NCCL_IB_GID_INDEX": "3"}, "b"),
             collectives.NcclRank("worker", "169.254.77.2", {"NCCL_SOCKET_IFNAME": "enp1s0f1np1",
                                                               "NCCL_IB_HCA": "rocep1s0f0"}, "b")]
    logs = {"head": "spark-head:1:1 [0] NCCL INFO Bootstrap : Using enp1s0f0np0:169.254.77.1<0>",
            "worker": "spark-worker:2:2 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to enp1s0f1np1\n"
                      "spark-worker:2:2 [0] NCCL WARN Bootstrap : no socket interface found"}
    assert collectives.rank_failures(ranks, logs) == [
        "worker: NCCL_SOCKET_IFNAME=enp1s0f1np1 names no interface of worker (NCCL: Bootstrap : no socket interface found)"]
    logs["worker"] = ("spark-worker:2:2 [0] NCCL WARN Call to ibv_modify_qp failed with 61 No data available, on dev "
                      "rocep1s0f0:1, curr state INIT")
    logs["head"] = "spark-head:1:1 [0] NCCL WARN NET/IB : peer rank failed"
    out = collectives.rank_failures(ranks, logs)
    assert out[0] == "head: NET/IB : peer rank failed"
    assert out[1].startswith("worker: NCCL_IB_GID_INDEX=unset on rocep1s0f0: Call to ibv_modify_qp failed with 61")
    assert collectives.rank_failures(ranks, {"head": "", "worker": ""}) == []


def test_nccl_failure_row_names_the_rank_and_its_interface():
    cluster = spark_cluster()
    log = ("#  Rank  0 Group  0 Pid   4242 on spark-head device  0 [000f:01:00] NVIDIA GB10\n"
           "#  Rank  1 Group  0 Pid   3131 on spark-worker device  0 [000f:01:00] NVIDIA GB10\n"
           "spark-worker:3131:3131 [0] NCCL WARN Bootstrap : no socket interface found\n"
           "spark-worker: Test NCCL failure common.cu:1279 'invalid usage'\n")
    cluster.nodes[0].rules.insert(0, (r"mpirun", res(1, mpirun_tagged(log))))
    checks, _ = network.verify_network(cluster, spark_profile(), None)
    c = by(checks, "net.nccl.busbw")
    assert c.status is Status.FAIL
    assert "worker: NCCL_SOCKET_IFNAME=enp1s0f0np0 names no interface of worker" in c.observed
    assert c.data["rank_failures"] and "<NODE>_CX7_IF" in c.fix


def test_tools_probe_in_a_rehearsal_finds_the_package_binary_behind_the_simulator(tmp_path):
    """The probe runs in bash with the simulators' bin first on PATH (as a rehearsal does): the row names the real
    binary and the simulator that shadows it; a tool only the simulators have is missing."""
    import subprocess
    from runbook.network import tools
    sim_bin, real_bin = tmp_path / "mnt/nvme/.rehearsal/sim/bin", tmp_path / "usr/bin"
    for d, names in ((sim_bin, ("ib_write_bw", "ib_write_lat")), (real_bin, ("ib_write_bw", "mpirun", "iperf3"))):
        d.mkdir(parents=True)
        for n in names:
            (d / n).write_text("#!/bin/sh\n")
            (d / n).chmod(0o755)
    cmd = tools.probe_cmd([], tools=("ib_write_bw", "ib_write_lat", "mpirun", "iperf3"), hide=str(sim_bin))
    out = subprocess.run(["/bin/bash", "-c", f'export PATH={sim_bin}:"$PATH"; {cmd}'], capture_output=True, text=True,
                         timeout=20, env={"PATH": f"{real_bin}:/nonexistent"}).stdout
    t = tools.parse_probe(out, tools.NodeTools(node="head"), str(sim_bin))
    assert t.found == {"ib_write_bw": f"{real_bin}/ib_write_bw", "mpirun": f"{real_bin}/mpirun",
                       "iperf3": f"{real_bin}/iperf3"}
    assert t.shadowed == {"ib_write_bw": f"{sim_bin}/ib_write_bw", "ib_write_lat": f"{sim_bin}/ib_write_lat"}
    # without hiding, the simulator is what a plain lookup finds, and parse_probe refuses it as the package
    plain = subprocess.run(["/bin/bash", "-c", f'export PATH={sim_bin}:"$PATH"; {tools.probe_cmd([], tools=("ib_write_lat",))}'],
                           capture_output=True, text=True, timeout=20, env={"PATH": str(real_bin)}).stdout
    assert plain.strip() == f"tool ib_write_lat {sim_bin}/ib_write_lat"
    assert tools.parse_probe(plain, tools.NodeTools(node="head"), str(sim_bin)).found == {}


def test_tools_row_of_a_rehearsal():
    from runbook.network import tools
    t = tools.NodeTools(node="head", found={"ib_write_bw": "/usr/bin/ib_write_bw", "ib_write_lat": "/usr/bin/ib_write_lat",
                                            "mpirun": "/usr/bin/mpirun", "iperf3": "/usr/bin/iperf3",
                                            "ethtool": "/usr/sbin/ethtool"},
                        shadowed={"ib_write_bw": "/sim/bin/ib_write_bw"}, nccl_dir="/sim/nccl-tests/build")
    node = FakeNode("head", 0, read_only=True)
    row = tools.tools_check(node, t, need_perftest=True, need_nccl=True, install=False, rehearsal=True)
    assert row.status is Status.PASS
    assert "ib_write_bw /usr/bin/ib_write_bw (the tests run the simulator /sim/bin/ib_write_bw)" in row.observed
    assert "mpirun /usr/bin/mpirun;" in row.observed and "all_reduce_perf in /sim/nccl-tests/build" in row.observed
    del t.found["mpirun"], t.found["ib_write_lat"]
    t.nccl_dir = ""
    row = tools.tools_check(node, t, need_perftest=True, need_nccl=True, install=True, rehearsal=True)
    assert row.status is Status.FAIL and node.runs() == []          # a rehearsal never installs
    assert row.fix == ("install the lab's packages on the lab host: apt-get install -y perftest openmpi-bin libopenmpi-dev "
                       "(make lab-deps), then `python -m runbook lab down` and `up` (each lab node starts from the lab "
                       "host's packages); reinstall the rehearsal simulators (they are "
                       "installed by 00_preflight / 01_network)")


def _cut(text: str, at: list[int]) -> list[str]:
    bounds = [0, *at, len(text)]
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), at
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def test_nccl_rank_output_cut_mid_line_by_mpirun():
    """OpenMPI forwards each rank's output in the chunks it reads (under load a read ends mid-line) and prints the
    other rank's chunk in between: here the head's ``NET/IB : Using`` line, its ``# Rank 1`` line and a table row
    are cut, with the worker's chunks inside them. Before --tag-output the step got those lines glued together
    (the worker's NET/IB line inside the head's, a row broken): net.nccl.hcas FAILed both nodes, net.nccl.transport
    the worker, and the table lost a row."""
    head_lines = [l for l in fx("nccl_log_ib.txt").splitlines(keepends=True) if not l.startswith("spark-worker")]
    worker = "".join(l for l in fx("nccl_log_ib.txt").splitlines(keepends=True) if l.startswith("spark-worker"))
    table = fx("all_reduce_perf_2node.txt")
    at = table.index("#\n", table.index("#  Rank  1")) + 2                 # after the '# Using devices' block
    head = table[:at] + "".join(head_lines) + table[at:]
    cuts = [head.index("Rank  1 Group") + 4, head.index("NET/IB : Us") + 11, head.index("33554432       8") + 5]
    w = [worker.index("NET/IB : Using") + 3, worker.index("Channel 00") + 7]
    h, k = _cut(head, cuts), _cut(worker, w)
    assert all(not c.endswith("\n") for c in h[:-1] + k[:-1])             # every cut is mid-line
    out = iof_tagged([(0, h[0]), (1, k[0]), (0, h[1]), (1, k[1]), (0, h[2]), (1, k[2]), (0, h[3])])
    cluster = spark_cluster()
    cluster.nodes[0].rules.insert(0, (r"mpirun .*all_reduce_perf", res(0, out)))
    checks, _ = network.verify_network(cluster, spark_profile(), None)
    busbw = by(checks, "net.nccl.busbw")
    assert busbw.status is Status.PASS and busbw.data["avg_busbw_gbs"] == 19.178 and len(busbw.data["rows"]) == 5
    assert [(c.node, c.status) for c in checks if c.name == "net.nccl.hcas"] == [("head", Status.PASS),
                                                                              ("worker", Status.PASS)]
    assert by(checks, "net.nccl.transport").status is Status.PASS
    from runbook.network import collectives
    logs = collectives.rank_logs(out, cluster.nodes)
    assert logs == {"head": head.rstrip("\n"), "worker": worker.rstrip("\n")}      # each rank's lines, exact
