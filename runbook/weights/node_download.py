#!/usr/bin/env python3
"""Pinned snapshot download with huggingface_hub: one implementation used locally by
``runbook.weights.download`` and shipped to a node (download-both mode) and run there with a python
that has ``huggingface_hub`` installed. Needs only the standard library + huggingface_hub.

The token is never on the command line: locally it is passed in-process (from the environment);
on a node it is read from ``--token-file`` (a 0600 file the runbook writes and deletes).

CLI::

    python3 node_download.py --repo ORG/NAME --revision SHA40 --dest DIR [--endpoint URL]
        [--allow PATTERN ...] [--ignore PATTERN ...] [--max-workers 8] [--timeout 120]
        [--etag-timeout 30] [--token-file PATH] [--no-progress]
prints one JSON line {"ok", "path", "revision", "seconds", "layout"}; exit 0 / 1.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

LAYOUT = "local_dir"   # plain directory (<dest>/<files>), not the HF cache (models--org--name/blobs…)
SHA40 = re.compile(r"^[0-9a-f]{40}$")


def snapshot(repo, revision, dest, *, endpoint=None, allow_patterns=None, ignore_patterns=None,
             max_workers=8, download_timeout=120, etag_timeout=30, token=None, progress=True):
    """``snapshot_download`` of a pinned revision into ``dest`` (local_dir layout). Returns path."""
    if not SHA40.match(revision or ""):
        raise ValueError(f"revision must be a pinned 40-hex commit sha, got {revision!r}")
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
        kwargs = {}
        if progress:
            from tqdm.auto import tqdm
            kwargs["tqdm_class"] = tqdm
        return snapshot_download(
            repo_id=repo, revision=revision, local_dir=dest, endpoint=endpoint,
            allow_patterns=allow_patterns or None, ignore_patterns=ignore_patterns or None,
            max_workers=max(1, int(max_workers)), etag_timeout=etag_timeout,
            token=token if token else False, **kwargs)
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
    args = ap.parse_args(argv)
    token = None
    if args.token_file:
        with open(args.token_file) as fh:
            token = fh.read().strip() or None
    t0 = time.monotonic()
    try:
        path = snapshot(args.repo, args.revision, args.dest, endpoint=args.endpoint,
                        allow_patterns=args.allow, ignore_patterns=args.ignore,
                        max_workers=args.max_workers, download_timeout=args.timeout,
                        etag_timeout=args.etag_timeout, token=token, progress=not args.no_progress)
    except Exception as err:  # noqa: BLE001 - report as JSON, never echo the token
        msg = str(err)
        if token:
            msg = msg.replace(token, "***")
        print(json.dumps({"ok": False, "error": f"{type(err).__name__}: {msg}"}))
        return 1
    print(json.dumps({"ok": True, "path": path, "revision": args.revision, "layout": LAYOUT,
                      "seconds": round(time.monotonic() - t0, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
