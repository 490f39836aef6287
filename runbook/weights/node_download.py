#!/usr/bin/env python3
"""Pinned snapshot download with huggingface_hub: one implementation used locally by
``runbook.weights.download`` and shipped to a node (download-both mode) and run there with a python
that has ``huggingface_hub`` installed. Needs only the standard library + huggingface_hub.

The token is never on the command line: locally it is passed in-process (from the environment);
on a node it is read from ``--token-file`` (a 0600 file the runbook writes and deletes).

CLI::

    python3 node_download.py --repo ORG/NAME --revision SHA40 --dest DIR [--endpoint URL]
        [--allow PATTERN ...] [--ignore PATTERN ...] [--max-workers 8] [--timeout 120]
        [--etag-timeout 30] [--token-file PATH] [--no-progress] [--layout local_dir|hub_cache]
prints one JSON line {"ok", "path", "revision", "seconds", "layout", "resumable"}; exit 0 / 1.

Resuming across runs: huggingface_hub resumes a cut transfer within one call (HTTP ``Range``) but deletes
its partial file when the call fails or the process dies, so the next run starts a 5-90 GB shard over
(huggingface_hub#4349; hf_xet does not resume either, xet-core#321/#715). So LFS files are first fetched
here with huggingface_hub's own ``http_get`` into a partial that outlives the process,
``<dest>/.cache/runbook/partial/<sha256>.part`` (named by content, so a changed revision never appends
to the wrong bytes); a re-run continues it with ``Range: bytes=<size>-``. A finished partial is renamed into
place and recorded in huggingface_hub's local-dir metadata, then ``snapshot_download`` fetches the rest
(small git files, and LFS files over the plain-HTTP size limit, which only the Xet path serves).
The bytes are verified afterwards against the Hub's sha256 (``verify_manifest``), not trusted here.

Two layouts (``--layout``), chosen by the runbook from the profile:

* ``local_dir`` -- ``<dest>/<files>``: a plain tree (recipe A's ``hf download --local-dir``; what
  ``vllm serve /model`` loads from a bind mount).
* ``hub_cache`` -- ``<dest>`` is an HF hub cache (``HF_HUB_CACHE`` = ``HF_HOME/hub``):
  ``models--org--name/blobs/<etag>``, ``snapshots/<rev>/<files>`` as relative symlinks into
  ``blobs``, and ``refs/main`` = the pinned revision, so ``vllm serve org/name`` resolves the bare
  repo id with ``HF_HUB_OFFLINE=1`` (recipe B's ``prepare-dspark-model-cache.sh``). A finished
  partial becomes ``blobs/<sha256>`` (the Hub's ETag of an LFS file); ``snapshot_download`` then
  links it into the snapshot itself.

Files over huggingface_hub's plain-HTTP limit (50 GB; the V4.1 Engram shards are 94.6 GiB) take the
same resumable path: the client refuses them only on a request from byte 0, so the first request is
made without the expected size (the length is still checked against ``Content-Length``, then the
size and sha256 afterwards) -- what an operator does with ``curl -C -`` on the same URL.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor

LAYOUT = "local_dir"   # the default: plain directory (<dest>/<files>)
LAYOUTS = ("local_dir", "hub_cache")
SHA40 = re.compile(r"^[0-9a-f]{40}$")


PARTIAL_DIR = (".cache", "runbook", "partial")
FROM_ZERO_ATTEMPTS = 3      # a file over the plain-HTTP limit cut before its first 10 MiB is asked again


def repo_folder(repo):
    """The hub cache's folder of a model repo: ``models--org--name`` (huggingface_hub's
    ``repo_folder_name``)."""
    return "models--" + repo.replace("/", "--")


def store_dir(layout, dest, repo):
    """The directory that holds everything of this repo (and its partials): what is copied or
    exported to another node. ``local_dir``: ``dest``; ``hub_cache``: ``dest/models--org--name``."""
    _check_layout(layout)
    return dest if layout == "local_dir" else os.path.join(dest, repo_folder(repo))


def tree_dir(layout, dest, repo, revision):
    """Where the files of the revision appear under their repo paths (what is verified, where the
    manifest sits). ``hub_cache``: ``dest/models--org--name/snapshots/<revision>``."""
    _check_layout(layout)
    return dest if layout == "local_dir" else os.path.join(store_dir(layout, dest, repo), "snapshots", revision)


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


def partial_path(base, sha256):
    """Where the not-yet-complete bytes of the LFS file with this sha256 are kept between runs
    (``base``: the store dir, :func:`store_dir`)."""
    return os.path.join(base, *PARTIAL_DIR, f"{sha256}.part")


def partial_bytes(base, sha256):
    try:
        return os.path.getsize(partial_path(base, sha256))
    except OSError:
        return 0


def lfs_files(repo, revision, *, endpoint=None, allow_patterns=None, ignore_patterns=None, token=None,
              timeout=30):
    """The pinned revision's LFS files selected by the patterns: [{"path", "size", "sha256"}]."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects
    info = HfApi(endpoint=endpoint, token=token if token else False).model_info(
        repo, revision=revision, files_metadata=True, timeout=timeout)
    siblings = {s.rfilename: s for s in info.siblings or []}
    wanted = filter_repo_objects(list(siblings), allow_patterns=allow_patterns or None,
                                 ignore_patterns=ignore_patterns or None)
    return [{"path": n, "size": int(siblings[n].size), "sha256": siblings[n].lfs.sha256} for n in wanted
            if siblings[n].lfs is not None and siblings[n].size is not None]


def resumable_fetch(repo, revision, dest, *, endpoint=None, allow_patterns=None, ignore_patterns=None,
                    max_workers=8, etag_timeout=30, token=None, progress=True, files=None,
                    layout=LAYOUT):
    """Fetch the LFS files of the pinned revision that are not yet in ``dest`` into partials that
    survive an interrupted run, then move each finished one into place (``local_dir``:
    ``dest/<path>``; ``hub_cache``: ``blobs/<sha256>``). ``files``: the selected LFS files as
    :func:`lfs_files` gives them, when the caller already has the Hub metadata (else it is read
    here). Returns one record per file: {"path", "size", "resumed_from"} (``resumed_from`` > 0:
    bytes a previous run had already fetched)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers
    if files is None:
        files = lfs_files(repo, revision, endpoint=endpoint, allow_patterns=allow_patterns,
                          ignore_patterns=ignore_patterns, token=token, timeout=etag_timeout)
    base = store_dir(layout, dest, repo)
    tree = tree_dir(layout, dest, repo, revision)
    todo = [f for f in files if not os.path.exists(os.path.join(tree, f["path"]))
            and not os.path.exists(_final_path(layout, dest, repo, f))]
    if not todo:
        return []
    headers = build_hf_headers(token=token if token else False)
    tqdm_class = None
    if progress:
        from tqdm.auto import tqdm as tqdm_class

    def fetch(f):
        url = hf_hub_url(repo, f["path"], revision=revision, endpoint=endpoint)
        return _fetch_one(url, headers, base, _final_path(layout, dest, repo, f), f["path"], f["size"],
                          f["sha256"], http_get, tqdm_class, record=(dest, revision) if layout == "local_dir" else None)

    with ThreadPoolExecutor(max_workers=max(1, int(max_workers))) as pool:
        return list(pool.map(fetch, todo))


def _final_path(layout, dest, repo, f):
    if layout == "local_dir":
        return os.path.join(dest, f["path"])
    return os.path.join(store_dir(layout, dest, repo), "blobs", f["sha256"])


def _fetch_one(url, headers, base, final, name, size, sha256, http_get, tqdm_class, record=None):
    from huggingface_hub import constants
    part = partial_path(base, sha256)
    os.makedirs(os.path.dirname(part), exist_ok=True)
    # One writer per partial: two runs appending to the same file would interleave bytes. The lock file
    # stays (unlinking it would let a late opener lock the old inode while a new run locks a new one).
    lock = open(part + ".lock", "w")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"{name}: another download is writing {part}; wait for it or stop it") from None
        first = partial_bytes(base, sha256)
        if first > size:         # cannot be a prefix of this file: start it over
            first = 0
        have = first
        for attempt in range(FROM_ZERO_ATTEMPTS):
            # huggingface_hub refuses a file over its plain-HTTP limit only on a request from byte 0 with
            # the size given; without it the length is checked against Content-Length (and below).
            expected = size if size <= constants.MAX_HTTP_DOWNLOAD_SIZE or have else None
            try:
                # "r+b", not "ab": http_get seeks back to 0 when a server answers a Range request with 200.
                with open(part, "r+b" if have else "wb") as fh:
                    fh.seek(have)
                    http_get(url, fh, resume_size=have, headers=headers, expected_size=expected,
                             displayed_filename=name, tqdm_class=tqdm_class)
                    fh.flush()
                    os.fsync(fh.fileno())
                break
            except ValueError:
                # http_get's own retry after a cut before its first 10 MiB chunk asks again from byte 0
                # with the size it learnt, and refuses itself: ask again here, the same way as above.
                have = partial_bytes(base, sha256)
                if expected is not None or have or attempt == FROM_ZERO_ATTEMPTS - 1:
                    raise
        got = os.path.getsize(part)
        if got != size:
            raise OSError(f"{name}: partial has {got} bytes, expected {size}; re-run to continue it")
        os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
        os.replace(part, final)
        if record is not None:
            _record_for_hub_client(record[0], name, record[1], sha256)
        return {"path": name, "size": size, "resumed_from": first}
    finally:
        lock.close()


def _record_for_hub_client(dest, name, revision, sha256):
    """Tell snapshot_download this file is the pinned revision's (else it would re-hash it to compare
    with the ETag). Private API: if it moves, the client just does that extra hash."""
    try:
        from pathlib import Path

        from huggingface_hub._local_folder import write_download_metadata
        write_download_metadata(local_dir=Path(dest), filename=name, commit_hash=revision, etag=sha256)
    except Exception:  # noqa: BLE001 - only an optimisation
        pass


def write_ref(dest, repo, revision, ref="main"):
    """``refs/<ref>`` = the pinned revision (no newline: huggingface_hub reads the file verbatim), so
    the bare repo id resolves offline to it."""
    path = os.path.join(store_dir("hub_cache", dest, repo), "refs", ref)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(revision)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def snapshot(repo, revision, dest, *, endpoint=None, allow_patterns=None, ignore_patterns=None,
             max_workers=8, download_timeout=120, etag_timeout=30, token=None, progress=True,
             fetched=None, lfs=None, layout=LAYOUT):
    """Pinned download into ``dest`` in ``layout``: LFS files by :func:`resumable_fetch` (``lfs``:
    its ``files``), the rest by ``snapshot_download``. Returns the tree (:func:`tree_dir`);
    ``fetched`` (a list) receives resumable_fetch's records."""
    if not SHA40.match(revision or ""):
        raise ValueError(f"revision must be a pinned 40-hex commit sha, got {revision!r}")
    _check_layout(layout)
    # The download timeout is read from huggingface_hub.constants at call time (http_get), and the
    # environment variable is read at import: set both, so it holds however the module was loaded.
    os.environ["HF_HUB_DOWNLOAD_TIMEOUT"] = str(int(download_timeout))
    os.environ["HF_HUB_ETAG_TIMEOUT"] = str(int(etag_timeout))
    if not progress:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    from huggingface_hub import constants, snapshot_download
    old_timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
    constants.HF_HUB_DOWNLOAD_TIMEOUT = int(download_timeout)
    try:
        records = resumable_fetch(repo, revision, dest, endpoint=endpoint, allow_patterns=allow_patterns,
                                  ignore_patterns=ignore_patterns, max_workers=max_workers,
                                  etag_timeout=etag_timeout, token=token, progress=progress, files=lfs,
                                  layout=layout)
        if fetched is not None:
            fetched.extend(records)
        kwargs = {}
        if progress:
            from tqdm.auto import tqdm
            kwargs["tqdm_class"] = tqdm
        if layout == "local_dir":
            kwargs["local_dir"] = dest
        else:
            kwargs["cache_dir"] = dest
        path = snapshot_download(
            repo_id=repo, revision=revision, endpoint=endpoint,
            allow_patterns=allow_patterns or None, ignore_patterns=ignore_patterns or None,
            max_workers=max(1, int(max_workers)), etag_timeout=etag_timeout,
            token=token if token else False, **kwargs)
        if layout == "hub_cache":
            write_ref(dest, repo, revision)
        return path
    finally:
        constants.HF_HUB_DOWNLOAD_TIMEOUT = old_timeout


def main(argv=None):
    ap = argparse.ArgumentParser(description="pinned snapshot download (runbook)")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--revision", required=True)
    ap.add_argument("--dest", required=True)
    ap.add_argument("--endpoint", default=None)
    ap.add_argument("--allow", action="append", default=[])
    ap.add_argument("--ignore", action="append", default=[])
    ap.add_argument("--max-workers", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--etag-timeout", type=int, default=30)
    ap.add_argument("--token-file", default="")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--layout", choices=LAYOUTS, default=LAYOUT)
    args = ap.parse_args(argv)
    token = None
    if args.token_file:
        with open(args.token_file) as fh:
            token = fh.read().strip() or None
    t0 = time.monotonic()
    fetched = []
    try:
        path = snapshot(args.repo, args.revision, args.dest, endpoint=args.endpoint,
                        allow_patterns=args.allow, ignore_patterns=args.ignore,
                        max_workers=args.max_workers, download_timeout=args.timeout,
                        etag_timeout=args.etag_timeout, token=token, progress=not args.no_progress,
                        fetched=fetched, layout=args.layout)
    except Exception as err:  # noqa: BLE001 - report as JSON, never echo the token
        msg = str(err)
        if token:
            msg = msg.replace(token, "***")
        print(json.dumps({"ok": False, "error": f"{type(err).__name__}: {msg}"}))
        return 1
    print(json.dumps({"ok": True, "path": path, "revision": args.revision, "layout": args.layout,
                      "seconds": round(time.monotonic() - t0, 3), "resumable": fetched}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
