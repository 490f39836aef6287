"""Local verification helpers around ``verify_manifest`` (the one hashing implementation)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..checks import Check, check
from ..weights_tools import verify_manifest
from ..weights_tools.verify_manifest import MANIFEST_NAME


def verify_dir(directory: str | os.PathLike, expected: dict[str, Any], *, workers: int = 4,
               reuse: bool = True, write: bool = True) -> dict[str, Any]:
    """Verify ``directory`` against an expected document (``RepoSnapshot.expected()`` or a manifest)."""
    return verify_manifest.verify(str(directory), expected, workers=workers, reuse=reuse, write=write)


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(directory) / MANIFEST_NAME
    return json.loads(path.read_text()) if path.is_file() else None


def manifest_to_expected(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest from one node as the expected document for another (sha256 for every file)."""
    return {"repo": manifest.get("repo", ""), "revision": manifest.get("revision", ""),
            "files": [{"path": f["path"], "size": f["size"], "sha256": f["sha256"]}
                      for f in manifest.get("files", [])]}


def parity(head_manifest: dict[str, Any] | None, worker_manifest: dict[str, Any] | None, *,
           node: str = "worker") -> Check:
    """Worker manifest == head manifest (revision, file set, size, sha256); names differing files."""
    if not head_manifest or not worker_manifest:
        missing = "head" if not head_manifest else node
        return check("weights.parity", False, node="cluster", observed=f"no manifest on {missing}",
                     expected="a .runbook-manifest.json on every node",
                     fix="run the verification on that node first")
    diffs = []
    if head_manifest.get("revision") != worker_manifest.get("revision"):
        diffs.append(f"revision {worker_manifest.get('revision')} != {head_manifest.get('revision')}")
    h = {f["path"]: f for f in head_manifest.get("files", [])}
    w = {f["path"]: f for f in worker_manifest.get("files", [])}
    for path in sorted(set(h) | set(w)):
        if path not in w:
            diffs.append(f"{path}: missing on {node}")
        elif path not in h:
            diffs.append(f"{path}: only on {node}")
        elif h[path]["size"] != w[path]["size"]:
            diffs.append(f"{path}: size {w[path]['size']} != {h[path]['size']}")
        elif h[path]["sha256"] != w[path]["sha256"]:
            diffs.append(f"{path}: sha256 {w[path]['sha256'][:12]}… != {h[path]['sha256'][:12]}…")
    return check("weights.parity", not diffs, node="cluster",
                 observed="; ".join(diffs) if diffs else f"{len(h)} files identical",
                 expected=f"{node} manifest == head manifest",
                 fix="re-sync the named files (rsync mode) or re-run the worker download",
                 data={"differences": diffs, "files": len(h)})


def hash_rate_vs_sha256sum(paths: Iterable[str | os.PathLike], *, workers: int = 4,
                           warm: bool = True) -> dict[str, Any]:
    """Hash the same files with the runbook verifier and with ``sha256sum`` in the same run.

    Returns GB/s (1e9 B/s) of: the runbook verifier (parallel across files, ``workers`` threads),
    ``sha256sum`` one process over all files (what an operator types), and ``sha256sum`` with
    ``workers`` processes (``xargs -P``). With ``warm`` every file is read once first so all three
    runs read from the page cache (the comparison is of hashing, not of the disk); digests must agree.
    """
    files = [str(Path(p).absolute()) for p in paths]
    total = sum(os.path.getsize(p) for p in files)
    if warm:
        for p in files:
            with open(p, "rb", buffering=0) as fh:
                while fh.read(8 << 20):
                    pass
    root = os.path.commonpath([os.path.dirname(p) for p in files])
    expected = {"revision": "", "files": [{"path": os.path.relpath(p, root),
                                           "size": os.path.getsize(p)} for p in files]}
    t0 = time.monotonic()
    report = verify_manifest.verify(root, expected, workers=workers, reuse=False, write=False)
    ours_s = time.monotonic() - t0
    ours = {os.path.join(root, r["path"]): r.get("sha256") for r in report["files"]}
    t0 = time.monotonic()
    out = subprocess.run(["sha256sum", *files], capture_output=True, text=True, check=True).stdout
    serial_s = time.monotonic() - t0
    theirs = {line.split(None, 1)[1].lstrip("*"): line.split()[0] for line in out.splitlines()}
    t0 = time.monotonic()
    subprocess.run(["xargs", "-0", "-n", "1", "-P", str(workers), "sha256sum"],
                   input="\0".join(files), capture_output=True, text=True, check=True)
    par_s = time.monotonic() - t0
    agree = report["ok"] and all(ours.get(p) == theirs.get(p) for p in files)
    return {"bytes": total, "files": len(files), "workers": workers,
            "runbook_gbps": round(total / ours_s / 1e9, 3),
            "sha256sum_gbps": round(total / serial_s / 1e9, 3),
            "sha256sum_parallel_gbps": round(total / par_s / 1e9, 3),
            "runbook_s": round(ours_s, 3), "sha256sum_s": round(serial_s, 3),
            "sha256sum_parallel_s": round(par_s, 3), "digests_agree": agree, "warm": warm}

