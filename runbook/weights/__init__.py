"""Step 02 — weights: pinned download, manifest/sha256 verification, sharing, parity (and the Engram source).

    outcome = runbook.weights.run(step, compare_sha256sum=True)   # checks and data into the step; shows the data

Check names → code: every ``weights.*`` row is built in ``transfer.py`` (``download_verify_share`` reads top to bottom as the
step), the download's rows in ``download.py``, the sharing modes in ``sharing.py``.

The parts, for a notebook cell or a test::

    layout = weights_layout(profile)                             # local_dir | hub_cache, from MODEL_DIR
    on_node(node, "~/.cache/huggingface")                        # ~ = that node's home (read once per node)
    snap = fetch_metadata(repo, revision, endpoint=...)          # Hub sizes + LFS sha256
    res  = download(repo, revision, weights_dir, endpoint=..., allow_patterns=..., layout="hub_cache")
    res.checks                                                   # free space, per-file, summary
    verify_dir(weights_dir, snap.expected())                     # re-run: manifest reuse
    rsync_to_worker(cluster.head, cluster.worker, src, dst)      # WEIGHT_SYNC=rsync
    download_on_node(cluster.worker, repo, rev, dst, expected=snap.expected(), ...)  # download-both
    nfs_share(cluster.head, cluster.worker, src, mnt, execute=not lab)               # nfs
    parity(head_manifest, worker_manifest)
    hash_rate_vs_sha256sum(paths)
"""
from .download import (
                       DownloadResult,
                       RemoteFile,
                       RepoSnapshot,
                       bytes_still_needed,
                       download,
                       fetch_metadata,
                       free_space_check,
                       hf_token, hf_token_for,
                       require_pinned,
                       verify_checks,
)
from ..weights_tools.layout import WeightsLayout, weights_layout
from ..weights_tools.node_download import LAYOUT, LAYOUTS
from ..facts.node_paths import NodeUser, expand_home, node_user, on_node
from .sharing import (
                       ShareResult,
                       cache_dir_is_local,
                       download_on_node,
                       nfs_share,
                       read_node_manifest,
                       render_nfs,
                       render_node_download,
                       render_rsync,
                       rsync_to_worker,
                       ship_tools,
                       stream_to_worker,
                       sudo_check,
                       verify_on_node,
)
from .verify import (
                       hash_rate_vs_sha256sum,
                       manifest_to_expected,
                       parity,
                       read_manifest,
                       verify_dir,
)
from ..weights_tools.verify_manifest import MANIFEST_NAME
from ..step import StepOutcome

__all__ = [
    "DownloadResult",
    "LAYOUT",
    "LAYOUTS",
    "MANIFEST_NAME",
    "NodeUser",
    "RemoteFile",
    "RepoSnapshot",
    "ShareResult",
    "WeightsLayout",
    "bytes_still_needed",
    "cache_dir_is_local",
    "download",
    "download_on_node",
    "expand_home",
    "fetch_metadata",
    "free_space_check",
    "hash_rate_vs_sha256sum",
    "hf_token",
    "hf_token_for",
    "manifest_to_expected",
    "nfs_share",
    "node_user",
    "on_node",
    "parity",
    "read_manifest",
    "read_node_manifest",
    "render_nfs",
    "render_node_download",
    "render_rsync",
    "require_pinned",
    "rsync_to_worker",
    "ship_tools",
    "stream_to_worker",
    "sudo_check",
    "verify_checks",
    "verify_dir",
    "verify_on_node",
    "weights_layout",
]


def run(step, *, compare_sha256sum: bool = True) -> StepOutcome:
    """Download, verify, share and compare on every node; record checks, data and the step's
    :class:`~runbook.records.WeightsRecord` in ``step``; shows the data."""
    from .transfer import download_verify_share, weights_record
    checks, data = download_verify_share(step.cluster, step.profile, compare_sha256sum=compare_sha256sum,
                                         site=step.site)
    step.add(checks)
    step.data.update(data)
    step.record = weights_record(step.profile, data)    # what a resume and the report read
    return step.outcome(data)
