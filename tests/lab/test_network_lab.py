"""01_network on the real lab, with the faults the step must name: link down on one node, MTU 1500 on one end, a
wrong interface name in the profile, a rank given another node's interface (real mpirun), and on the 3-node lab
(seed B's TP3 triangle of point-to-point cables) a TP=3 worker given only its head-facing port."""
from __future__ import annotations

import json

import pytest

from runbook.lab.site import site_for
from runbook.network import verify as network
from runbook.checks import Status
from runbook.facts.nccl import split_mpirun_output
from runbook.profile import load_profile
from runbook.remote import Cluster

pytestmark = pytest.mark.lab
IF = "enp1s0f0np0"          # the worker's port facing the head (lab.env: head enp1s0f1np1 <-> worker enp1s0f0np0)


@pytest.fixture()
def cluster(lab):
    profile = load_profile("env/lab.env")
    with Cluster.from_profile(profile) as c:
        yield profile, c


def _failed(checks):
    return [c for c in checks if c.status is Status.FAIL]


def test_healthy_fabric_passes_with_traffic(cluster):
    profile, c = cluster
    checks, raw = network.verify_network(c, profile, site=site_for(profile), iperf_seconds=2)
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
        checks, _ = network.verify_network(c, profile, site=site_for(profile), traffic=False)
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
        checks, _ = network.verify_network(c, profile, site=site_for(profile), traffic=False)
        mismatch = [f for f in _failed(checks) if f.name.startswith("net.mtu.rail0")]
        assert mismatch and "9000" in mismatch[0].observed and "1500" in mismatch[0].observed
    finally:
        c.worker.run(f"ip link set {IF} mtu 9000", timeout=20)


def test_wrong_interface_name_is_named_before_any_traffic(cluster):
    profile, _ = cluster
    bad = profile.with_overrides({"WORKER_CX7_IF": "enP2p1s0f1np1"})
    with Cluster.from_profile(bad) as c:
        checks, raw = network.verify_network(c, bad, site=site_for(bad))
        failed = _failed(checks)
        assert failed and failed[0].node == "worker" and "enP2p1s0f1np1" in failed[0].observed
        assert not any(name.startswith(("iperf3_", "ping_")) for name in raw)   # stopped before traffic


# --------------------------------------------------------------------------- a rehearsal's nccl-tests under real mpirun


@pytest.fixture()
def rehearsed(lab):
    """Recipe A's profile as a rehearsal runs it, with the simulated Sparks installed on the lab nodes."""
    from runbook.lab import sim
    from runbook.lab.rehearsal import load_rehearsal
    profile, _, _ = load_rehearsal("env/exl3-v41.env")
    with Cluster.from_profile(profile) as c:
        rows = sim.install(c, profile)
        assert rows and all(r.status in (Status.PASS, Status.NOOP) for r in rows), [(r.node, r.observed) for r in rows]
        yield profile, c


def _tools_and_nccl(profile, c, tweak=None):
    """01_network's own path up to nccl-tests (facts, validation, GID plan, tools row, nccl rows), without the
    ping/iperf3/perftest traffic; ``tweak(ranks)`` changes the ranks the step renders."""
    from runbook.network import collectives, rails as rl, rdma, tools
    from runbook.network.context import Verification
    ctx = Verification(c, profile, None, site_for(profile))
    rl.collect_base(ctx)
    assert rl.early_validation(ctx), ctx.checks.to_text()
    built = rl.build_rails(ctx)
    rl.collect_rail_facts(ctx, built)
    gid = rdma.gid_checks(ctx)
    tools.tools_checks(ctx, "", False)
    if tweak is None:
        collectives.nccl_checks(ctx, gid)
    else:
        original = collectives.nccl_ranks
        try:
            collectives.nccl_ranks = lambda ctx_, gid_: tweak(*original(ctx_, gid_))
            collectives.nccl_checks(ctx, gid)
        finally:
            collectives.nccl_ranks = original
    return ctx.checks, ctx.raw


def test_rehearsal_runs_the_real_mpirun_and_the_real_package_tools(rehearsed):
    """In a rehearsal `mpirun` is OpenMPI's (no simulator on PATH), it starts one all_reduce_perf rank on each
    node over ssh, and the tools row names perftest's and OpenMPI's own binaries."""
    from runbook.facts import nccl as fn
    from runbook.lab import sim
    profile, c = rehearsed
    where = c.head.read("command -v mpirun; mpirun --version 2>&1 | head -1", timeout=30).stdout.split("\n")
    assert where[0] == "/usr/bin/mpirun" and "Open MPI" in where[1], where
    assert not c.head.read(f"test -e {sim.SIM_DIR}/bin/mpirun", timeout=20).ok      # no simulator of it
    checks, raw = _tools_and_nccl(profile, c)
    rows = [ch for ch in checks if ch.name == "net.tools"]
    assert [r.node for r in rows] == ["head", "worker"]
    for r in rows:
        assert r.status is Status.SIMULATED, (r.node, r.observed)
        assert f"ib_write_bw /usr/bin/ib_write_bw (the tests run the simulator {sim.SIM_DIR}/bin/ib_write_bw)" in r.observed
        assert "mpirun /usr/bin/mpirun" in r.observed
    text = split_mpirun_output(raw["nccl_all_reduce_perf.txt"]).text      # mpirun --tag-output: whole lines
    out = fn.parse_nccl_tests(text)
    assert out.ranks == 2 and out.rows and out.avg_busbw_gbs, text[-3000:]
    assert "on spark-head" in text and "on spark-worker" in text      # each rank read its own node's private tree
    assert [ch.status for ch in checks if ch.name == "net.nccl.transport"] == [Status.SIMULATED]


def test_real_mpirun_catches_a_rank_given_an_interface_it_does_not_have(rehearsed):
    """The worker's rank gets the head's NCCL_SOCKET_IFNAME (recipe A: enp1s0f1np1, an interface the worker does
    not have): OpenMPI starts it on the worker, NCCL's bootstrap there finds no such interface, OpenMPI aborts
    the job, and the step's busbw row FAILs naming the worker and the interface."""
    profile, c = rehearsed

    def head_if_on_worker(ranks, include):
        ranks[1].env["NCCL_SOCKET_IFNAME"] = "enp1s0f1np1"
        return ranks, include
    checks, raw = _tools_and_nccl(profile, c, head_if_on_worker)
    text = split_mpirun_output(raw["nccl_all_reduce_perf.txt"]).text      # whole lines, whichever rank
    assert "mpirun detected that one or more processes exited with non-zero status" in text, text[-3000:]  # OpenMPI's
    row = next(ch for ch in checks if ch.name == "net.nccl.busbw")
    assert row.status is Status.FAIL
    assert "worker: NCCL_SOCKET_IFNAME=enp1s0f1np1 names no interface of worker" in row.observed, row.observed
    assert "[simulated:" in row.observed


# --------------------------------------------------------------------------- the TP=3 triangle


@pytest.fixture(scope="module")
def triangle(lab):
    """The 3-node lab: worker2 and its cables added to the running lab (seed B's TP3 triangle), removed at the end."""
    from runbook.lab import netlab
    three = netlab.up(lab.lab_dir, nodes=3)
    try:
        yield three
    finally:
        netlab.up(lab.lab_dir, nodes=2)


def _tp3(overrides=None):
    """env/tp3-dspark.env as a rehearsal runs it (every node both CX ports, BOOTSTRAP_IF=enP7s7), simulators installed."""
    from runbook.lab import sim
    from runbook.lab.rehearsal import load_rehearsal
    profile, _, _ = load_rehearsal("env/tp3-dspark.env", overrides)
    with Cluster.from_profile(profile) as c:
        rows = sim.install(c, profile)
    assert rows and all(r.status in (Status.PASS, Status.NOOP) for r in rows), [(r.node, r.observed) for r in rows]
    return profile


def _path_rows(checks):
    return {c.name: c for c in checks if c.name.startswith("net.path.")}


def test_tp3_on_the_triangle_reaches_every_rank_over_its_own_cable(triangle):
    """The TP=3 rehearsal profile keeps the recipe's ports (HEAD_CX7_IF=enp1s0f0np0, WORKER2_CX7_IF=enp1s0f1np1, both
    HCAs everywhere): three rails, one per cable, and every pair pings (DF, MTU 9000) over the cable between them."""
    profile = _tp3()
    assert [(n.fabric_if, n.fabric_ip) for n in profile.nodes] == [
        ("enp1s0f0np0", "169.254.22.1"), ("enp1s0f0np0", "169.254.22.2"), ("enp1s0f1np1", "169.254.23.3")]
    assert profile.bootstrap_if == "enP7s7"
    with Cluster.from_profile(profile) as c:
        checks, _ = network.verify_network(c, profile, site=site_for(profile), iperf_seconds=1)
    assert not _failed(checks), [(f.name, f.node, f.observed) for f in _failed(checks)]
    rails = next(ch for ch in checks if ch.name == "net.rails")
    for cable in ("169.254.22.", "169.254.23.", "169.254.24."):
        assert cable in rails.observed, rails.observed
    assert not _path_rows(checks)
    pings = {ch.name.split(".", 3)[3] for ch in checks if ch.name.startswith("net.ping.") and ch.status is Status.PASS}
    names = [n.name for n in profile.nodes]
    assert pings == {f"{a}->{b}" for a in names for b in names if a != b}, pings


def test_tp3_worker_limited_to_its_head_facing_port_fails_naming_the_pair(triangle):
    """What hangs on hardware (NCCL's worker<->worker2 QP times out in RTR) fails here: the loader refuses one HCA per
    worker and two HCAs of one port (rocep1s0f0 and its twin; recipe B's rule); a rank given one port anyway (its
    spec set past the loader) makes 01_network name the pair, the worker's free port cabled to worker2 and the HCA
    to add."""
    import dataclasses

    from runbook.errors import ProfileError
    from runbook.lab.rehearsal import load_rehearsal
    for one_port in ("rocep1s0f0", "rocep1s0f0,roceP2p1s0f0"):          # one HCA; both twins of the facing port
        with pytest.raises(ProfileError) as refused:
            load_rehearsal("env/tp3-dspark.env", {"WORKER_CX7_IB": one_port})
        assert any(i.key == "WORKER_CX7_IB" and "both CX ports on worker" in i.fix
                   for i in refused.value.issues), refused.value
    profile = _tp3()
    with Cluster.from_profile(profile) as c:
        c.worker.spec = dataclasses.replace(profile.nodes[1], ib_devs=["rocep1s0f0"])   # only its facing HCA
        checks, _ = network.verify_network(c, profile, site=site_for(profile), traffic=False)
    for rows in (checks,):
        path = _path_rows(rows)
        assert list(path) == ["net.path.worker-worker2"], [(ch.name, ch.status) for ch in rows if ch.status is Status.FAIL]
        row = path["net.path.worker-worker2"]
        assert row.status is Status.FAIL and row.node == "cluster"
        assert ("worker's enp1s0f1np1 (rocep1s0f1) is cabled to worker2's enp1s0f0np0 on 169.254.24.0/24, "
                "but worker is not given it") in row.observed, row.observed
        assert "add rocep1s0f1 to WORKER_CX7_IB" in row.fix and "QP RTR" in row.fix, row.fix


def test_tp3_health_and_diagnose_ping_every_pair_over_its_own_cable(triangle):
    """The server-health fabric rows and the diagnose bundle's pings follow 01's pair model (facts.net.pair_path):
    the worker reaches worker2 over their own cable (enp1s0f1np1 -> 169.254.24.3), not at worker2's head-facing
    WORKER2_IP over its head-facing port (which failed on a healthy triangle)."""
    from runbook.api import health
    from runbook.diagnose import collect as dcollect
    from runbook.diagnose.bundle import PING_PREFIX, collect_commands
    from runbook.facts import net as fnet
    profile = _tp3()
    with Cluster.from_profile(profile) as c:
        rows = health.fabric_rows(c, profile)
        pings = {r.name: r for r in rows if r.name.startswith("fabric ping ")}
        assert len(pings) == 6 and all(r.status is Status.PASS for r in pings.values()), \
            [(r.name, r.status, r.observed) for r in rows]
        assert "from 169.254.24.3 over enp1s0f1np1" in pings["fabric ping worker→worker2"].observed
        assert "from 169.254.24.2 over enp1s0f0np0" in pings["fabric ping worker2→worker"].observed
        cmds = collect_commands(profile, fabric=dcollect.fabric_ends(c))
        worker = next(n for n in c if n.name == "worker")
        cmd = next(x.cmd for x in cmds["worker"] if x.name == f"{PING_PREFIX}worker2.txt")
        assert cmd.endswith("-I enp1s0f1np1 169.254.24.3"), cmd
        res = worker.read(cmd, timeout=20)
        assert fnet.parse_ping(res.stdout + res.stderr).ok, res.stdout + res.stderr


def test_tp3_real_mpirun_fails_worker2_given_its_head_facing_port_only(triangle):
    """The rank given only its head-facing HCA (rocep1s0f1 on worker2), set past the profile rule: the real mpirun
    starts the three simulated ranks and the worker<->worker2 pair times out in QP RTR (ibv_modify_qp 110), as
    NCCL does on hardware; the busbw row FAILs naming the rank and its <NODE>_CX7_IB (before, only net.path did)."""
    profile = _tp3()

    def one_port(ranks, include):
        ranks[2].env["NCCL_IB_HCA"] = "rocep1s0f1"
        return ranks, include
    with Cluster.from_profile(profile) as c:
        checks, raw = _tools_and_nccl(profile, c, one_port)
    text = split_mpirun_output(raw["nccl_all_reduce_perf.txt"]).text      # whole lines, whichever rank
    assert "ibv_modify_qp failed with 110 Connection timed out" in text and "next state RTR" in text, text[-3000:]
    row = next(ch for ch in checks if ch.name == "net.nccl.busbw")
    assert row.status is Status.FAIL
    assert "no RoCE path" in row.observed and "_CX7_IB" in row.observed, row.observed
