"""A small Hugging Face Hub-compatible endpoint for the lab (``HF_ENDPOINT``).

The lab nodes cannot reach huggingface.co, so the weights step downloads from this server with the
*real* ``huggingface_hub`` client. It implements exactly the routes ``huggingface_hub`` 2.4 calls for
``model_info``/``repo_info`` (``files_metadata=True``), ``list_repo_tree``, ``get_paths_info``,
``snapshot_download``, ``hf_hub_download`` and ``get_hf_file_metadata`` (HEAD), with HTTP ``Range``
(how the client resumes a cut transfer) and bodies streamed from disk in 1 MiB pieces (bounded
memory, files of any size). Standard library only, so a lab node's ``python3`` can run it too.

Layout served (one directory per pinned revision; ``publish_repo`` creates it)::

    <root>/<org>/<name>/<revision-sha>/<files…>      the files of that revision
    <root>/<org>/<name>/refs/<branch>                 text: the revision sha (``main``)
    <root>/<org>/<name>/.meta/<revision-sha>.json     cached per-file size/sha256/git-oid

Large files (weights, or >= ``LFS_THRESHOLD`` bytes) are presented as Git LFS files: ``lfs.sha256``
and ``lfs.size`` in the metadata, ``ETag``/``X-Linked-Etag`` = sha256, ``X-Linked-Size``; small
files as plain git blobs (``oid`` = git blob sha1), exactly as the Hub does.

Run:  ``python -m runbook.lab.hub --root DIR --host 10.77.0.1 --port 8765``
An Engram source repo for a rehearsal: ``python -m runbook.lab.hub --root DIR --publish-engram ORG/NAME``.
Tests: ``with HubServer(root, host="127.0.0.1") as hub: hub.url …`` (port 0 = any free port).
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from typing_extensions import Self

CHUNK = 1 << 20
HEALTH_PATH = "/lab/health"      # the lab's liveness probe (not a Hub route): answers with no repository published
LFS_THRESHOLD = 1 << 20          # files this big or bigger are served as LFS files
LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.msgpack",
                "*.h5", "*.onnx", "*.npy", "*.npz", "*.model", "*.tar", "*.gz", "*.zst")
POINTER_SIZE = 134               # a Git LFS pointer file is ~134 bytes
_SHA40 = re.compile(r"^[0-9a-f]{40}$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


# --------------------------------------------------------------------------------------------
# repository store

def _is_lfs(path: str, size: int, threshold: int = LFS_THRESHOLD) -> bool:
    name = path.rsplit("/", 1)[-1]
    return size >= threshold or any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS)


def _hash_file(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of one file, streamed."""
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    git = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            sha256.update(chunk)
            git.update(chunk)
    return sha256.hexdigest(), git.hexdigest()


def _list_files(rev_dir: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(rev_dir):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            out.append(os.path.relpath(os.path.join(dirpath, name), rev_dir).replace(os.sep, "/"))
    return sorted(out)


def scan_revision(rev_dir: Path, threshold: int = LFS_THRESHOLD) -> list[dict[str, Any]]:
    """Per-file metadata of one revision directory: path, size, sha256, oid (git blob), lfs."""
    files = []
    for rel in _list_files(rev_dir):
        full = rev_dir / rel
        size = full.stat().st_size
        sha256, oid = _hash_file(full)
        files.append({"path": rel, "size": size, "sha256": sha256, "oid": oid,
                      "lfs": _is_lfs(rel, size, threshold)})
    return files


def _write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def publish_repo(root: str | os.PathLike, repo_id: str, src_dir: str | os.PathLike, *,
                 branch: str = "main", link: bool = False,
                 lfs_threshold: int = LFS_THRESHOLD) -> str:
    """Add ``src_dir`` (e.g. the tiny model) as a new pinned revision of ``repo_id`` under ``root``.

    Returns the 40-hex revision sha (deterministic: derived from the parent revision and the
    path/size/sha256 of every file) and points ``refs/<branch>`` at it. Files are copied, or
    hard-linked with ``link=True`` (then never modify the source afterwards).
    """
    org, name = _split_repo(repo_id)
    src = Path(src_dir)
    if not src.is_dir():
        raise FileNotFoundError(f"publish_repo: source directory {src} does not exist")
    repo_dir = Path(root) / org / name
    files = scan_revision(src, lfs_threshold)
    parent = read_ref(repo_dir, branch) or ""
    digest = hashlib.sha1(f"{repo_id}\n{parent}\n".encode())
    for f in files:
        digest.update(f"{f['path']}\0{f['size']}\0{f['sha256']}\n".encode())
    sha = digest.hexdigest()
    rev_dir = repo_dir / sha
    if not rev_dir.is_dir():
        tmp = repo_dir / f".{sha}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for f in files:
            dst = tmp / f["path"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            if link:
                try:
                    os.link(src / f["path"], dst)
                    continue
                except OSError:
                    pass
            shutil.copy2(src / f["path"], dst)
        tmp.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, rev_dir)
    _write_json_atomic(repo_dir / ".meta" / f"{sha}.json",
                       {"repo": repo_id, "revision": sha, "parent": parent,
                        "created": datetime.now(timezone.utc).isoformat(), "files": files})
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / branch).write_text(sha + "\n")
    return sha


ENGRAM_OTHER_SHARD = "model-00001-of-00048.safetensors"


def publish_engram_source(root: str | os.PathLike, repo_id: str, *, vocab: int = 2000, seed: int = 0,
                          branch: str = "main") -> str:
    """Publish a scaled-down original DeepSeek-V4.1 checkpoint as ``repo_id``: the Engram tables in
    shards ``model-00047/00048-of-00048.safetensors`` with the real tensor names and dtypes, a
    ``config.json`` with the ``engram_*`` keys and an index (``runbook.engram_tools.synth``), plus what a
    full checkpoint has and recipe A does NOT download (a non-Engram shard in the index, a tokenizer),
    so a rehearsal's 02_weights proves it fetches only config, index and shards 47/48. Deterministic
    for (vocab, seed): the same revision sha every time on a fresh root. Returns the sha."""
    import tempfile

    from ..engram_tools import synth
    with tempfile.TemporaryDirectory(prefix="lab-engram-src-") as tmp:
        synth.make_source(tmp, vocab_size=vocab, seed=seed)
        with open(os.path.join(tmp, ENGRAM_OTHER_SHARD), "wb") as fh:     # stands in for a shard 02 must not fetch
            fh.write(hashlib.sha256(f"other shard {seed}".encode()).digest() * 4096)
        index_path = os.path.join(tmp, "model.safetensors.index.json")
        with open(index_path) as fh:
            index = json.load(fh)
        index["weight_map"]["layers.0.attn.wq_a.weight"] = ENGRAM_OTHER_SHARD
        with open(index_path, "w") as fh:
            json.dump(index, fh, indent=1)
        with open(os.path.join(tmp, "tokenizer.json"), "w") as fh:
            json.dump({"version": "1.0", "lab": True}, fh)
        return publish_repo(root, repo_id, tmp, branch=branch)


def _split_repo(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or any(p.startswith(".") for p in parts):
        raise ValueError(f"repo id must be 'org/name', got {repo_id!r}")
    return parts[0], parts[1]


def read_ref(repo_dir: Path, ref: str) -> str | None:
    path = repo_dir / "refs" / ref
    if "/" in ref or ref.startswith(".") or not path.is_file():
        return None
    sha = path.read_text().strip()
    return sha if _SHA40.match(sha) else None


class HubStore:
    """Read side of the layout, with an in-memory cache of per-revision metadata."""

    def __init__(self, root: str | os.PathLike, lfs_threshold: int = LFS_THRESHOLD):
        self.root = Path(root)
        self.lfs_threshold = lfs_threshold
        self._meta: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def repo_dir(self, repo_id: str) -> Path | None:
        try:
            org, name = _split_repo(repo_id)
        except ValueError:
            return None
        path = self.root / org / name
        return path if path.is_dir() else None

    def resolve(self, repo_id: str, revision: str) -> str | None:
        repo_dir = self.repo_dir(repo_id)
        if repo_dir is None:
            return None
        if _SHA40.match(revision):
            return revision if (repo_dir / revision).is_dir() else None
        return read_ref(repo_dir, revision)

    def files(self, repo_id: str, sha: str) -> dict[str, dict[str, Any]]:
        key = (repo_id, sha)
        with self._lock:
            if key in self._meta:
                return self._meta[key]
        repo_dir = self.repo_dir(repo_id)
        assert repo_dir is not None
        meta_path = repo_dir / ".meta" / f"{sha}.json"
        files = None
        if meta_path.is_file():
            try:
                files = json.loads(meta_path.read_text())["files"]
            except (OSError, ValueError, KeyError):
                files = None
        if files is None:   # hand-made revision directory: hash once, cache on disk
            files = scan_revision(repo_dir / sha, self.lfs_threshold)
            _write_json_atomic(meta_path, {"repo": repo_id, "revision": sha, "files": files})
        table = {f["path"]: f for f in files}
        with self._lock:
            self._meta[key] = table
        return table

    def mtime(self, repo_id: str, sha: str) -> str:
        repo_dir = self.repo_dir(repo_id)
        ts = (repo_dir / sha).stat().st_mtime if repo_dir else time.time()
        return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


# --------------------------------------------------------------------------------------------
# JSON shapes (as huggingface_hub parses them)

def _tree_entry(f: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "path": f["path"], "size": f["size"], "oid": f["oid"]}
    if f["lfs"]:
        entry["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": POINTER_SIZE}
    return entry


def _sibling(f: dict[str, Any], blobs: bool) -> dict[str, Any]:
    if not blobs:
        return {"rfilename": f["path"]}
    entry: dict[str, Any] = {"rfilename": f["path"], "size": f["size"], "blobId": f["oid"]}
    if f["lfs"]:
        entry["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": POINTER_SIZE}
    return entry


def _dirs_of(paths: list[str]) -> list[str]:
    dirs = set()
    for p in paths:
        parts = p.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return sorted(dirs)


def _dir_entry(path: str) -> dict[str, Any]:
    return {"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest()}


# --------------------------------------------------------------------------------------------
# fault injection (tests): cut a transfer after N bytes

@dataclass
class Fault:
    """Drop the connection after ``cut_after`` body bytes of ``path``, ``times`` times; with
    ``stall_seconds``, first hold it open that long sending nothing (a client killed mid-file)."""
    path: str
    cut_after: int
    times: int = 1
    stall_seconds: float = 0.0


@dataclass
class RequestLog:
    method: str
    path: str
    range: str
    status: int
    bytes_sent: int


@dataclass
class HubState:
    store: HubStore
    token: str | None = None                      # if set, requests must carry it as Bearer
    faults: list[Fault] = field(default_factory=list)
    log: list[RequestLog] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closing: threading.Event = field(default_factory=threading.Event)   # ends stalls when the server stops

    def take_fault(self, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.path == path and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def record(self, entry: RequestLog) -> None:
        with self.lock:
            self.log.append(entry)

    def bytes_sent(self, path: str | None = None) -> int:
        with self.lock:
            return sum(e.bytes_sent for e in self.log
                       if e.method == "GET" and (path is None or e.path == path))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "runbook-lab-hub/1"
    state: HubState  # set on the subclass made per server

    # quiet by default; the server logs its own one-liners
    def log_message(self, fmt: str, *args: Any) -> None:
        if getattr(self.server, "verbose", False):
            sys.stderr.write("hub: " + fmt % args + "\n")

    # ---- plumbing
    def _send_json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.state.record(RequestLog(self.command, self.path, "", status, 0))

    def _error(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        hdrs = {"X-Error-Code": code, "X-Error-Message": message}
        hdrs.update(headers or {})
        self._send_json({"error": message}, status, hdrs)

    def _authorized(self) -> bool:
        if not self.state.token:
            return True
        if self.headers.get("Authorization", "") == f"Bearer {self.state.token}":
            return True
        self._error(401, "RepoNotFound", "Invalid credentials in Authorization header")
        return False

    def _drain_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # ---- verbs
    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            body = self._drain_body() if self.command == "POST" else b""
            if self.path == HEALTH_PATH and self.command == "GET":     # the lab's own liveness probe, no auth
                return self._send_json({"hub": "spark-runbook lab", "root": str(self.state.store.root)})
            if not self._authorized():
                return
            url = urlsplit(self.path)
            path = unquote(url.path)
            query = parse_qs(url.query)
            m = re.match(r"^/api/models/([^/]+/[^/]+?)(?:/revision/(.+))?/?$", path)
            if m and self.command in ("GET", "HEAD"):
                return self._model_info(m.group(1), m.group(2) or "main", query)
            m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
            if m and self.command == "GET":
                return self._tree(m.group(1), m.group(2), m.group(3) or "", query)
            m = re.match(r"^/api/models/([^/]+/[^/]+)/paths-info/([^/]+)$", path)
            if m and self.command == "POST":
                return self._paths_info(m.group(1), m.group(2), body)
            m = re.match(r"^/(?:models/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
            if m and self.command in ("GET", "HEAD"):
                return self._resolve(m.group(1), m.group(2), m.group(3))
            self._error(404, "NotFound", f"no route for {self.command} {path}")
        except (BrokenPipeError, ConnectionResetError):
            pass

    # ---- routes
    def _repo_rev(self, repo_id: str, revision: str) -> str | None:
        if self.state.store.repo_dir(repo_id) is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {repo_id}")
            return None
        sha = self.state.store.resolve(repo_id, revision)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return sha

    def _model_info(self, repo_id: str, revision: str, query: dict[str, list[str]]) -> None:
        sha = self._repo_rev(repo_id, revision)
        if sha is None:
            return
        files = self.state.store.files(repo_id, sha)
        blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        used = sum(f["size"] for f in files.values())
        info = {"_id": sha[:24], "id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0],
                "sha": sha, "lastModified": self.state.store.mtime(repo_id, sha), "private": False,
                "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                "library_name": "transformers", "usedStorage": used,
                "siblings": [_sibling(f, blobs) for f in files.values()]}
        self._send_json(info)

    def _tree(self, repo_id: str, revision: str, sub: str, query: dict[str, list[str]]) -> None:
        sha = self._repo_rev(repo_id, unquote(revision))
        if sha is None:
            return
        files = self.state.store.files(repo_id, sha)
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        sub = sub.strip("/")
        prefix = sub + "/" if sub else ""
        if sub and not any(p.startswith(prefix) for p in files):
            return self._error(404, "EntryNotFound", f"{sub} does not exist at {sha}")
        entries = []
        paths = [p for p in files if p.startswith(prefix)]
        for d in _dirs_of(paths):
            if d.startswith(prefix) and (recursive or "/" not in d[len(prefix):]):
                entries.append(_dir_entry(d))
        for p in paths:
            if recursive or "/" not in p[len(prefix):]:
                entries.append(_tree_entry(files[p]))
        self._send_json(entries)

    def _paths_info(self, repo_id: str, revision: str, body: bytes) -> None:
        sha = self._repo_rev(repo_id, unquote(revision))
        if sha is None:
            return
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            wanted = json.loads(body or b"{}").get("paths", [])
        else:
            wanted = parse_qs(body.decode()).get("paths", [])
        files = self.state.store.files(repo_id, sha)
        dirs = set(_dirs_of(list(files)))
        out = []
        for p in wanted if isinstance(wanted, list) else [wanted]:
            p = p.strip("/")
            if p in files:
                out.append(_tree_entry(files[p]))
            elif p in dirs:
                out.append(_dir_entry(p))
        self._send_json(out)

    def _resolve(self, repo_id: str, revision: str, filename: str) -> None:
        sha = self._repo_rev(repo_id, unquote(revision))
        if sha is None:
            return
        files = self.state.store.files(repo_id, sha)
        meta = files.get(filename)
        if meta is None:
            return self._error(404, "EntryNotFound", f"{filename} does not exist at {sha}",
                               {"X-Repo-Commit": sha})
        disk = self.state.store.repo_dir(repo_id) / sha / filename  # type: ignore[operator]
        size = meta["size"]
        etag = meta["sha256"] if meta["lfs"] else meta["oid"]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream", "Content-Disposition":
                   f'attachment; filename="{filename.rsplit("/", 1)[-1]}"'}
        if meta["lfs"]:
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(size)
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng:
            m = _RANGE.match(rng.strip())
            if not m or (not m.group(1) and not m.group(2)):
                return self._error(416, "RangeNotSatisfiable", f"bad range {rng!r}",
                                   {"Content-Range": f"bytes */{size}"})
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start, end = max(0, size - int(m.group(2))), size - 1
            if start >= size or start > end:
                return self._error(416, "RangeNotSatisfiable", f"range {rng!r} outside 0..{size}",
                                   {"Content-Range": f"bytes */{size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = end - start + 1 if size else 0
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
            self.state.record(RequestLog("HEAD", filename, rng or "", status, 0))
            return
        fault = self.state.take_fault(filename)
        budget = length if fault is None else min(length, fault.cut_after)
        sent = 0
        try:
            with open(disk, "rb") as fh:
                fh.seek(start)
                while sent < budget:
                    chunk = fh.read(min(CHUNK, budget - sent))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
            if fault is not None and sent < length:
                self.wfile.flush()
                if fault.stall_seconds:
                    self.state.closing.wait(fault.stall_seconds)
                self.close_connection = True
                try:   # hard close: the client sees a short body
                    import socket
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        finally:
            self.state.record(RequestLog("GET", filename, rng or "", status, sent))


# --------------------------------------------------------------------------------------------
# server object

class HubServer:
    """The endpoint, in-process (tests, notebooks) or as ``python -m runbook.lab.hub``."""

    def __init__(self, root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0, *,
                 token: str | None = None, lfs_threshold: int = LFS_THRESHOLD, verbose: bool = False):
        self.state = HubState(store=HubStore(root, lfs_threshold), token=token)
        handler = type("HubHandler", (_Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.httpd.verbose = verbose  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def add_fault(self, path: str, cut_after: int, times: int = 1, stall_seconds: float = 0.0) -> None:
        with self.state.lock:
            self.state.faults.append(Fault(path, cut_after, times, stall_seconds))

    def bytes_sent(self, path: str | None = None) -> int:
        return self.state.bytes_sent(path)

    @property
    def log(self) -> list[RequestLog]:
        with self.state.lock:
            return list(self.state.log)

    def start(self) -> HubServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="lab-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.state.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.lab.hub", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="directory holding <org>/<name>/<revision>/files")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--token-file", default="", help="require this bearer token (file, 0600)")
    ap.add_argument("--publish", nargs=2, metavar=("REPO_ID", "SRC_DIR"),
                    help="publish SRC_DIR as a new revision of REPO_ID, print the sha, and exit")
    ap.add_argument("--publish-engram", metavar="REPO_ID",
                    help="publish a scaled-down V4.1 Engram source checkpoint as REPO_ID, print the sha, and exit")
    ap.add_argument("--engram-vocab", type=int, default=2000, help="vocab of --publish-engram (table size)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.publish:
        print(publish_repo(args.root, args.publish[0], args.publish[1]))
        return 0
    if args.publish_engram:
        print(publish_engram_source(args.root, args.publish_engram, vocab=args.engram_vocab))
        return 0
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    server = HubServer(args.root, args.host, args.port, token=token, verbose=args.verbose)
    print(f"lab hub serving {args.root} at {server.url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
