"""The lab's non-root operator (issue 23 item 3), measured on the nodes with the real sudo, sshd and dockerd:

- it exists only inside the nodes (not on this machine), is not root, logs in with the lab key, and reaches the
  node's dockerd through the docker group;
- its /etc/sudoers.d holds exactly the runbook's drop-in (``weights_tools.nfs.sudoers_line``), nothing more;
- with that drop-in a probe of ``sudo -n true`` (what the runbook probed before a4d36a1) is refused, although sudo
  allows every command the kernel NFS mode runs as root: that probe would have stopped a correctly prepared
  Spark. The runbook's probe (``sudo -n -l <command>`` per command) says yes, the commands then really run
  through ``sudo -n``, and a command outside the drop-in stays refused.
"""
from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from runbook.lab.netlab.spec import OPERATOR, OPERATOR_UID
from runbook.profile import load_profile
from runbook.remote import Cluster, quote
from runbook.weights import sharing
from runbook.weights_tools import nfs

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0, reason="the netns lab needs root")]
LAB_ENV = Path(__file__).resolve().parents[2] / "env" / "lab.env"


@pytest.fixture(scope="module")
def clusters(lab):
    """The lab's nodes as the operator and as root (the same nodes, the same key)."""
    as_op = load_profile(LAB_ENV, {"HEAD_SSH": f"{OPERATOR}@spark-head", "WORKER_SSH": f"{OPERATOR}@spark-worker"})
    with Cluster.from_profile(as_op) as op, Cluster.from_profile(load_profile(LAB_ENV)) as root:
        yield op, root


def test_the_operator_exists_only_in_the_nodes_and_uses_docker_through_its_group(clusters):
    op, _ = clusters
    with pytest.raises(KeyError):
        pwd.getpwnam(OPERATOR)                  # this machine's users are untouched
    for node in op:
        ident = node.read("id -u; id -un; id -nG; printf %s \"$HOME\"", timeout=20)
        uid, name, groups, home = ident.stdout.splitlines()
        assert (int(uid), name, home) == (OPERATOR_UID, OPERATOR, f"/home/{OPERATOR}"), ident.stdout
        assert "docker" in groups.split() and "sudo" not in groups.split()
        docker = node.read("docker version --format '{{.Server.Version}}'", timeout=30)
        assert docker.ok and docker.stdout.strip(), docker.stderr
        assert not node.read("test -w /etc/sudoers.d", timeout=20).ok               # not root


def test_sudoers_d_holds_exactly_the_runbooks_drop_in(clusters):
    op, root = clusters
    for node in root:
        listing = node.read("ls -A /etc/sudoers.d; stat -c '%a %U' /etc/sudoers.d/spark-runbook", timeout=20)
        assert listing.stdout.splitlines() == ["spark-runbook", "440 root"], listing.stdout
        text = node.read(f"cat {nfs.SUDOERS_FILE}", timeout=20).stdout
        assert text == nfs.sudoers_line(OPERATOR) + "\n"
        assert node.read(f"visudo -c -f {nfs.SUDOERS_FILE}", timeout=20).ok
    for node in op:                              # what sudo itself says the operator may do
        listed = node.read("sudo -n -l", timeout=20)
        assert listed.ok, listed.stderr
        allowed = listed.stdout.split("NOPASSWD:", 1)[1]
        assert [a.strip() for a in allowed.split(",")] == [f"{p} {a}".strip() for p, a in nfs.SUDO_RULES], listed.stdout
        assert listed.stdout.count("NOPASSWD:") == 1 and "ALL" not in allowed, listed.stdout


def test_sudo_n_true_is_the_wrong_probe_and_the_runbooks_probe_is_right(clusters):
    op, root = clusters
    head, worker = op.head, op.worker
    export = f"/home/{OPERATOR}/.cache/spark-runbook-sudo-probe"
    cmds = nfs.render_nfs(export, head.spec.fabric_ip, worker.spec.fabric_ip, export, name="sudo-probe",
                          head_sudo=True, worker_sudo=True)
    # the old probe: refused with the prescribed drop-in, so it would have stopped a correctly prepared node
    old = head.read("sudo -n true", timeout=20)
    assert not old.ok and "password is required" in (old.stderr + old.stdout), (old.exit_code, old.stderr)
    # the runbook's probe: every command of the kernel NFS mode allowed, on both nodes
    assert nfs.sudo_check(head, cmds["head"]) is None and nfs.sudo_check(worker, cmds["worker"]) is None
    row = sharing.sudo_allowed_row(head, cmds["head"])
    assert row.status.value == "PASS" and f"as {OPERATOR}" in row.observed
    # ... and it is right: the commands run through sudo -n for real (the head's exports file, node-private)
    exports = nfs.exports_file("sudo-probe")
    try:
        head.run(f"{cmds['head'][0]} && {cmds['head'][1]}", timeout=30)
        assert head.read(f"cat {exports}", timeout=20).stdout.strip() == nfs.export_line(export, worker.spec.fabric_ip)
        assert root.head.read(f"stat -c %U {exports}", timeout=20).stdout.strip() == "root"
    finally:
        head.run(f"sudo -n rm -f {exports}", timeout=20, warn=True)
    assert not root.head.read(f"test -e {exports}", timeout=20).ok
    assert not Path(exports).exists()            # the node's /etc/exports.d, not this machine's
    # what the drop-in does not list stays refused, probed or run
    assert not head.read("sudo -n -l true", timeout=20).ok
    assert not head.read("sudo -n id -u", timeout=20).ok
    assert not head.read("sudo -n -l tee /etc/passwd", timeout=20).ok
    # a refusal names the command and the drop-in (what preflight and step 02 print)
    refused = nfs.sudo_check(head, ["sudo -n chown root /tmp"])
    assert refused is not None and refused.failed and nfs.sudoers_line(OPERATOR) in refused.fix


def test_network_tool_install_asks_sudo_first_then_runs_through_the_drop_in(clusters):
    """INSTALL_NET_TOOLS=1 as the operator, on a node without nccl-tests and NCCL's headers (the lab has neither
    outside a rehearsal): with the NFS drop-in only, sudo refuses step 01's apt-get and the row FAILs before
    anything is installed, naming the drop-in for exactly that command; with that drop-in (node-private
    /etc/sudoers.d), the apt-get really runs through ``sudo -n`` and the failure is apt's own: Debian has no
    ``libnccl-dev`` (NVIDIA's CUDA repository, configured on DGX OS, holds it)."""
    from runbook.network import tools
    op, root = clusters
    as_op = load_profile(LAB_ENV, {"HEAD_SSH": f"{OPERATOR}@spark-head", "WORKER_SSH": f"{OPERATOR}@spark-worker"})
    head = op.head
    found = tools.locate(head, as_op, need_perftest=True, need_nccl=True)
    assert found.missing(True, True) == ["all_reduce_perf", "nccl.h"], found
    cmds = tools.install_commands(found, True, True)
    assert cmds[0] == "sudo -n apt-get install -y libnccl-dev", cmds
    refused = tools.tools_check(head, found, need_perftest=True, need_nccl=True, install=True)
    assert refused.failed and "sudo refuses `apt-get install -y libnccl-dev`" in refused.observed, refused
    assert "`sudo -n -l apt-get install -y libnccl-dev`: exit 1" in refused.observed     # sudo -l says no by rc only
    line = tools.net_tools_sudoers_line(OPERATOR, cmds)
    assert line in refused.fix and tools.NET_TOOLS_SUDOERS in refused.fix
    path = tools.NET_TOOLS_SUDOERS
    try:
        root.head.run(f"printf '%s\\n' {quote(line)} > {path} && chmod 0440 {path} && visudo -cf {path}",
                      timeout=20)
        ran = tools.tools_check(head, found, need_perftest=True, need_nccl=True, install=True)
    finally:
        root.head.run(f"rm -f {path}", timeout=20, warn=True)
    assert ran.failed and "installing all_reduce_perf, nccl.h" in ran.observed, ran
    assert "Unable to locate package libnccl-dev" in ran.observed, ran.observed        # apt's words, not sudo's
    assert not root.head.read(f"test -e {path}", timeout=20).ok
