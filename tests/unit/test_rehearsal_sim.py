"""The rehearsal's simulators of the hardware-only tools (runbook/lab/sim) run as real subprocesses, fed exactly
what 00_preflight / 01_network render for env/exl3-v41.env (and env/tp3-dspark.env) under --rehearse.

Every "lab node" here is a directory holding the tree the installer puts in the node's private
/mnt/nvme/.rehearsal/sim; :func:`sim_node` (a support.doubles FakeNode) stands in for runbook.remote.Node: it runs the simulator-bound
commands for real (bash, the rehearsal PATH prefix of runbook.remote, the node's directory in place of the
lab path) and answers the lab's real-tool facts (ip, ethtool, ping, iperf3, the gloo sweep) from the captured
lab fixtures; any other command is refused. ``mpirun`` is OpenMPI's own (no simulator): the rendered MPMD
line runs with every rank on this host (:func:`local_mpirun` points each app context at its node's tree and
OpenMPI's TCP at the loopback); those tests skip where OpenMPI is not installed. perftest's TCP exchange runs
over one loopback address per node (RUNBOOK_SIM_ADDRESS_MAP).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from runbook.checks import Status
from runbook.facts import nccl as fn
from runbook.facts import rdma as fr
from runbook.facts import system
from runbook.lab import sim
from runbook.lab.rehearsal import load_rehearsal
from runbook.lab.site import site_for
from runbook.network import collectives
from runbook.network import verify as network
from runbook.remote import REHEARSAL_SIM_DIR, Cluster, rehearsal_path_prefix

from support.doubles import SHELL, FakeCluster, FakeNode, LocalShell, exact, res
from support.net import by, fx, lab_addresses, lab_node_addr, lab_node_rules, mpirun_apps

SIM_ROWS = ("net.gid", "net.gid.plan", "net.tools", "net.rdma.bw.rail0.", "net.rdma.lat.rail0.", "net.nccl.")
MPIRUN = shutil.which("mpirun")
needs_openmpi = pytest.mark.skipif(MPIRUN is None, reason="OpenMPI's mpirun is not installed (apt-get install "
                                                           "openmpi-bin; make lab-deps and .ci/run install it)")


def load(path):
    prof, _, _ = load_rehearsal(path)
    assert prof.rehearsal and prof.lab and prof.expect_gpu and prof.expect_rdma
    return prof


@pytest.fixture(scope="module")
def exl3():
    return load("env/exl3-v41.env")


def sim_node(spec, root: Path, profile, env: dict[str, str], hostname: str) -> FakeNode:
    """A lab node whose /mnt/nvme/.rehearsal/sim is ``root`` (the installer's tree, written here): the simulated
    tools run there for real with the rehearsal PATH prefix; the lab's real-tool facts come from the fixtures;
    anything else is refused, and nothing may change the node."""
    nodes = len(profile.nodes)
    sim.write_tree(root, sim.node_files(sim.node_config(profile, spec, lab_node_addr(spec.name, nodes),
                                                        hostname=hostname, root=str(root)), str(profile.source)))
    rules = [*lab_node_rules(spec.name, nodes),
             (r'^printf "%s\\n" "\$HOME"; id -u; id -un$', res(0, "/root\n0\nroot\n")),     # the lab runs as root
             (r"RUNBOOK_SWEEP_EOF", res(0, fx("allreduce_sweep_rank0.json"))),
             (re.escape(REHEARSAL_SIM_DIR) + r"|\b(ibdev2netdev|nvidia-smi|ibv_devinfo|ib_write_\w+)\b", SHELL)]
    shell = LocalShell(env=env, rewrite={REHEARSAL_SIM_DIR: str(root)}, prefix=rehearsal_path_prefix(profile))
    return FakeNode(spec=spec, rules=rules, shell=shell, read_only=True)


def sh(node: FakeNode, command: str, timeout: float = 60):
    """Run ``command`` in the node's simulator shell directly (no rule in between)."""
    return node.shell(node.name, command, timeout=timeout)


def sim_cluster(profile, tmp_path) -> FakeCluster:
    roots = {str(n.fabric_ip): tmp_path / f"n{n.rank}-{n.name}" for n in profile.nodes}
    env = dict(os.environ, RUNBOOK_SIM_ADDRESS_MAP=",".join(f"{ip}=127.0.1.{n.rank + 1}" for n in profile.nodes
                                                            for ip in lab_addresses(n.name, len(profile.nodes))))
    nodes = [sim_node(n, roots[str(n.fabric_ip)], profile, env, f"spark-{n.name}") for n in profile.nodes]
    head = nodes[0]
    # the step's mpirun line, run by OpenMPI with every rank here (refused where OpenMPI is absent)
    head.rules.insert(0, (r"^timeout \d+ mpirun ", lambda cmd: sh(head, local_mpirun(cmd, roots), 200)))
    return FakeCluster(nodes)


def local_mpirun(cmd: str, roots: dict[str, Path]) -> str:
    """The rendered mpirun line with every rank on this host: each app context's ``-H <fabric ip>`` becomes
    localhost and its binary that node's simulator tree (so each rank still reads ITS node's node.json and
    gets ITS ``-x`` environment); OpenMPI's TCP is limited to the loopback instead of the fabric subnet."""
    if MPIRUN is None:
        raise AssertionError("OpenMPI's mpirun is not installed: this test cannot run the step's mpirun line")
    argv = shlex.split(cmd.replace(" 2>&1", ""))
    out, host = [], None
    for k, a in enumerate(argv):
        prev = argv[k - 1] if k else ""
        if prev == "-H":
            host = a.split(":")[0]
            if host not in roots:
                raise AssertionError(f"mpirun -H {a}: not a node of this cluster ({sorted(roots)})")
            a = "localhost:1"
        elif prev in ("btl_tcp_if_include", "oob_tcp_if_include"):
            a = "127.0.0.0/8"
        elif a.startswith(REHEARSAL_SIM_DIR) and host:
            a = str(roots[host]) + a[len(REHEARSAL_SIM_DIR):]
        out.append(a)
    at = out.index("mpirun") + 1
    out[at:at] = ["--oversubscribe"]           # every rank on one host: one slot per app context is not enough
    return " ".join(shlex.quote(a) for a in out) + " 2>&1"


# --------------------------------------------------------------------------- the installer's tree


def test_tree_is_a_spark_with_the_profiles_cabling(exl3, tmp_path):
    head, worker = sim_cluster(exl3, tmp_path).nodes
    out = sh(head, "ibdev2netdev").stdout
    assert fr.parse_ibdev2netdev(out)
    ports = {p.hca: p for p in fr.parse_ibdev2netdev(out)}
    # recipe A: the head's rocep1s0f1 sits on the lab's enp1s0f1np1, cabled to the worker's enp1s0f0np0; the other
    # port has no cable (Down, as ibdev2netdev shows an empty cage); the twins have no lab netdev (Down)
    assert ports["rocep1s0f1"].up and ports["rocep1s0f1"].netdev == "enp1s0f1np1"
    assert not ports["rocep1s0f0"].up and ports["rocep1s0f0"].netdev == "enp1s0f0np0"
    assert {h for h, p in ports.items() if not p.up} == {"rocep1s0f0", "roceP2p1s0f0", "roceP2p1s0f1"}
    assert {p.hca: p.netdev for p in fr.parse_ibdev2netdev(sh(worker, "ibdev2netdev").stdout) if p.up} == {
        "rocep1s0f0": "enp1s0f0np0"}
    # the network step's own GID dump and resolver read the simulated sysfs: RoCE v2 IPv4 at the pinned 3
    dump = sh(head, fr.gid_dump_cmd(sim.SYSFS_ROOT)).stdout
    gids = fr.parse_gid_dump(dump, root=sim.SYSFS_ROOT)
    ng = fr.resolve_node_gid("head", gids, ["rocep1s0f1"], {"enp1s0f1np1": ["169.254.77.1"]},
                             {"rocep1s0f1": "enp1s0f1np1"}, match_ip="169.254.77.1")
    assert ng.index == 3 and ng.via == "match IP 169.254.77.1"
    assert gids["rocep1s0f1"].entry(3).ipv4 == "169.254.77.1" and gids["rocep1s0f1"].entry(4).zero
    manifest = json.loads((Path(head.shell.rewrite[REHEARSAL_SIM_DIR]) / "manifest.json").read_text())
    assert set(manifest["sources"]) >= {"rdma_gbps", "lat_us", "nccl_busbw_gbs", "gpu"}
    assert manifest["profile"].endswith("exl3-v41.env") and manifest["gid_index"] == 3


def test_pinned_index_and_typo_hca(exl3, tmp_path):
    from dataclasses import replace
    spec = replace(exl3.nodes[1], gid=5, ib_devs=["rocep1s0f0", "roceP2p1s0f9"])
    files = sim.node_files(sim.node_config(exl3, spec, lab_node_addr("worker"), hostname="spark-worker", root=str(tmp_path)))
    sim.write_tree(tmp_path, files)
    gids = fr.parse_gid_dump(subprocess.run(["bash", "-c", fr.gid_dump_cmd(f"{tmp_path}/sys")], capture_output=True,
                                            text=True, timeout=20).stdout, root=f"{tmp_path}/sys")
    assert gids["rocep1s0f0"].entry(5).roce_v2 and gids["rocep1s0f0"].entry(5).ipv4 == "169.254.77.2"
    assert gids["rocep1s0f0"].entry(3).zero
    assert "roceP2p1s0f9" not in gids                # not a Spark HCA name: the step will name it missing


def test_active_mtu_follows_the_netdev_mtu():
    assert [sim.active_mtu(m) for m in (9000, 4200, 1500)] == [4096, 4096, 1024]


# --------------------------------------------------------------------------- GPU


def test_nvidia_smi_and_the_preflight_gpu_row(exl3, tmp_path):
    from runbook.preflight import verify as preflight
    head = sim_cluster(exl3, tmp_path).nodes[0]
    out = sh(head, system.GPU_CMD).stdout
    assert system.parse_gpus(out) == ["NVIDIA GB10"] and "(UUID: GPU-" in out
    driver = sh(head, system.DRIVER_CMD).stdout.strip()
    assert driver == sim.GPU["driver"]
    row = preflight.gpu_check("head", {"gpus": system.parse_gpus(out), "gpu_text": out, "driver": driver}, exl3,
                              site=site_for(exl3))
    assert row.status is Status.SIMULATED and "simulator" in row.observed
    bad = sh(head, "nvidia-smi --query-gpu=vram --format=csv")
    assert bad.exit_code == 2 and 'Field "vram" is not a valid field to query.' in bad.stderr
    assert sh(head, "nvidia-smi -q -x").exit_code != 0


def test_ibv_devinfo(exl3, tmp_path):
    from runbook.facts import ibv
    head = sim_cluster(exl3, tmp_path).nodes[0]
    ports = ibv.parse_ibv_devinfo(sh(head, ibv.IBV_DEVINFO_CMD).stdout)
    assert ports
    up = [p for p in ports if p.hca == "rocep1s0f1"]
    assert up and up[0].active and up[0].active_mtu == 4096 and up[0].link_layer == "Ethernet"
    res = sh(head, "ibv_devinfo -d roceP2p1s0f9")
    assert res.exit_code != 0 and "IB device 'roceP2p1s0f9' wasn't found" in res.stderr


# --------------------------------------------------------------------------- perftest


def _pair(client, server, ccmd, scmd):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("srv", sh(server, scmd, 60)))
    t.start()
    cli = sh(client, ccmd, 60)
    t.join(70)
    return cli, out["srv"]


def test_ib_write_bw_as_the_step_renders_it(exl3, tmp_path):
    head, worker = sim_cluster(exl3, tmp_path).nodes
    scmd = fr.ib_write_bw_cmd("rocep1s0f0", 18715, gid_index=3, timeout_s=45)
    ccmd = fr.ib_write_bw_cmd("rocep1s0f1", 18715, server_ip="169.254.77.2", gid_index=3, timeout_s=30)
    cli, srv = _pair(head, worker, ccmd, scmd)
    assert cli.exit_code == 0 and srv.exit_code == 0, cli.stdout + srv.stdout
    bw = fr.parse_ib_write_bw(cli.stdout)
    assert bw.avg_gbps == sim.FIGURES["rdma_gbps"]["rocep1s0f1"]
    assert (bw.header.device, bw.header.gid_index, bw.header.mtu, bw.header.qps) == ("rocep1s0f1", 3, 4096, 4)
    assert "GID: 00:00:00:00:00:00:00:00:00:00:255:255:169:254:77:02" in cli.stdout   # the peer's GID, over TCP


@pytest.mark.slow
@pytest.mark.parametrize("case", ["hca_typo", "gid_zero_slot", "gid_0_link_local", "server_is_self"])
def test_ib_write_bw_bad_invocations_fail_like_perftest(exl3, tmp_path, case):
    head, worker = sim_cluster(exl3, tmp_path).nodes
    hca, gid, server = "rocep1s0f1", 3, "169.254.77.2"
    if case == "hca_typo":
        hca = "rocep1s0f9"
    elif case == "gid_zero_slot":
        gid = 4
    elif case == "gid_0_link_local":
        gid = 0
    else:
        server = "169.254.77.1"
    scmd = fr.ib_write_bw_cmd("rocep1s0f0", 18716, gid_index=3, timeout_s=8)
    ccmd = fr.ib_write_bw_cmd(hca, 18716, server_ip=server, gid_index=gid, timeout_s=8)
    cli, _ = _pair(head, worker, ccmd, scmd)
    bw = fr.parse_ib_write_bw(cli.stdout + cli.stderr)
    assert cli.exit_code != 0 and bw.avg_gbps is None
    expected = {"hca_typo": "Unable to find the Infiniband/RoCE device", "gid_zero_slot": "Failed to modify QP",
                "gid_0_link_local": "Failed to modify QP", "server_is_self": "Couldn't connect to 169.254.77.1"}
    assert expected[case] in bw.error


def test_ib_write_lat(exl3, tmp_path):
    head, worker = sim_cluster(exl3, tmp_path).nodes
    cli, _ = _pair(head, worker, fr.ib_write_lat_cmd("rocep1s0f1", 18717, server_ip="169.254.77.2", gid_index=3),
                   fr.ib_write_lat_cmd("rocep1s0f0", 18717, gid_index=3))
    lat = fr.parse_ib_write_lat(cli.stdout)
    assert (lat.t_typical_us, lat.p99_us, lat.p999_us) == (1.47, 1.57, 1.93)


# --------------------------------------------------------------------------- nccl-tests


def _ranks(profile, **worker):
    """The step's own ranks (GID index 3 resolved), the worker's NCCL variables then changed by ``worker``."""
    ranks = [collectives.nccl_rank(profile, n, gid_index=3, tests_dir=sim.NCCL_TESTS_DIR) for n in profile.nodes]
    ranks[1].env.update(worker)
    return ranks


def _mpirun(cluster, profile, **worker):
    cmd = collectives.nccl_tests_cmd(_ranks(profile, **worker), mpi_include=["169.254.77.0/24"],
                                     as_root=os.geteuid() == 0)
    return cmd, cluster.nodes[0].read(cmd, timeout=200)


@needs_openmpi
def test_all_reduce_perf_per_rank_under_openmpi(exl3, tmp_path):
    cluster = sim_cluster(exl3, tmp_path)
    cmd, res = _mpirun(cluster, exl3)
    assert res.exit_code == 0, res.stdout + res.stderr
    out = fn.parse_nccl_tests(res.stdout)
    assert out.ranks == 2 and len(out.rows) == 5 and not out.wrong
    assert out.avg_busbw_gbs == sim.FIGURES["nccl_busbw_gbs"]["1"]       # one twin per node in recipe A
    logs = collectives.rank_logs(res.stdout, cluster.nodes)
    assert fn.parse_nccl_log(logs["head"]).hca_names == ["rocep1s0f1"]
    assert fn.parse_nccl_log(logs["worker"]).hca_names == ["rocep1s0f0"]
    assert all(fn.parse_nccl_log(log).transport == "IB" for log in logs.values())


@needs_openmpi
@pytest.mark.parametrize("case", ["worker_gets_head_interface", "hca_typo", "gid_zero_slot"])
def test_all_reduce_perf_bad_invocations_under_openmpi(exl3, tmp_path, case):
    cluster = sim_cluster(exl3, tmp_path)
    change = {"worker_gets_head_interface": {"NCCL_SOCKET_IFNAME": "enp1s0f1np1"},   # recipe A's head IF (defect 5)
              "hca_typo": {"NCCL_IB_HCA": "roce1s0f0"}, "gid_zero_slot": {"NCCL_IB_GID_INDEX": "4"}}[case]
    _, res = _mpirun(cluster, exl3, **change)
    text = fn.split_mpirun_output(res.stdout + res.stderr).text      # whole lines: a tag may sit inside a cut one
    logs = collectives.rank_logs(res.stdout, cluster.nodes)
    if case == "hca_typo":        # not fatal in NCCL: the worker falls back to sockets, and the step FAILs on it
        assert res.exit_code == 0, text
        worker = fn.parse_nccl_log(logs["worker"])
        assert worker.transport == "Socket" and "NET/IB : No device found." in logs["worker"]
        assert fn.parse_nccl_tests(res.stdout).avg_busbw_gbs == sim.FIGURES["nccl_busbw_gbs"]["socket"]
        return
    assert res.exit_code != 0
    parsed = fn.parse_nccl_tests(res.stdout)
    assert parsed.avg_busbw_gbs is None and parsed.error
    expected = {"worker_gets_head_interface": "spark-worker: Test NCCL failure common.cu:1279 'invalid usage",
                "gid_zero_slot": "Call to ibv_modify_qp failed with 61 No data available, on dev rocep1s0f0:1"}[case]
    assert expected in text
    assert "mpirun detected that one or more processes exited with non-zero status" in text   # OpenMPI's own
    if case == "worker_gets_head_interface":
        assert "NCCL WARN Bootstrap : no socket interface found" in logs["worker"]


@needs_openmpi
def test_real_mpirun_tagged_output_splits_back_into_whole_lines(tmp_path):
    """OpenMPI's own --tag-output (the flag step 01's line carries): each rank writes a line in two pieces and one
    line on stderr; however mpirun read and interleaved the pieces (the pause only makes a cut line likely, nothing
    depends on it), every rank's lines come back whole."""
    assert " mpirun --tag-output " in collectives.nccl_tests_cmd(_ranks(load("env/exl3-v41.env")), mpi_include=["x"])
    script = tmp_path / "rank.sh"
    script.write_text('printf "rank %s begins " "$OMPI_COMM_WORLD_RANK"; sleep 0.2; printf "and ends\\n"; '
                      'echo "rank $OMPI_COMM_WORLD_RANK on stderr" >&2\n')
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    run = subprocess.run([MPIRUN, *root, "--oversubscribe", "--tag-output", "-np", "3", "bash", str(script)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    out = fn.split_mpirun_output(run.stdout + run.stderr)
    assert out.tagged and out.own == []
    assert {k: sorted(v) for k, v in out.ranks.items()} == {
        k: [f"rank {k} begins and ends", f"rank {k} on stderr"] for k in range(3)}


def _rank_alone(node, **env):
    """One rank's all_reduce_perf as the node runs it, without mpirun (a world of one: no MPI needed)."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return sh(node, f"env {exports} {REHEARSAL_SIM_DIR}/nccl-tests/build/all_reduce_perf -b 8M -e 16M -f 2 -g 1", 60)


def test_all_reduce_perf_checks_the_environment_it_receives(exl3, tmp_path):
    worker = sim_cluster(exl3, tmp_path).nodes[1]
    ok = _rank_alone(worker, NCCL_SOCKET_IFNAME="enp1s0f0np0", NCCL_IB_HCA="rocep1s0f0", NCCL_IB_GID_INDEX="3")
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    assert fn.parse_nccl_tests(ok.stdout).rows and fn.parse_nccl_log(ok.stdout).hca_names == ["rocep1s0f0"]
    bad = _rank_alone(worker, NCCL_SOCKET_IFNAME="enp1s0f1np1", NCCL_IB_HCA="rocep1s0f0")
    assert bad.exit_code == 1
    assert "NCCL_SOCKET_IFNAME set by environment to enp1s0f1np1" in bad.stdout
    assert "NCCL WARN Bootstrap : no socket interface found" in bad.stdout
    assert not fn.parse_nccl_tests(bad.stdout).rows


def test_all_reduce_perf_without_libmpi_says_so(exl3, tmp_path):
    """A rank of a world of two that cannot load OpenMPI's libmpi fails like a binary whose library is missing."""
    head = sim_cluster(exl3, tmp_path).nodes[0]
    root = Path(head.shell.rewrite[REHEARSAL_SIM_DIR])
    env = dict(os.environ, OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="1", NCCL_SOCKET_IFNAME="enp1s0f0np0",
               LD_LIBRARY_PATH="", RUNBOOK_SIM_NODE=str(root / "node.json"))
    code = ("import runpy, sys, ctypes; ctypes.CDLL = lambda *a, **k: (_ for _ in ()).throw(OSError('absent')); "
            f"sys.argv = ['simtools.py', 'all_reduce_perf', '-b', '8M']; runpy.run_path({str(sim.SIMTOOLS)!r}, run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    assert res.returncode == 127 and "libmpi.so.40" in res.stderr


# --------------------------------------------------------------------------- 01_network, rehearsed


def _rehearse(path, tmp_path):
    profile = load(path)
    cluster = sim_cluster(profile, tmp_path)
    checks, raw = network.verify_network(cluster, profile, tmp_path / "raw", site=site_for(profile))
    return profile, cluster, checks, raw


def _expected_failures(profile, checks):
    """Rows the published figures cannot meet under this profile's thresholds (a finding, not a simulator
    fault): a single twin per node gives 92.57 Gb/s of RDMA and ~12 GB/s of NCCL busbw."""
    one_twin = sim.FIGURES["rdma_gbps"]["rocep1s0f0"]
    out = set()
    if one_twin < profile.min_rdma_gbps_total:
        out |= {(c.name, c.node) for c in checks if c.name.startswith("net.rdma.bw.total.")}
    if sim.FIGURES["nccl_busbw_gbs"]["1"] < profile.min_nccl_busbw_gbs:
        out.add(("net.nccl.busbw", "cluster"))
    return out


@pytest.mark.slow
@needs_openmpi
@pytest.mark.skipif(shutil.which("ib_write_bw") is None, reason="perftest is not installed (the tools row looks for "
                                                                "its real binaries; make lab-deps installs it)")
@pytest.mark.parametrize("path", ["env/exl3-v41.env", "env/tp3-dspark.env"])
def test_network_step_rehearsed(path, tmp_path):
    profile, cluster, checks, raw = _rehearse(path, tmp_path)
    failed = {(c.name, c.node) for c in checks.failures()}
    assert failed == _expected_failures(profile, checks), checks.to_text()
    sim_rows = [c for c in checks if c.name.startswith(SIM_ROWS)]
    assert sim_rows
    for c in sim_rows:
        assert c.status in (Status.SIMULATED, Status.FAIL), (c.name, c.status)
        assert "[simulated:" in c.observed or c.status is Status.FAIL
    assert not [c for c in checks if c.name.startswith(SIM_ROWS) and c.status is Status.PASS]
    # real tools stay real (here: answered from the lab fixtures) and are never marked simulated
    real = [c for c in checks if c.name.startswith(("net.ping.", "net.tcp.", "net.link."))]
    assert real and all(c.status is Status.PASS for c in real), [(c.name, c.status) for c in real]
    assert by(checks, f"net.pcie.{profile.nodes[0].fabric_if}", "head").status is Status.NA
    mp = next(cmd for cmd in cluster.nodes[0].commands if cmd.startswith("timeout 180 mpirun"))
    apps = mpirun_apps(mp)
    assert [a["env"]["NCCL_IB_HCA"] for a in apps] == [",".join(n.ib_devs) for n in profile.nodes]
    assert all(a["binary"] == f"{sim.NCCL_TESTS_DIR}/all_reduce_perf" for a in apps)
    assert "--allow-run-as-root" in mp                # the lab's SSH user is root
    hcas = [c for c in checks if c.name == "net.nccl.hcas"]
    assert [c.node for c in hcas] == [n.name for n in profile.nodes]
    assert all(c.status is Status.SIMULATED for c in hcas)
    assert "Avg bus bandwidth" in fn.split_mpirun_output(raw["nccl_all_reduce_perf.txt"]).text


def test_rehearsal_path_hook_is_recorded(exl3, tmp_path):
    from runbook.profile import load_profile
    cluster = Cluster.from_profile(exl3, run_dir=tmp_path, dry_run=True)
    assert [n.name for n in cluster.nodes] == ["head", "worker"]
    assert all(n.command_prefix == f'export PATH={REHEARSAL_SIM_DIR}/bin:"$PATH"; ' for n in cluster.nodes)
    cluster.head.run("ibdev2netdev")
    logged = json.loads((tmp_path / "commands.jsonl").read_text().splitlines()[-1])
    assert logged["command"].startswith(f"export PATH={REHEARSAL_SIM_DIR}/bin:")
    real = Cluster.from_profile(load_profile("env/exl3-v41.env")).nodes
    assert real and all(n.command_prefix == "" for n in real)


# --------------------------------------------------------------------------- install()


def install_node(spec, root: Path, lab: bool = True) -> FakeNode:
    """A lab node for install(): node-private paths (/mnt/nvme/...) live under ``root``; reads other than the
    facts install() asks are refused, commands that change the node run for real."""
    (root / "nvme").mkdir(parents=True)
    if lab:
        (root / "nvme" / "WHOAMI").write_text(f"this is spark-{spec.name}'s local NVMe (lab)\n")
    rules = [(exact("ip -j addr show"), res(0, lab_node_addr(spec.name))),
             (exact("hostname"), f"spark-{spec.name}\n"),
             (r"^cat /mnt/nvme/", SHELL, "read"),
             (r"", SHELL, "run")]
    return FakeNode(spec=spec, rules=rules, shell=LocalShell(cwd=root, rewrite={"/mnt/nvme": str(root / "nvme")}))


def test_install_puts_the_tree_on_each_lab_node_once(exl3, tmp_path):
    nodes = [install_node(n, tmp_path / n.name) for n in exl3.nodes]
    first = sim.install(FakeCluster(nodes), exl3)
    assert [(c.node, c.status) for c in first] == [("head", Status.PASS), ("worker", Status.PASS)]
    tree = tmp_path / "worker" / "nvme" / ".rehearsal" / "sim"
    assert (tree / "bin" / "ib_write_bw").is_symlink() and (tree / "nccl-tests/build/all_reduce_perf").exists()
    node = json.loads((tree / "node.json").read_text())
    assert node["node"] == "worker" and node["sysfs"] == sim.SYSFS_ROOT and node["hostname"] == "spark-worker"
    # the tree runs: the worker's own config through its installed nvidia-smi
    env = dict(os.environ, RUNBOOK_SIM_NODE=str(tree / "node.json"))
    out = subprocess.run([str(tree / "bin" / "nvidia-smi"), "-L"], capture_output=True, text=True, env=env, timeout=20)
    assert out.stdout.startswith("GPU 0: NVIDIA GB10")
    again = sim.install(FakeCluster(nodes), exl3)
    assert [c.status for c in again] == [Status.NOOP, Status.NOOP]
    assert not (tmp_path / "head" / "nvme" / ".rehearsal" / "sim-install.tar.gz").exists()
    dry = install_node(exl3.nodes[0], tmp_path / "dry")
    dry.dry_run = True
    row = sim.install(FakeCluster([dry]), exl3)[0]
    assert row.status is Status.NOOP and "dry run: would install" in row.observed and dry.runs() == []


def test_install_refuses_a_node_that_is_not_a_lab_node_and_a_real_profile(exl3, tmp_path):
    from runbook.errors import RunbookError
    from runbook.profile import load_profile
    nodes = [install_node(n, tmp_path / n.name, lab=(n.name == "head")) for n in exl3.nodes]
    rows = sim.install(FakeCluster(nodes), exl3)
    worker = next(c for c in rows if c.node == "worker")
    assert worker.status is Status.FAIL and "never go on a real node" in worker.fix
    assert nodes[1].runs() == []
    with pytest.raises(RunbookError):
        sim.install(FakeCluster(nodes), load_profile("env/exl3-v41.env"))


def test_simtools_is_standard_library_only():
    src = Path(sim.SIMTOOLS).read_text()
    assert not re.search(r"^\s*(from|import)\s+runbook", src, re.M)
    res = subprocess.run([sys.executable, str(sim.SIMTOOLS), "no-such-tool"], capture_output=True, text=True,
                         timeout=20)
    assert res.returncode == 127 and "unknown tool" in res.stderr


def test_the_labs_apt_lists_agree():
    """The lab's packages are named in three places (make lab-deps, .ci/run, `lab up`): each holds all of
    runbook.lab.netlab.packages, OpenMPI and perftest included (a rehearsal's step 01 runs them for real)."""
    from runbook.evidence import REPO_ROOT
    from runbook.lab.netlab import packages
    wanted = set(packages.APT_PACKAGES)
    assert {"openmpi-bin", "perftest"} <= wanted
    assert {packages.REQUIRED_BINARIES[b] for b in ("mpirun", "ib_write_bw", "ib_write_lat")} <= wanted
    make = (REPO_ROOT / "Makefile").read_text()
    make_pkgs = set(re.search(r"^APT_PACKAGES := (.*?)(?<!\\)\n", make, re.S | re.M).group(1).replace("\\\n", " ").split())
    assert make_pkgs == set(packages.APT_PACKAGES)
    binaries = re.search(r"for b in ([^;]*); do", make).group(1).split()
    assert {"mpirun", "ib_write_bw"} <= set(binaries)
    ci = re.search(r"apt-get install -y -qq --no-install-recommends (.*?)>/dev/null",
                   (REPO_ROOT / ".ci" / "run").read_text(), re.S).group(1).replace("\\\n", " ").split()
    assert wanted <= set(ci)
