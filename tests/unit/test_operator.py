"""Issue 23 item 3, a non-root operator: the lab's operator gets exactly the sudoers line the runbook prescribes
(one rendering), its own user and docker group inside the nodes; a rehearsal may log in as it (``--ssh-user``);
step 02's kernel NFS mode runs in the lab as that user up to nfsd (sudo probe, exports file, exportfs), never
passing what cannot run there; preflight's NFS rows are real in a rehearsal; a docker socket the user may not
open is named as the docker group."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from runbook import cli
from runbook.checks import Status
from runbook.errors import ExitStatus, ProfileError, RunbookError
from runbook.lab import control, rehearsal
from runbook.lab.netlab import files, spec
from runbook.preflight import node_needs
from runbook.preflight.verify import docker_fix
from runbook.profile import load_profile
from runbook.remote import Node, SshSettings
from runbook.weights import sharing as W
from runbook.weights_tools import nfs
from tests.support.doubles import FakeCluster, FakeNode, res

ENV = Path(__file__).resolve().parents[2] / "env"
OPERATOR = "/home/spark\n2626\nspark\n"
ROOT = "/root\n0\nroot\n"


# -- the drop-in: one rendering -------------------------------------------------------------------------------

def test_sudoers_line_is_the_line_the_fix_prints_and_names_every_rule():
    line = nfs.sudoers_line("spark")
    assert line.startswith("spark ALL=(root) NOPASSWD: /usr/bin/mkdir, ")
    assert line.split("NOPASSWD: ", 1)[1].split(", ") == [f"{p} {a}".strip() for p, a in nfs.SUDO_RULES]
    assert f"echo '{line}' | sudo tee {nfs.SUDOERS_FILE}" in nfs.sudoers_fix("spark", "head")


@pytest.mark.parametrize("user", ["", "-x", "a b", "root,spark", "ALL=(ALL)", "spark\n"])
def test_sudoers_line_refuses_a_name_that_is_not_a_login_name(user):
    with pytest.raises(RunbookError, match="sudoers user name"):
        nfs.sudoers_line(user)


def test_export_line_and_file_are_what_render_nfs_writes():
    cmds = nfs.render_nfs("/home/spark/m x", "10.0.0.1", "10.0.0.2", "/m", name="engram", head_sudo=True)
    line = nfs.export_line("/home/spark/m x", "10.0.0.2")
    assert line == '"/home/spark/m x" 10.0.0.2(ro,sync,no_subtree_check,root_squash)'
    assert cmds["head"][1] == f"printf '%s\\n' {shlex.quote(line)} | sudo -n tee {nfs.exports_file('engram')} >/dev/null"
    with pytest.raises(RunbookError):
        nfs.export_line("/w", "10.0.0.0/24")


# -- the lab's operator files (pure) ----------------------------------------------------------------------------

HOST_PASSWD = "root:x:0:0:root:/root:/bin/bash\nsshd:x:102:65534::/run/sshd:/usr/sbin/nologin\nold:x:2626:2626::/x:/bin/sh\n"
HOST_GROUP = "root:x:0:\nssl-cert:x:103:postgres\ndocker:x:106:\n"


def test_passwd_with_adds_the_operator_once_and_drops_a_clash():
    text = files.passwd_with(HOST_PASSWD, "spark", 2626, "/home/spark")
    lines = text.splitlines()
    assert lines[:2] == HOST_PASSWD.splitlines()[:2]
    assert [ln for ln in lines if ":2626:" in ln] == ["spark:*:2626:2626:Spark Runbook lab operator:/home/spark:/bin/bash"]
    assert files.passwd_with(text, "spark", 2626, "/home/spark") == text          # idempotent


def test_group_with_puts_the_operator_in_docker_and_its_own_group():
    text = files.group_with(HOST_GROUP, "spark", 2626)
    assert "docker:x:106:spark" in text.splitlines() and "spark:x:2626:" in text.splitlines()
    assert "ssl-cert:x:103:postgres" in text.splitlines()
    assert files.group_with(text, "spark", 2626) == text
    with_member = files.group_with("docker:x:106:alice\n", "spark", 2626)
    assert "docker:x:106:alice,spark" in with_member.splitlines()
    added = files.group_with("root:x:0:\nusers:x:101:\n", "spark", 2626)       # a host without docker
    assert "docker:x:102:spark" in added.splitlines()


def test_node_private_paths_cover_what_the_operator_changes():
    assert set(spec.NODE_PRIVATE.values()) >= {"/etc/passwd", "/etc/group", "/etc/sudoers.d", "/etc/exports.d",
                                               "/home", "/var/lib/nfs"}
    assert Path(nfs.SUDOERS_FILE).parent.as_posix() in spec.NODE_PRIVATE.values()
    assert nfs.EXPORTS_DIR in spec.NODE_PRIVATE.values()


# -- a rehearsal as the operator --------------------------------------------------------------------------------

def test_as_user():
    assert rehearsal.as_user("spark-head", "spark") == "spark@spark-head"
    assert rehearsal.as_user("root@spark-head", "spark") == "spark@spark-head"
    assert rehearsal.as_user("spark-head", "root") == "spark-head" and rehearsal.as_user("spark-head", "") == "spark-head"
    assert rehearsal.as_user("", "spark") == ""


@pytest.mark.parametrize("path", ["exl3-v41.env", "tp3-dspark.env"])
def test_substitutions_as_the_operator_change_only_the_ssh_targets(path):
    profile = load_profile(ENV / path)
    as_root, as_op = rehearsal.substitutions(profile), rehearsal.substitutions(profile, ssh_user="spark")
    assert [s.key for s in as_root] == [s.key for s in as_op] and as_root
    changed = {s.key: s for s, r in zip(as_op, as_root) if s != r}
    assert set(changed) == {k for k in rehearsal.SSH_KEYS if profile.value(k)}
    for key, sub in changed.items():
        assert sub.lab == f"spark@spark-{rehearsal.SSH_KEYS[key]}" and sub.kind == "lab"
        assert "non-root operator spark" in sub.why and "sudoers drop-in" in sub.why
    assert rehearsal.count([s.to_dict() for s in as_op]) == rehearsal.count([s.to_dict() for s in as_root])


def test_an_unknown_lab_user_is_refused_before_anything_loads():
    with pytest.raises(ProfileError, match="--ssh-user bob"):
        rehearsal.load_rehearsal(ENV / "exl3-v41.env", ssh_user="bob")


def test_load_rehearsal_as_the_operator():
    profile, overrides, _ = rehearsal.load_rehearsal(ENV / "exl3-v41.env", ssh_user="spark")
    assert [n.ssh for n in profile.nodes] == ["spark@spark-head", "spark@spark-worker"]
    assert overrides["HEAD_SSH"] == "spark@spark-head"


def test_ssh_user_without_rehearse_is_a_usage_error(capsys):
    assert cli.main(["run", "--profile", "env/exl3-v41.env", "--ssh-user", "spark"]) == ExitStatus.INVALID
    assert "--rehearse" in capsys.readouterr().err


def test_lab_root_is_the_node_for_root_and_a_root_login_for_the_operator():
    settings = SshSettings()
    as_root = FakeNode("head", 0, ssh="spark-head")
    with control.lab_root(as_root) as node:
        assert node is as_root
    op = Node(load_profile(ENV / "lab.env", {"HEAD_SSH": "spark@spark-head"}).nodes[0], settings)
    with control.lab_root(op) as node:
        assert node is not op and node.spec.ssh == "spark-head" and node.spec.fabric_ip == op.spec.fabric_ip
        assert node._conn is None                      # lazy: nothing connects until a command runs


# -- step 02's kernel NFS mode in the lab, as the profile's user ----------------------------------------------

def _allowed(argv):
    import fnmatch
    import posixpath
    return any(posixpath.basename(p) == argv[0] and (not a or fnmatch.fnmatchcase(" ".join(argv[1:]), a))
               for p, a in nfs.SUDO_RULES)


def etab(exports_text):
    """What `exportfs -v` prints for an exports file's lines (path, then client(options) on the next line)."""
    out = []
    for line in exports_text.splitlines():
        path, client = shlex.split(line)
        out.append(f"{path}\n\t\t{client.replace('(', '(wdelay,hide,sec=sys,', 1)}")
    return "\n".join(out) + "\n"


def _lab_node(name, rank, user, *, refuse=(), exports=None):
    def probe(command):
        argv = shlex.split(command)[3:]
        return res(0, f"/usr/bin/{argv[0]}\n") if argv[0] not in refuse and _allowed(argv) else res(1, "", "")
    written = {}

    def tee(command):
        written["line"] = shlex.split(command.split(" | ")[0])[-1]
        return res(0, "")
    return FakeNode(name, rank, ssh=f"spark@spark-{name}", rules=[
        (r"^sudo -n -l ", probe, "read"),
        (r'^printf "%s', user, "read"),
        (r"mkdir -p /etc/exports\.d && printf", tee, "run"),
        (r"^cat /etc/exports\.d/", lambda c: exports if exports is not None else written.get("line", "") + "\n", "read"),
        (r"exportfs -ra$", res(0, "", "exportfs: could not open /proc/fs/nfs/exports for locking"), "run"),
        (r"exportfs -v$", lambda c: res(0, etab(exports if exports is not None else written.get("line", ""))), "read"),
        (r"^rpcinfo -t ", res(1, "", "rpcinfo: RPC: Program not registered\nprogram 100003 version 4 is not available"),
         "read"),
        (r"^mkdir -p .* \|\| ", res(0, ""), "run"),
    ])


def test_kernel_nfs_runs_as_the_operator_up_to_nfsd_and_never_passes_the_server():
    head, worker = _lab_node("head", 0, OPERATOR), _lab_node("worker", 1, OPERATOR)
    rows = W.kernel_nfs_until_server(head, worker, "/home/spark/.cache/m", "/home/spark/.cache/m", name="weights")
    got = {(c.name, c.node): c for c in rows}
    assert [c.name for c in rows] == ["weights.nfs.sudo", "weights.nfs.sudo", "weights.nfs.exports",
                                      "weights.nfs.exportfs", "weights.nfs.kernel_server", "weights.nfs.mountpoint"]
    exportfs = got[("weights.nfs.exportfs", "head")]
    assert exportfs.status is Status.PASS and "/home/spark/.cache/m 10.0.0.2(wdelay,hide,sec=sys,ro," in exportfs.observed
    assert got[("weights.nfs.sudo", "head")].status is Status.PASS
    assert "as spark" in got[("weights.nfs.sudo", "head")].observed
    assert got[("weights.nfs.exports", "head")].status is Status.PASS
    assert "10.0.0.2(ro,sync,no_subtree_check,root_squash)" in got[("weights.nfs.exports", "head")].observed
    server = got[("weights.nfs.kernel_server", "head")]
    assert server.status is Status.NA and "no nfsd" in server.observed and "exit 1: program 100003" in server.observed
    assert got[("weights.nfs.mountpoint", "worker")].status is Status.PASS
    # as the operator every root command went through sudo -n, and what it ran is what the probe asked about
    assert [c for c in head.runs()] == [
        "sudo -n mkdir -p /etc/exports.d && printf '%s\\n' '\"/home/spark/.cache/m\" 10.0.0.2(ro,sync,no_subtree_check,"
        "root_squash)' | sudo -n tee /etc/exports.d/spark-runbook-weights.exports >/dev/null",
        "sudo -n exportfs -ra"]
    assert worker.runs() == ["mkdir -p /home/spark/.cache/m 2>/dev/null || sudo -n mkdir -p /home/spark/.cache/m"]


def test_kernel_nfs_stops_at_a_refused_sudo_before_anything_changes():
    head, worker = _lab_node("head", 0, OPERATOR, refuse=("exportfs",)), _lab_node("worker", 1, OPERATOR)
    rows = W.kernel_nfs_until_server(head, worker, "/w", "/m")
    assert [(c.name, c.node, c.status) for c in rows] == [("weights.nfs.sudo", "head", Status.FAIL),
                                                          ("weights.nfs.sudo", "worker", Status.PASS)]
    assert "sudo -n -l exportfs -ra" in rows[0].observed and nfs.sudoers_line("spark") in rows[0].fix
    assert head.runs() == [] and worker.runs() == []


def test_kernel_nfs_exports_row_fails_on_a_different_line_and_root_needs_no_sudo():
    head = _lab_node("head", 0, ROOT, exports="/w *(rw)\n")
    worker = _lab_node("worker", 1, ROOT)
    rows = W.kernel_nfs_until_server(head, worker, "/w", "/m")
    got = {c.name: c for c in rows}
    assert got["weights.nfs.exports"].failed and "*(rw)" in got["weights.nfs.exports"].observed
    assert got["weights.nfs.exportfs"].failed and "/w *(wdelay,hide,sec=sys,rw)" in got["weights.nfs.exportfs"].observed
    assert "no sudo needed" in rows[0].observed and not any("sudo" in c for c in head.runs() + worker.runs())


# -- preflight ----------------------------------------------------------------------------------------------------

def test_preflight_nfs_rows_are_real_in_a_rehearsal():
    profile, _, _ = rehearsal.load_rehearsal(ENV / "exl3-v41.env", ssh_user="spark")
    assert profile.rehearsal and profile.weight_sync == "nfs"
    head, worker = _lab_node("head", 0, OPERATOR), _lab_node("worker", 1, OPERATOR)
    head.rules.insert(0, (r"command -v exportfs", "exportfs /usr/sbin/exportfs\nrpcinfo /usr/sbin/rpcinfo\n"))
    worker.rules.insert(0, (r"command -v mount.nfs4", "mount.nfs4 /usr/sbin/mount.nfs4\n"))
    # the lab operator's home is 0700 (netlab.files): a squashed root could not enter it on a kernel nfsd
    head.rules.insert(0, (r"^umask; p=", "0022\nhave 700 spark /home/spark\nhave 755 root /home\nhave 755 root /\n"))
    rows = node_needs.nfs_checks(FakeCluster([head, worker]), profile)
    assert [(c.name, c.node, c.status.value) for c in rows] == [
        ("nfs packages", "head", "PASS"), ("nfs packages", "worker", "PASS"),
        ("nfs sudo rules", "head", "PASS"), ("nfs sudo rules", "worker", "PASS"),
        (node_needs.REACH_ROW, "head", "WARN")]        # the lab's stand-ins read as root: WARN, not FAIL
    assert "on the Sparks' kernel nfsd this FAILs" in rows[-1].observed and "chmod o+x /home/spark" in rows[-1].fix
    assert head.runs() == [] and worker.runs() == []
    lab = node_needs.nfs_checks(FakeCluster([FakeNode("head", 0), FakeNode("worker", 1)]),
                                load_profile(ENV / "lab.env", {"WEIGHT_SYNC": "nfs"}))
    assert [c.status.value for c in lab] == ["N/A"]


def test_docker_fix_names_the_group_for_a_refused_socket():
    said = ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
            "Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.24/version\": dial unix /var/run/docker.sock: connect: "
            "permission denied")
    assert re.search(r"usermod -aG docker", docker_fix(said, "worker")) and "on worker" in docker_fix(said, "worker")
    assert "start dockerd" in docker_fix("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                                         "Is the docker daemon running?", "head")


def test_rsync_goes_to_the_workers_login_not_root():
    """Before: ``root@<WORKER_IP>`` whoever the profile logs in as; a non-root operator's key is not root's."""
    manifest = {"revision": "r", "files": [{"path": "config.json", "size": 2, "sha256": "0" * 64}]}
    head = FakeNode("head", 0, ssh="spark@spark-head", rules=[(r"^rsync ", res(23, "", "rsync error"), "run")])
    worker = FakeNode("worker", 1, ssh="spark@spark-worker", rules=[(r'^printf "%s', OPERATOR, "read")])
    out = W.rsync_to_worker(head, worker, "/home/spark/m", "/home/spark/m", head_manifest=manifest)
    assert out.data["command"].endswith(" spark@10.0.0.2:/home/spark/m/") and "root@" not in out.data["command"]
    assert out.checks[-1].failed           # the rsync's own exit is still the row


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="chowns the operator's home")
@pytest.mark.skipif(__import__("shutil").which("visudo", path="/usr/sbin:/usr/bin") is None,
                    reason="visudo (Debian package sudo, make lab-deps) checks the drop-in")
def test_write_operator_makes_exactly_the_drop_in_and_a_private_home(tmp_path):
    import subprocess
    lab_dir, node_dir = tmp_path, tmp_path / "nodes" / "head"
    (node_dir / "etc").mkdir(parents=True)
    key = lab_dir / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    (node_dir / "etc" / "sudoers.d").mkdir()
    (node_dir / "etc" / "sudoers.d" / "left-over").write_text("spark ALL=(ALL) NOPASSWD: ALL\n")
    files.write_operator(lab_dir, node_dir, key)
    sudoers = node_dir / "etc" / "sudoers.d"
    assert [p.name for p in sudoers.iterdir()] == ["spark-runbook"]          # nothing more than the drop-in
    drop_in = sudoers / "spark-runbook"
    assert drop_in.read_text() == nfs.sudoers_line("spark") + "\n" and oct(drop_in.stat().st_mode & 0o777) == "0o440"
    home = node_dir / "users" / "spark"
    assert (home.stat().st_uid, oct(home.stat().st_mode & 0o777)) == (spec.OPERATOR_UID, "0o700")
    auth = (home / ".ssh" / "authorized_keys").read_text().splitlines()
    assert auth[0] == key.with_suffix(".pub").read_text().strip() and len(auth) == 2
    assert (home / ".ssh" / "id_ed25519").read_bytes() == (lab_dir / "operator_ed25519").read_bytes()
    assert all(p.stat().st_uid == spec.OPERATOR_UID for p in home.rglob("*"))
    assert "directory = *" in (home / ".gitconfig").read_text()        # the lab recipe's root-owned upstream
    assert "spark:*:2626:2626:" in (node_dir / "etc" / "passwd").read_text()
    assert any(line.startswith("docker:") and line.endswith("spark")
               for line in (node_dir / "etc" / "group").read_text().splitlines())


def test_engram_tools_live_in_the_ssh_users_home_not_a_shared_tmp_dir():
    """Before: /tmp/spark-runbook-engram, made by whoever ran first; the next user was refused ("belongs to uid
    0, not to spark"), measured on the lab when the operator rehearsed after root."""
    from runbook.engram import packing, read_probe
    from runbook.engram_tools import ship as tools
    profile = load_profile(ENV / "exl3-v41.env")
    plans = packing.plan_pack(profile)
    assert plans["head"][0] == 'mkdir -p "$HOME"/.cache/spark-runbook/engram-tools/head'
    assert plans["worker"][1].startswith('python3 "$HOME"/.cache/spark-runbook/engram-tools/worker/pack.py ')
    assert '"$HOME"/.cache/spark-runbook/engram-tools/head/probe.py' in read_probe.plan_probe(profile)["head"]
    node = FakeNode("head", 0, rules=[(r'^printf "%s', OPERATOR, "read"), (r"", res(0, ""), "run")], dry_run=True)
    tdir = tools.ship_tools(node, files=())
    assert tdir == "/home/spark/.cache/spark-runbook/engram-tools/head"
    assert "/home/spark/.cache/spark-runbook/engram-tools/head" in node.runs()[0] and "~" not in node.runs()[0]
