"""The lab's shapes (runbook.lab.netlab.spec, network, files): 2 nodes on a cable, 3 on the triangle, 3 to 8 on a
switch (one bridge ``nlsw0`` with MTU 9000, each node's first CX-7 port at ``169.254.30.<rank + 1>/24``), and the
topology ``ensure_lab`` takes from a profile's node list. Rendered, not run: the lab itself is tests/lab."""
from __future__ import annotations

import ipaddress

import pytest

from runbook.errors import LabError
from runbook.profile import load_profile
from runbook.profile.nodes import node_key
from runbook.profile.model import REPO_ROOT as REPO
from runbook.lab.control import lab_topology
from runbook.lab.netlab import network
from runbook.lab.netlab.files import write_files
from runbook.lab.netlab.health import repairs
from runbook.lab.netlab.spec import (GUARD_ROUTES, NODE_NAMES, SWITCH, all_addresses, check_shape, default_topology,
                                     node_specs, peer_address)


@pytest.mark.parametrize("count", [4, 8])
def test_switch_nodes_have_rank_names_and_one_switch_address(count):
    specs = node_specs(count)
    assert default_topology(count) == "switch"
    assert [n.name for n in specs] == ["head", "worker", *(f"worker{k}" for k in range(2, count))]
    assert [n.alias for n in specs] == [f"spark-{n.name}" for n in specs]
    assert [n.netns for n in specs] == [f"nl-{n.name}" for n in specs]
    assert [n.mgmt_ip for n in specs] == [f"10.77.0.{11 + r}" for r in range(count)]
    assert [n.ports for n in specs] == [(("enp1s0f0np0", f"169.254.30.{r + 1}"),) for r in range(count)]
    assert all((n.fabric_if, n.fabric_ip) == n.ports[0] for n in specs)
    # every peer by its switch address from every node (/etc/hosts), none unreachable
    assert {peer_address(count, a.name, b.name) for a in specs for b in specs if a is not b} == \
        {f"169.254.30.{r + 1}" for r in range(count)}


@pytest.mark.parametrize("count", [4, 8])
def test_switch_links_are_one_port_per_node_on_the_bridge(count):
    cmds = network._link_cmds(node_specs(count), count, "switch")
    ports = [c for c in cmds if c.startswith("link add nl-s-")]
    assert len(ports) == count
    for n in node_specs(count):
        assert (f"link add nl-s-{n.name} mtu 9000 type veth peer name enp1s0f0np0 mtu 9000 netns nl-{n.name}"
                in cmds)
        assert f"link set nl-s-{n.name} master {SWITCH} up" in cmds
        # the second CX-7 port is there, uncabled (an empty cage whose other end stays down in the root netns)
        assert any(c.startswith(f"link add nl-u-{n.name}-1 ") and c.endswith(f"enp1s0f1np1 mtu 9000 netns nl-{n.name}")
                   for c in cmds)
    assert not [c for c in cmds if "type veth" in c and "netns nl-" in c.split("peer")[0]]   # no node-to-node cable
    assert network._switch_cmds("switch") in ([], [f"link add {SWITCH} mtu 9000 type bridge", f"link set {SWITCH} up"])
    assert network._switch_cmds("cable") == []


def test_the_switch_subnet_is_guarded_and_its_addresses_pinned():
    assert "169.254.30.0/24" in GUARD_ROUTES
    for r, name in enumerate(NODE_NAMES):
        assert f"169.254.30.{r + 1}" in all_addresses(name)
    assert all(ipaddress.ip_network(g).is_private or g.startswith("169.254.") for g in GUARD_ROUTES)


def test_two_and_three_nodes_keep_their_cablings():
    assert [(n.fabric_if, n.fabric_ip) for n in node_specs(2)] == [("enp1s0f1np1", "169.254.77.1"),
                                                                   ("enp1s0f0np0", "169.254.77.2")]
    assert [n.fabric_ip for n in node_specs(3)] == ["169.254.22.1", "169.254.22.2", "169.254.23.3"]
    assert [n.fabric_ip for n in node_specs(3, "switch")] == ["169.254.30.1", "169.254.30.2", "169.254.30.3"]


@pytest.mark.parametrize("count,topology", [(1, None), (9, None), (4, "triangle"), (2, "switch"), (4, "ring"),
                                            (3, "cable")])
def test_shapes_the_lab_cannot_wire_are_refused(count, topology):
    with pytest.raises(LabError) as err:
        check_shape(count, topology or default_topology(count)) if count <= len(NODE_NAMES) else node_specs(count)
    assert "nodes" in str(err.value) or "topology" in str(err.value)


def test_files_name_every_node_by_alias_and_pin_its_switch_address(tmp_path):
    """ssh_config has an alias per node (up to worker7), known_hosts pins each host key for every address it may
    have; a 4-node switch lab's /etc/hosts names every peer by its switch address."""
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    write_files(lab_dir, node_specs(4), "switch")
    cfg = (lab_dir / "ssh_config").read_text()
    for r, name in enumerate(NODE_NAMES):
        assert f"Host spark-{name}\n  HostName 10.77.0.{11 + r}\n" in cfg
    pins = {line.split()[0].split(",")[0]: line.split()[0].split(",")
            for line in (lab_dir / "known_hosts").read_text().splitlines()}
    assert len(pins) == len(NODE_NAMES)
    assert "169.254.30.4" in pins["spark-worker3"] and "10.77.0.14" in pins["spark-worker3"]
    hosts = (lab_dir / "nodes" / "worker3" / "etc" / "hosts").read_text()
    assert [line for line in hosts.splitlines() if "spark-" in line] == [
        "169.254.30.1\tspark-head", "169.254.30.2\tspark-worker", "169.254.30.3\tspark-worker2",
        "169.254.30.4\tspark-worker3"]
    assert "169.254.30.*" in (lab_dir / "nodes" / "worker3" / "etc" / "ssh_config").read_text()


LAB = REPO / "env" / "lab.env"


def _on(count: int, net) -> dict[str, str]:
    """env/lab.env grown to ``count`` nodes, rank r at ``net(r)``."""
    out = {"NNODES": str(count), "TP": str(count), "WEIGHT_SYNC": "rsync"}
    for rank, name in enumerate(NODE_NAMES[:count]):
        out[node_key(name, "IP")] = net(rank)
        if rank >= 2:
            out[node_key(name, "SSH")] = f"spark-{name}"
            out[node_key(name, "CX7_IF")] = "enp1s0f0np0"
    return out


def test_the_profile_node_list_chooses_the_cabling():
    assert lab_topology(load_profile(LAB)) == "cable"
    assert lab_topology(load_profile(REPO / "env" / "lab-tp3.env")) == "triangle"
    assert lab_topology(load_profile(REPO / "env" / "lab-tp4.env")) == "switch"
    three = load_profile(REPO / "env" / "lab-tp3.env", {**_on(3, lambda r: f"169.254.30.{r + 1}"),
                                                        "HEAD_CX7_IF": "enp1s0f0np0", "WORKER_CX7_IF": "enp1s0f0np0"},
                         environ={})
    assert lab_topology(three) == "switch"
    # a switchless ring loads as a recipe profile (validate reviews its NCCL), but the lab cannot wire one
    ring = load_profile(REPO / "env" / "exl3-v41.env", {**_on(4, lambda r: f"10.0.{r or 4}.{r + 1}"),
                                                        "WORKER2_SSH": "spark3", "WORKER3_SSH": "spark4",
                                                        "WORKER2_CX7_IB": "rocep1s0f0", "WORKER3_CX7_IB": "rocep1s0f0"},
                        environ={})
    assert ring.topology == "ring"
    with pytest.raises(LabError, match="ring"):
        lab_topology(ring)


def test_a_switch_port_off_the_switch_is_not_repaired_in_place():
    """A node whose switch port left the bridge or went back to 1500 is rebuilt, not restarted."""
    node = {"alias": "spark-head", "netns_exists": True, "sshd_alive": False, "ssh_ok": False, "healthy": False,
            "ports": {"enp1s0f0np0": {"ip": "169.254.30.1", "state": "UP", "mtu": 9000}},
            "switch_port": {"name": "nl-s-head", "state": "UP", "mtu": 9000, "master": SWITCH}}
    st = {"state_file": True, "node_count": 4, "bridge_up": True, "guard_routes": {"x": True}, "nodes": {"head": node}}
    assert repairs(st, 4) == {"head": "node"}
    node["switch_port"]["mtu"] = 1500
    assert repairs(st, 4) is None
