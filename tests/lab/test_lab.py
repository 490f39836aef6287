"""The embedded lab itself: identity, isolation, fabric, SSH trust, docker, up/down idempotence.

Run: `.venv/bin/python -m pytest tests/lab/test_lab.py -m lab` (as root). The last test tears the lab
down and brings it up again, so it stays last in this file.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import paramiko
import pytest
from fabric import Config, Connection, ThreadingGroup

from runbook.errors import LabError
from runbook.lab import netlab
from runbook.lab.netlab.nodes import home_shares
from runbook.lab.netlab.spec import IMAGE, REPO_ROOT, STATE_FILE

pytestmark = pytest.mark.lab


def sh(lab: netlab.LabInfo, target: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(lab.ssh_argv(target, command), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def ok(lab: netlab.LabInfo, target: str, command: str, timeout: float = 30) -> str:
    res = sh(lab, target, command, timeout)
    assert res.returncode == 0, f"{target}: {command!r} rc={res.returncode}\n{res.stderr}"
    return res.stdout


def fabric_config(lab: netlab.LabInfo) -> Config:
    return Config(runtime_ssh_path=str(lab.ssh_config), overrides={"run": {"in_stream": False}})


def pinned(conn: Connection, lab: netlab.LabInfo) -> Connection:
    """Fabric itself never loads known_hosts and auto-adds unknown keys: pin the lab's host keys."""
    conn.client.load_host_keys(str(lab.known_hosts))
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return conn


@pytest.fixture(scope="module")
def conns(lab):
    """One pinned fabric Connection per node (opened once: each command then costs ~0.06 s)."""
    cfg = fabric_config(lab)
    out = {n.name: pinned(Connection(n.alias, config=cfg), lab) for n in lab.nodes}
    yield out
    for c in out.values():
        c.close()


def run(conns, name: str, command: str, timeout: float = 30):
    return conns[name].run(command, hide=True, warn=True, timeout=timeout)


def out(conns, name: str, command: str, timeout: float = 30) -> str:
    res = run(conns, name, command, timeout)
    assert res.exited == 0, f"{name}: {command!r} rc={res.exited}\n{res.stderr}"
    return res.stdout


def test_up_requires_root(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="needs root") as exc:
        netlab.up(tmp_path)
    assert "uid 1000" in exc.value.observed and exc.value.fix
    with pytest.raises(LabError, match="needs root"):
        netlab.down(tmp_path)


def test_node_identity_and_pid_namespace(lab, conns):
    host_pidns = os.readlink("/proc/self/ns/pid")
    seen = {}
    for n in lab.nodes:
        lines = out(conns, n.name, "hostname; cat /etc/hostname; readlink /proc/self/ns/pid; "
                                   "tr '\\0' ' ' </proc/1/cmdline; echo; ps -e -o pid= | wc -l").splitlines()
        hostname, etc_hostname, pidns, pid1, nprocs = lines
        assert hostname == etc_hostname == n.alias
        assert pidns != host_pidns
        assert f"nodes/{n.name}/sshd_config" in pid1 and "sshd" in pid1   # PID 1 is this node's sshd
        assert int(nprocs) < 60                                           # sees only its own processes
        seen[n.name] = pidns
    assert len(set(seen.values())) == len(lab.nodes)
    # a process started on the worker is invisible on the head
    tag = f"20.{uuid.uuid4().int % 10**9:09d}"                 # unique `sleep` argument
    out(conns, "worker", f"nohup sleep {tag} >/dev/null 2>&1 & echo $! > /run/sleep-{tag}.pid")
    try:
        assert f"sleep {tag}" in out(conns, "worker", "ps -e -o args=")
        assert f"sleep {tag}" not in out(conns, "head", "ps -e -o args=")
    finally:
        out(conns, "worker", f"kill $(cat /run/sleep-{tag}.pid); rm -f /run/sleep-{tag}.pid")


def test_private_nvme(lab, conns):
    name = f"probe-{uuid.uuid4().hex[:8]}"
    out(conns, "head", f"echo from-head > /mnt/nvme/{name}")
    try:
        assert out(conns, "head", f"cat /mnt/nvme/{name}").strip() == "from-head"
        assert run(conns, "worker", f"test -e /mnt/nvme/{name}").exited == 1
        assert not Path("/mnt/nvme", name).exists()                         # not on the host either
        assert (lab.lab_dir / "nodes" / "head" / "nvme" / name).exists()   # it is the head's dir
    finally:
        out(conns, "head", f"rm -f /mnt/nvme/{name}")


def test_private_home(lab, conns):
    """~ is the node's own (a hub cache or a `~/` weight path lands on that node only, as on two Sparks); the
    host's Python installs under ~ stay visible read-only so the lab venvs run."""
    name = f".probe-{uuid.uuid4().hex[:8]}"
    out(conns, "head", f"echo from-head > ~/{name}")
    try:
        assert out(conns, "head", f"cat ~/{name}").strip() == "from-head"
        assert run(conns, "worker", f"test -e ~/{name}").exited == 1
        assert not (Path.home() / name).exists()                              # not on the host either
        assert (lab.lab_dir / "nodes" / "head" / "home" / name).exists()     # it is the head's dir
        shared = home_shares(lab.lab_dir)
        for entry in shared:
            assert run(conns, "worker", f"test -d ~/{entry}").exited == 0, entry
            assert run(conns, "worker", f"touch ~/{entry}/.rw-probe").exited != 0, entry   # read-only
        assert out(conns, "worker", f"{REPO_ROOT}/.venv/bin/python -c 'print(6*7)'").strip() == "42"
    finally:
        out(conns, "head", f"rm -f ~/{name}")


def test_fabric_mtu_and_jumbo_ping_both_directions(lab, conns):
    for a in lab.nodes:
        mtu, state = out(conns, a.name, f"cat /sys/class/net/{a.fabric_if}/mtu /sys/class/net/{a.fabric_if}/operstate").split()
        assert (mtu, state) == ("9000", "up")
        for b in lab.nodes:
            if a is b:
                continue
            big = run(conns, a.name, f"ping -c 1 -W 2 -M do -s 8972 {b.fabric_ip}")
            assert big.exited == 0, big.stdout + big.stderr
            too_big = run(conns, a.name, f"ping -c 1 -W 2 -M do -s 8973 {b.fabric_ip}")
            assert too_big.exited != 0
            assert "message too long" in (too_big.stdout + too_big.stderr)


def test_fabric_reachable_only_inside_nodes(lab, conns):
    worker = lab.node("worker")
    # host side: the guard route rejects the fabric prefix locally (no packet leaves)
    route = subprocess.run(["ip", "route", "get", worker.fabric_ip], capture_output=True, text=True, timeout=10)
    assert route.returncode != 0 or "unreachable" in route.stdout
    ping = subprocess.run(["ping", "-c", "1", "-W", "1", worker.fabric_ip], capture_output=True, text=True,
                          timeout=10, stdin=subprocess.DEVNULL)
    assert ping.returncode != 0
    # nodes: no default route, anything outside the lab is unreachable (checked without sending)
    for n in lab.nodes:
        assert "default" not in out(conns, n.name, "ip route")
        res = run(conns, n.name, "ip route get 192.0.2.1")
        assert res.exited != 0 and "unreachable" in res.stderr.lower()


def test_host_key_verification_is_on(lab, tmp_path):
    head = lab.node("head")
    assert "stricthostkeychecking true" in ok_local(["ssh", "-F", str(lab.ssh_config), "-G", head.alias])
    # a known_hosts with a *different* key for the head must be refused
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True,
                   timeout=30, stdin=subprocess.DEVNULL)
    wrong = tmp_path / "known_hosts"
    pub = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    wrong.write_text(f"{head.alias},{head.mgmt_ip} {pub}\n")
    bad = subprocess.run(["ssh", "-F", str(lab.ssh_config), "-o", f"UserKnownHostsFile={wrong}", head.alias, "true"],
                         capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert bad.returncode == 255 and "verification failed" in bad.stderr
    # an empty known_hosts is refused too (no accept-new)
    empty = tmp_path / "empty"
    empty.write_text("")
    bad = subprocess.run(["ssh", "-F", str(lab.ssh_config), "-o", f"UserKnownHostsFile={empty}", head.alias, "true"],
                         capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert bad.returncode == 255 and "verification failed" in bad.stderr
    # paramiko with the pinned keys: the wrong key raises
    client = paramiko.SSHClient()
    client.load_host_keys(str(wrong))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.BadHostKeyException):
        client.connect(head.mgmt_ip, username="root", key_filename=str(lab.key), timeout=10,
                       allow_agent=False, look_for_keys=False)
    client.close()
    # node to node over the fabric (node-private /etc/ssh/ssh_config, pinned keys)
    worker = lab.node("worker")
    out = ok(lab, head.alias, f"ssh {worker.alias} 'hostname; echo $SSH_CONNECTION'").split()
    assert out[0] == worker.alias and out[1] == head.fabric_ip and out[3] == worker.fabric_ip


def test_a_live_node_whose_host_key_changed_is_not_rebuilt_over(lab, tmp_path):
    """A node that runs but fails its pinned host key is for a person to judge: ``up`` refuses, names the node and
    the rebuild command, and leaves every node (and whatever runs there) as it was."""
    worker = lab.node("worker")
    before = netlab.status(lab.lab_dir)
    assert before["healthy"], before
    pids = {name: node["sshd_pid"] for name, node in before["nodes"].items()}
    original = lab.known_hosts.read_text()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True,
                   timeout=30, stdin=subprocess.DEVNULL)
    pub = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    lines = [line for line in original.splitlines() if line.strip()]
    changed = [f"{line.split()[0]} {pub}" if worker.alias in line.split()[0].split(",") else line for line in lines]
    assert changed != lines, "the worker's pinned key was not found in the lab's known_hosts"
    try:
        lab.known_hosts.write_text("\n".join(changed) + "\n")
        with pytest.raises(LabError) as err:
            netlab.up(lab.lab_dir, nodes=len(lab.nodes))
        assert "worker" in err.value.observed and "lab down" in err.value.fix
        assert lab.known_hosts.read_text() == "\n".join(changed) + "\n", "up re-pinned a host key on its own"
    finally:
        lab.known_hosts.write_text(original)
    after = netlab.status(lab.lab_dir)
    assert after["healthy"] and {name: node["sshd_pid"] for name, node in after["nodes"].items()} == pids


def ok_local(argv: list[str]) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_fabric_connection_group_and_jump(lab):
    cfg = fabric_config(lab)
    head, worker = lab.node("head"), lab.node("worker")
    with pinned(Connection(head.alias, config=cfg), lab) as c:
        res = c.run("hostname; cat /mnt/nvme/WHOAMI", hide=True)
        assert res.stdout.splitlines()[0] == head.alias
        assert c.run("exit 3", warn=True, hide=True).exited == 3
        # jump over the fabric (CX-7 path): head -> worker's fabric IP
        with pinned(Connection(worker.fabric_ip, config=cfg, gateway=c), lab) as w:
            out = w.run("hostname; echo $SSH_CONNECTION", hide=True).stdout.split()
            assert out[0] == worker.alias and out[1] == head.fabric_ip
    group = ThreadingGroup(*(n.alias for n in lab.nodes), config=cfg)
    for conn in group:
        pinned(conn, lab)
    try:
        results = group.run("hostname", hide=True)
        assert sorted(r.stdout.strip() for r in results.values()) == sorted(n.alias for n in lab.nodes)
    finally:
        group.close()


def test_iperf3_over_fabric(lab, conns):
    head, worker = lab.node("head"), lab.node("worker")
    pidfile = f"/run/iperf3-test-{uuid.uuid4().hex[:6]}.pid"
    out(conns, "worker", f"iperf3 -s -1 -D -B {worker.fabric_ip} -I {pidfile}")
    try:
        for _ in range(20):   # the daemon needs a moment to listen
            res = run(conns, "head", f"iperf3 -c {worker.fabric_ip} -t 2 -J", timeout=30)
            if res.exited == 0 or "refused" not in res.stdout + res.stderr:
                break
            time.sleep(0.1)
        assert res.exited == 0, res.stdout[-2000:] + res.stderr
        gbps = json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9
        print(f"\n[lab] iperf3 head -> worker over {head.fabric_if}: {gbps:.2f} Gbit/s")
        assert gbps > 0.1
    finally:
        run(conns, "worker", f"test -f {pidfile} && kill $(cat {pidfile}) 2>/dev/null; rm -f {pidfile}")


def test_docker_on_every_node_same_image(lab, conns):
    ids = {}
    for n in lab.nodes:
        version, image_id = out(conns, n.name, "docker version --format '{{.Server.Version}}'; "
                                               f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}").split()
        assert version
        ids[n.name] = image_id
    assert len(set(ids.values())) == 1, ids
    assert ids == lab.image_ids
    assert out(conns, "head", f"docker run --rm --network none {IMAGE} echo container-ok").strip() == "container-ok"


def test_status_reports_healthy(lab):
    st = netlab.status(lab.lab_dir)
    json.dumps(st)
    assert st["healthy"], st
    for n in lab.nodes:
        node = st["nodes"][n.name]
        assert node["netns_exists"] and node["sshd_alive"] and node["ssh_ok"] and node["dockerd_alive"]
        assert (node["fabric_state"], node["fabric_mtu"]) == ("UP", 9000)
        assert node["registry_insecure"], node          # its dockerd pulls from the lab registry over plain HTTP
        assert node["own_packages"], node               # its /usr, /etc, /var overlays and apt proxy line
    assert st["registry"]["healthy"] and st["registry"]["address"] == "10.77.0.1:5077", st["registry"]
    assert st["apt_proxy"]["healthy"] and st["apt_proxy"]["address"] == "10.77.0.1:3142", st["apt_proxy"]
    assert st["apt_proxy"]["sources"], st["apt_proxy"]  # forwards to this machine's apt sources only


def test_a_container_in_the_nodes_is_not_taken_for_their_pid1(lab):
    """A rehearsal's docker-runtime rank is a container (host network): PID 1 of a PID namespace nested in the
    node's. `lab status` still finds each node's sshd as its PID 1 and the lab healthy, and `up` reuses it (it took
    the container for PID 1 once the host's PIDs wrapped, called both nodes dead and the next `up` rebuilt the lab
    under the running server; the deterministic case: tests/unit/test_lab_repair.py)."""
    from runbook.lab.netlab.host import _proc_nspid, netns_pids, node_pid1, proc_comm
    before = {name: node["sshd_pid"] for name, node in netlab.status(lab.lab_dir)["nodes"].items()}
    name = f"pid1-probe-{uuid.uuid4().hex[:8]}"
    try:
        for n in lab.nodes:
            ok(lab, n.alias, f"docker run -d --rm --network host --name {name} {IMAGE} sleep 300 >/dev/null")
        for n in lab.nodes:
            init = ok(lab, n.alias, f"docker inspect --format '{{{{.State.Pid}}}}' {name}").strip()
            host = [p for p in netns_pids(n.netns) if len(_proc_nspid(p)) == 3 and _proc_nspid(p)[-1] == 1]
            assert host and int(init) in [_proc_nspid(p)[1] for p in host], (init, host)   # the nested PID 1 exists
            assert node_pid1(n.netns) == before[n.name] and proc_comm(before[n.name]) == "sshd"
        st = netlab.status(lab.lab_dir)
        assert st["healthy"] and {k: v["sshd_pid"] for k, v in st["nodes"].items()} == before, st
        assert netlab.up(lab.lab_dir, nodes=len(lab.nodes)).reused
    finally:
        for n in lab.nodes:
            sh(lab, n.alias, f"docker rm -f {name} >/dev/null 2>&1; true")


def test_a_dockerd_that_does_not_trust_the_registry_makes_up_rebuild(lab):
    """The insecure-registry flag is given when the lab is built (a running dockerd cannot learn it): a node whose
    dockerd runs without it (a lab built by older code) is unhealthy, and `up` rebuilds the lab."""
    from runbook.lab.netlab.spec import REGISTRY
    restart = ("kill $(cat /run/docker.pid); i=0; while [ -e /run/docker.pid ] && [ $i -lt 100 ]; do sleep 0.2; "
               "i=$((i+1)); done; nohup setsid dockerd --cgroup-parent /nl-worker > /run/dockerd.log 2>&1 < /dev/null & "
               "i=0; while ! docker info >/dev/null 2>&1 && [ $i -lt 150 ]; do sleep 0.2; i=$((i+1)); done; "
               "docker info --format '{{json .RegistryConfig.IndexConfigs}}'")
    seen = ok(lab, "spark-worker", restart, timeout=90)
    assert REGISTRY not in seen, seen
    st = netlab.status(lab.lab_dir)
    assert not st["nodes"]["worker"]["registry_insecure"] and not st["nodes_healthy"] and st["nodes"]["head"]["healthy"]
    rebuilt = netlab.up(lab.lab_dir)
    assert not rebuilt.reused and "clean" in rebuilt.timings
    after = netlab.status(lab.lab_dir)
    assert after["healthy"] and all(n["registry_insecure"] for n in after["nodes"].values()), after


def test_worker2_joins_and_leaves_without_touching_head_and_worker(lab):
    """2 -> 3 -> 2 nodes on a running lab: worker2 and its cables come and go, the fabric is re-cabled (the recipes'
    pair, then seed B's TP3 triangle: each cable its own /24, every node both CX-7 ports), and the head's and the
    worker's sshd (PID 1), dockerd and files stay as they were."""
    from runbook.lab.netlab.spec import MGMT_IF
    before = netlab.status(lab.lab_dir)
    assert before["healthy"] and before["node_count"] == 2, before
    pids = {n: before["nodes"][n]["sshd_pid"] for n in ("head", "worker")}
    dockerd = ok(lab, "spark-worker", "cat /run/docker.pid").strip()
    t = time.monotonic()
    three = netlab.up(lab.lab_dir, nodes=3)
    grow_s = time.monotonic() - t
    try:
        st = netlab.status(lab.lab_dir)
        assert st["healthy"] and [n.name for n in three.nodes] == ["head", "worker", "worker2"], st
        assert {n: st["nodes"][n]["sshd_pid"] for n in pids} == pids, "head or worker was restarted"
        assert ok(lab, "spark-worker", "cat /run/docker.pid").strip() == dockerd
        assert "clean" not in three.timings and not three.reused, three.timings
        # the triangle: every node both ports, each cable its own /24; a node reaches a peer only over their cable
        want = {"head": {"enp1s0f0np0": "169.254.22.1/24", "enp1s0f1np1": "169.254.23.1/24"},
                "worker": {"enp1s0f0np0": "169.254.22.2/24", "enp1s0f1np1": "169.254.24.2/24"},
                "worker2": {"enp1s0f0np0": "169.254.24.3/24", "enp1s0f1np1": "169.254.23.3/24"}}
        for n in three.nodes:
            got = json.loads(ok(lab, n.alias, "ip -j -4 addr show"))
            addrs = {i["ifname"]: f"{a['local']}/{a['prefixlen']}" for i in got for a in i["addr_info"]}
            assert {k: v for k, v in addrs.items() if k.startswith("enp1s0")} == want[n.name], (n.name, addrs)
            assert addrs[MGMT_IF] == f"{n.mgmt_ip}/24"
        for src, dst, ip in (("worker", "worker2", "169.254.24.3"), ("worker2", "head", "169.254.23.1")):
            assert ok(lab, f"spark-{src}", f"ping -c 1 -W 2 -M do -s 8972 {ip} >/dev/null && ssh spark-{dst} hostname"
                      ).strip() == f"spark-{dst}"
        # the head's address on the worker's cable is not reachable from worker2 (no bridge, no route)
        assert sh(lab, "spark-worker2", "ping -c 1 -W 1 169.254.22.1").returncode != 0
    finally:
        t = time.monotonic()
        two = netlab.up(lab.lab_dir, nodes=2)
        shrink_s = time.monotonic() - t
    after = netlab.status(lab.lab_dir)
    assert after["healthy"] and after["node_count"] == 2 and not Path("/run/netns/nl-worker2").exists(), after
    assert {n: after["nodes"][n]["sshd_pid"] for n in pids} == pids
    assert [(n.fabric_if, n.fabric_ip) for n in two.nodes] == [("enp1s0f1np1", "169.254.77.1"),
                                                                ("enp1s0f0np0", "169.254.77.2")]
    assert ok(lab, "spark-head", "ping -c 1 -W 2 -M do -s 8972 169.254.77.2 >/dev/null && ssh spark-worker hostname"
              ).strip() == "spark-worker"
    print(f"\n[lab] worker2 added in {grow_s:.1f} s {three.timings}; removed in {shrink_s:.1f} s {two.timings}")


def _end_the_nodes_processes(lab: netlab.LabInfo) -> None:
    """What ending the session that built the lab does (a harness ends every process the session started): SIGKILL
    to every process of the nodes, the `unshare` parents that started them, the lab registry and the apt proxy.
    Namespaces, links and files stay."""
    from runbook.lab.netlab import aptproxy, registry
    from runbook.lab.netlab.host import netns_pids, pid_alive
    state = json.loads((lab.lab_dir / STATE_FILE).read_text())
    victims = [p["unshare"] for p in state["pids"].values()] + [registry.registry_pid(lab.lab_dir) or 0,
                                                                 aptproxy.proxy_pid(lab.lab_dir) or 0]
    victims += [p for n in lab.nodes for p in netns_pids(n.netns)]
    victims = [p for p in victims if p]
    assert len(victims) >= 2 * len(lab.nodes) + 2, victims
    for p in victims:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in victims) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in victims if pid_alive(p)]


def test_nodes_whose_processes_were_ended_are_restarted_in_place(lab):
    """The lab's processes ended with the session that built it (sshd, dockerd, registry gone; every nl-* netns
    left): the next `up` starts them again in the same namespaces, without a rebuild, and says so in one line. A
    node whose dockerd alone died gets dockerd again, its sshd and what runs there untouched."""
    before = netlab.status(lab.lab_dir)
    assert before["healthy"], before
    inodes = {n.netns: Path("/run/netns", n.netns).stat().st_ino for n in lab.nodes}
    ids = {name: node["image_id"] for name, node in before["nodes"].items()}
    marker = "/usr/share/doc/spark-runbook-lab-restart-marker"     # the head's own /usr: survives its restart
    ok(lab, "spark-head", f"echo {uuid.uuid4().hex} > {marker}")
    _end_the_nodes_processes(lab)
    dead = netlab.status(lab.lab_dir)
    assert not dead["healthy"] and not dead["registry"]["healthy"] and not dead["apt_proxy"]["healthy"]
    assert all(n["netns_exists"] and not n["sshd_alive"] and not n["dockerd_alive"] for n in dead["nodes"].values())
    said: list[str] = []
    t = time.monotonic()
    again = netlab.up(lab.lab_dir, nodes=len(lab.nodes), log=said.append)
    restart_s = time.monotonic() - t
    assert again.restarted == {n.name: "node" for n in lab.nodes} and not again.reused, (again, said)
    assert [m for m in said if "restarted in place" in m and all(n.alias in m for n in lab.nodes)], said
    assert not [m for m in said if "rebuilding" in m], said
    after = netlab.status(lab.lab_dir)
    assert after["healthy"], after
    assert {n.netns: Path("/run/netns", n.netns).stat().st_ino for n in lab.nodes} == inodes   # not rebuilt
    assert {name: node["image_id"] for name, node in after["nodes"].items()} == ids
    assert ok(lab, "spark-head", f"cat {marker} && rm {marker}").strip() and not Path(marker).exists()
    assert sh(lab, "spark-worker", f"test -e {marker}").returncode == 1
    assert ok(lab, "spark-head", "ping -c 1 -W 2 -M do -s 8972 169.254.77.2 >/dev/null && ssh spark-worker hostname"
              ).strip() == "spark-worker"
    # dockerd alone
    sshd = after["nodes"]["worker"]["sshd_pid"]
    ok(lab, "spark-worker", "kill $(cat /run/docker.pid); i=0; while docker info >/dev/null 2>&1 && [ $i -lt 100 ]; "
                            "do sleep 0.2; i=$((i+1)); done; ! docker info >/dev/null 2>&1", timeout=60)
    assert not netlab.status(lab.lab_dir)["nodes"]["worker"]["dockerd_alive"]
    said.clear()
    t = time.monotonic()
    third = netlab.up(lab.lab_dir, nodes=len(lab.nodes), log=said.append)
    dockerd_s = time.monotonic() - t
    assert third.restarted == {"worker": "dockerd"}, (third, said)
    final = netlab.status(lab.lab_dir)
    assert final["healthy"] and final["nodes"]["worker"]["sshd_pid"] == sshd, final
    reuse = netlab.up(lab.lab_dir, nodes=len(lab.nodes))
    assert reuse.reused and reuse.restarted == {}
    print(f"\n[lab] nodes restarted in place in {restart_s:.1f} s {again.timings}; dockerd alone in {dockerd_s:.1f} s")


def _nothing_left() -> list[str]:
    left = [f"netns {ns}" for ns in ("nl-head", "nl-worker", "nl-worker2") if Path("/run/netns", ns).exists()]
    left += [f"link {l}" for l in ("nlbr0", "nlfab0", "nl-m-head", "nl-m-worker") if Path("/sys/class/net", l).exists()]
    routes = subprocess.run(["ip", "route", "show", "type", "unreachable"], capture_output=True, text=True, timeout=10).stdout
    left += [f"route {r}" for r in ("10.77.0.0/16", "169.254.77.0/24") if r in routes]
    return left


def test_up_down_idempotence_and_stale_recovery(lab):   # keep last: it restarts the lab
    state_file = lab.lab_dir / STATE_FILE
    # 1. a second up on a healthy lab returns quickly without touching it
    again = netlab.up(lab.lab_dir)
    assert again.reused and again.timings["total"] < 10
    # 2. a node dies (its PID 1 is killed): status notices
    pid1 = netlab.status(lab.lab_dir)["nodes"]["worker"]["sshd_pid"]
    os.kill(pid1, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid1}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    st = netlab.status(lab.lab_dir)
    assert not st["healthy"] and not st["nodes"]["worker"]["sshd_alive"] and st["nodes"]["head"]["healthy"]
    crashed_state = state_file.read_text()
    # 3. down cleans the half-dead lab completely; a second down is a no-op
    t = time.monotonic()
    netlab.down(lab.lab_dir)
    down_s = time.monotonic() - t
    assert _nothing_left() == [] and not state_file.exists()
    from runbook.lab.netlab import aptproxy, registry
    assert registry.registry_pid(lab.lab_dir) is None          # down ended the lab's registry too
    assert aptproxy.proxy_pid(lab.lab_dir) is None and not aptproxy.answers()      # and the apt proxy
    assert not list(lab.lab_dir.glob("nodes/*/overlay"))       # and the nodes' package layers
    netlab.down(lab.lab_dir)
    # 4. stale leftovers of a crashed run (state file with dead pids, netns, bridge, guard route,
    #    a docker cgroup dir): up cleans them and comes up healthy
    state_file.write_text(crashed_state)
    for cmd in (["ip", "netns", "add", "nl-head"], ["ip", "link", "add", "nlbr0", "type", "bridge"],
                ["ip", "route", "add", "unreachable", "169.254.77.0/24"]):
        subprocess.run(cmd, check=True, timeout=10)
    cg = Path("/sys/fs/cgroup/memory/nl-worker/stale-container")
    cg.mkdir(parents=True)
    rebuilt = netlab.up(lab.lab_dir)
    assert not rebuilt.reused and "clean" in rebuilt.timings and rebuilt.image_id_identical
    assert not cg.exists()
    assert ok(lab, "spark-worker", "hostname").strip() == "spark-worker"
    print(f"\n[lab] warm up {again.timings}\n[lab] down {down_s:.2f} s\n[lab] up over stale state {rebuilt.timings}")
    assert netlab.status(lab.lab_dir)["healthy"]
