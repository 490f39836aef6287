"""WEIGHT_SYNC=nfs past two nodes (issue 39 item 5): on a switch one export lists every worker's fabric address
(each worker's share writes the same line, so no share drops another worker's access); on a triangle or a ring,
where a worker off the head's first link does not reach HEAD_IP, validate refuses it naming WEIGHT_SYNC."""
from __future__ import annotations

import re

import pytest

from runbook.errors import ProfileError, RunbookError
from runbook.profile import REPO_ROOT, load_profile
from runbook.review import review
from runbook.weights.sharing import exported_clients
from runbook.weights_tools.nfs import export_line, render_nfs

ENV = REPO_ROOT / "env"
OPTS = "(ro,sync,no_subtree_check,root_squash)"


def issues(name: str, **overrides) -> list:
    try:
        load_profile(ENV / name, overrides, environ={})
    except ProfileError as err:
        return err.issues
    return []


def test_nfs_on_a_switch_validates_and_a_triangle_or_ring_is_refused_naming_the_key():
    assert issues("tp4-v41.env", WEIGHT_SYNC="nfs") == []                       # 4 Sparks on one /24
    assert issues("lab-tp4.env", WEIGHT_SYNC="nfs") == []
    assert issues("lab-tp2pp2.env", WEIGHT_SYNC="nfs") == []
    tri = issues("tp3-dspark.env", WEIGHT_SYNC="nfs")
    assert [i.key for i in tri] == ["WEIGHT_SYNC"]
    assert "3-node triangle" in tri[0].message and "rsync" in tri[0].fix
    # the four-Spark profile re-addressed off one /24: the switchless ring
    ring = issues("tp4-v41.env", WEIGHT_SYNC="nfs", WORKER_IP="192.168.193.4", WORKER3_IP="192.168.194.1")
    assert "WEIGHT_SYNC" in [i.key for i in ring]
    msg = next(i for i in ring if i.key == "WEIGHT_SYNC").message
    assert "4-node ring" in msg and "HEAD_IP=192.168.192.2" in msg


def test_export_line_lists_every_worker_once_in_rank_order():
    line = export_line("/srv/m", ["10.0.0.3", "10.0.0.4", "10.0.0.3"])
    assert line == f'"/srv/m" 10.0.0.3{OPTS} 10.0.0.4{OPTS}'
    assert export_line("/srv/m", "10.0.0.2") == f'"/srv/m" 10.0.0.2{OPTS}'                   # one worker: as before
    with pytest.raises(RunbookError, match="one IPv4"):
        export_line("/srv/m", ["10.0.0.2", "10.0.0.0/24"])                                     # never a subnet
    with pytest.raises(RunbookError, match="at least one worker"):
        export_line("/srv/m", [])


def test_render_nfs_exports_to_all_and_mounts_on_the_one_worker():
    cmds = render_nfs("/srv/m", "10.0.0.1", "10.0.0.3", "/mnt/m", export_to=["10.0.0.2", "10.0.0.3", "10.0.0.4"])
    tee = next(c for c in cmds["head"] if " tee " in c)
    assert f"10.0.0.2{OPTS} 10.0.0.3{OPTS} 10.0.0.4{OPTS}" in tee
    assert any("mount -t nfs4" in c and "10.0.0.1:/srv/m" in c for c in cmds["worker"])
    with pytest.raises(RunbookError, match="does not list the worker"):
        render_nfs("/srv/m", "10.0.0.1", "10.0.0.5", "/mnt/m", export_to=["10.0.0.2"])


def test_exported_clients_reads_one_line_per_client():
    listing = ("/srv/m  \t10.0.0.2(sync,wdelay,hide,no_subtree_check,sec=sys,ro,secure,root_squash,no_all_squash)\n"
               "/srv/m  \t10.0.0.3(sync,wdelay,hide,no_subtree_check,sec=sys,ro,secure,root_squash,no_all_squash)\n"
               "/srv/other\t10.0.0.9(rw)\n")
    got = exported_clients(listing, "/srv/m")
    assert list(got) == ["10.0.0.2", "10.0.0.3"] and all({"ro", "root_squash"} <= set(o) for o in got.values())
    assert got["10.0.0.2"][:3] == ["sync", "wdelay", "hide"]                     # exportfs's own order, shown as is
    assert exported_clients("", "/srv/m") == {}


def test_the_rendered_four_spark_share_exports_to_every_worker(monkeypatch):
    """The offline review of 02 on the four-Spark profile with WEIGHT_SYNC=nfs: each worker's share writes the
    exports line naming all three workers, and mounts the head's one address."""
    monkeypatch.setenv("HF_TOKEN", "hf_reviewsecret0123456789")
    text = review(str(ENV / "tp4-v41.env"), home="/home/ops", overrides={"WEIGHT_SYNC": "nfs"}, step="02")
    p = load_profile(ENV / "tp4-v41.env")
    workers = [n for n in p.nodes if n.name != "head"]
    everyone = " ".join(f"{n.fabric_ip}{OPTS}" for n in workers)
    for share in ("weights", "engram"):                      # recipe A shares the Engram source the same way
        tees = [l for l in text.splitlines() if "[head] [run] printf" in l and f"spark-runbook-{share}.exports" in l]
        assert len(tees) == len(workers) == 3 and all(everyone in t for t in tees), (share, tees)
    for n in workers:
        mounts = [l for l in text.splitlines() if l.startswith(f"[{n.name}] [run] ") and "mount -t nfs4" in l]
        assert len(mounts) == 2 and all(f" {p.head_ip}:/home/ops/" in m for m in mounts), (n.name, mounts)
    assert not re.search(r"exports.*\b192\.168\.192\.2\(", text)             # never the head itself
