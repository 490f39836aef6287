"""Issue 22 defect 2 and item 3: the kernel NFS sudo probe asks about exactly the commands the prescribed
drop-in allows (one definition, ``sharing.SUDO_RULES``), and preflight checks the node's python3, the NFS
packages and those sudo rules before the download."""
from __future__ import annotations

import fnmatch
import posixpath
from pathlib import Path

import pytest

from runbook.preflight import node_needs
from runbook.profile import load_profile
from runbook.weights import sharing as W
from tests.support.doubles import FakeCluster, FakeNode, res

ENV = Path(__file__).resolve().parents[2] / "env"
USER = "/home/spark\n1000\nspark\n"


def _allowed(argv: list[str]) -> bool:
    """What sudo decides for the drop-in built from SUDO_RULES (sudoers: the command by its full path;
    an argument pattern is matched against the arguments joined by spaces, wildcards as fnmatch)."""
    prog, args = argv[0], " ".join(argv[1:])
    for path, pattern in W.SUDO_RULES:
        if posixpath.basename(path) == prog and (not pattern or fnmatch.fnmatchcase(args, pattern)):
            return True
    return False


def test_every_sudo_command_the_nfs_mode_renders_is_allowed_by_the_drop_in():
    cmds = W.render_nfs("/home/spark/.cache/m x", "10.0.0.1", "10.0.0.2", "/home/spark/m", name="engram",
                        head_sudo=True, worker_sudo=True)
    argvs = W.sudo_argvs(c for group in cmds.values() for c in group)
    assert len(argvs) >= 7, argvs       # mkdir, tee, exportfs -ra, exportfs -v, mkdir, mount, rm, umount
    assert [a for a in argvs if not _allowed(a)] == []
    assert ["tee", "/etc/exports.d/spark-runbook-engram.exports"] in argvs
    assert ["mkdir", "-p", "/home/spark/m"] in argvs                  # `2>/dev/null`'s fd is not an argument
    # the fix prints the same rules
    fix = W.sudoers_fix("spark", "head")
    assert all(f"{p} {a}".strip() in fix for p, a in W.SUDO_RULES) and "NOPASSWD" in fix
    assert not _allowed(["true"])       # what a4d36a1 probed: the drop-in never allowed it


def _sudo_node(name, rank, *, refuse=()):
    """A node whose sudo follows exactly the drop-in (SUDO_RULES); `sudo -n true` is refused as real sudo does."""
    def probe(command):
        import shlex
        argv = shlex.split(command)[3:]
        if argv[0] in refuse or not _allowed(argv):
            return res(1, "", "")
        return res(0, f"/usr/bin/{argv[0]} {' '.join(argv[1:])}\n")
    return FakeNode(name, rank, rules=[(r"^sudo -n -l ", probe),
                                       (r"^sudo -n true$", res(1, "", "sudo: a password is required")),
                                       (r'^printf "%s', USER)])


def test_sudo_check_passes_with_the_prescribed_drop_in():
    head = _sudo_node("head", 0)
    cmds = W.render_nfs("/w", "10.0.0.1", "10.0.0.2", "/m", head_sudo=True, worker_sudo=True)
    assert W.sudo_check(head, cmds["head"]) is None
    assert head.reads() and all(c.startswith("sudo -n -l ") for c in head.reads())


def test_sudo_check_names_the_refused_command_and_the_drop_in():
    worker = _sudo_node("worker", 1, refuse=("mount",))
    cmds = W.render_nfs("/w", "10.0.0.1", "10.0.0.2", "/m", head_sudo=True, worker_sudo=True)
    row = W.sudo_check(worker, cmds["worker"])
    assert row is not None and row.failed
    assert "sudo -n -l mount -t nfs4" in row.observed and "spark ALL=(root) NOPASSWD: /usr/bin/mkdir" in row.fix


@pytest.mark.parametrize("text,ok", [("3.12.3\n", True), ("3.8.10", True), ("3.6.9", False),
                                     ("bash: python3: command not found", False)])
def test_python_check(text, ok):
    node = FakeNode("worker", 1, rules=[(r"^python3 -c ", res(0 if ok or "." in text else 127, text))])
    row = node_needs.python_check(node)
    assert row.failed is (not ok)


def _reach_answer(command: str) -> str:
    """The head as DGX OS makes it, before the download: /home/spark 0750, umask 0022, nothing exported yet."""
    path = command.split("p=", 1)[1].split(";", 1)[0]
    lines, p = ["0022"], path
    while p != "/home/spark/.cache":
        lines.append(f"missing {p}")
        p = posixpath.dirname(p)
    lines += ["have 755 spark /home/spark/.cache", "have 750 spark /home/spark", "have 755 root /home",
              "have 755 root /"]
    return "\n".join(lines) + "\n"


def _nfs_cluster(*, head_programs="exportfs /usr/sbin/exportfs\nrpcinfo /usr/sbin/rpcinfo\n",
                 worker_programs="mount.nfs4 /usr/sbin/mount.nfs4\n"):
    head, worker = _sudo_node("head", 0), _sudo_node("worker", 1)
    head.rules.insert(0, (r"command -v exportfs", head_programs))
    head.rules.insert(0, (r"^umask; p=", _reach_answer))
    worker.rules.insert(0, (r"command -v mount.nfs4", worker_programs))
    for n in (head, worker):
        n.rules.insert(0, (r"^python3 -c ", "3.12.3\n"))
    return head, worker


def test_preflight_nfs_rows_for_a_non_root_user():
    profile = load_profile(ENV / "exl3-v41.env")
    assert profile.weight_sync == "nfs" and profile.engram
    head, worker = _nfs_cluster(worker_programs="mount.nfs4 -\n")
    rows = node_needs.node_needs(FakeCluster([head, worker]), profile)
    got = {(c.name, c.node): c for c in rows}
    assert got[("nfs sudo rules", "head")].status.value == "PASS"
    assert got[("nfs sudo rules", "worker")].status.value == "PASS"
    assert got[("nfs packages", "head")].status.value == "PASS"
    miss = got[("nfs packages", "worker")]
    assert miss.failed and "sudo apt-get install -y nfs-common" in miss.fix
    # the probe covered the Engram export too, with the head's real paths
    assert any("spark-runbook-engram.exports" in c for c in head.reads())
    # a 0750 home under root_squash: the worker's container (root -> nobody) could not read the share
    reach = got[(node_needs.REACH_ROW, "head")]
    assert reach.failed and "/home/spark is 750 (spark): others cannot enter it" in reach.observed
    assert reach.fix.startswith("on the head: chmod o+x /home/spark")
    assert "/srv/models" in reach.fix and "no_root_squash" in reach.fix
    assert sum(c.startswith("umask; p=") for c in head.reads()) == 2      # the weights and the Engram source
    assert all(n.runs() == [] for n in (head, worker))              # preflight changes nothing


def test_preflight_nfs_rows_not_applicable_without_nfs():
    profile = load_profile(ENV / "dspark-v4.env", {"WEIGHT_SYNC": "rsync"})
    rows = node_needs.nfs_checks(FakeCluster([FakeNode("head", 0), FakeNode("worker", 1)]), profile)
    assert [c.status.value for c in rows] == ["N/A"]
