"""Step 02 — weights: pinned download on the head, verification, sharing to every worker, parity.

Reads top to bottom as the step: Hub metadata → free space on the head → the head downloads and
verifies → the profile's WEIGHT_SYNC mode brings the same bytes to the worker → parity of the two
manifests → JIT caches node-local → verification speed against ``sha256sum`` on the same files.
"""
from __future__ import annotations

import posixpath
import shlex
from typing import Any

from ..checks import CheckList, check
from ..evidence import REPO_ROOT
from ..facts import system
from .download import fetch_metadata
from .sharing import (cache_dir_is_local, download_on_node, nfs_share, nfs_userspace_share,
                      read_node_manifest, rsync_to_worker, verify_on_node)
from .verify import manifest_to_expected, parity

GIB = 1024 ** 3


def node_python(profile) -> str:
    """A python with huggingface_hub on the nodes. The lab's nodes share this machine's
    filesystem, so they use the package's own venv; on Sparks the operator's python3."""
    return str(REPO_ROOT / ".venv" / "bin" / "python") if profile.is_lab else "python3"


def worker_dir(profile) -> str:
    return profile.worker_weights_dir or profile.weights_dir


def run(profile, cluster, *, compare_sha256sum: bool = True, margin_gib: float = 1.0) -> tuple[CheckList, dict[str, Any]]:
    checks = CheckList()
    head = cluster.head
    python = node_python(profile)
    endpoint = profile.hf_endpoint or None

    snap = fetch_metadata(profile.hf_model_repo, profile.hf_revision, endpoint=endpoint)
    data: dict[str, Any] = {"repo": snap.repo, "revision": snap.revision, "files": len(snap.files),
                            "total_bytes": snap.total_bytes, "layout": "local_dir",
                            "endpoint": endpoint or "https://huggingface.co", "mode": profile.weight_sync}

    # free space on the head before a byte is fetched
    free = system.parse_disk_free(head.read(system.disk_free_cmd(profile.weights_dir)).stdout)
    need = snap.total_bytes + int(margin_gib * GIB)
    checks.add(check("weights.free_space", free.avail_bytes >= need, node=head.name,
                     observed=f"{free.avail_bytes / GIB:.2f} GiB free on {free.mount}",
                     expected=f">= {need / GIB:.2f} GiB ({snap.total_bytes / GIB:.2f} GiB of files + "
                              f"{margin_gib:.0f} GiB margin)",
                     fix=f"free space on {free.mount} or set WEIGHTS_DIR elsewhere"))
    if checks.failures():
        return checks, data

    head_result = download_on_node(head, snap.repo, snap.revision, profile.weights_dir,
                                   expected=snap.expected(), endpoint=endpoint, python=python,
                                   max_workers=profile.hf_max_workers)
    checks.add(head_result.checks)
    data["head"] = head_result.data
    if not head_result.ok:
        return checks, data
    head_manifest = read_node_manifest(head, profile.weights_dir)

    mode = profile.weight_sync
    shares: dict[str, Any] = {}
    for worker in cluster.workers:            # every worker rank (TP=3: worker and worker2), in rank order
        if mode == "rsync":
            share = rsync_to_worker(head, worker, profile.weights_dir, worker_dir(profile),
                                    head_manifest=head_manifest, python=python)
        elif mode == "download-both":
            share = download_on_node(worker, snap.repo, snap.revision, worker_dir(profile),
                                     expected=snap.expected(), endpoint=endpoint, python=python,
                                     max_workers=profile.hf_max_workers)
            share.checks.append(parity(head_manifest, read_node_manifest(worker, worker_dir(profile)),
                                       node=worker.name))
        elif profile.is_lab:      # no kernel NFS here: userspace server and client, kernel mount rendered
            share = nfs_userspace_share(head, worker, profile.weights_dir, worker_dir(profile),
                                        head_manifest=head_manifest,
                                        worker_ips=[w.spec.fabric_ip for w in cluster.workers])
        else:
            share = nfs_share(head, worker, profile.weights_dir, worker_dir(profile), execute=True,
                              head_manifest=head_manifest, python=python)
        checks.add(share.checks)
        shares[worker.name] = share.data
    data["share"] = shares[cluster.workers[0].name]       # the (first) worker, as with two nodes
    if len(shares) > 1:
        data["shares"] = shares

    checks.add(cache_dir_is_local(profile.cache_dir, [profile.weights_dir, worker_dir(profile)],
                                  node="cluster"))
    if compare_sha256sum and head_manifest:
        data["hash_rate"] = hash_rate_on_node(head, profile.weights_dir, head_manifest, python)
    return checks, data


def hash_rate_on_node(node, directory: str, manifest: dict[str, Any], python: str) -> dict[str, Any]:
    """Our verifier (forced to re-hash) against ``sha256sum`` on the same files, same node, same run."""
    report = verify_on_node(node, directory, manifest_to_expected(manifest), python=python,
                            reuse=False, write=False)
    files = " ".join(shlex.quote(posixpath.join(directory, f["path"])) for f in manifest.get("files", []))
    res = node.read(f"s=$(date +%s.%N); sha256sum {files} >/dev/null; e=$(date +%s.%N); "
                    f"echo \"$s $e\"", timeout=3600)
    start, end = (float(x) for x in res.stdout.split()[-2:])
    total = sum(f["size"] for f in manifest.get("files", []))
    seconds = max(end - start, 1e-9)
    return {"bytes": total, "verifier_gbps": report.get("gbps"), "verifier_seconds": report.get("seconds"),
            "sha256sum_gbps": round(total / seconds / 1e9, 4), "sha256sum_seconds": round(seconds, 6)}

