"""Full rehearsals of the shipped recipe profiles on the embedded lab: all nine steps of env/exl3-v41.env
(2 nodes), env/dspark-v4.env (2 nodes) and env/tp3-dspark.env (3 nodes), through runbook.runner exactly as
`make rehearse PROFILE=…` runs them (the substitutions and stand-in checkpoints of runbook.lab.rehearsal;
results in tmp), then `stop --rehearse`.

What each rehearsal must show (issue "Recipe rehearsal", Done when):
- every step passed; SIMULATED rows only where the tool cannot exist here (GPU, RDMA, nccl-tests,
  perftest) and never a plain PASS from a simulator; the report lists the simulated rows;
- the downloaded tree at the profile's expanded path on every node, in that node's own home or NVMe
  (the lab nodes' homes are private, as two Sparks' are);
- for exl3-v41, the Engram source fetched, packed on every node and mounted into every rank;
- the recipe checkout on every node at the pinned commit, the start chain's markers in every rank's boot
  log (the lab recipe's; seed B's TP=3 pad line is checked the same way on Sparks), one rendered command per rank;
- a second start while the ranks run: exit 3 (recorded by 04, and again through the CLI here).

Budget on 2 cores: about 3-4 minutes per profile (the launch and the benchmark dominate; the benchmark runs
one repeat here), plus the 3-node lab and the 2-node restore for tp3.
"""
from __future__ import annotations

import json
from html import escape
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runbook import runner
from runbook.checks import CheckList, Status
from runbook.facts.nccl import split_mpirun_output
from runbook.lab import sim
from runbook.lab.netlab.spec import OPERATOR
from runbook.lab.rehearsal import count, load_rehearsal
from runbook.site import GOALS, count_text
from runbook.profile import REPO_ROOT
from runbook.remote import REHEARSAL_SIM_DIR, Cluster, expand_home, quote

VENV = REPO_ROOT / ".lab" / "vllm-venv"
pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the netns lab needs root"),
              pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                                 reason=f"{VENV} missing: make lab-vllm installs the lab's CPU vLLM")]
PROFILES = ["env/exl3-v41.env", "env/dspark-v4.env", "env/tp3-dspark.env"]
# exl3-v41 (kernel NFS, Engram, docker) rehearses as the lab's non-root operator with exactly the runbook's sudoers
# drop-in (`run --rehearse --ssh-user spark`); the others as root
SSH_USER = {"env/exl3-v41.env": OPERATOR}
# rows whose tool cannot exist on the lab (GPU, RDMA, nccl-tests, perftest): the only ones allowed to say SIMULATED
# the rows whose tool cannot exist on the lab: the GPU (nvidia-smi: presence, driver parity, the driver's CUDA against
# the image's) and RDMA / NCCL
SIMULATED_ALLOWED = ("GPU present", "driver parity", "driver supports the image's CUDA", "net.gid", "net.tools",
                     "net.rdma.", "net.nccl.")
REAL_NETWORK = ("net.ping.", "net.tcp.", "net.link.", "net.mtu.", "net.allreduce")
TIMINGS: dict[str, dict] = {}
# the suite's budget: what a rehearsal proves here is the recipe's flow through every step, not its figures, so
# the bench runs one repeat of two concurrency levels with short answers and no soak (as tests/lab/test_four_nodes.py;
# `make rehearse` keeps the lab's sizes, and test_full_runbook.py runs the lab's bench cases with a soak)
BENCH_IN_TESTS = {"BENCH_REPEATS": "1", "SOAK_SECONDS": "0", "BENCH_CONCURRENCY": "1,2", "BENCH_DECODE_TOKENS": "32"}


def _lab_dir() -> Path:
    from runbook.lab import netlab
    return Path(os.environ.get("RUNBOOK_LAB_DIR") or netlab.default_lab_dir())


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runbook", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


@pytest.fixture(scope="module", params=PROFILES, ids=lambda p: Path(p).stem)
def rehearsal(request, lab, tmp_path_factory):
    """One full rehearsal per profile; the server it leaves is stopped with `stop --rehearse` at the end."""
    from runbook.lab import control, netlab
    path = request.param
    profile, overrides, subs = load_rehearsal(REPO_ROOT / path, publish=True, ssh_user=SSH_USER.get(path, ""))
    overrides = {**overrides, **BENCH_IN_TESTS}
    nodes = len(profile.nodes)
    if nodes != 2:
        netlab.up(_lab_dir(), nodes=nodes)        # worker2 and the triangle's cables join the running lab
    try:
        results = tmp_path_factory.mktemp(Path(path).stem)
        t0 = time.monotonic()
        run_dir, outcomes = runner.run(REPO_ROOT / path, overrides=overrides, results_root=results,
                                       lab_up=control.ensure_lab, rehearsal=[s.to_dict() for s in subs])
        TIMINGS[path] = {"total_s": round(time.monotonic() - t0, 1),
                         **{o.name: round(o.seconds, 1) for o in outcomes}}
        print(f"\n[rehearsal {path}] " + json.dumps(TIMINGS[path]))
        yield path, profile, run_dir, outcomes
    finally:
        try:
            stopped = _cli("stop", "--rehearse", "--profile", path, *_as_user(path))
            assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-2000:]
        finally:
            if nodes != 2:
                netlab.up(_lab_dir(), nodes=2)          # worker2 leaves: the 2-node lab the rest of the suite expects


def _as_user(path: str) -> list[str]:
    return ["--ssh-user", SSH_USER[path]] if path in SSH_USER else []


def _node_dir(lab: Path, node: str, home: str) -> Path:
    """This machine's folder of a node's home: root's private home, or the operator's under the node's /home."""
    return lab / "nodes" / node / ("home" if home == "/root" else "users/" + home.removeprefix("/home/"))


def _checks(run_dir, step: str) -> CheckList:
    return CheckList.from_records(json.loads((run_dir.path / f"steps/{step}.json").read_text())["checks"])


def _sidecar(run_dir, step: str) -> dict:
    return json.loads((run_dir.path / f"steps/{step}.json").read_text())


def test_every_step_passed_and_only_hardware_rows_are_simulated(rehearsal):
    path, profile, run_dir, outcomes = rehearsal
    assert [(o.name, o.status) for o in outcomes] == [(s, "passed") for s in runner.discover_steps()], \
        "\n".join(f"{o.name}: {o.status} {o.error[:600]}" for o in outcomes)
    simulated = []
    for step in runner.discover_steps():
        checks = _checks(run_dir, step)
        assert not checks.failures(), (step, checks.to_text())
        for c in checks:
            if "[simulated:" in c.observed:
                assert c.status is not Status.PASS, (step, c.name, c.node)
            if c.status is Status.SIMULATED:
                assert c.name.startswith(SIMULATED_ALLOWED), (step, c.name, c.observed)
                simulated.append((step, c.name, c.node))
    assert {s for s, _, _ in simulated} == {"00_preflight", "01_network"}, simulated
    names = [n.name for n in profile.nodes]
    assert sorted(c.node for c in _checks(run_dir, "00_preflight") if c.name == "GPU present"
                  and c.status is Status.SIMULATED) == sorted(names)
    for prefix in ("net.gid", "net.tools", "net.rdma.bw.rail0.", "net.rdma.lat.", "net.nccl.transport", "net.nccl.hcas"):
        assert any(name.startswith(prefix) for _, name, _ in simulated), prefix
    # what really ran on the lab stays a real PASS
    real = [c for c in _checks(run_dir, "01_network") if c.name.startswith(REAL_NETWORK)]
    assert real and all(c.status is Status.PASS for c in real), [(c.name, c.status) for c in real]
    # the substitutions and the simulated rows are in the evidence and on the report
    record = json.loads((run_dir.path / "rehearsal.json").read_text())
    substituted = record["substituted"]
    keys = {s["key"] for s in substituted}
    assert keys >= {"HEAD_SSH", "IMAGE", "HF_REVISION"}
    # the run's mode is recorded as such, not substituted; the lab's node count and CPU binding are derived
    assert record["mode"]["keys"] == {"LAB": "1", "REHEARSAL": "1"}
    assert not keys & {"LAB", "REHEARSAL", "LAB_NODES", "LAB_CPU_BIND"}, keys
    counts = count(substituted)
    assert (record["classes"], record["lab_by_goal"]) == (counts["classes"], counts["lab_by_goal"])
    assert list(counts["classes"]) == ["hardware", "lab"] and all(counts["classes"].values()), counts
    # #23 item 6: every lab-class substitution in one of the goal groups (item 5: the Sparks' port names are kept)
    outside = {s["key"] for s in substituted if s["kind"] == "lab" and s["goal"] not in GOALS}
    assert not outside, outside
    html = (run_dir.path / "report.html").read_text()
    assert "SIMULATED" in html and "rehears" in html.lower()
    assert f"{len(substituted)} key(s) substituted ({count_text(counts)})" in html
    assert "Mode: LAB=1, REHEARSAL=1" in html
    for _, name, _ in simulated[:5]:
        assert escape(name) in html or name.replace(">", "&gt;") in html or name in html, name


def test_simulators_got_each_ranks_own_invocation(rehearsal):
    """nccl-tests: one rank per node, each started on its own node with its own NCCL_IB_HCA; every node's
    private /mnt/nvme holds its own simulated Spark."""
    _, profile, run_dir, _ = rehearsal
    text = split_mpirun_output((run_dir.path / "raw/01_network/nccl_all_reduce_perf.txt").read_text()).text
    for rank, node in enumerate(profile.nodes):
        assert f"Rank  {rank} Group  0" in text and f"on spark-{node.name}" in text
    cmds = [json.loads(line) for line in (run_dir.path / "commands.jsonl").read_text().splitlines()]
    mpirun = [c for c in cmds if "mpirun" in c["command"] and "all_reduce_perf" in c["command"]]
    assert mpirun and mpirun[-1]["command"].startswith(f'export PATH={REHEARSAL_SIM_DIR}/bin:"$PATH"; ')
    for node in profile.nodes:
        assert f"NCCL_IB_HCA={','.join(node.ib_devs)}" in mpirun[-1]["command"]
    with Cluster.from_profile(profile) as cluster:
        for node in cluster.nodes:
            cfg = json.loads(node.read(f"cat {sim.SIM_DIR}/node.json", timeout=20).stdout)
            assert cfg["node"] == node.name and cfg["hostname"] == f"spark-{node.name}"


def test_weights_at_the_expanded_path_on_every_node(rehearsal):
    """The tree the launch mounts exists on every node at the profile's path, expanded on that node (the
    hub-cache snapshot at the pinned revision for dspark); a `~/` path lands in that node's own home (the lab
    nodes' homes are private, as two Sparks' are)."""
    path, profile, run_dir, _ = rehearsal
    data = _sidecar(run_dir, "02_weights")["data"]
    assert data["revision"] == profile.hf_revision and data["files"] >= 1
    assert data["layout"] == ("hub_cache" if profile.recipe == "dspark-v4" else "local_dir")
    lab = _lab_dir()
    names = sorted(n.name for n in profile.nodes)
    assert sorted(data["paths"]) == names
    with Cluster.from_profile(profile) as cluster:
        for node in cluster.nodes:
            home = node.read('printf %s "$HOME"').stdout.strip()
            tree = data["paths"][node.name]["tree"]
            assert data["paths"][node.name]["weights_dir"] == expand_home(profile.weights_dir_on(node.name), home)
            if profile.recipe == "dspark-v4":
                assert tree.endswith(f"/snapshots/{profile.hf_revision}"), tree
            listed = node.read(f"cd {quote(tree)} && find . -type f -o -type l | sort", timeout=30).stdout.split()
            assert "./config.json" in listed and len(listed) >= data["files"], (node.name, tree, listed)
            if node.name != "head" and profile.weight_sync == "nfs":
                # the head's export at the worker's path (on Sparks the kernel NFS mount, here its sshfs stand-in)
                mounts = node.read("cat /proc/mounts").stdout
                share = data["paths"]["head"]["shared"]
                assert any(line.startswith(f"{cluster.head.spec.fabric_ip}:{share} {data['paths'][node.name]['shared']} ")
                           for line in mounts.splitlines()), (node.name, mounts)
            elif tree.startswith(home + "/"):            # in the node's own home, not the host's or a peer's
                assert (_node_dir(lab, node.name, home) / tree[len(home) + 1:] / "config.json").exists(), tree


def test_engram_fetched_packed_and_mounted(rehearsal):
    path, profile, run_dir, _ = rehearsal
    engram = _checks(run_dir, "03_engram")
    if not profile.engram:
        assert engram and all(c.status is Status.NA for c in engram)
        return
    names = sorted(n.name for n in profile.nodes)
    # packed now or complete from an earlier run (NO-OP), and verified, for both layers on every node
    for row in ("engram source", "engram pack L1", "engram pack L14", "engram packed L1 verify",
                "engram packed L14 verify", "engram slim source"):
        nodes = sorted(c.node for c in engram if c.name == row and c.status in (Status.PASS, Status.NOOP))
        assert nodes == names, (row, engram.to_text())
    rendered = json.loads((run_dir.path / "raw/04_launch/rendered.json").read_text())
    with Cluster.from_profile(profile) as cluster:
        homes = {n.name: n.read('printf %s "$HOME"').stdout.strip() for n in cluster.nodes}
    for r in rendered["ranks"]:
        argv = r["docker_argv"]
        packed = expand_home(profile.engram_packed_dir, homes[r["node"]])
        assert f"{packed}:/engram-packed:ro" in argv and any(a.endswith(":/engram-src:ro") for a in argv), \
            (r["node"], argv)
        assert r["env"].get("DSV41_PACKED_DIR") == "/engram-packed", r["env"]


def test_recipe_checkout_markers_rendered_ranks_and_second_start(rehearsal):
    path, profile, run_dir, _ = rehearsal
    names = sorted(n.name for n in profile.nodes)
    launch = _checks(run_dir, "04_launch")
    checkout = [c for c in launch if c.name == "recipe checkout at the pinned commit"]
    assert sorted(c.node for c in checkout if c.status in (Status.PASS, Status.NOOP)) == names, launch.to_text()
    markers = [c for c in launch if c.name == "recipe start chain markers in the boot log"]
    assert sorted(c.node for c in markers if c.status is Status.PASS) == names, launch.to_text()
    data = _sidecar(run_dir, "04_launch")["data"]
    found = data["recipe"]["markers"]
    assert sorted(found) == names and all(found[n] for n in names), found
    rendered = json.loads((run_dir.path / "raw/04_launch/rendered.json").read_text())
    assert sorted(r["node"] for r in rendered["ranks"]) == names
    assert all(r["runtime"] == profile.runtime for r in rendered["ranks"])
    again = [c for c in launch if c.name == "a second start while the ranks run"]
    assert len(again) == 1 and again[0].status is Status.PASS and again[0].observed.startswith("exit 3 "), again
    with Cluster.from_profile(profile) as cluster:
        for node in cluster.nodes:
            home = node.read('printf %s "$HOME"').stdout.strip()
            checkout = expand_home(profile.recipe_dir, home)
            head = node.read(f"git -C {quote(checkout)} rev-parse HEAD", timeout=30).stdout.strip()
            assert head == profile.recipe_commit, (node.name, checkout, head)
    # the CLI, as a boot script would call it while the ranks run
    done = _cli("start", "--rehearse", "--profile", path, *_as_user(path), timeout=300)
    assert done.returncode == 3, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])


def test_tp3_every_pair_and_every_rank(rehearsal):
    path, profile, run_dir, _ = rehearsal
    if profile.tp != 3:
        pytest.skip("the 3-node checks")
    nodes = [n.name for n in profile.nodes]
    pre = _checks(run_dir, "00_preflight")
    # the triangle: ssh from the head to both workers and from the worker to HEAD_IP (on its cable); worker2 is on no
    # cable with HEAD_IP or WORKER_IP, the worker on none with WORKER2_IP: N/A, as on seed B's ring
    fabric = {c.name: c.status for c in pre if c.name.startswith("ssh ") and "over fabric" in c.name}
    assert sorted(n for n, st in fabric.items() if st is Status.PASS) == [
        "ssh head→worker over fabric", "ssh head→worker2 over fabric", "ssh worker→head over fabric"], fabric
    assert len(fabric) == 6 and all(st in (Status.PASS, Status.NA) for st in fabric.values()), fabric
    # one rail per cable (each its own /24) and every pair pinged over the cable between them, worker<->worker2 too
    net = _checks(run_dir, "01_network")
    pings = {c.name.split(".", 3)[3] for c in net if c.name.startswith("net.ping.") and c.status is Status.PASS}
    assert pings == {f"{a}->{b}" for a in nodes for b in nodes if a != b}, pings
    rails = next(c for c in net if c.name == "net.rails")
    assert all(cable in rails.observed for cable in ("169.254.22.", "169.254.23.", "169.254.24.")), rails.observed
    assert not [c for c in net if c.name.startswith("net.path.")]
    startup = _sidecar(run_dir, "04_launch")["data"]["launch"]["startup_log"]
    for rank, node in enumerate(nodes):
        world = startup[node]["world"]
        assert world and (world["world_size"], world["rank"]) == (3, rank), (node, world)


def test_recipe_cabling_reaches_the_simulated_tools(rehearsal):
    """Recipe A: one rail, head rocep1s0f1 <-> worker rocep1s0f0, GID index 3 pinned on both. Seed B TP3: the
    head lists both CX ports for NCCL, each worker its facing one."""
    path, profile, run_dir, _ = rehearsal
    net = _checks(run_dir, "01_network")
    hcas = {c.node: c.observed for c in net if c.name == "net.nccl.hcas"}
    assert sorted(hcas) == sorted(n.name for n in profile.nodes)
    for node in profile.nodes:
        assert node.ib_devs and all(h in hcas[node.name] for h in node.ib_devs), (node.name, hcas[node.name])
    if profile.recipe == "exl3-v41":
        assert {c.node: c.data.get("pinned") for c in net if c.name == "net.gid"} == {"head": 3, "worker": 3}
    if profile.tp == 3:
        assert "rocep1s0f0" in hcas["head"] and "rocep1s0f1" in hcas["head"]


def test_the_image_came_from_the_lab_registry(rehearsal):
    """Issue 23 item 1: the recipe's image path and tag at the lab registry, pulled for real: recipe B by digest on
    every node, recipe A on the head and shipped to the worker(s) with the node's platform of a two-platform index;
    rehearsal.json lists only the registry host (and the digest, with its reason) as IMAGE's substitutions."""
    from runbook.lab import oci
    from runbook.lab.netlab.spec import REGISTRY
    path, profile, run_dir, _ = rehearsal
    data = _sidecar(run_dir, "04_launch")["data"]["image"]
    ref = oci.parse_reference(profile.image)
    recipe = oci.parse_reference(load_profile_from(path).image)
    assert (ref.host, ref.path, ref.tag) == (REGISTRY, recipe.path, recipe.tag), profile.image
    names = sorted(n.name for n in profile.nodes)
    if ref.digest:
        assert data["plan"] == "pull" and sorted(data["shipped"]) == names, data
        assert all(v["pulled"] for v in data["shipped"].values()), data
    else:
        assert data["plan"] == "pull-head" and data["shipped"]["head"]["pulled"], data
        for name in [n for n in names if n != "head"]:
            assert data["shipped"][name]["platform"] == oci.native_platform(), data
    assert oci.manifest_platforms(REGISTRY, ref.path, ref.digest or ref.tag) == [
        oci.native_platform(), oci.other_platform(oci.native_platform())]
    image_rows = [s for s in json.loads((run_dir.path / "rehearsal.json").read_text())["substituted"]
                  if s["key"] == "IMAGE"]
    assert [s["part"] for s in image_rows] == (["registry host", "digest"] if ref.digest else ["registry host"])
    assert all(s["kind"] == "lab" for s in image_rows)


def load_profile_from(path: str):
    from runbook.profile import load_profile
    return load_profile(REPO_ROOT / path)


def test_non_root_operator_runs_the_kernel_nfs_steps_through_sudo(rehearsal):
    """exl3-v41 as the lab's non-root operator: every command ran as that user (its home, the docker group), the
    kernel NFS mode's root commands through `sudo -n` after the runbook's probe said the drop-in allows them;
    the exports file is real and read back; the kernel server and mount say N/A (the lab kernel has neither), the
    userspace server and mount stand in for them."""
    path, profile, run_dir, _ = rehearsal
    if path not in SSH_USER:
        pytest.skip("rehearsed as root")
    user = SSH_USER[path]
    assert [n.ssh for n in profile.nodes] == [f"{user}@spark-{n.name}" for n in profile.nodes]
    record = json.loads((run_dir.path / "rehearsal.json").read_text())
    ssh = {s["key"]: s for s in record["substituted"] if s["key"] in ("HEAD_SSH", "WORKER_SSH")}
    assert {k: v["lab"] for k, v in ssh.items()} == {"HEAD_SSH": f"{user}@spark-head", "WORKER_SSH": f"{user}@spark-worker"}
    assert all("non-root operator" in v["why"] for v in ssh.values())
    pre = _checks(run_dir, "00_preflight")
    rows = {(c.name, c.node): c for c in pre}
    for node in ("head", "worker"):
        assert rows[("nfs sudo rules", node)].status is Status.PASS, pre.to_text()
        assert rows[("nfs sudo rules", node)].observed.startswith("sudo -n -l allows every NFS command")
        assert rows[("nfs packages", node)].status is Status.PASS
        assert rows[("docker engine", node)].status is Status.PASS
    weights = _checks(run_dir, "02_weights")
    for name in ("weights.nfs.sudo", "weights.nfs.exports", "weights.nfs.exportfs", "weights.nfs.mountpoint", "weights.nfs.server",
                 "weights.nfs.lab_mount"):
        passed = [c for c in weights if c.name == name and c.status is Status.PASS]
        assert passed, (name, weights.to_text())
    assert all(f"as {user}" in c.observed for c in weights if c.name == "weights.nfs.sudo")
    kernel = [c for c in weights if c.name in ("weights.nfs.kernel_server", "weights.nfs.mount")]
    assert kernel and all(c.status is Status.NA for c in kernel), [(c.name, c.status) for c in kernel]
    cmds = [json.loads(line) for line in (run_dir.path / "commands.jsonl").read_text().splitlines()]
    sudo = [c for c in cmds if "sudo -n tee /etc/exports.d/spark-runbook-" in c["command"]]
    assert sudo and all(c["exit_code"] == 0 for c in sudo), sudo
    with Cluster.from_profile(profile) as cluster:
        for node in cluster.nodes:
            who = node.read("id -un; id -nG", timeout=20).stdout.split()
            assert who[0] == user and "docker" in who[1:] and "root" not in who
