"""02_weights on the real lab: the head downloads from the lab Hub at the pinned revision, the worker
gets the bytes by rsync and by its own download, parity holds, a flipped byte is named."""
from __future__ import annotations

import contextlib

import time

import pytest

from runbook.lab.site import site_for
from runbook.errors import RunbookError

from runbook.profile import load_profile
from runbook.remote import Cluster
from runbook.weights import transfer as weights_step
from runbook.weights.sharing import read_node_manifest, verify_on_node
from runbook.weights.download import verify_checks
from runbook.weights.verify import manifest_to_expected, parity
from runbook.lab.control import ensure_lab

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab_profile(lab):
    profile = load_profile("env/lab.env")
    ensure_lab(profile)          # tiny model published at the pinned revision, Hub endpoint up
    return profile


def _failed(checks):
    return [(c.name, c.node, c.observed) for c in checks if c.failed]


def test_rsync_mode_then_rerun_reuses_manifests(lab_profile):
    with Cluster.from_profile(lab_profile) as cluster:
        checks, data = weights_step.download_verify_share(cluster, lab_profile, site=site_for(lab_profile), compare_sha256sum=True)
        assert not _failed(checks), _failed(checks)
        assert {c.name for c in checks} >= {"weights.download", "weights.verified", "weights.rsync", "weights.parity"}
        assert data["hash_rate"]["sha256sum_gbps"] > 0 and data["hash_rate"]["verifier_gbps"] > 0
        started = time.monotonic()
        checks2, data2 = weights_step.download_verify_share(cluster, lab_profile, site=site_for(lab_profile), compare_sha256sum=False)
        rerun = time.monotonic() - started
        assert not _failed(checks2)
        # the manifest is reused: nothing is hashed again on either node
        hashed = [c.data.get("files_hashed") for c in checks2 if c.name == "weights.verified"]
        assert hashed and all(h == 0 for h in hashed), hashed
        print(f"re-run on a healthy lab: {rerun:.1f} s")


def test_download_both_mode_proves_parity(lab_profile):
    profile = lab_profile.with_overrides({"WEIGHT_SYNC": "download-both",
                                          "WORKER_WEIGHTS_DIR": "/mnt/nvme/models/tiny-own"})
    with Cluster.from_profile(profile) as cluster:
        try:
            checks, data = weights_step.download_verify_share(cluster, profile, site=site_for(profile), compare_sha256sum=False)
            assert not _failed(checks), _failed(checks)
            assert [c.node for c in checks if c.name == "weights.download"] == ["head", "worker"]
            assert any(c.name == "weights.parity" and c.observed == "7 files identical" for c in checks)
        finally:
            cluster.worker.run("rm -rf /mnt/nvme/models/tiny-own", timeout=30, warn=True)


def test_the_nodes_own_python3_without_huggingface_hub_downloads(lab_profile):
    """Issue 22 item 3 on the lab: the nodes' python3 is the distribution's (no huggingface_hub), and step 02's
    download and verification run with it (a4d36a1 lent the nodes the runbook's venv and imported the package)."""
    profile = lab_profile.with_overrides({"WEIGHT_SYNC": "download-both",
                                          "WORKER_WEIGHTS_DIR": "/mnt/nvme/models/tiny-bare"})
    assert weights_step.node_python(profile) == "python3"
    with Cluster.from_profile(profile) as cluster:
        for node in cluster.nodes:
            r = node.read("python3 -c 'import huggingface_hub'", timeout=30)
            assert not r.ok and "No module named" in (r.stderr + r.stdout), (node.name, r.stdout, r.stderr)
        try:
            checks, _ = weights_step.download_verify_share(cluster, profile, site=site_for(profile), compare_sha256sum=False)
            assert not _failed(checks), _failed(checks)
            assert [c.node for c in checks if c.name == "weights.download"] == ["head", "worker"]
            r = cluster.worker.read("stat -c '%a %U' ~/.cache/spark-runbook/tools", timeout=30)
            assert r.ok and r.stdout.split()[0] == "700", r.stdout
        finally:
            cluster.worker.run("rm -rf /mnt/nvme/models/tiny-bare", timeout=30, warn=True)


def test_flipped_byte_on_worker_is_named(lab_profile):
    with Cluster.from_profile(lab_profile) as cluster:
        checks, _ = weights_step.download_verify_share(cluster, lab_profile, site=site_for(lab_profile), compare_sha256sum=False)
        assert not _failed(checks)
        head_manifest = read_node_manifest(cluster.head, lab_profile.weights_dir)
        target = f"{lab_profile.weights_dir}/model.safetensors"
        try:
            # flip one byte in the middle, same size (the mtime changes, so the manifest cannot vouch for it)
            cluster.worker.run(f"printf '\\x5a' | dd of={target} bs=1 seek=4096 conv=notrunc status=none",
                               timeout=30)
            report = verify_on_node(cluster.worker, lab_profile.weights_dir, manifest_to_expected(head_manifest),
                                    python=weights_step.node_python(lab_profile))
            failed = [c for c in verify_checks(report, node="worker") if c.failed]
            assert failed and failed[0].name == "weights.file:model.safetensors", [c.name for c in failed]
            assert failed[0].observed.startswith("sha256")
            tampered = dict(head_manifest, files=[dict(f, sha256="0" * 64) if f["path"] == "model.safetensors" else f
                                                  for f in head_manifest["files"]])
            check = parity(head_manifest, tampered)
            assert check.failed and "model.safetensors" in check.observed
        finally:
            # repair: the next rsync run restores the file (size+mtime differ from the head's)
            weights_step.download_verify_share(cluster, lab_profile, site=site_for(lab_profile), compare_sha256sum=False)


@contextlib.contextmanager
def _sshfs_undone(worker, mountpoint: str):
    """The nfs mode leaves the head's export mounted on the worker (sshfs, the kernel mount's stand-in): the
    other tests own the worker's local copy at that path, so unmount it afterwards."""
    try:
        yield
    finally:
        worker.run(f"fusermount -u {mountpoint} 2>/dev/null; true", timeout=30)


def test_nfs_mode_serves_the_export_for_real_with_a_userspace_server(lab_profile):
    """WEIGHT_SYNC=nfs in the lab: nfs-ganesha on the head, libnfs's client on the worker. Every file
    reads back byte-identical over NFS, the export is read-only and closed to non-worker addresses;
    only the kernel mount is N/A (this kernel has no NFS client)."""
    profile = lab_profile.with_overrides({"WEIGHT_SYNC": "nfs"})
    with Cluster.from_profile(profile) as cluster, _sshfs_undone(cluster.worker, profile.weights_dir):
        checks, data = weights_step.download_verify_share(cluster, profile, site=site_for(profile), compare_sha256sum=False)
        assert not _failed(checks), _failed(checks)
        by = {c.name: c for c in checks if c.name.startswith("weights.nfs") or c.name == "weights.parity"}
        for name in ("weights.nfs.server", "weights.nfs.read_only", "weights.nfs.restricted", "weights.parity",
                     "weights.nfs.lab_mount"):
            assert by[name].status.value == "PASS", (name, by[name].observed)
        assert by["weights.parity"].observed == "7 files identical"
        assert by["weights.nfs.mount"].status.value == "N/A"
        # the stand-in for the worker's kernel mount: the head's export, read-only, at the worker's path
        mounts = cluster.worker.read("cat /proc/mounts").stdout
        assert f"{cluster.head.spec.fabric_ip}:{profile.weights_dir} {profile.weights_dir} fuse.sshfs ro," in mounts
        assert cluster.worker.run(f"touch {profile.weights_dir}/.probe", warn=True).exit_code != 0
        assert "NFS4ERR_ROFS" in by["weights.nfs.read_only"].observed
        assert data["share"]["bytes_read"] == data["total_bytes"]
        # the server is gone afterwards and nothing was written into the export
        assert ":2049 " not in cluster.head.read("ss -ltn").stdout
        assert not cluster.head.read(f"test -e {profile.weights_dir}/.runbook-write-probe").ok


def test_nfs_mode_names_a_file_that_differs_on_the_export(lab_profile):
    """A byte changed under the export after the head's manifest was taken: parity over NFS names it."""
    profile = lab_profile.with_overrides({"WEIGHT_SYNC": "nfs"})
    from runbook.lab.nfs import nfs_userspace_share
    with Cluster.from_profile(profile) as cluster, _sshfs_undone(cluster.worker, profile.weights_dir):
        checks, _ = weights_step.download_verify_share(cluster, profile, site=site_for(profile), compare_sha256sum=False)
        assert not _failed(checks), _failed(checks)
        manifest = read_node_manifest(cluster.head, profile.weights_dir)
        target = f"{profile.weights_dir}/tokenizer.json"
        before = cluster.head.read(f"dd if={target} bs=1 skip=100 count=1 status=none | od -An -tx1").stdout.strip()
        try:
            cluster.head.run(f"printf '\\x00' | dd of={target} bs=1 seek=100 conv=notrunc status=none", timeout=30)
            rows, _ = nfs_userspace_share(cluster.head, cluster.worker, profile.weights_dir, profile.weights_dir,
                                          head_manifest=manifest, parity=parity)
            par = [c for c in rows if c.name == "weights.parity"]
            assert par and par[0].failed and "tokenizer.json: sha256" in par[0].observed, par
        finally:
            cluster.head.run(f"printf '\\x{before}' | dd of={target} bs=1 seek=100 conv=notrunc status=none",
                             timeout=30)
            cluster.head.run(f"rm -f {profile.weights_dir}/.runbook-manifest.json", timeout=30)


def test_nfs_mode_refuses_a_port_2049_held_by_another_server(lab_profile, hold_port):
    from runbook.lab.nfs import nfs_userspace_share
    with Cluster.from_profile(lab_profile) as cluster, hold_port(cluster.head, 2049, ip=lab_profile.head_ip):
        rows, _ = nfs_userspace_share(cluster.head, cluster.worker, lab_profile.weights_dir,
                                      lab_profile.weights_dir, head_manifest=None, parity=parity)
        (server,) = [c for c in rows if c.name == "weights.nfs.server"]
        assert server.failed and "port 2049 is already taken" in server.observed, server
        assert "python3" in server.observed, server.observed


def test_a_gated_repo_downloads_with_hf_token_only_in_the_secrets_file(lab_profile, tmp_path, monkeypatch):
    """Issue 24: a Hub that answers 401 without a bearer token (a gated repo) serves step 02 when HF_TOKEN is only
    in the 0600 secrets file, not in the environment; without it the download fails and says why; the token is in
    no command the nodes ran."""
    import secrets as pysecrets
    from runbook.lab import control
    from runbook.lab.hub import HubServer
    token = "hf_labGated" + pysecrets.token_hex(8)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    empty = tmp_path / "empty.env"
    empty.write_text("")
    empty.chmod(0o600)
    host = lab_profile.hf_endpoint.split("//", 1)[1].rsplit(":", 1)[0]       # the lab bridge the nodes reach
    with HubServer(control.HUB_ROOT, host, 0, token=token) as hub:
        profile = lab_profile.with_overrides({"HF_ENDPOINT": hub.url,      # the lab bridge: the lab hub, trusted
                                              "WEIGHTS_DIR": "/mnt/nvme/models/tiny-gated"})
        with Cluster.from_profile(profile, run_dir=tmp_path) as cluster:
            try:
                monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(empty))
                try:                                                  # no token anywhere: refused, and said
                    refused = [c for c in weights_step.download_verify_share(cluster, profile, site=site_for(profile),
                                                                             compare_sha256sum=False)[0] if c.failed]
                    said = " ".join(f"{c.observed} {c.fix}" for c in refused)
                    assert refused, "the gated Hub served an anonymous download"
                except RunbookError as err:
                    said = str(err)
                assert "401" in said or "token" in said.lower(), said
                secrets_file = tmp_path / "secrets.env"
                secrets_file.write_text(f"HF_TOKEN={token}\n")
                secrets_file.chmod(0o600)
                monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(secrets_file))
                checks, _ = weights_step.download_verify_share(cluster, profile, site=site_for(profile), compare_sha256sum=False)
                assert not _failed(checks), _failed(checks)
                assert any(c.name == "weights.download" for c in checks)
                assert hub.bytes_sent() > 0
            finally:
                for node in cluster.nodes:
                    node.run("rm -rf /mnt/nvme/models/tiny-gated", timeout=30, warn=True)
        ran = (tmp_path / "commands.jsonl").read_text()
        assert ran.strip() and token not in ran        # every node command recorded; the token in none
