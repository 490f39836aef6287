#!/usr/bin/env python3
"""Verify a weights directory against expected sizes/hashes; keep a manifest for fast re-runs.

Standard library only: the runbook ships this file to a node and runs it with the node's
``python3`` (worker after rsync, worker in download-both mode); the library imports the same
functions locally, so there is one hashing implementation.

Expected file (JSON)::

    {"repo": "org/name", "revision": "<40-hex>",
     "files": [{"path": "model-00001.safetensors", "size": 123, "sha256": "<64-hex>"},   # LFS file
               {"path": "config.json", "size": 456, "git_sha1": "<40-hex>"}]}           # plain git blob

A manifest written by this script (``.runbook-manifest.json`` next to the weights) has the same
shape plus ``sha256`` and ``mtime_ns`` for every file, so a head manifest can serve as the worker's
expected file. On a re-run, a file whose path, size and mtime match the manifest entry (and whose
recorded hash equals the expected one) is not hashed again.

CLI::

    python3 verify_manifest.py --dir DIR --expected EXPECTED.json [--workers 4] [--no-reuse]
                               [--no-write] [--manifest NAME]
prints one JSON report on stdout; exit 0 = all files verified, 1 = some file failed, 2 = usage error.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

MANIFEST_NAME = ".runbook-manifest.json"
READ_SIZE = 8 << 20          # 8 MiB streaming reads: memory per worker is bounded by this
SCHEMA = 1


def hash_file(path, want_git_sha1=False, read_size=READ_SIZE):
    """Stream one file once; return {"sha256", "size", ["git_sha1"]}. hashlib releases the GIL
    on large buffers, so threads hash different files in parallel."""
    size = os.stat(path).st_size
    sha = hashlib.sha256()
    git = hashlib.sha1(b"blob %d\0" % size) if want_git_sha1 else None
    done = 0
    buf = bytearray(read_size)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            sha.update(view[:n])
            if git is not None:
                git.update(view[:n])
            done += n
    out = {"sha256": sha.hexdigest(), "size": done}
    if git is not None:
        out["git_sha1"] = git.hexdigest()
    return out


def load_json(path):
    with open(path) as fh:
        return json.load(fh)


def write_json_atomic(path, data):
    """Write JSON next to the weights atomically (tmp + fsync + rename + dir fsync)."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _safe_join(root, rel):
    full = os.path.normpath(os.path.join(root, rel))
    if not (full == root or full.startswith(root.rstrip(os.sep) + os.sep)):
        raise ValueError(f"path escapes the weights directory: {rel!r}")
    return full


def verify(directory, expected, *, workers=4, reuse=True, write=True, manifest_name=MANIFEST_NAME,
           read_size=READ_SIZE):
    """Check every expected file: exists, exact size, sha256 (LFS) or git blob sha1 (plain).

    ``expected`` is the dict described in the module docstring. Returns a report dict::

        {"ok", "revision", "files": [{"path", "status", "observed", "expected", "hashed"}],
         "failed": [paths], "bytes_hashed", "files_hashed", "seconds", "gbps", "manifest"}

    status is one of ok | missing | size | sha256 | git_sha1 | error. The manifest is
    (re)written only when every file verified, so a manifest always describes a good tree.
    """
    root = os.path.abspath(directory)
    revision = expected.get("revision", "")
    manifest_path = os.path.join(root, manifest_name)
    old = {}
    if reuse and os.path.isfile(manifest_path):
        try:
            prev = load_json(manifest_path)
            if prev.get("revision") == revision and prev.get("schema") == SCHEMA:
                old = {f["path"]: f for f in prev.get("files", [])}
        except (OSError, ValueError, KeyError, TypeError):
            old = {}

    results = {}
    to_hash = []
    entries = {}
    for exp in expected.get("files", []):
        rel = exp["path"]
        try:
            full = _safe_join(root, rel)
        except ValueError as err:
            results[rel] = _res(rel, "error", str(err), "a path inside the directory")
            continue
        try:
            st = os.stat(full)
        except FileNotFoundError:
            results[rel] = _res(rel, "missing", "no such file", f"{exp['size']} bytes")
            continue
        if st.st_size != exp["size"]:
            results[rel] = _res(rel, "size", f"{st.st_size} bytes", f"{exp['size']} bytes")
            continue
        prev = old.get(rel)
        if (prev is not None and prev.get("size") == st.st_size and prev.get("mtime_ns") == st.st_mtime_ns
                and _hash_matches(prev, exp)):
            results[rel] = _res(rel, "ok", "manifest (size+mtime unchanged)", "", hashed=False)
            entries[rel] = dict(prev)
            continue
        to_hash.append((rel, full, exp, st))

    bytes_hashed = 0
    t0 = time.monotonic()
    if to_hash:
        def work(item):
            _rel, full, exp, _st = item
            try:
                return item, hash_file(full, want_git_sha1="git_sha1" in exp, read_size=read_size), None
            except OSError as err:
                return item, None, err
        # largest first so the slowest file starts early
        to_hash.sort(key=lambda it: -it[3].st_size)
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(to_hash)))) as pool:
            for (rel, full, exp, st), got, err in pool.map(work, to_hash):
                if err is not None:
                    results[rel] = _res(rel, "error", str(err), "readable file")
                    continue
                bytes_hashed += got["size"]
                if got["size"] != exp["size"]:
                    results[rel] = _res(rel, "size", f"{got['size']} bytes (changed while hashing)",
                                        f"{exp['size']} bytes")
                elif "sha256" in exp and got["sha256"] != exp["sha256"]:
                    results[rel] = _res(rel, "sha256", got["sha256"], exp["sha256"])
                elif "git_sha1" in exp and got.get("git_sha1") != exp["git_sha1"]:
                    results[rel] = _res(rel, "git_sha1", got.get("git_sha1", ""), exp["git_sha1"])
                else:
                    results[rel] = _res(rel, "ok", "hashed", "")
                    results[rel]["sha256"] = got["sha256"]
                    entry = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                             "sha256": got["sha256"], "revision": revision}
                    if "git_sha1" in got:
                        entry["git_sha1"] = got["git_sha1"]
                    entries[rel] = entry
    seconds = time.monotonic() - t0

    files = [results[e["path"]] for e in expected.get("files", []) if e["path"] in results]
    failed = [r["path"] for r in files if r["status"] != "ok"]
    ok = not failed
    if ok and write:
        write_json_atomic(manifest_path, {
            "schema": SCHEMA, "repo": expected.get("repo", ""), "revision": revision,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": [entries[e["path"]] for e in expected.get("files", [])]})
    return {"ok": ok, "revision": revision, "directory": root, "files": files, "failed": failed,
            "bytes_hashed": bytes_hashed, "files_hashed": len(to_hash), "seconds": round(seconds, 6),
            "gbps": round(bytes_hashed / seconds / 1e9, 4) if bytes_hashed and seconds > 0 else 0.0,
            "manifest": manifest_path if ok and write else ""}


def _hash_matches(prev, exp):
    if "sha256" in exp and prev.get("sha256") != exp["sha256"]:
        return False
    if "git_sha1" in exp and prev.get("git_sha1") != exp["git_sha1"]:
        return False
    return "sha256" in exp or "git_sha1" in exp or bool(prev.get("sha256"))


def _res(path, status, observed, expected, hashed=None):
    return {"path": path, "status": status, "observed": observed, "expected": expected,
            "hashed": (status != "ok" or observed == "hashed") if hashed is None else hashed}


def main(argv=None):
    ap = argparse.ArgumentParser(description="verify a weights directory against expected hashes")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--expected", required=True, help="expected JSON (or a manifest from another node)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--no-reuse", action="store_true", help="ignore an existing manifest; hash everything")
    ap.add_argument("--no-write", action="store_true", help="do not write the manifest")
    ap.add_argument("--manifest", default=MANIFEST_NAME)
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if not os.path.isdir(args.dir):
        print(json.dumps({"ok": False, "error": f"not a directory: {args.dir}"}))
        return 2
    try:
        expected = load_json(args.expected)
    except (OSError, ValueError) as err:
        print(json.dumps({"ok": False, "error": f"cannot read expected file: {err}"}))
        return 2
    report = verify(args.dir, expected, workers=args.workers, reuse=not args.no_reuse,
                    write=not args.no_write, manifest_name=args.manifest)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
