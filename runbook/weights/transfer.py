"""Step 02's transfer on the cluster: pinned download on the head, verification, sharing to every worker, parity;
then (ENGRAM=1) the Engram source the same way.

Reads top to bottom as the step: the layout (from MODEL_DIR, ``layout.weights_layout``) → Hub
metadata → every profile path expanded on its own node (``~`` = that node's home) → free space on
the head → the head downloads and verifies → the profile's WEIGHT_SYNC mode brings the same bytes to
every worker → parity of the manifests → the Engram source (HF_ENGRAM_REPO: config, index and the
shards holding the tables) on every node that packs → JIT caches node-local → verification speed
against ``sha256sum`` on the same files.
"""
from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..checks import Check, CheckList, check, not_applicable
from ..errors import RemoteError, RunbookError
from ..remote import OfflineNode
from ..facts import system
from .download import RepoSnapshot, fetch_metadata, hf_token_for, require_pinned
from ..weights_tools.layout import weights_layout
from ..facts.node_paths import on_node
from ..records import EngramSource, WeightsCopy, WeightsRecord
from .sharing import (ShareResult, cache_dir_is_local, download_on_node, kernel_nfs_until_server, nfs_share,
                      read_node_manifest, rsync_to_worker, stream_to_worker, verify_on_node)
from ..site import SPARKS_SITE, Site
from .verify import manifest_to_expected, parity
from ..engram_tools.layout import engram_shards

GIB = 1024 ** 3
ENGRAM_INDEX = "model.safetensors.index.json"
ENGRAM_CONFIG = "config.json"


def node_python(profile) -> str:
    """The node's own ``python3``, on the Sparks and on the lab's nodes alike: what step 02 runs there
    (``node_download.py``, ``verify_manifest.py``) needs the standard library only (preflight checks the
    version), never a package of the node's Python (stock DGX OS has no ``huggingface_hub``, PEP 668)."""
    return "python3"


def worker_dir(profile) -> str:
    return profile.worker_weights_dir or profile.weights_dir


def _workers_key(profile) -> str:
    return "WORKER_WEIGHTS_DIR" if profile.worker_weights_dir else "WEIGHTS_DIR"


def _hub_allowed(node) -> None:
    """The offline review (``render``) talks to no server, the Hub included (no token leaves, the text is the same
    with or without a network): its reads take the dry run's way, without the file list."""
    if isinstance(node, OfflineNode):
        raise RunbookError("offline review: the Hub is not asked for the file list")


def download_verify_share(cluster, profile, *, compare_sha256sum: bool = True, margin_gib: float = 1.0,
                          site: Site = SPARKS_SITE) -> tuple[CheckList, dict[str, Any]]:
    """Step 02 top to bottom; ``site``: where the lab's stand-ins come from (the NFS server and mount where the
    kernel's cannot run, the generated Engram source)."""
    checks = CheckList()
    layout = weights_layout(profile)          # refuses a MODEL_DIR / HF_MODEL_REPO mismatch first
    head = cluster.head
    python = node_python(profile)
    endpoint = profile.hf_endpoint or None
    margin = int(margin_gib * GIB)
    # the secrets file's token for metadata and bytes alike (a gated repo); none to a foreign, untrusted mirror
    token = hf_token_for(profile) or ""

    try:
        _hub_allowed(head)
        snap = fetch_metadata(profile.hf_model_repo, profile.hf_revision, endpoint=endpoint, token=token)
    except RunbookError as err:
        if not head.dry_run:
            raise
        # a dry run (and the offline review) goes past a failing read: the commands below still show, without
        # the file list (sizes and hashes) the Hub would give
        checks.add(check("weights.hub_metadata", False, node="local", observed=str(err).splitlines()[0],
                         expected="the Hub's file list at the pinned revision",
                         fix="dry run: the commands below are shown without it; a real run needs the Hub"))
        snap = RepoSnapshot(profile.hf_model_repo, profile.hf_revision, [])
    roots = {head.name: on_node(head, profile.weights_dir, key="WEIGHTS_DIR")}
    for worker in cluster.workers:
        roots[worker.name] = on_node(worker, worker_dir(profile), key=_workers_key(profile))
    data: dict[str, Any] = {"repo": snap.repo, "revision": snap.revision, "files": len(snap.files),
                            "total_bytes": snap.total_bytes, "layout": layout.kind,
                            "endpoint": endpoint or "https://huggingface.co", "mode": profile.weight_sync,
                            "paths": {name: {"weights_dir": root, "shared": layout.store(root),
                                             "tree": layout.tree(root)} for name, root in roots.items()}}

    # free space on the head before a byte is fetched
    checks.add(free_space(head, layout.download_dir(roots[head.name]), layout.tree(roots[head.name]), snap,
                          margin, key="WEIGHTS_DIR"))
    if checks.failures() and not head.dry_run:      # a dry run goes on: every command is shown
        return checks, data

    head_result = download_on_node(head, snap.repo, snap.revision, layout.download_dir(roots[head.name]),
                                   expected=snap.expected(), endpoint=endpoint, python=python,
                                   max_workers=profile.hf_max_workers, layout=layout.kind, token=token)
    checks.add(head_result.checks)
    data["head"] = head_result.data
    if not head_result.ok and not head.dry_run:
        return checks, data
    head_tree = layout.tree(roots[head.name])
    head_manifest = read_node_manifest(head, head_tree)

    def share_weights(worker) -> ShareResult:
        return share_to_worker(cluster, profile, worker, src=layout.store(roots[head.name]),
                               dst=layout.store(roots[worker.name]), tree=layout.tree_in_store,
                               head_manifest=head_manifest, python=python,
                               download=lambda node, dest: download_on_node(
                                   node, snap.repo, snap.revision, layout.download_dir(dest), expected=snap.expected(),
                                   endpoint=endpoint, python=python, max_workers=profile.hf_max_workers,
                                   layout=layout.kind, token=token),
                               space=lambda node, dest: free_space(node, layout.download_dir(dest), layout.tree(dest),
                                                                   snap, margin, key=_workers_key(profile)),
                               name="weights",
                               worker_root=roots[worker.name], worker_tree=layout.tree(roots[worker.name]), site=site)

    shares: dict[str, Any] = {}
    for worker_name, share in share_to_workers(cluster.workers, share_weights,
                                               parallel=shares_in_parallel(cluster, profile)).items():
        checks.add(share.checks)
        shares[worker_name] = share.data
    data["share"] = shares[cluster.workers[0].name]       # the (first) worker, as with two nodes
    if len(shares) > 1:
        data["shares"] = shares

    engram_checks, data["engram"] = engram_source(cluster, profile, python=python, endpoint=endpoint, margin=margin,
                                                  token=token, site=site)
    checks.add(engram_checks)

    for node in [head, *cluster.workers]:
        shared = [data["paths"][node.name]["shared"]]
        if data["engram"].get("paths"):
            shared.append(data["engram"]["paths"].get(node.name, ""))
        checks.add(cache_local(profile, node, shared))
    if compare_sha256sum and head_manifest:
        data["hash_rate"] = hash_rate_on_node(head, head_tree, head_manifest, python)
    return checks, data


def weights_record(profile, data: dict[str, Any]) -> WeightsRecord:
    """Step 02's record from the data ``download_verify_share`` returned: where the verified tree is on each
    node (WEIGHT_SYNC=nfs: the workers read the head's, they hold no copy of their own)."""
    copies = tuple(WeightsCopy(node=name, weights_dir=p["weights_dir"], tree=p["tree"],
                               own_copy=profile.weight_sync != "nfs" or rank == 0)     # paths: the head first
                   for rank, (name, p) in enumerate(data["paths"].items()))
    eng = data.get("engram") or {}
    engram = None
    if eng.get("enabled"):
        engram = EngramSource(repo=eng.get("repo", ""), revision=eng.get("revision", ""),
                              files=tuple(eng.get("files") or ()), paths=dict(eng.get("paths") or {}),
                              source=eng.get("source", ""))
    return WeightsRecord(repo=data["repo"], revision=data["revision"], files=data["files"],
                         total_bytes=data["total_bytes"], layout=data["layout"], mode=data["mode"], copies=copies,
                         engram=engram)


SHARE_PARALLEL = 4      # workers receiving at once: each rsync costs the head one ssh cipher stream (a core)


def shares_in_parallel(cluster, profile) -> bool:
    """rsync and download-both run on every worker at once. NFS stays in rank order: the lab's one userspace server
    holds port 2049 per worker, and an export moves no bytes up front. So does a dry run and the offline review:
    their commands are recorded, and compared, in rank order."""
    return profile.weight_sync != "nfs" and not cluster.head.dry_run


def share_to_workers(workers, share_one: Callable[[Any], ShareResult], *, parallel: bool,
                     limit: int = SHARE_PARALLEL) -> dict[str, ShareResult]:
    """``share_one(worker)`` for every worker, at most ``limit`` at once when ``parallel`` (else one after the
    other); results in rank order. Each share keeps its own timeout, verification and parity rows. A share that
    raises a :class:`RunbookError` (its command timed out, the connection was lost, the verifier could not run)
    becomes one ``weights.share`` FAIL naming that worker; the other workers' shares go on and keep their rows."""
    workers = list(workers)

    def one(worker) -> ShareResult:
        try:
            return share_one(worker)
        except RunbookError as err:
            return ShareResult("share", checks=[check(
                "weights.share", False, node=worker.name,
                observed=f"{worker.name}: {err.what}" + (f" ({err.observed[-400:]})" if err.observed else ""),
                expected=f"the head's verified files on {worker.name}, verified there",
                fix=err.fix or f"re-run step 02: {worker.name} resumes from what it already has")])

    if not parallel or len(workers) < 2:
        return {w.name: one(w) for w in workers}
    with ThreadPoolExecutor(max_workers=max(1, min(limit, len(workers)))) as pool:
        futures = {w.name: pool.submit(one, w) for w in workers}
        return {name: future.result() for name, future in futures.items()}


def share_to_worker(cluster, profile, worker, *, src: str, dst: str, tree: str, head_manifest, python: str,
                    download, space, name: str, worker_root: str, worker_tree: str,
                    site: Site = SPARKS_SITE) -> ShareResult:
    """Bring the head's verified directory ``src`` to ``worker`` at ``dst`` by WEIGHT_SYNC (``tree``:
    where the verified files sit inside it). ``download(node, root)`` / ``space(node, root)``: the
    download-both mode's download and its free-space check on the worker (``root``: the worker's
    directory for this content, ``worker_tree`` its verified tree). NFS where the site stands in for nfsd and the
    kernel's NFS client (``site.nfs_stand_in``: the lab): the kernel mode up to them, then the stand-in."""
    head, mode = cluster.head, profile.weight_sync
    probe = posixpath.join(tree, "config.json")
    if mode in ("rsync", "download-both"):
        mounted = copy_target_mount(worker, dst, mode=mode)
        if mounted is not None:
            return ShareResult(mode, checks=[mounted])
    if mode == "rsync" and profile.weight_transport == "stream":
        return stream_to_worker(head, worker, src, dst, head_manifest=head_manifest, python=python, tree=tree)
    if mode == "rsync":
        return rsync_to_worker(head, worker, src, dst, head_manifest=head_manifest, python=python, tree=tree)
    if mode == "download-both":
        room = space(worker, worker_root)
        if room.failed:
            return ShareResult("download-both", checks=[room])
        share = download(worker, worker_root)
        share.checks.insert(0, room)
        share.checks.append(parity(head_manifest, read_node_manifest(worker, worker_tree), node=worker.name))
        return share
    if site.nfs_stand_in is not None:
        # no nfsd or kernel NFS client here: the kernel mode runs as the profile's user up to them (sudo probe,
        # exports file, exportfs), then the site's stand-ins for the kernel's server and mount (the lab's, as root)
        kernel = kernel_nfs_until_server(head, worker, src, dst, name=name, probe=probe,
                                         worker_ips=[w.spec.fabric_ip for w in cluster.workers])
        if any(c.failed for c in kernel):
            return ShareResult("nfs", checks=kernel)
        rows, data = site.nfs_stand_in(head, worker, src, dst, head_manifest=head_manifest, name=name, tree=tree,
                                       probe=probe, worker_ips=[w.spec.fabric_ip for w in cluster.workers],
                                       parity=parity)
        return ShareResult("nfs", checks=[*kernel, *rows], data=data)
    return nfs_share(head, worker, src, dst, execute=True, head_manifest=head_manifest, python=python,
                     name=name, tree=tree, probe=probe, worker_ips=[w.spec.fabric_ip for w in cluster.workers])


def copy_target_mount(worker, dst: str, *, mode: str) -> Check | None:
    """A FAIL when the worker's copy target is (or lies in) a network mount: a folder an earlier WEIGHT_SYNC=nfs run
    mounted read-only from the head keeps its mount when the profile (or another profile with the same path)
    copies instead, and the copy would write into the head's export or fail on a read-only mount. Read from
    /proc/mounts, which never blocks on a dead server. None when the target is the worker's own disk."""
    res = worker.read(system.MOUNTS_CMD, timeout=15)
    if not res.ok:
        return None
    target = on_node(worker, dst).rstrip("/")
    holding = [m for m in system.parse_network_mounts(res.stdout)
               if target == m.mountpoint.rstrip("/") or target.startswith(m.mountpoint.rstrip("/") + "/")]
    if not holding:
        return None
    m = holding[-1]                      # the last mounted is the one the path reaches
    return check("weights.copy_target", False, node=worker.name,
                 observed=f"{target} is in a network mount: {m.fstype} {m.source} on {m.mountpoint}",
                 expected=f"WEIGHT_SYNC={mode} copies onto the worker's own disk",
                 fix=(f"unmount it (an earlier WEIGHT_SYNC=nfs share, or another profile's): sudo umount "
                      f"{shlex.quote(m.mountpoint)}, then re-run 02; or keep the share with WEIGHT_SYNC=nfs"))


def free_space(node, dest: str, tree: str, snap: RepoSnapshot, margin: int, *, key: str) -> Check:
    """Room on ``dest``'s filesystem for the files of ``snap`` not already complete in ``tree``."""
    res = node.read(system.disk_free_cmd(dest))
    if not res.ok and node.dry_run:        # a dry run goes past an unanswered read (the offline review)
        return check("weights.free_space", False, node=node.name, observed="unknown (dry run: not read)",
                     expected=f"room for {snap.repo}", fix="a real run reads it")
    free = system.parse_disk_free(res.stdout)
    present = present_bytes(node, tree, snap)
    need = snap.total_bytes - present + margin
    have = f"; {present / GIB:.2f} GiB of it present already" if present else ""
    return check("weights.free_space", free.avail_bytes >= need, node=node.name,
                 observed=f"{free.avail_bytes / GIB:.2f} GiB free on {free.mount}",
                 expected=f">= {need / GIB:.2f} GiB ({snap.total_bytes / GIB:.2f} GiB of {snap.repo}{have} + "
                          f"{margin / GIB:.0f} GiB margin)",
                 fix=f"free space on {free.mount} or set {key} elsewhere")


def present_bytes(node, tree: str, snap: RepoSnapshot) -> int:
    """Bytes of ``snap``'s files already in ``tree`` on the node with their exact size (one read)."""
    files = snap.expected()["files"]
    if not files:
        return 0
    names = " ".join(shlex.quote(f["path"]) for f in files)
    res = node.read(f"cd {shlex.quote(tree)} 2>/dev/null && stat -L -c '%s %n' -- {names} 2>/dev/null", timeout=30)
    sizes: dict[str, int] = {}
    for line in (res.stdout or "").splitlines():
        size, _, path = line.partition(" ")
        if size.isdigit():
            sizes[path] = int(size)
    return sum(f["size"] for f in files if sizes.get(f["path"]) == f["size"])


def cache_local(profile, node, shared: list[str]) -> Check:
    """CACHE_DIR on this node, outside every directory shared with another node."""
    try:
        cache = on_node(node, profile.cache_dir, key="CACHE_DIR")
    except RemoteError as err:
        return not_applicable("weights.cache_local", f"CACHE_DIR={profile.cache_dir} not expanded: {err}",
                              node=node.name, expected="CACHE_DIR outside every shared weights directory")
    return cache_dir_is_local(cache, [d for d in shared if d], node=node.name)


# ---------------------------------------------------------------------------------------------
# the Engram source (V4.1, recipe A): HF_ENGRAM_REPO's config, index and the shards with the tables

def engram_files(index: dict[str, Any]) -> list[str]:
    """What recipe A downloads of HF_ENGRAM_REPO (seed A ``download.sh``: shards 47+48, the index,
    config.json): the files 03_engram and the loader read."""
    return [ENGRAM_CONFIG, ENGRAM_INDEX, *engram_shards(index)]


def fetch_index(repo: str, revision: str, *, endpoint: str | None, token: str = "",
                timeout: float = 60) -> dict[str, Any]:
    """The repo's ``model.safetensors.index.json`` at the pinned revision, read here (a small file)."""
    from huggingface_hub import hf_hub_download
    try:
        with tempfile.TemporaryDirectory(prefix="spark-runbook-index-") as tmp:
            path = hf_hub_download(repo, ENGRAM_INDEX, revision=revision, endpoint=endpoint, local_dir=tmp,
                                   token=token if token else False, etag_timeout=timeout)
            with open(path) as fh:
                return json.load(fh)
    except Exception as err:  # noqa: BLE001 - one readable message for the notebook
        text = f"{type(err).__name__}: {err}"
        raise RunbookError(f"cannot read {ENGRAM_INDEX} of {repo}@{revision[:12]}",
                           observed=text.replace(token, "***") if token else text,
                           expected="the index of the V4.1 checkpoint (HF_ENGRAM_REPO)",
                           fix="check HF_ENGRAM_REPO / HF_ENGRAM_REVISION, HF_ENDPOINT and HF_TOKEN") from None


def _relabel(checks, prefix: str) -> list[Check]:
    """``weights.x`` rows of the Engram source as ``weights.engram.x`` (one table holds both)."""
    return [dataclasses.replace(c, name=c.name.replace("weights.", prefix + ".", 1)) for c in checks]


def engram_source(cluster, profile, *, python: str, endpoint: str | None, margin: int,
                  token: str = "", site: Site = SPARKS_SITE) -> tuple[list[Check], dict]:
    """ENGRAM=1: HF_ENGRAM_REPO@HF_ENGRAM_REVISION (pinned) -> ENGRAM_SRC_DIR on every node that
    packs (rank < TP; each packs its own rank's rows from its own ENGRAM_SRC_DIR), only the files recipe
    A needs, resumable and sha256-verified like the model, brought to the workers by WEIGHT_SYNC.
    Where the site generates the source instead (``site.engram_source``: RECIPE=lab), 03_engram makes it (N/A
    here)."""
    if not profile.engram:
        return [], {"enabled": False}
    if site.engram_source is not None:
        return [not_applicable("weights.engram.source", "RECIPE=lab: 03_engram generates a synthetic V4.1-style "
                               "source (lab.engram_source.prepare_lab_source) instead of downloading HF_ENGRAM_REPO",
                               node="cluster", expected="config, index and the Engram shards in ENGRAM_SRC_DIR")], \
            {"enabled": True, "source": "lab fixture (03_engram)"}
    repo, revision = profile.hf_engram_repo, require_pinned(profile.hf_engram_revision, "HF_ENGRAM_REVISION")
    try:
        _hub_allowed(cluster.head)
        full = fetch_metadata(repo, revision, endpoint=endpoint, token=token)
        files = engram_files(fetch_index(repo, revision, endpoint=endpoint, token=token))
        absent = [f for f in files if f not in {f.path for f in full.files}]
    except RunbookError:
        if not cluster.head.dry_run:
            raise
        # a dry run without the Hub: the files seed A's download.sh names (config, index, shards 47+48)
        full, absent = RepoSnapshot(repo, revision, []), []
        files = ["config.json", ENGRAM_INDEX, "model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors"]
    data: dict[str, Any] = {"enabled": True, "repo": repo, "revision": revision, "files": files}
    if len(files) < 3 or absent:
        return [check("weights.engram.source", False, node="cluster",
                      observed=(f"{repo}@{revision[:12]}: " + (f"missing {', '.join(absent)}" if absent else
                                f"{ENGRAM_INDEX} maps no '.engram.embed.' tensor")),
                      expected="config.json, the index and the shards holding layers.*.engram.embed.{weight,scale}",
                      fix="set HF_ENGRAM_REPO to the original DeepSeek-V4.1-Flash checkpoint and HF_ENGRAM_REVISION "
                          "to its commit")], data
    snap = full.select(files)
    data["total_bytes"] = snap.total_bytes
    packers = [n for n in [cluster.head, *cluster.workers] if profile.holds_rank(n.spec.rank)]
    head, workers = packers[0], packers[1:]
    paths = {n.name: on_node(n, profile.engram_src_dir, key="ENGRAM_SRC_DIR") for n in packers}
    data["paths"] = paths
    checks: list[Check] = [free_space(head, paths[head.name], paths[head.name], snap, margin, key="ENGRAM_SRC_DIR")]
    if checks[0].failed and not head.dry_run:
        return _relabel(checks, "weights.engram"), data

    def fetch(node, dest):
        return download_on_node(node, repo, revision, dest, expected=snap.expected(), endpoint=endpoint,
                                python=python, allow=files, max_workers=profile.hf_max_workers, token=token,
                                label="engram source download")

    got = fetch(head, paths[head.name])
    checks += got.checks
    data["head"] = got.data
    if not got.ok and not head.dry_run:
        return _relabel(checks, "weights.engram"), data
    head_manifest = read_node_manifest(head, paths[head.name])

    def share_engram(worker) -> ShareResult:
        return share_to_worker(cluster, profile, worker, src=paths[head.name], dst=paths[worker.name], tree="",
                               head_manifest=head_manifest, python=python, download=fetch,
                               space=lambda node, dest: free_space(node, dest, dest, snap, margin, key="ENGRAM_SRC_DIR"),
                               name="engram", worker_root=paths[worker.name], worker_tree=paths[worker.name],
                               site=site)

    shares = {}
    for worker_name, share in share_to_workers(workers, share_engram,
                                               parallel=shares_in_parallel(cluster, profile)).items():
        checks += share.checks
        shares[worker_name] = share.data
    data["shares"] = shares
    return _relabel(checks, "weights.engram"), data


def hash_rate_on_node(node, directory: str, manifest: dict[str, Any], python: str) -> dict[str, Any]:
    """Our verifier (forced to re-hash) against ``sha256sum`` on the same files, same node, same run."""
    directory = on_node(node, directory)
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
