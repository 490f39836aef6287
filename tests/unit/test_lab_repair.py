"""What ``netlab.up`` starts again in place of a rebuild (``health.repairs``), decided from ``lab status``: a node
whose processes are gone but whose namespace and cables stay is restarted, a lone dead dockerd is started again,
anything else is rebuilt as before."""
from __future__ import annotations

import copy

import pytest

from runbook.lab.netlab.health import DOCKERD, NODE, repairs


def node(alias: str) -> dict:
    """One healthy node as ``health._probe_node`` reports it."""
    return {"alias": alias, "netns_exists": True, "sshd_pid": 4242, "sshd_alive": True, "ssh_ok": True,
            "hostname": alias, "dockerd_alive": True, "image_id": "sha256:ab", "registry_insecure": True,
            "operator": True, "own_packages": True, "ports": {"enp1s0f1np1": {"ip": "169.254.77.1", "state": "UP", "mtu": 9000}},
            "healthy": True}


def healthy() -> dict:
    return {"state_file": True, "node_count": 2, "bridge_up": True,
            "guard_routes": {"10.77.0.0/16": True, "169.254.77.0/24": True},
            "nodes": {"head": node("spark-head"), "worker": node("spark-worker")},
            "registry": {"healthy": True}}


def processes_gone(st: dict, name: str) -> None:
    """What a node whose PID 1 died looks like: no sshd, so no ssh, no dockerd; namespace and cables stay."""
    n = st["nodes"][name]
    n.update(sshd_pid=None, sshd_alive=False, ssh_ok=False, hostname=None, dockerd_alive=False, image_id=None,
             registry_insecure=False, operator=False, own_packages=False, healthy=False)


def test_a_healthy_lab_needs_nothing():
    assert repairs(healthy(), 2) == {}


def test_nodes_whose_processes_are_gone_are_restarted_in_place():
    st = healthy()
    for name in ("head", "worker"):
        processes_gone(st, name)
    st["registry"]["healthy"] = False              # it was ended with them; `up` starts it on its own
    assert repairs(st, 2) == {"head": NODE, "worker": NODE}
    one = healthy()
    processes_gone(one, "worker")
    assert repairs(one, 2) == {"worker": NODE}


def test_a_dead_dockerd_alone_is_started_again():
    st = healthy()
    st["nodes"]["head"].update(dockerd_alive=False, image_id=None, registry_insecure=False, healthy=False)
    assert repairs(st, 2) == {"head": DOCKERD}


@pytest.mark.parametrize("broken", [
    "another node count", "no state file", "bridge down", "a guard route gone", "netns gone", "cable down",
    "wrong MTU", "wrong hostname", "no operator", "dockerd without the insecure registry", "no image",
    "a node sharing this machine's packages", "a dead dockerd on a node sharing this machine's packages"])
def test_what_a_restart_cannot_heal_is_rebuilt(broken):
    st = healthy()
    processes_gone(st, "worker")          # a restartable node beside it changes nothing
    head = st["nodes"]["head"]
    count = 2
    if broken == "another node count":
        count = 3
    elif broken == "no state file":
        st["state_file"] = False
    elif broken == "bridge down":
        st["bridge_up"] = False
    elif broken == "a guard route gone":
        st["guard_routes"]["169.254.77.0/24"] = False
    elif broken == "netns gone":
        head.update(netns_exists=False, healthy=False)
    elif broken == "cable down":
        head["ports"]["enp1s0f1np1"]["state"] = "DOWN"
        head["healthy"] = False
    elif broken == "wrong MTU":
        head["ports"]["enp1s0f1np1"]["mtu"] = 1500
        head["healthy"] = False
    elif broken == "wrong hostname":
        head.update(hostname="spark-worker", dockerd_alive=False, healthy=False)
    elif broken == "no operator":
        head.update(operator=False, dockerd_alive=False, healthy=False)
    elif broken == "dockerd without the insecure registry":
        head.update(registry_insecure=False, healthy=False)     # dockerd runs: only a rebuild gives it the flag
    elif broken == "no image":
        head.update(image_id=None, healthy=False)
    elif broken == "a node sharing this machine's packages":          # a lab built before the overlays
        head.update(own_packages=False, healthy=False)
    elif broken == "a dead dockerd on a node sharing this machine's packages":
        head.update(own_packages=False, dockerd_alive=False, healthy=False)
    before = copy.deepcopy(st)
    assert repairs(st, count) is None
    assert st == before                     # read-only


def test_the_nodes_pid1_is_the_shallowest_pid1_in_its_netns(monkeypatch):
    """A rehearsal's container in a node is PID 1 of a PID namespace nested in the node's; after the host's PIDs
    wrapped its host PID (10104) sorts before the node's sshd (28723). The node's PID 1 is still the sshd."""
    from runbook.lab.netlab import host
    nspids = {10104: [10104, 5615, 1], 10521: [10521, 5640, 23], 28723: [28723, 1], 29019: [29019, 69]}
    monkeypatch.setattr(host, "netns_pids", lambda ns: sorted(nspids))
    monkeypatch.setattr(host, "_proc_nspid", lambda pid: nspids[pid])
    assert host.node_pid1("nl-head") == 28723
    monkeypatch.setattr(host, "netns_pids", lambda ns: [29019])          # PID 1 gone, a straggler left
    assert host.node_pid1("nl-head") is None


def test_a_marker_naming_a_folder_that_is_gone_blocks_nothing(tmp_path, monkeypatch):
    """CI's machine carried /run/spark-runbook-lab.json from a checkout at /check/work/main, a folder this
    machine never had: ``up`` refused for good, naming a `lab down --lab-dir` that could not work either."""
    from runbook.lab.netlab import health
    alive = []
    monkeypatch.setattr(health, "lab_present", lambda: True)
    monkeypatch.setattr(health, "any_node_alive", lambda d: alive.append(d) or True)
    marker = tmp_path / "marker.json"
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    marker.write_text('{"lab_dir": "%s"}' % (tmp_path / "gone"))
    assert health.other_running_lab(mine, marker) is None
    marker.write_text('{"lab_dir": "%s"}' % mine)
    assert health.other_running_lab(mine, marker) is None
    marker.write_text("not json")
    assert health.other_running_lab(mine, marker) is None
    assert alive == []
    other.mkdir()                                # another checkout's lab that still runs: refused as before
    marker.write_text('{"lab_dir": "%s"}' % other)
    assert health.other_running_lab(mine, marker) == str(other)
    assert alive == [other]
