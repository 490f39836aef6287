"""Node paths in the weights step: ``~/…`` is expanded with EACH node's own home before it goes into a
command (issue 13 defect 2), and the kernel NFS path renders absolute paths and ``sudo -n`` for a
non-root SSH user, refusing clearly before anything changes when sudo wants a password (defect 7).

The nodes here are local bash shells with their own ``$HOME`` (a tmp dir per node, with a space in it)
and a working directory of their own, so a literal ``~`` would show up as ``<cwd>/~/…``."""
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("huggingface_hub")

from runbook import weights as W
from runbook.checks import Status
from runbook.errors import RunbookError
from runbook.lab.hub import HubServer, publish_repo
from runbook.facts import node_paths
from support.doubles import local_pair

REPO = "lab-org/nodes-test"
ODD = "models/it's a \"quoted\" dir"          # spaces, a single and a double quote


def no_tilde_dirs(*nodes):
    """Nothing landed under a literal '~' in any node's working directory or home."""
    return [p for n in nodes for base in (n.cwd, n.home) for p in base.rglob("~")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    (src / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    (src / "tokenizer.json").write_text('{"v": [1, 2]}')
    (src / "model.safetensors").write_bytes(os.urandom(1 << 20))
    root = tmp_path_factory.mktemp("hubroot")
    sha = publish_repo(root, REPO, src)
    with HubServer(root) as server:
        snap = W.fetch_metadata(REPO, sha, endpoint=server.url)
    return SimpleNamespace(root=root, src=src, sha=sha, snap=snap)


@pytest.fixture()
def hub(repo):
    with HubServer(repo.root) as server:
        yield server


# ------------------------------------------------------------------------------ defect 2: ~ per node

def test_expand_home_is_pure_and_refuses_what_a_node_cannot_mean():
    assert node_paths.expand_home("~", "/home/a") == "/home/a"
    assert node_paths.expand_home("~/x y/z", "/home/a") == "/home/a/x y/z"
    assert node_paths.expand_home("/abs/~/x", "/home/a") == "/abs/~/x"
    with pytest.raises(RunbookError, match="ENGRAM_SRC_DIR uses another user's home"):
        node_paths.expand_home("~spark/x", "/home/a", key="ENGRAM_SRC_DIR")
    with pytest.raises(RunbookError, match="WEIGHTS_DIR is a relative path"):
        node_paths.expand_home("models/x", "/home/a", key="WEIGHTS_DIR")
    assert node_paths.parse_user("relative\n1000\nx\n") is None and node_paths.parse_user("") is None


def test_home_is_read_once_per_node_and_differs_per_node(tmp_path):
    head, worker = local_pair(tmp_path)
    assert node_paths.on_node(head, "~/a") == f"{head.home}/a"
    assert node_paths.on_node(worker, "~/a") == f"{worker.home}/a"
    node_paths.on_node(head, "~/b")
    node_paths.on_node(head, "/abs")
    reads = head.reads()
    assert reads == [node_paths.USER_CMD]                 # one fact, whatever the number of paths
    assert node_paths.node_user(head).uid == os.geteuid()


def test_download_on_node_lands_under_that_nodes_home(repo, hub, tmp_path, monkeypatch):
    """The command the runbook renders, run by a real bash whose HOME is the node's: the files are at
    HOME/<path> (a path with spaces and quotes), never at <cwd>/~/…, and verified there."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    _, worker = local_pair(tmp_path)
    res = W.download_on_node(worker, REPO, repo.sha, f"~/{ODD}", endpoint=hub.url,
                             expected=repo.snap.expected(), python=sys.executable)
    assert res.ok, [c.to_record() for c in res.checks]
    dest = worker.home / ODD
    assert res.data["dest"] == str(dest) and res.data["tree"] == str(dest)
    assert (dest / "model.safetensors").read_bytes() == (repo.src / "model.safetensors").read_bytes()
    assert json.loads((dest / W.MANIFEST_NAME).read_text())["revision"] == repo.sha
    assert no_tilde_dirs(worker) == []
    assert worker.runs() and all("~" not in c for c in worker.runs())


def test_rsync_expands_each_side_with_its_own_home(repo, hub, tmp_path, monkeypatch):
    """Head and worker have different homes (anchors-2026-12 failure 13): the source is the head's
    ~/…, the destination the worker's ~/…; verified and at parity there."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    head, worker = local_pair(tmp_path)
    got = W.download_on_node(head, REPO, repo.sha, f"~/{ODD}", endpoint=hub.url, expected=repo.snap.expected(),
                             python=sys.executable)
    assert got.ok
    # the ssh hop stood in for by a local shell that parses the remote command line as sshd's shell would
    res = W.rsync_to_worker(head, worker, f"~/{ODD}", f"~/{ODD}", target="localhost",
                            ssh="sh -c 'shift; exec sh -c \"$*\"' --", python=sys.executable)
    assert res.ok, [c.to_record() for c in res.checks]
    assert [c.name for c in res.checks] == ["weights.rsync", "weights.verified", "weights.parity"]
    assert res.data["src"] == str(head.home / ODD) and res.data["dst"] == str(worker.home / ODD)
    assert (worker.home / ODD / "config.json").is_file()
    # the worker hashed its own copy: the head's manifest was not copied over
    verified = next(c for c in res.checks if c.name == "weights.verified")
    assert verified.data["files_hashed"] == 3
    assert no_tilde_dirs(head, worker) == []


# ------------------------------------------------------------------------------ defect 7: kernel NFS

def test_nfs_renders_expanded_paths_never_a_literal_tilde(tmp_path):
    head, worker = local_pair(tmp_path)
    res = W.nfs_share(head, worker, f"~/{'w x'}", "~/w x", execute=False)
    assert res.checks[0].status is Status.NA
    cmds = res.data["commands"]
    export_line = cmds["head"][1]
    assert f'"{head.home}/w x" 10.77.0.2(ro,sync,no_subtree_check,root_squash)' in export_line
    assert f"10.77.0.1:{head.home}/w x" in cmds["worker"][1] and f"{worker.home}/w x" in cmds["worker"][1]
    assert not any("~" in c for group in cmds.values() for c in group)
    assert head.runs() == [] and worker.runs() == []          # rendered only
    with pytest.raises(RunbookError, match="absolute path without quotes"):
        W.render_nfs('/w/"x', "10.0.0.1", "10.0.0.2", "/m")


def test_nfs_as_root_needs_no_sudo_and_as_a_user_gets_sudo_n():
    root = W.render_nfs("/w", "10.0.0.1", "10.0.0.2", "/m")
    assert root and all(root.values()) and not any("sudo" in c for g in root.values() for c in g)
    user = W.render_nfs("/w", "10.0.0.1", "10.0.0.2", "/m", head_sudo=True, worker_sudo=True)
    assert user["head"][:4] == ["sudo -n mkdir -p /etc/exports.d",
                                "printf '%s\\n' '\"/w\" 10.0.0.2(ro,sync,no_subtree_check,root_squash)' | "
                                "sudo -n tee /etc/exports.d/spark-runbook-weights.exports >/dev/null",
                                "sudo -n exportfs -ra", "sudo -n exportfs -v | grep -F /w"]
    assert "|| sudo -n mount -t nfs4" in user["worker"][1]
    assert user["undo_worker"] == ["sudo -n umount /m"]


@pytest.fixture()
def stub_sudo_dir():
    """sudo as it answers a user without a NOPASSWD rule under -n; refuses anything else. In a dir
    outside pytest's 0700 tmp tree, so the non-root user can run it."""
    bindir = Path(tempfile.mkdtemp(prefix="spark-runbook-stub-sudo-"))
    os.chmod(bindir, 0o755)
    stub = bindir / "sudo"
    stub.write_text('#!/bin/sh\nif [ "$1" = "-n" ]; then echo "sudo: a password is required" >&2; exit 1; fi\n'
                    'echo "stub sudo: unexpected arguments: $*" >&2; exit 99\n')
    stub.chmod(0o755)
    yield bindir
    shutil.rmtree(bindir)


@pytest.mark.parametrize("sudo", ["wants a password", "not installed", "installed, no rule"])
def test_nfs_refuses_before_changing_anything_when_sudo_cannot_run(tmp_path, stub_sudo_dir, sudo):
    """A real non-root login (setpriv to nobody) whose sudo needs a password (a stub, or the real sudo without a
    rule for it) or is absent: one FAIL per node naming what sudo said, the first command that needs root and the
    sudoers drop-in; no command changed anything."""
    installed = shutil.which("sudo", path="/usr/local/bin:/usr/bin:/bin") is not None
    if sudo == "not installed" and installed:
        pytest.skip("sudo is installed here (the lab installs it): the case 'installed, no rule' runs instead")
    if sudo == "installed, no rule" and not installed:
        pytest.skip("sudo is not installed here: the case 'not installed' runs instead")
    first = [stub_sudo_dir] if sudo == "wants a password" else []
    head, worker = local_pair(tmp_path, path_first=first, as_user=(65534, 65534))
    res = W.nfs_share(head, worker, "~/weights", "~/weights", execute=True, head_manifest={"files": []})
    fails = [c for c in res.checks if c.failed]
    assert [(c.name, c.node) for c in fails] == [("weights.nfs.sudo", "head"), ("weights.nfs.sudo", "worker")]
    said = "sudo: command not found" if sudo == "not installed" else "sudo: a password is required"
    assert said in fails[0].observed and "as nobody" in fails[0].observed
    assert "`sudo -n -l mkdir -p /etc/exports.d` as nobody" in fails[0].observed
    assert "/etc/sudoers.d/spark-runbook" in fails[0].fix and "nobody ALL=(root) NOPASSWD:" in fails[0].fix
    assert f"`sudo -n -l mkdir -p '{worker.home}/weights'`" in fails[1].observed
    assert head.runs() == [] and worker.runs() == []
    assert not (worker.home / "weights").exists()
