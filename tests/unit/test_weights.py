"""runbook.weights: pinned download from the lab hub with the real client, verification,
manifest reuse, named failures, free-space refusal, sharing helpers, parity."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("huggingface_hub")

from runbook import weights as W
from runbook.checks import Status
from runbook.errors import ActionError, RunbookError
from runbook.lab.hub import HubServer, publish_repo
from runbook.weights_tools import node_download, verify_manifest
from support.doubles import LocalNode

REPO = "lab-org/weights-test"
BIG = "model-00001-of-00002.safetensors"
BIG_SIZE = 24 << 20          # > 10 MiB: huggingface_hub resumes in 10 MiB chunks


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    (src / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden": 64}))
    (src / "tokenizer").mkdir()
    (src / "tokenizer" / "tokenizer.json").write_text('{"v": [1, 2, 3]}')
    (src / BIG).write_bytes(os.urandom(BIG_SIZE))
    (src / "model-00002-of-00002.safetensors").write_bytes(os.urandom(300_000))
    (src / "README.md").write_text("# tiny\n")
    root = tmp_path_factory.mktemp("hubroot")
    sha = publish_repo(root, REPO, src)
    return SimpleNamespace(root=root, src=src, sha=sha)


@pytest.fixture()
def hub(repo):
    with HubServer(repo.root) as server:
        yield server


@pytest.fixture(scope="module")
def downloaded(repo, tmp_path_factory):
    """One good download shared by the read-only tests (copy it before damaging)."""
    dest = tmp_path_factory.mktemp("dl") / "weights"
    with HubServer(repo.root) as server:
        res = W.download(REPO, repo.sha, dest, endpoint=server.url, margin_bytes=0, progress=False)
        snap = W.fetch_metadata(REPO, repo.sha, endpoint=server.url)
    assert res.ok, res.verify
    return SimpleNamespace(dest=dest, res=res, snap=snap)


def _copy(tree, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(tree, dst)
    return dst


# ------------------------------------------------------------------------------ download

def test_pinned_download_verifies_and_writes_manifest(repo, downloaded):
    res, dest = downloaded.res, downloaded.dest
    assert res.layout == "local_dir" and res.revision == repo.sha
    assert (dest / BIG).stat().st_size == BIG_SIZE
    manifest = json.loads((dest / W.MANIFEST_NAME).read_text())
    assert manifest["revision"] == repo.sha
    paths = {f["path"] for f in manifest["files"]}
    assert paths == {"config.json", "tokenizer/tokenizer.json", BIG, "model-00002-of-00002.safetensors",
                     "README.md"}
    assert all(len(f["sha256"]) == 64 and f["revision"] == repo.sha for f in manifest["files"])
    assert [(c.name, c.status) for c in res.checks] == [
        ("weights.free_space", Status.PASS), ("weights.fetched", Status.PASS), ("weights.verified", Status.PASS)]
    # the LFS files (the .safetensors) came through the resumable path, from byte 0, leaving no partial
    assert sorted(res.fetched, key=lambda f: f["path"]) == [
        {"path": BIG, "size": BIG_SIZE, "resumed_from": 0},
        {"path": "model-00002-of-00002.safetensors", "size": 300_000, "resumed_from": 0}]
    assert not list((dest / ".cache" / "runbook" / "partial").glob("*.part"))
    assert res.total_bytes == sum(f["size"] for f in manifest["files"])


def test_branch_name_is_refused(hub, tmp_path):
    with pytest.raises(RunbookError, match="pinned"):
        W.download(REPO, "main", tmp_path / "w", endpoint=hub.url)


def test_allow_patterns_limit_download_and_verification(repo, hub, tmp_path):
    res = W.download(REPO, repo.sha, tmp_path / "w", endpoint=hub.url, allow_patterns=["*.json"],
                     margin_bytes=0, progress=False)
    assert res.ok and res.total_bytes < 1000
    assert sorted(p.name for p in (tmp_path / "w").rglob("*.json") if ".cache" not in p.parts
                  and p.name != W.MANIFEST_NAME) == ["config.json", "tokenizer.json"]
    assert hub.bytes_sent(BIG) == 0


def test_cut_transfer_resumes_with_range(repo, hub, tmp_path):
    hub.add_fault(BIG, cut_after=15 << 20)
    res = W.download(REPO, repo.sha, tmp_path / "w", endpoint=hub.url, margin_bytes=0, progress=False)
    assert res.ok
    gets = [e for e in hub.log if e.method == "GET" and e.path == BIG]
    assert len(gets) == 2 and gets[0].bytes_sent == 15 << 20 and gets[0].range == ""
    assert gets[1].range.startswith("bytes=") and gets[1].range != "bytes=0-"
    assert 0 < gets[1].bytes_sent < BIG_SIZE          # resumed, not started over
    assert (tmp_path / "w" / BIG).read_bytes() == (repo.src / BIG).read_bytes()


def test_download_killed_mid_file_continues_on_the_next_run(repo, hub, tmp_path):
    """The process dies mid-file (SIGKILL: Ctrl-C'd kernel, dropped SSH, power): the next run asks for the
    rest with Range and fetches only the missing bytes, instead of starting the shard over."""
    import signal
    import time
    chunk = 10 << 20                      # huggingface_hub writes in 10 MiB pieces
    hub.add_fault(BIG, cut_after=chunk + (1 << 20), stall_seconds=120)
    dest = tmp_path / "w"
    part = Path(node_download.partial_path(str(dest), _lfs_sha(repo, BIG)))
    script = Path(node_download.__file__)
    proc = subprocess.Popen([sys.executable, str(script), "--repo", REPO, "--revision", repo.sha,
                             "--dest", str(dest), "--endpoint", hub.url, "--max-workers", "1",
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size >= chunk):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the first run never wrote its partial"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    kept = part.stat().st_size
    assert not (dest / BIG).exists()                       # nothing half-written under the final name
    snap = W.fetch_metadata(REPO, repo.sha, endpoint=hub.url)
    space = W.free_space_check(dest, snap, margin_bytes=0)
    assert space.data["need_bytes"] == snap.total_bytes - kept   # kept bytes are not asked for again

    res = W.download(REPO, repo.sha, dest, endpoint=hub.url, margin_bytes=0, progress=False)
    assert res.ok, res.verify
    gets = [e for e in hub.log if e.method == "GET" and e.path == BIG]
    assert gets[-1].range == f"bytes={kept}-"
    assert gets[-1].bytes_sent == BIG_SIZE - kept          # only the missing bytes crossed the wire
    assert {"path": BIG, "size": BIG_SIZE, "resumed_from": kept} in res.fetched
    row = next(c for c in res.checks if c.name == "weights.fetched")
    assert f"{BIG} from byte {kept}" in row.observed
    assert (dest / BIG).read_bytes() == (repo.src / BIG).read_bytes()
    assert not part.exists()


def _lfs_sha(repo, rel):
    import hashlib
    return hashlib.sha256((repo.src / rel).read_bytes()).hexdigest()


def test_disk_too_small_is_refused_before_downloading(repo, hub, tmp_path):
    with pytest.raises(ActionError) as err:
        W.download(REPO, repo.sha, tmp_path / "w", endpoint=hub.url, margin_bytes=0,
                   free_fn=lambda path: 1_000_000, progress=False)
    msg = str(err.value)
    assert "(1000000 B)" in msg and "B to download" in msg
    total = sum(p.stat().st_size for p in repo.src.rglob("*") if p.is_file())
    assert f"{total} B to download of {total} B total" in msg
    assert hub.bytes_sent() == 0


def test_disk_too_small_on_real_tmpfs(repo, hub, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                                           capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(ActionError, match="not enough disk space"):
            W.download(REPO, repo.sha, mnt / "w", endpoint=hub.url, margin_bytes=0, progress=False)
        assert hub.bytes_sent() == 0
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_token_comes_from_environment_and_is_not_in_messages(repo, tmp_path, monkeypatch):
    with HubServer(repo.root, token="hf_labsecret123") as server:
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        with pytest.raises(RunbookError) as err:
            W.download(REPO, repo.sha, tmp_path / "a", endpoint=server.url, progress=False)
        monkeypatch.setenv("HF_TOKEN", "hf_labsecret123")
        res = W.download(REPO, repo.sha, tmp_path / "b", endpoint=server.url, allow_patterns=["*.json"],
                         margin_bytes=0, progress=False)
    assert res.ok
    assert "hf_labsecret123" not in str(err.value)
    assert "hf_labsecret123" not in (tmp_path / "b" / W.MANIFEST_NAME).read_text()


# ------------------------------------------------------------------------------ verification

def test_manifest_reuse_skips_hashing(downloaded, tmp_path):
    dest = _copy(downloaded.dest, tmp_path)       # copy2 keeps mtimes → manifest still valid
    expected = downloaded.snap.expected()
    again = W.verify_dir(dest, expected)
    assert again["ok"] and again["files_hashed"] == 0 and again["bytes_hashed"] == 0
    assert again["files"] and not any(f["hashed"] for f in again["files"])
    os.utime(dest / "config.json")                # changed mtime → only that file is re-hashed
    third = W.verify_dir(dest, expected)
    assert third["ok"] and [f["path"] for f in third["files"] if f["hashed"]] == ["config.json"]


@pytest.mark.parametrize("damage,status", [("flip", "sha256"), ("truncate", "size"),
                                           ("delete", "missing"), ("flip-small", "git_sha1")])
def test_damaged_file_is_named(downloaded, tmp_path, damage, status):
    dest = _copy(downloaded.dest, tmp_path)
    target = dest / ("config.json" if damage == "flip-small" else BIG)
    if damage.startswith("flip"):
        with open(target, "r+b") as fh:
            fh.seek(7)
            b = fh.read(1)
            fh.seek(7)
            fh.write(bytes([b[0] ^ 0x01]))
    elif damage == "truncate":
        os.truncate(target, BIG_SIZE - 1)
    else:
        target.unlink()
    report = W.verify_dir(dest, downloaded.snap.expected())
    name = target.relative_to(dest).as_posix()
    assert not report["ok"] and report["failed"] == [name]
    bad = [f for f in report["files"] if f["status"] != "ok"]
    assert bad[0]["status"] == status
    checks = W.verify_checks(report, node="head")
    assert checks[0].failed and name in checks[0].name and checks[-1].failed


def test_flip_with_preserved_mtime_needs_no_reuse(downloaded, tmp_path):
    """Manifest reuse trusts size+mtime (documented); --no-reuse is the deep check."""
    dest = _copy(downloaded.dest, tmp_path)
    st = os.stat(dest / BIG)
    with open(dest / BIG, "r+b") as fh:
        fh.seek(BIG_SIZE // 2)
        fh.write(b"\x00" if fh.read(1) != b"\x00" else b"\x01")
    os.utime(dest / BIG, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert W.verify_dir(dest, downloaded.snap.expected())["ok"]
    deep = W.verify_dir(dest, downloaded.snap.expected(), reuse=False)
    assert deep["failed"] == [BIG]


def test_repair_refetches_only_the_bad_file(repo, hub, downloaded, tmp_path):
    dest = _copy(downloaded.dest, tmp_path)
    os.truncate(dest / BIG, 1000)
    res = W.download(REPO, repo.sha, dest, endpoint=hub.url, margin_bytes=0, progress=False)
    assert res.ok and (dest / BIG).stat().st_size == BIG_SIZE
    assert hub.bytes_sent() == BIG_SIZE            # nothing else transferred


def test_verifier_runs_standalone_with_system_python(downloaded, tmp_path):
    """verify_manifest.py is shipped to nodes: stdlib only, runs under the node's python3."""
    dest = _copy(downloaded.dest, tmp_path)
    exp = tmp_path / "expected.json"
    exp.write_text(json.dumps(downloaded.snap.expected()))
    python = shutil.which("python3") or sys.executable
    cmd = [python, "-I", verify_manifest.__file__, "--dir", str(dest), "--expected", str(exp), "--no-reuse"]
    ok = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"]
    (dest / "README.md").write_text("# changed\n")
    bad = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and json.loads(bad.stdout)["failed"] == ["README.md"]
    assert subprocess.run(cmd[:3] + ["--dir", str(tmp_path / "nope"), "--expected", str(exp)],
                          capture_output=True, check=False).returncode == 2


def test_hash_rate_vs_sha256sum(downloaded):
    files = [downloaded.dest / BIG, downloaded.dest / "model-00002-of-00002.safetensors"]
    rates = W.hash_rate_vs_sha256sum(files, workers=2)
    assert rates["digests_agree"] and rates["bytes"] == BIG_SIZE + 300_000
    assert rates["runbook_gbps"] > 0 and rates["sha256sum_gbps"] > 0


# ------------------------------------------------------------------------------ sharing

def test_verify_on_node_and_parity_names_the_differing_file(downloaded, tmp_path):
    head_manifest = W.read_manifest(downloaded.dest)
    worker_dir = tmp_path / "worker-weights"
    shutil.copytree(downloaded.dest, worker_dir, ignore=shutil.ignore_patterns(".cache", W.MANIFEST_NAME))
    worker = LocalNode("worker", 1, fabric_ip="10.77.0.2", home=tmp_path / "worker home")
    report = W.verify_on_node(worker, str(worker_dir), W.manifest_to_expected(head_manifest))
    assert report["ok"] and report["files_hashed"] == 5
    same = W.parity(head_manifest, W.read_node_manifest(worker, str(worker_dir)))
    assert same.status is Status.PASS
    other = json.loads(json.dumps(W.read_node_manifest(worker, str(worker_dir))))
    other["files"][1]["sha256"] = "0" * 64
    diff = W.parity(head_manifest, other)
    assert diff.failed and other["files"][1]["path"] in diff.observed
    other["files"].pop(0)
    assert "missing on worker" in W.parity(head_manifest, other).observed


@pytest.mark.slow
def test_download_on_node_uses_token_file_and_verifies(repo, downloaded, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_nodesecret456")
    worker = LocalNode("worker", 1, fabric_ip="10.77.0.2", home=tmp_path / "worker home")
    with HubServer(repo.root, token="hf_nodesecret456") as server:
        res = W.download_on_node(worker, REPO, repo.sha, str(tmp_path / "wd"), endpoint=server.url,
                                 expected=downloaded.snap.expected(), python=sys.executable)
    assert res.ok, [c.to_record() for c in res.checks]
    assert worker.commands and all("hf_nodesecret456" not in c for c in worker.commands)
    tools = tmp_path / "worker home" / ".cache" / "spark-runbook" / "tools"
    assert (tools / "node_download.py").exists() and oct(tools.stat().st_mode & 0o777) == "0o700"
    assert not list(tools.glob(".tok-*")) and not list(tools.glob("files-*.json"))
    assert W.parity(W.read_manifest(downloaded.dest), W.read_manifest(tmp_path / "wd")).status is Status.PASS


def test_rsync_command_and_rsync_mode(downloaded, tmp_path):
    cmd = W.render_rsync("/models/dsv4", "/models/dsv4", "root@10.0.22.2")
    for flag in ("--whole-file", "--partial", "--exclude=/.cache/", f"--exclude={W.MANIFEST_NAME} ",
                 "root@10.0.22.2:/models/dsv4/", "BatchMode=yes"):
        assert flag in cmd
    head, worker = LocalNode("head", 0, fabric_ip="10.77.0.1"), LocalNode("worker", 1, fabric_ip="10.77.0.2")
    dst = tmp_path / "w"
    # a local rsync stands in for the ssh hop: same flags, target without host
    res = W.rsync_to_worker(head, worker, str(downloaded.dest), str(dst), target="localhost",
                            ssh="sh -c 'shift; exec \"$@\"' --")
    assert res.ok, [c.to_record() for c in res.checks]
    names = [c.name for c in res.checks]
    assert names == ["weights.rsync", "weights.verified", "weights.parity"]
    assert not (dst / ".cache").exists()


def test_nfs_commands_are_rendered_not_run_in_the_lab():
    cmds = W.render_nfs("/models/dsv4", "10.0.22.1", "10.0.22.2", "/mnt/dsv4")
    export = cmds["head"][1]
    assert '"/models/dsv4" 10.0.22.2(ro,sync,no_subtree_check,root_squash)' in export and "*" not in export
    assert "fsid=0" not in export          # the pseudo root is built from every export (model + Engram)
    mount = cmds["worker"][1]
    for opt in ("vers=4.2", "ro", "nconnect=8", "rsize=1048576", "wsize=1048576", "hard"):
        assert opt in mount
    assert "10.0.22.1:/models/dsv4 /mnt/dsv4" in mount
    with pytest.raises(RunbookError):
        W.render_nfs("/models", "10.0.22.1", "*", "/mnt")
    head, worker = LocalNode("head", 0, fabric_ip="10.77.0.1"), LocalNode("worker", 1, fabric_ip="10.77.0.2")
    res = W.nfs_share(head, worker, "/models", "/mnt/m", execute=False)
    assert res.checks[0].status is Status.NA and head.commands == worker.commands == []
    assert res.data["executed"] is False and "10.77.0.2(" in res.data["commands"]["head"][1]


def test_cache_dir_must_be_node_local():
    assert W.cache_dir_is_local("/root/.cache/spark-runbook", ["/models/dsv4"]).status is Status.PASS
    bad = W.cache_dir_is_local("/models/dsv4/jit", ["/models/dsv4"])
    assert bad.failed and "/models/dsv4" in bad.observed


# nfs-ls of the lab export as the worker saw it (libnfs-utils 4.0.0, nfs-ganesha 4.3, root squashed)
NFS_LS_CAPTURED = """\
-rw-r--r--  1 65534 65534           98 generation_config.json
-rw-r--r--  1 65534 65534          720 config.json
-rw-r--r--  1 65534 65534         2032 chat_template.jinja
-rw-r--r--  1 65534 65534      8920240 model.safetensors
-rw-r--r--  1 65534 65534         2135 .runbook-manifest.json
-rw-r--r--  1 65534 65534         1100 README.md
-rw-r--r--  1 65534 65534          382 tokenizer_config.json
drwxr-xr-x  4 65534 65534         4096 .cache
-rw-r--r--  1 65534 65534       123554 tokenizer.json
"""


def test_parse_nfs_ls_keeps_regular_files_with_sizes():
    from runbook.lab.nfs import parse_nfs_ls
    sizes = parse_nfs_ls(NFS_LS_CAPTURED)
    assert sizes["model.safetensors"] == 8920240 and sizes["config.json"] == 720
    assert ".cache" not in sizes and len(sizes) == 8


def test_render_ganesha_exports_read_only_to_the_workers_only():
    from runbook.errors import RunbookError
    from runbook.lab.nfs import render_ganesha
    conf = render_ganesha("/mnt/nvme/models/tiny", "169.254.77.1", ["169.254.77.2", "169.254.78.2"])
    assert "Bind_addr = 169.254.77.1" in conf and "Protocols = 4;" in conf
    assert "Access_Type = None" in conf                      # nobody by default ...
    assert "CLIENT { Clients = 169.254.77.2, 169.254.78.2; Access_Type = RO; }" in conf   # ... but the workers, ro
    assert "Squash = Root_Squash" in conf and 'Path = "/mnt/nvme/models/tiny"' in conf
    for bad in ("*", "spark-worker", "169.254.77.0/24"):
        with pytest.raises(RunbookError):
            render_ganesha("/w", "169.254.77.1", [bad])


def test_rsync_never_copies_credential_files(tmp_path):
    """A real rsync of a tree holding a logged-in user's token files: the model files go, the tokens stay."""
    import shutil
    import subprocess
    from runbook.weights.sharing import CREDENTIAL_FILES, render_rsync
    if shutil.which("rsync") is None:
        import pytest
        pytest.skip("rsync is not installed (make lab-deps)")
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "hub" / "models--o--m").mkdir(parents=True)
    (src / "hub" / "models--o--m" / "config.json").write_text("{}")
    for name in CREDENTIAL_FILES:
        (src / name).write_text("hf_secret")
    # rsync's remote shell is a local one here (drops the host, runs rsync's server side): the real rsync
    # protocol and the command exactly as rendered
    shell = tmp_path / "local-shell"
    shell.write_text('#!/bin/sh\nshift\nexec "$@"\n')
    shell.chmod(0o755)
    cmd = render_rsync(str(src), str(dst), "localhost", ssh=str(shell))
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (dst / "hub" / "models--o--m" / "config.json").is_file()
    assert CREDENTIAL_FILES and not [n for n in CREDENTIAL_FILES if (dst / n).exists()]


def _bare_python3(tmp_path):
    """A node's ``python3`` without any site package (stock DGX OS: no huggingface_hub, PEP 668): this
    interpreter with ``-I -S``, first on the node's PATH."""
    bindir = tmp_path / "bare-bin"
    bindir.mkdir()
    py = bindir / "python3"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    py.chmod(0o755)
    probe = subprocess.run([str(py), "-c", "import huggingface_hub"], capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named" in probe.stderr     # the double has no packages
    return bindir


@pytest.mark.parametrize("layout", ["local_dir", "hub_cache"])
def test_download_on_node_needs_no_package_of_the_nodes_python(repo, downloaded, tmp_path, monkeypatch, layout):
    """Issue 22 item 3: step 02 runs the shipped downloader and verifier with the node's python3, which has
    no huggingface_hub on stock DGX OS; a4d36a1's downloader imported it and failed there."""
    monkeypatch.setenv("HF_TOKEN", "hf_nodesecret789")
    worker = LocalNode("worker", 1, fabric_ip="10.77.0.2", home=tmp_path / "worker home",
                       path_first=[_bare_python3(tmp_path)])
    with HubServer(repo.root, token="hf_nodesecret789") as server:
        res = W.download_on_node(worker, REPO, repo.sha, str(tmp_path / "wd"), endpoint=server.url,
                                 expected=downloaded.snap.expected(), python="python3", layout=layout)
    assert res.ok, [c.to_record() for c in res.checks]
    assert [c.name for c in res.checks][:2] == ["weights.download", "weights.fetched"]
    tree = Path(res.data["tree"])
    assert (tree / BIG).read_bytes() == (repo.src / BIG).read_bytes()
    if layout == "hub_cache":
        assert (tree / BIG).is_symlink() and os.readlink(tree / BIG).startswith("../../blobs/")


def test_node_download_reads_the_file_list_from_the_hub_api_without_packages(repo, hub, tmp_path):
    """The standalone CLI (no --files): the pinned revision's list from the Hub API, with urllib only."""
    py = _bare_python3(tmp_path) / "python3"
    out = subprocess.run([str(py), node_download.__file__, "--repo", REPO, "--revision", repo.sha,
                          "--dest", str(tmp_path / "d"), "--endpoint", hub.url, "--allow", "*.json",
                          "--no-progress"], capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ok"], (got, out.stderr)
    assert sorted(p.relative_to(tmp_path / "d").as_posix() for p in (tmp_path / "d").rglob("*.json")
                  if ".cache" not in p.parts) == ["config.json", "tokenizer/tokenizer.json"]
    assert hub.bytes_sent(BIG) == 0


def test_a_gated_repo_downloads_with_the_token_only_in_the_secrets_file(repo, downloaded, tmp_path, monkeypatch):
    """HF_TOKEN in secrets.env and not in the environment: metadata and bytes both send it (a gated repo: the hub
    answers 401 without it); the node's command lines never show it."""
    token = "hf_gatedSecretsFileOnly789"
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    secrets = tmp_path / "secrets.env"
    secrets.write_text(f"HF_TOKEN={token}\n")
    secrets.chmod(0o600)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(secrets))
    worker = LocalNode("worker", 1, fabric_ip="10.77.0.2")
    with HubServer(repo.root, token=token) as server:
        with pytest.raises(RunbookError):
            W.fetch_metadata(REPO, repo.sha, endpoint=server.url, token="")       # anonymous: refused
        snap = W.fetch_metadata(REPO, repo.sha, endpoint=server.url, token=W.hf_token())
        res = W.download_on_node(worker, REPO, repo.sha, str(tmp_path / "wd"), endpoint=server.url,
                                 expected=snap.expected(), python=sys.executable)
    assert res.ok, [c.to_record() for c in res.checks]
    assert worker.commands and all(token not in c for c in worker.commands)


# ------------------------------------------------------------------------------ counted progress (issue 38 item 2)
class _Seen:
    """What the progress channel showed: (label, done, total, final)."""

    def __init__(self):
        self.shown = []

    def show(self, counter, text, final):
        self.shown.append((counter.label, counter.done, counter.total, final))


def test_download_on_node_counts_its_bytes_up_to_the_total(repo, downloaded, tmp_path, monkeypatch):
    """The node's downloader prints its bytes in the progress form; download_on_node relays them into the channel
    as ``<node> weights download``: counts that rise and end at the snapshot's size, kept for the sidecar."""
    from runbook import progress
    seen = _Seen()
    progress.use(seen)
    progress.reset()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    worker = LocalNode("worker", 1, fabric_ip="10.77.0.2", home=tmp_path / "worker home")
    try:
        with HubServer(repo.root) as server:
            res = W.download_on_node(worker, REPO, repo.sha, str(tmp_path / "wd"), endpoint=server.url,
                                     expected=downloaded.snap.expected(), python=sys.executable, token="")
        finals = progress.finals()
    finally:
        progress.use(None)
        progress.reset()
    assert res.ok, [c.to_record() for c in res.checks]
    shown = [s for s in seen.shown if s[0] == "worker weights download"]
    assert shown, seen.shown
    done = [s[1] for s in shown]
    assert done == sorted(done) and shown[-1][3] and shown[-1][1] == shown[-1][2]
    total_mib = downloaded.snap.total_bytes / 2 ** 20
    assert finals["worker weights download"]["total"] == pytest.approx(total_mib, abs=0.01)
    assert finals["worker weights download"]["unit"] == "MiB" and finals["worker weights download"]["ended"]


def test_the_downloader_counts_every_chunk_never_back_and_a_kept_partial_as_done(repo, hub, tmp_path, monkeypatch):
    """In-process, unthrottled: a line per MiB written, rising through a cut and its Range resume; a partial an
    earlier run left counts from the start."""
    import io
    import contextlib
    from runbook import progress
    dest = tmp_path / "w"
    snap = W.fetch_metadata(REPO, repo.sha, endpoint=hub.url)
    big = next(f for f in snap.files if f.path == BIG)
    base = node_download.store_dir("local_dir", str(dest), REPO)
    part = node_download.partial_path(base, big.sha256)
    os.makedirs(os.path.dirname(part))
    with open(part, "wb") as fh:
        fh.write((repo.src / BIG).read_bytes()[:5 << 20])      # 5 MiB kept from an earlier run
    hub.add_fault(BIG, cut_after=8 << 20)                      # cut 8 MiB into the resumed part: Range again
    monkeypatch.setattr(node_download, "COUNT_EVERY_S", 0.0)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        node_download.snapshot(REPO, repo.sha, str(dest), endpoint=hub.url, files=[f.expected() for f in snap.files],
                               progress=False, max_workers=1, label="weights download")
    readings = [progress.parse(line) for line in err.getvalue().splitlines()]
    assert readings and all(r is not None and r.label == "weights download" for r in readings), err.getvalue()
    done = [r.done for r in readings]
    assert done == sorted(done) and len(done) > 10
    assert readings[0].done == pytest.approx(5.0, abs=0.01) and readings[0].unit == "MiB"
    assert readings[-1].done == readings[-1].total == pytest.approx(snap.total_bytes / 2 ** 20, abs=0.01)
    assert len([e for e in hub.log if e.method == "GET" and e.path == BIG]) == 2       # the cut was resumed


def test_the_downloaders_count_never_goes_back():
    """A server answering a Range with 200 starts the file over: its bytes on disk drop, the count does not."""
    import io
    out = io.StringIO()
    counts = node_download.Counts("weights download", {"a": 0, "b": 0}, 4 << 20, stream=out, every_s=0)
    counts.set("a", 3 << 20)
    counts.set("a", 1 << 20)
    counts.set("b", 1 << 20)
    counts.end()
    from runbook import progress
    assert [progress.parse(line).done for line in out.getvalue().splitlines()] == [3.0, 4.0]


def test_the_rsync_to_the_worker_counts_its_bytes_from_rsyncs_own_lines(downloaded, tmp_path):
    """A real rsync (the ssh hop stood in for, as above): its --info=progress2 lines feed ``worker weights copy``
    through runbook.progress, rising to the head manifest's bytes."""
    from runbook import progress
    seen = _Seen()
    progress.use(seen)
    progress.reset()
    try:
        head, worker = LocalNode("head", 0, fabric_ip="10.77.0.1"), LocalNode("worker", 1, fabric_ip="10.77.0.2")
        res = W.rsync_to_worker(head, worker, str(downloaded.dest), str(tmp_path / "w"), target="localhost",
                                ssh="sh -c 'shift; exec \"$@\"' --")
    finally:
        progress.use(None)
        progress.reset()
    assert res.ok, [c.to_record() for c in res.checks]
    shown = [s for s in seen.shown if s[0] == "worker weights copy"]
    done = [s[1] for s in shown]
    assert len(shown) >= 3 and done == sorted(done), shown      # rsync's own lines, then the end
    assert 0 < done[0] < res.data["bytes"] and shown[-1] == ("worker weights copy", res.data["bytes"],
                                                             res.data["bytes"], True)


def test_a_plain_tree_of_another_revision_is_fetched_again_where_its_bytes_differ(repo, downloaded, tmp_path):
    """local_dir names files by path: a folder downloaded at one revision and then pinned to another holds files
    of the right size with the wrong bytes (seen on the lab: two rehearsals of one repo id, README.md and
    config.json of equal sizes). The downloader fetches those again, and only those; the rest is kept unread
    where the verifier's manifest says it is unchanged."""
    src = tmp_path / "src-b"
    shutil.copytree(repo.src, src)
    config = json.loads((src / "config.json").read_text())
    config["hidden"] = 46                                 # same length, other bytes
    (src / "config.json").write_text(json.dumps(config))
    big = bytearray((src / BIG).read_bytes())
    big[-1] ^= 0xFF                                       # an LFS file of the same size, one byte changed
    (src / BIG).write_bytes(bytes(big))
    root = tmp_path / "hub-b"
    shutil.copytree(repo.root, root)
    sha_b = publish_repo(root, REPO, src)
    assert sha_b != repo.sha
    dest = _copy(downloaded.dest, tmp_path)
    assert (dest / "config.json").stat().st_size == (src / "config.json").stat().st_size
    with HubServer(root) as server:
        node_download.snapshot(REPO, sha_b, str(dest), endpoint=server.url, progress=False)
        sent = {name: server.bytes_sent(name) for name in ("config.json", BIG, "README.md",
                                                             "model-00002-of-00002.safetensors")}
        snap = W.fetch_metadata(REPO, sha_b, endpoint=server.url)
    assert sent["config.json"] > 0 and sent[BIG] == BIG_SIZE, sent
    assert sent["README.md"] == 0 and sent["model-00002-of-00002.safetensors"] == 0, sent
    report = verify_manifest.verify(dest, snap.expected())
    assert report["ok"], report["failed"]
    assert (dest / "config.json").read_text() == (src / "config.json").read_text()


def test_the_downloader_reads_the_verifiers_manifest_by_its_name():
    # node_download.py is shipped alone to a node, so it names the verifier's file itself
    assert node_download.VERIFIED_MANIFEST == verify_manifest.MANIFEST_NAME
