#!/usr/bin/env python3
"""Pinned snapshot download with the Python standard library only: one implementation used locally by
``runbook.weights.download`` and shipped to a node (download-both mode, the head's download) and run there
with the node's own ``python3`` (3.8 or later; stock DGX OS has no ``huggingface_hub`` and refuses ``pip
install`` outside a venv, PEP 668). No package of the node's Python is imported.

The token is never on the command line: locally it is passed in-process (from the environment);
on a node it is read from ``--token-file`` (a 0600 file the runbook writes and deletes).

CLI::

    python3 node_download.py --repo ORG/NAME --revision SHA40 --dest DIR [--endpoint URL]
        [--files EXPECTED.json] [--allow PATTERN ...] [--ignore PATTERN ...] [--max-workers 8]
        [--timeout 120] [--etag-timeout 30] [--token-file PATH] [--no-progress] [--layout local_dir|hub_cache]
        [--label WHAT]
prints one JSON line {"ok", "path", "revision", "seconds", "layout", "resumable"}; exit 0 / 1. With ``--label``
the bytes still to fetch are counted on stderr, at most every :data:`COUNT_EVERY_S` and once at the end, in the
runbook's progress form (``runbook/progress.py``: ``<label>: 45.0% 1.20/2.70 GiB eta 30s``; a partial kept from
an earlier run counts as done, and the count never goes back when a server ignores a Range and a file starts over).
``--no-progress``: no ``fetched <file>`` line per file.

What is fetched: the files of ``--files`` (the runbook's expected-file document: path, size, and the Hub's
``sha256`` for an LFS file or ``git_sha1`` for a plain one, read from the Hub by the runbook), else the
pinned revision's file list from the Hub API (``/api/models/<repo>/revision/<sha>?blobs=true``); either
filtered by ``--allow`` / ``--ignore`` (fnmatch, a pattern ending in ``/`` matches the folder, as
huggingface_hub filters). Each file comes from the Hub's resolve URL
``<endpoint>/<repo>/resolve/<sha>/<path>`` (redirects followed; the token is not sent to another host).

Resuming across runs: every file is written to a partial that outlives the process,
``<store>/.cache/runbook/partial/<sha256 or git sha1>.part`` (named by content, so a changed revision never
appends to the wrong bytes); a cut transfer continues with ``Range: bytes=<size>-`` within the run
(:data:`RETRIES` times) and on the next run. A server answering a Range request with 200 is written from
byte 0. A finished partial of the exact size is renamed into place. The bytes are verified afterwards
against the Hub's sha256 / git blob id (``verify_manifest``, also standard library), not trusted here.

Two layouts (``--layout``), chosen by the runbook from the profile:

* ``local_dir`` -- ``<dest>/<files>``: a plain tree (recipe A's ``hf download --local-dir``; what
  ``vllm serve /model`` loads from a bind mount). A file already there of the right size is kept only if its
  bytes are the pinned revision's (the verifier's manifest when the file is unchanged since it was hashed, else
  the file hashed); another revision's file is fetched again and replaces it (rename, never half-written).
* ``hub_cache`` -- ``<dest>`` is an HF hub cache (``HF_HUB_CACHE`` = ``HF_HOME/hub``):
  ``models--org--name/blobs/<etag>`` (the sha256 of an LFS file, the git blob id of a plain one: the Hub's
  ETags), ``snapshots/<rev>/<files>`` as relative symlinks into ``blobs``, and ``refs/main`` = the pinned
  revision, so ``vllm serve org/name`` resolves the bare repo id with ``HF_HUB_OFFLINE=1`` (recipe B's
  ``prepare-dspark-model-cache.sh``).
"""
from __future__ import annotations

import argparse
import fcntl
import fnmatch
import hashlib
import http.client
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

LAYOUT = "local_dir"   # the default: plain directory (<dest>/<files>)
LAYOUTS = ("local_dir", "hub_cache")
SHA40 = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_ENDPOINT = "https://huggingface.co"

PARTIAL_DIR = (".cache", "runbook", "partial")
VERIFIED_MANIFEST = ".runbook-manifest.json"     # verify_manifest.MANIFEST_NAME (this file is shipped alone)
READ_SIZE = 1 << 20        # written and flushed per MiB: a killed run leaves what it received
RETRIES = 5                # a cut transfer is continued (Range) this many times within one run
USER_AGENT = "spark-runbook-node-download/1"
COUNT_EVERY_S = 1.0        # --label: a counting line at most this often
_BINARY = (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024))


class Counts:
    """The bytes of one snapshot's files, counted for ``--label`` (thread-safe: the fetch pool's threads)."""

    def __init__(self, label, have, total, stream=None, every_s=None):
        self.label, self.total = label, int(total)
        self.every_s = COUNT_EVERY_S if every_s is None else every_s
        self.have = dict(have)                   # file key -> bytes on disk
        self.shown = -1
        self.done = self.first = sum(self.have.values())     # first: kept from an earlier run (not in the rate)
        self.stream = stream
        self.started = time.monotonic()
        self._at = 0.0
        self._lock = threading.Lock()

    def line(self, done):
        """The runbook's progress form (``runbook.progress.line``; this tool imports nothing of the runbook)."""
        pct = 100.0 * done / self.total if self.total else 100.0
        name, size = next(((n, s) for n, s in _BINARY if self.total >= s), ("B", 1))
        fig = (f"{done / size:.2f}/{self.total / size:.2f}" if size > 1 else f"{done}/{self.total}")
        spent = time.monotonic() - self.started
        eta = (f" eta {(self.total - done) * spent / (done - self.first):.0f}s"
               if 0 < done - self.first and done < self.total else "")
        return f"{self.label}: {pct:5.1f}% {fig} {name}{eta}"

    def start(self):
        self._say(self.done)

    def set(self, key, nbytes):
        with self._lock:
            self.have[key] = nbytes
            self.done = max(self.done, sum(self.have.values()))   # never back (a 200 to a Range starts over)
            if time.monotonic() - self._at >= self.every_s:
                self._say(self.done)

    def end(self):
        with self._lock:
            self._say(self.total)

    def _say(self, done):
        if done == self.shown:
            return
        self.shown, self._at = done, time.monotonic()
        print(self.line(done), file=self.stream or sys.stderr, flush=True)


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


def partial_path(base, key):
    """Where the not-yet-complete bytes of the file with this content hash (``key``: sha256 of an LFS
    file, git blob id of a plain one) are kept between runs (``base``: the store dir, :func:`store_dir`)."""
    return os.path.join(base, *PARTIAL_DIR, f"{key}.part")


def partial_bytes(base, key):
    try:
        return os.path.getsize(partial_path(base, key))
    except OSError:
        return 0


def select(paths, allow_patterns=None, ignore_patterns=None):
    """``paths`` filtered like huggingface_hub's ``filter_repo_objects`` (fnmatch; ``dir/`` = ``dir/*``)."""
    def norm(patterns):
        return [p + "*" if p.endswith("/") else p for p in patterns or []]
    allow, ignore = norm(allow_patterns), norm(ignore_patterns)
    return [p for p in paths if (not allow or any(fnmatch.fnmatch(p, a) for a in allow))
            and not any(fnmatch.fnmatch(p, i) for i in ignore)]


class _NoAuthAcrossHosts(urllib.request.HTTPRedirectHandler):
    """Follow the Hub's redirect to its CDN without handing the token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.headers.pop("Authorization", None)
            new.unredirected_hdrs.pop("Authorization", None)
        return new


_OPENER = urllib.request.build_opener(_NoAuthAcrossHosts)


def _request(url, token=None, headers=None):
    h = {"User-Agent": USER_AGENT, **(headers or {})}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return urllib.request.Request(url, headers=h)


def hub_files(repo, revision, *, endpoint=None, token=None, timeout=30):
    """The pinned revision's files from the Hub API: [{"path", "size", "sha256" | "git_sha1"}]."""
    url = (f"{(endpoint or DEFAULT_ENDPOINT).rstrip('/')}/api/models/{repo}/revision/{revision}?blobs=true")
    with _OPENER.open(_request(url, token), timeout=timeout) as resp:
        info = json.loads(resp.read().decode("utf-8"))
    if info.get("sha") and info["sha"] != revision:
        raise RuntimeError(f"the Hub answered revision {info['sha']}, expected {revision}")
    out = []
    for s in info.get("siblings") or []:
        lfs = s.get("lfs") or {}
        if s.get("size") is None and not lfs.get("size"):
            raise RuntimeError(f"the Hub's file list has no size for {s.get('rfilename')}")
        f = {"path": s["rfilename"], "size": int(lfs.get("size") or s["size"])}
        if lfs.get("sha256"):
            f["sha256"] = lfs["sha256"]
        elif s.get("blobId"):
            f["git_sha1"] = s["blobId"]
        out.append(f)
    return out


def resolve_url(repo, revision, path, endpoint=None):
    return (f"{(endpoint or DEFAULT_ENDPOINT).rstrip('/')}/{repo}/resolve/{revision}/"
            f"{urllib.parse.quote(path, safe='/')}")


def _key(f):
    key = f.get("sha256") or f.get("git_sha1")
    if not key:
        raise ValueError(f"{f.get('path')}: neither sha256 nor git_sha1 in the file list")
    return key


def _final_path(layout, dest, repo, f):
    if layout == "local_dir":
        return os.path.join(dest, f["path"])
    return os.path.join(store_dir(layout, dest, repo), "blobs", _key(f))


def _complete(path, size):
    try:
        return os.path.getsize(path) == size
    except OSError:
        return False


def _verified_entries(tree):
    """The verifier's record of this tree (``verify_manifest.MANIFEST_NAME``: path -> size, mtime, hashes) or {}."""
    try:
        with open(os.path.join(tree, VERIFIED_MANIFEST)) as fh:
            return {e["path"]: e for e in json.load(fh).get("files", []) if isinstance(e, dict) and "path" in e}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def _matches(path, f, entry):
    """Whether the file at ``path`` holds ``f``'s bytes: the verifier's entry when size and mtime are unchanged
    since it hashed the file (no read), else the file hashed now (sha256 for an LFS file, the git blob id else)."""
    want = ("sha256", f["sha256"]) if f.get("sha256") else ("git_sha1", _key(f))
    try:
        st = os.stat(path)
    except OSError:
        return False
    if entry and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
        return entry.get(want[0]) == want[1]
    h = hashlib.sha256() if want[0] == "sha256" else hashlib.sha1(b"blob %d\0" % st.st_size)
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest() == want[1]


def _link(layout, dest, repo, revision, f):
    """hub_cache: ``snapshots/<rev>/<path>`` -> ``../../blobs/<etag>`` (relative, as huggingface_hub links)."""
    if layout != "hub_cache":
        return
    link = os.path.join(tree_dir(layout, dest, repo, revision), f["path"])
    blob = _final_path(layout, dest, repo, f)
    target = os.path.relpath(blob, os.path.dirname(link))
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.islink(link) and os.readlink(link) == target:
        return
    tmp = f"{link}.{os.getpid()}.tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _fetch_one(url, token, base, final, f, timeout, progress, counts=None):
    """The file into its partial (continued with Range), then renamed to ``final``. Returns the record."""
    name, size = f["path"], int(f["size"])
    part = partial_path(base, _key(f))
    os.makedirs(os.path.dirname(part), exist_ok=True)
    # One writer per partial: two runs appending to the same file would interleave bytes. The lock file
    # stays (unlinking it would let a late opener lock the old inode while a new run locks a new one).
    lock = open(part + ".lock", "w")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"{name}: another download is writing {part}; wait for it or stop it") from None
        first = partial_bytes(base, _key(f))
        if first > size:                    # cannot be a prefix of this file: start it over
            os.unlink(part)
            first = 0
        resumed_from = first
        error = None
        for attempt in range(RETRIES + 1):
            have = partial_bytes(base, _key(f))
            if have == size:
                break
            headers = {"Range": f"bytes={have}-"} if have else {}
            try:
                with _OPENER.open(_request(url, token, headers), timeout=timeout) as resp:
                    status = resp.status
                    if have and status == 200:      # the server ignored the Range: start from byte 0
                        have = 0
                        if attempt == 0:
                            resumed_from = 0
                    elif status == 206:
                        start = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", "") or "")
                        if not start or int(start.group(1)) != have:
                            raise RuntimeError(f"{name}: asked from byte {have}, got "
                                               f"{resp.headers.get('Content-Range')!r}")
                    with open(part, "r+b" if have else "wb") as fh:
                        fh.seek(have)
                        fh.truncate()
                        try:
                            while True:
                                chunk = resp.read(READ_SIZE)
                                if not chunk:
                                    break
                                fh.write(chunk)
                                fh.flush()
                                if counts is not None:
                                    counts.set(_key(f), fh.tell())
                        except http.client.IncompleteRead as cut:   # keep what arrived before the cut
                            fh.write(cut.partial)
                            raise
                        finally:
                            fh.flush()
                            os.fsync(fh.fileno())
                error = None
            except urllib.error.HTTPError as err:
                if err.code == 416 and partial_bytes(base, _key(f)) == size:
                    break
                if err.code in (401, 403, 404):
                    raise RuntimeError(f"{name}: HTTP {err.code} from {url.split('/resolve/')[0]} (gated repo: "
                                       "HF_TOKEN; wrong repo or revision: the profile)") from None
                error = err
            except (OSError, http.client.HTTPException) as err:   # URLError, timeouts, resets, IncompleteRead
                error = err
            if partial_bytes(base, _key(f)) == size:
                break
            if attempt < RETRIES:
                time.sleep(min(2 ** attempt, 30))
        got = partial_bytes(base, _key(f))
        if got != size:
            why = f" ({type(error).__name__}: {error})" if error is not None else ""
            raise OSError(f"{name}: partial has {got} bytes, expected {size}; re-run to continue it{why}")
        os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
        os.replace(part, final)
        if progress:
            print(f"fetched {name} ({size} B, from byte {resumed_from})", file=sys.stderr, flush=True)
        return {"path": name, "size": size, "resumed_from": resumed_from}
    finally:
        lock.close()


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
             fetched=None, files=None, layout=LAYOUT, label=""):
    """Pinned download into ``dest`` in ``layout``. ``files``: the expected files ([{"path", "size",
    "sha256" | "git_sha1"}], the runbook's Hub metadata), else read from the Hub API; both filtered by the
    patterns. Files already complete are kept. Returns the tree (:func:`tree_dir`); ``fetched`` (a list)
    receives one record per LFS file fetched: {"path", "size", "resumed_from"} (``resumed_from`` > 0:
    bytes an earlier run had already fetched). ``label``: count the bytes on stderr (:class:`Counts`)."""
    if not SHA40.match(revision or ""):
        raise ValueError(f"revision must be a pinned 40-hex commit sha, got {revision!r}")
    _check_layout(layout)
    if files is None:
        files = hub_files(repo, revision, endpoint=endpoint, token=token, timeout=etag_timeout)
    keep = set(select([f["path"] for f in files], allow_patterns, ignore_patterns))
    files = [f for f in files if f["path"] in keep]
    base = store_dir(layout, dest, repo)
    tree = tree_dir(layout, dest, repo, revision)
    os.makedirs(tree, exist_ok=True)
    todo = []
    known = _verified_entries(tree) if layout == "local_dir" else {}
    for f in files:
        here = os.path.join(tree, f["path"])
        if _complete(here, int(f["size"])):
            # a plain tree names files by path, not by content: a file of another revision (or another repo
            # downloaded into the same folder) can have the right size; it is kept only if its bytes are this
            # revision's (huggingface_hub's local_dir keeps an etag per file for the same reason)
            if layout != "local_dir" or _matches(here, f, known.get(f["path"])):
                continue
            todo.append(f)
            continue
        if _complete(_final_path(layout, dest, repo, f), int(f["size"])):
            _link(layout, dest, repo, revision, f)        # the blob is there, its link is not
            continue
        todo.append(f)

    counts = None
    if label:
        counts = Counts(label, {_key(f): min(partial_bytes(base, _key(f)), int(f["size"])) for f in todo},
                        sum(int(f["size"]) for f in todo))
        counts.start()

    def fetch(f):
        record = _fetch_one(resolve_url(repo, revision, f["path"], endpoint), token, base,
                            _final_path(layout, dest, repo, f), f, download_timeout, progress, counts)
        _link(layout, dest, repo, revision, f)
        return record

    todo.sort(key=lambda f: -int(f["size"]))        # the long transfers first: the pool ends sooner
    with ThreadPoolExecutor(max_workers=max(1, int(max_workers))) as pool:
        records = list(pool.map(fetch, todo))
    if counts is not None:
        counts.end()
    if fetched is not None:
        by_path = {f["path"]: f for f in files}
        fetched.extend(r for r in records if by_path[r["path"]].get("sha256"))
    if layout == "hub_cache":
        write_ref(dest, repo, revision)
    return tree


def main(argv=None):
    ap = argparse.ArgumentParser(description="pinned snapshot download (runbook, standard library only)")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--revision", required=True)
    ap.add_argument("--dest", required=True)
    ap.add_argument("--endpoint", default=None)
    ap.add_argument("--files", default="", help="expected-file JSON ({'files': [...]}) instead of the Hub API")
    ap.add_argument("--allow", action="append", default=[])
    ap.add_argument("--ignore", action="append", default=[])
    ap.add_argument("--max-workers", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--etag-timeout", type=int, default=30)
    ap.add_argument("--token-file", default="")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--layout", choices=LAYOUTS, default=LAYOUT)
    ap.add_argument("--label", default="", help="count the bytes on stderr under this name")
    args = ap.parse_args(argv)
    token = None
    if args.token_file:
        with open(args.token_file) as fh:
            token = fh.read().strip() or None
    t0 = time.monotonic()
    fetched = []
    try:
        files = None
        if args.files:
            with open(args.files) as fh:
                doc = json.load(fh)
            files = doc["files"] if isinstance(doc, dict) else doc
        path = snapshot(args.repo, args.revision, args.dest, endpoint=args.endpoint,
                        allow_patterns=args.allow, ignore_patterns=args.ignore,
                        max_workers=args.max_workers, download_timeout=args.timeout,
                        etag_timeout=args.etag_timeout, token=token, progress=not args.no_progress,
                        fetched=fetched, files=files, layout=args.layout, label=args.label)
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
