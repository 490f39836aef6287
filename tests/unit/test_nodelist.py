"""Nodes as a list (issue 39 item 1): a profile names 2 to 8 nodes in one shape (HEAD_*, WORKER_*, WORKER2_* ...
WORKER7_*), numbered without gaps; the node count, the nodes in rank order and the fabric's topology are derived
from it, and validate refuses a gap, a half-configured node, a ninth node and a ring on the lab naming the key."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runbook.errors import ProfileError
from runbook.profile import (KEYS, MAX_NODES, NODE_KEY_SUFFIXES, NODE_NAMES, Profile, absent_node_keys,
                             load_profile, node_key)
from runbook.profile.rules import review_notes

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "env" / "lab.env"
NO_ENV: dict[str, str] = {}


def nodes_on(count: int, *, net: str = "169.254.77", **extra) -> dict[str, str]:
    """Overrides that turn env/lab.env into a ``count``-node profile (TP = count), fabric IPs on ``net``.0/24;
    a callable ``net`` gives each rank its own /24 (a switchless ring)."""
    out = {"NNODES": str(count), "TP": str(count)}
    for rank, name in enumerate(NODE_NAMES[:count]):
        ip = net(rank) if callable(net) else f"{net}.{rank + 1}"
        out[node_key(name, "IP")] = ip
        if rank >= 2:
            out[node_key(name, "SSH")] = f"spark-{name}"
            out[node_key(name, "CX7_IF")] = "enp1s0f0np0"
    return {**out, **extra}


def issues(overrides: dict[str, str], path: Path = LAB) -> list:
    with pytest.raises(ProfileError) as ei:
        load_profile(path, overrides, environ=NO_ENV)
    return ei.value.issues


# ----------------------------------------------------------------------------- the keys

def test_every_node_has_the_same_keys_of_the_same_type():
    assert NODE_NAMES == ("head", "worker", "worker2", "worker3", "worker4", "worker5", "worker6", "worker7")
    fields = Profile.model_fields
    for suffix in NODE_KEY_SUFFIXES:
        keys = [node_key(n, suffix) for n in NODE_NAMES]
        assert len(keys) == MAX_NODES and all(k in KEYS for k in keys), suffix
        head = fields[keys[0].lower()]
        for rank, key in enumerate(keys):
            f = fields[key.lower()]
            assert f.annotation == head.annotation and f.metadata == head.metadata, key
            assert f.get_default(call_default_factory=True) == head.get_default(call_default_factory=True), key
            assert f"rank {rank}" in f.description, (key, f.description)
        # declared together, in rank order (the order of the form, the docs and the env files)
        at = KEYS.index(keys[0])
        assert list(KEYS[at:at + MAX_NODES]) == keys


def test_absent_node_keys_are_those_of_the_missing_ranks():
    assert absent_node_keys(MAX_NODES) == ()
    three = absent_node_keys(3)
    assert three and len(three) == 5 * len(NODE_KEY_SUFFIXES)
    assert "WORKER3_SSH" in three and "WORKER7_BOOTSTRAP_IP" in three and "WORKER2_SSH" not in three


# ----------------------------------------------------------------------------- four and eight nodes

def test_four_node_switch_profile():
    p = load_profile(LAB, nodes_on(4), environ=NO_ENV)
    assert p.node_count == p.nnodes == 4 and p.topology == "switch"
    assert [(n.name, n.rank) for n in p.nodes] == [("head", 0), ("worker", 1), ("worker2", 2), ("worker3", 3)]
    assert [n.ssh for n in p.nodes] == ["spark-head", "spark-worker", "spark-worker2", "spark-worker3"]
    assert [n.fabric_ip for n in p.nodes] == [f"169.254.77.{r}" for r in range(1, 5)]
    assert p.nodes[3].fabric_if == "enp1s0f0np0" and p.node("worker3").rank == 3
    assert review_notes(p) == []


def test_eight_node_profile_every_rank():
    p = load_profile(LAB, nodes_on(8, TP="4", PP="2", ENFORCE_EAGER="0", LAB_CPU_BIND="0,1,1,1,1,1,1,1"), environ=NO_ENV)
    assert p.node_count == 8 and p.topology == "switch"
    assert [n.name for n in p.nodes] == list(NODE_NAMES) and [n.rank for n in p.nodes] == list(range(8))
    assert p.nodes[-1].ssh == "spark-worker7" and p.nodes[-1].fabric_ip == "169.254.77.8"
    assert [p.cpu_bind(r, cpus=2) for r in range(8)] == ["0"] + ["1"] * 7


def test_two_by_two_layout_on_four_nodes():
    p = load_profile(LAB, nodes_on(4, TP="2", PP="2", ENFORCE_EAGER="0"), environ=NO_ENV)
    assert (p.tp, p.pp, p.nnodes) == (2, 2, 4)


@pytest.mark.parametrize("count,topology", [(2, "cable"), (4, "ring"), (8, "ring")])
def test_topology_when_the_fabric_is_not_one_segment(count, topology):
    """Each rank on its own /24 (a recipe profile: loads, and validate's review names the ring's NCCL); three
    nodes (the triangle) are the shipped tp3 profiles, below."""
    path = REPO / "env" / "exl3-v41.env"
    base = load_profile(path, environ=NO_ENV)
    over = {"NNODES": str(count), "TP": str(count), "WEIGHT_SYNC": "rsync"}
    for rank, name in enumerate(NODE_NAMES[:count]):
        over[node_key(name, "IP")] = f"10.0.{rank if rank else count}.{rank + 1}" if count > 2 else \
            base.value(node_key(name, "IP"))
        if rank >= 2:
            over[node_key(name, "SSH")] = f"spark{rank + 1}"
            over[node_key(name, "CX7_IF")] = "enp1s0f0np0"
            over[node_key(name, "CX7_IB")] = "rocep1s0f0"
    p = load_profile(path, over, environ=NO_ENV)
    assert p.topology == topology
    notes = review_notes(p)
    if topology == "ring":
        assert len(notes) == 1 and "patched NCCL" in notes[0] and "sparkring" in notes[0]
    else:
        assert notes == []


def test_a_ring_is_refused_on_the_lab():
    over = nodes_on(4, net=lambda r: f"169.254.{70 + r}.{r + 1}")
    (iss,) = [i for i in issues(over) if "ring" in i.message]
    assert iss.key == "WORKER_IP" and "patched NCCL" in iss.message and "169.254.30" in iss.fix


# ----------------------------------------------------------------------------- refusals

def test_a_gap_in_the_node_list_is_refused_naming_both_keys():
    over = nodes_on(4)
    over["WORKER2_SSH"] = ""
    found = issues(over)
    gap = [i for i in found if "without gaps" in i.message]
    assert gap and gap[0].key == "WORKER3_SSH" and "WORKER2_SSH is empty" in gap[0].message
    assert "set WORKER2_SSH" in gap[0].fix


def test_a_gap_further_up_is_refused():
    over = {**nodes_on(3), "WORKER5_SSH": "spark-worker5", "WORKER5_IP": "169.254.77.6",
            "WORKER5_CX7_IF": "enp1s0f0np0"}
    gap = [i for i in issues(over) if "without gaps" in i.message]
    assert [i.key for i in gap] == ["WORKER5_SSH"] and "WORKER3_SSH is empty" in gap[0].message


@pytest.mark.parametrize("missing", ["WORKER3_IP", "WORKER3_CX7_IF", "WORKER7_IP"])
def test_a_set_node_needs_its_ip_and_netdev(missing):
    count = 8 if missing.startswith("WORKER7") else 4
    over = nodes_on(count, LAB_CPU_BIND=",".join("0" * count))
    over[missing] = ""
    found = issues(over)
    ssh = missing.split("_", 1)[0] + "_SSH"
    hit = [i for i in found if missing in i.message]
    assert hit and hit[0].key == ssh and f"set {missing}" in hit[0].fix and f"clear {ssh}" in hit[0].fix


def test_nnodes_must_equal_the_node_count():
    (iss,) = [i for i in issues(nodes_on(4, NNODES="3", TP="3")) if i.key == "NNODES"]
    assert "4 nodes are configured" in iss.message and "WORKER3_SSH" in iss.message and "NNODES=4" in iss.fix
    (iss,) = [i for i in issues(nodes_on(3, NNODES="4", TP="4")) if i.key == "NNODES"]
    assert "WORKER3_SSH empty" in iss.message and "set WORKER3_SSH" in iss.fix
    (iss,) = [i for i in issues(nodes_on(4, NNODES="2", TP="2")) if i.key == "NNODES"]
    assert "WORKER4_SSH empty" in iss.message and "clear WORKER2_SSH and the *_SSH after it (2 node(s))" in iss.fix


def test_a_ninth_node_is_refused():
    found = issues({**nodes_on(8), "WORKER8_SSH": "spark-worker8", "WORKER8_IP": "169.254.77.9"})
    keys = {i.key for i in found}
    assert {"WORKER8_SSH", "WORKER8_IP"} <= keys
    iss = next(i for i in found if i.key == "WORKER8_SSH")
    assert "at most 8 nodes" in iss.message and "node 9" in iss.message


def test_nine_in_nnodes_is_refused():
    (iss,) = [i for i in issues(nodes_on(8, NNODES="9", TP="9")) if i.key == "NNODES"]
    assert "8 nodes are configured" in iss.message and "at most 8" in iss.fix


# ----------------------------------------------------------------------------- the shipped profiles

@pytest.mark.parametrize("name,count,topology", [("lab.env", 2, "cable"), ("exl3-v41.env", 2, "cable"),
                                                  ("dspark-v4.env", 2, "cable"), ("tp3-dspark.env", 3, "triangle"),
                                                  ("lab-tp3.env", 3, "triangle")])
def test_shipped_profiles_keep_their_nodes(name, count, topology):
    p = load_profile(REPO / "env" / name, environ=NO_ENV)
    assert p.node_count == count and p.topology == topology
    assert [n.name for n in p.nodes] == list(NODE_NAMES[:count])
    # the file lists no key of a node it cannot have beyond worker2
    assert not set(p.key_lines) & set(absent_node_keys(3))


def test_cli_names_nodes_from_the_profile():
    r = subprocess.run([sys.executable, "-m", "runbook", "logs", "worker2", "--profile", "env/lab.env"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "no node 'worker2'" in r.stderr and "head, worker" in r.stderr


def test_the_node_helpers_doctests_hold():
    import doctest

    import runbook.profile.nodes as nodes
    result = doctest.testmod(nodes)
    assert result.attempted >= 5 and result.failed == 0


def test_cli_validate_lists_a_ring_for_review():
    over = []
    for rank, name in enumerate(NODE_NAMES[:4]):
        over += ["-p", f"{node_key(name, 'IP')}=10.0.{rank + 1}.{rank + 1}"]
        if rank >= 2:
            over += ["-p", f"{node_key(name, 'SSH')}=spark{rank + 1}", "-p", f"{node_key(name, 'CX7_IF')}=enp1s0f0np0",
                     "-p", f"{node_key(name, 'CX7_IB')}=rocep1s0f0"]
    r = subprocess.run([sys.executable, "-m", "runbook", "validate", "--profile", "env/exl3-v41.env", "-p", "NNODES=4",
                        "-p", "TP=4", "-p", "WEIGHT_SYNC=rsync", *over], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith("worker2 spark3, worker3 spark4; topology ring)")
    assert lines[1].startswith("review: topology ring (4 nodes") and "patched NCCL" in lines[1]


# ----------------------------------------------------------------------------- recipe B's two-port rule by topology

TP3 = REPO / "env" / "tp3-dspark.env"


def test_one_port_per_node_is_refused_on_the_triangle_only():
    """Recipe B's HCA rule: on the triangle (and a ring) every node reaches its two neighbours over its two CX ports;
    on a switch every peer is behind the one port."""
    one_port = {"WORKER_CX7_IB": "rocep1s0f0"}
    hit = [i for i in issues(one_port, TP3) if i.key == "WORKER_CX7_IB"]
    assert hit and "the triangle" in hit[0].message and "both CX ports" in hit[0].fix
    switch = {**one_port, "WORKER2_IP": "10.0.22.3"}
    p = load_profile(TP3, switch, environ=NO_ENV)
    assert p.topology == "switch" and p.worker_cx7_ib == ["rocep1s0f0"]
