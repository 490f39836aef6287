#!/usr/bin/env python3
"""Step 02's zero-copy share (``WEIGHT_TRANSPORT=stream``): the head's verified files to one worker over plain TCP
on the fabric, several streams at once, verified on arrival.

Standard library only: the runbook ships this file (beside ``verify_manifest.py``, which it imports from the same
directory) into each node's private tools dir and runs it with the node's own ``python3`` (>= 3.8; ``os.splice``
needs 3.10 on Linux, else a plain read/write loop is used).

Why: rsync over ssh copies every byte through user space four times (rsync reads, ssh encrypts, sshd decrypts,
rsync writes) and costs 5-7 CPU-seconds per GiB (docs/weights.md §4b). Here the sender hands the page cache to the
socket (``sendfile``) and the receiver moves the socket's pages through a pipe into the file (``splice``): the only
copy left is the kernel's into the destination's page cache. The fabric is the cluster's private link; the bytes
are not encrypted (as NCCL's own traffic on it), but every connection must present a one-time random token and
every file is sha256-verified before it gets its name.

Receiver (on the worker)::

    python3 stream_share.py recv --dir DST --expected EXPECTED.json --bind WORKER_FABRIC_IP --token-file TOK
                                 --state-file STATE [--port 0] [--timeout 60] [--deadline 21600] [--stop-file F]

It skips the files already verified (the directory's manifest, or this tool's ledger from a cut run: same size,
mtime and sha256), listens, writes ``{"port", "need", "skipped"}`` to STATE (0600) and then takes connections until
every needed file arrived. A file is written to ``.<name>.stream-part`` beside its final name, hashed there
(``verify_manifest.hash_file``), and renamed only when size and sha256 match; a mismatch deletes it. At the end the
directory is verified by ``verify_manifest.verify`` (no re-hash of what was hashed on arrival) and the manifest
written. Prints one JSON report; exit 0 = every file verified, 1 = not, 2 = usage.

Sender (on the head)::

    python3 stream_share.py send --src SRC --files NEED.json --host WORKER_FABRIC_IP --port P --bind HEAD_FABRIC_IP
                                 --token-file TOK [--streams 4] [--chunk 268435456] [--timeout 60]

Wire format, per connection: ``SRSHARE1`` + the token (64 ASCII hex) -> ``OK``; then ranges, each a 4-byte
big-endian length + JSON ``{"path", "offset", "length"}`` followed by the bytes -> ``OK`` once written; a header
with an empty path ends the connection.
"""
from __future__ import annotations

import argparse
import hmac
import json
import os
import queue
import socket
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

try:                                # inside the runbook package
    from . import verify_manifest
except ImportError:                 # on a node: shipped beside this file, run as a script
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import verify_manifest  # noqa: E402

MAGIC = b"SRSHARE1"
TOKEN_LEN = 64
HDR = struct.Struct("!I")
MAX_HEADER = 64 << 10
PIPE_SIZE = 1 << 20                 # F_SETPIPE_SZ: /proc/sys/fs/pipe-max-size's default, allowed to any user
F_SETPIPE_SZ = 1031
CHUNK = 256 << 20                   # one range: the unit a stream takes from the queue
LEDGER = ".runbook-stream-ledger.json"
PART_SUFFIX = ".stream-part"


class Refused(Exception):
    """The peer broke the protocol (or the token): the connection is dropped."""


def _timeouts(sock, seconds):
    """Kernel send/receive timeouts on a blocking socket: they bound ``sendfile``/``splice`` too, which a Python
    socket timeout (a non-blocking socket) would turn into EAGAIN at once."""
    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        try:
            got = sock.recv(n - len(buf))
        except BlockingIOError:
            raise TimeoutError("no bytes from the peer within the timeout") from None
        if not got:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += got
    return bytes(buf)


def read_token(path):
    with open(path) as fh:
        token = fh.read().strip()
    if len(token) != TOKEN_LEN or any(c not in "0123456789abcdef" for c in token):
        raise ValueError(f"{path}: not a {TOKEN_LEN}-hex token")
    return token


def _write_private_json(path, data):
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- receiver

def _part_path(full):
    head, name = os.path.split(full)
    return os.path.join(head, f".{name}{PART_SUFFIX}")


def already_verified(root, expected):
    """Files of ``expected`` present with their size and an entry (manifest or ledger) of the same size, mtime and
    expected sha256: {path: entry}."""
    entries = {}
    for name in (verify_manifest.MANIFEST_NAME, LEDGER):
        try:
            doc = verify_manifest.load_json(os.path.join(root, name))
        except (OSError, ValueError):
            continue
        if doc.get("revision") == expected.get("revision", "") and doc.get("schema") == verify_manifest.SCHEMA:
            for e in doc.get("files", []):
                entries.setdefault(e.get("path"), e)
    out = {}
    for exp in expected.get("files", []):
        prev = entries.get(exp["path"])
        if prev is None:
            continue
        try:
            st = os.stat(verify_manifest._safe_join(root, exp["path"]))
        except (OSError, ValueError):
            continue
        if (st.st_size == exp["size"] == prev.get("size") and prev.get("mtime_ns") == st.st_mtime_ns
                and verify_manifest._hash_matches(prev, exp)):
            out[exp["path"]] = dict(prev)
    return out


class Receiver:
    def __init__(self, root, expected, token, *, timeout=60.0, hash_workers=None, pipe_size=PIPE_SIZE):
        self.root = os.path.abspath(root)
        self.expected = expected
        self.token = token.encode()
        self.timeout = timeout
        self.pipe_size = pipe_size
        self.lock = threading.Lock()
        self.files = {e["path"]: e for e in expected.get("files", [])}
        self.verified = already_verified(self.root, expected)
        self.skipped = sorted(self.verified)
        self.need = [p for p in self.files if p not in self.verified]
        self.open = {}                   # path -> [fd, bytes received]
        self.done = {}                   # path -> "ok" | reason
        self.received_bytes = 0
        self.refused = 0
        self.errors = []
        # files hashed as they complete, beside the transfer: half the cores, 2 to 8 (sha256 costs about as much CPU
        # per byte as the TCP stack does: docs/weights.md §4c)
        self.hashing = ThreadPoolExecutor(max_workers=hash_workers or max(2, min(8, (os.cpu_count() or 2) // 2)))
        self.pending = []
        self.all_done = threading.Event()
        if not self.need:
            self.all_done.set()

    # a range of a file: the part is created (truncated) at the file's first range in this run
    def _fd(self, path):
        with self.lock:
            if path not in self.open:
                full = verify_manifest._safe_join(self.root, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                fd = os.open(_part_path(full), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.ftruncate(fd, self.files[path]["size"])
                self.open[path] = [fd, 0]
            return self.open[path][0]

    def _write(self, sock, fd, offset, length):
        if hasattr(os, "splice"):
            r, w = os.pipe()
            try:
                try:
                    import fcntl
                    fcntl.fcntl(w, F_SETPIPE_SZ, self.pipe_size)
                except OSError:
                    pass                          # the default pipe (64 KiB) still works
                left = length
                while left:
                    try:
                        n = os.splice(sock.fileno(), w, min(left, self.pipe_size))
                    except BlockingIOError:
                        raise TimeoutError(f"no bytes within {self.timeout:g} s") from None
                    if n == 0:
                        raise EOFError(f"connection closed with {left} bytes of the range missing")
                    left -= n
                    while n:
                        k = os.splice(r, fd, n, offset_dst=offset)
                        n -= k
                        offset += k
            finally:
                os.close(r)
                os.close(w)
            return
        buf = bytearray(min(length, 1 << 20) or 1)
        view = memoryview(buf)
        left = length
        while left:
            try:
                n = sock.recv_into(view[:min(left, len(buf))])
            except BlockingIOError:
                raise TimeoutError(f"no bytes within {self.timeout:g} s") from None
            if n == 0:
                raise EOFError(f"connection closed with {left} bytes of the range missing")
            done = 0
            while done < n:
                done += os.pwrite(fd, view[done:n], offset + done)
            offset += n
            left -= n

    def _finish(self, path):
        """Every byte of ``path`` arrived: hash the part, rename it when size and sha256 match."""
        exp = self.files[path]
        full = verify_manifest._safe_join(self.root, path)
        part = _part_path(full)
        try:
            got = verify_manifest.hash_file(part, want_git_sha1="git_sha1" in exp)
            if got["size"] != exp["size"]:
                reason = f"size {got['size']} != {exp['size']}"
            elif "sha256" in exp and got["sha256"] != exp["sha256"]:
                reason = f"sha256 {got['sha256'][:12]}... != {exp['sha256'][:12]}..."
            elif "git_sha1" in exp and got.get("git_sha1") != exp["git_sha1"]:
                reason = f"git_sha1 {got.get('git_sha1', '')[:12]}... != {exp['git_sha1'][:12]}..."
            else:
                reason = ""
            if reason:
                os.unlink(part)
            else:
                os.replace(part, full)
                st = os.stat(full)
                entry = {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": got["sha256"],
                         "revision": self.expected.get("revision", "")}
                if "git_sha1" in got:
                    entry["git_sha1"] = got["git_sha1"]
        except OSError as err:
            reason = f"{type(err).__name__}: {err}"
        with self.lock:
            self.done[path] = reason or "ok"
            if not reason:
                self.verified[path] = entry
                self._write_ledger()
            if all(p in self.done for p in self.need):
                self.all_done.set()

    def _write_ledger(self):
        verify_manifest.write_json_atomic(os.path.join(self.root, LEDGER), {
            "schema": verify_manifest.SCHEMA, "repo": self.expected.get("repo", ""),
            "revision": self.expected.get("revision", ""), "files": sorted(self.verified.values(),
                                                                           key=lambda e: e["path"])})

    def handle(self, sock):
        try:
            _timeouts(sock, self.timeout)
            hello = _recv_exact(sock, len(MAGIC) + TOKEN_LEN)
            if hello[:len(MAGIC)] != MAGIC or not hmac.compare_digest(hello[len(MAGIC):], self.token):
                with self.lock:
                    self.refused += 1
                raise Refused("wrong token")
            sock.sendall(b"OK")
            while True:
                (size,) = HDR.unpack(_recv_exact(sock, HDR.size))
                if size > MAX_HEADER:
                    raise Refused(f"header of {size} bytes")
                hdr = json.loads(_recv_exact(sock, size))
                path, offset, length = hdr.get("path", ""), int(hdr.get("offset", -1)), int(hdr.get("length", -1))
                if not path:
                    return
                exp = self.files.get(path)
                if exp is None or path not in self.need or path in self.done:
                    raise Refused(f"{path!r} is not a file this receiver waits for")
                if offset < 0 or length < 0 or offset + length > exp["size"]:
                    raise Refused(f"{path}: range {offset}+{length} outside its {exp['size']} bytes")
                fd = self._fd(path)
                self._write(sock, fd, offset, length)
                sock.sendall(b"OK")
                with self.lock:
                    self.received_bytes += length
                    self.open[path][1] += length
                    complete = self.open[path][1] == exp["size"]
                    if complete:
                        os.close(self.open[path][0])
                        self.open[path][0] = -1
                if complete:
                    self.pending.append(self.hashing.submit(self._finish, path))
        except (Refused, OSError, EOFError, ValueError, TimeoutError) as err:
            with self.lock:
                self.errors.append(f"{type(err).__name__}: {err}")
        finally:
            sock.close()

    def serve(self, bind, port, state_file, *, deadline=6 * 3600.0, stop_file=""):
        start = time.monotonic()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(64)
        listener.settimeout(1.0)
        _write_private_json(state_file, {"port": listener.getsockname()[1], "need": self.need,
                                         "skipped": self.skipped})
        threads, last = [], time.monotonic()
        stopped = ""
        try:
            while not self.all_done.is_set():
                now = time.monotonic()
                if now - start > deadline:
                    stopped = f"deadline of {deadline:g} s passed"
                    break
                if stop_file and os.path.exists(stop_file):
                    stopped = "stopped by the runbook (the sender failed)"
                    break
                busy = any(t.is_alive() for t in threads) or any(not f.done() for f in self.pending)
                if not busy and now - last > self.timeout:
                    stopped = f"no connection for {self.timeout:g} s"
                    break
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    continue
                conn.settimeout(None)
                last = time.monotonic()
                t = threading.Thread(target=self.handle, args=(conn,), daemon=True)
                t.start()
                threads.append(t)
        finally:
            listener.close()
        for t in threads:
            t.join(self.timeout + 5)
        self.hashing.shutdown(wait=True)
        with self.lock:
            for path, (fd, _) in self.open.items():
                if fd >= 0:
                    os.close(fd)
        return self.report(time.monotonic() - start, stopped)

    def report(self, seconds, stopped):
        failed = {p: r for p, r in self.done.items() if r != "ok"}
        failed.update({p: "not received" for p in self.need if p not in self.done})
        verified = {"ok": False, "failed": []}
        if not failed:
            # the directory as a whole, by the one verification code: what was hashed on arrival (the ledger) is
            # not hashed again; the manifest is written only when every file is there and verified
            verified = verify_manifest.verify(self.root, self.expected, reuse=True, write=True, manifest_name=LEDGER)
            if verified["ok"]:
                os.replace(os.path.join(self.root, LEDGER), os.path.join(self.root, verify_manifest.MANIFEST_NAME))
            failed.update({p: "verification" for p in verified["failed"]})
        received = sorted(p for p, r in self.done.items() if r == "ok")
        return {"ok": not failed and not stopped, "received": received, "skipped": self.skipped,
                "failed": failed, "bytes": self.received_bytes, "seconds": round(seconds, 3),
                "refused_connections": self.refused, "errors": self.errors[-5:], "stopped": stopped,
                "splice": hasattr(os, "splice"), "bytes_hashed_at_end": verified.get("bytes_hashed", 0)}


# ---------------------------------------------------------------------------------------------- sender

def ranges(files, chunk):
    """(path, offset, length) of every file, largest files first, in ``chunk``-byte ranges."""
    out = []
    for f in sorted(files, key=lambda f: -f["size"]):
        if f["size"] == 0:
            out.append((f["path"], 0, 0))
        for offset in range(0, f["size"], chunk):
            out.append((f["path"], offset, min(chunk, f["size"] - offset)))
    return out


def send(src, files, host, port, token, *, bind="", streams=4, chunk=CHUNK, timeout=60.0):
    root = os.path.abspath(src)
    work = queue.Queue()
    for item in ranges(files, chunk):
        work.put(item)
    sizes = {f["path"]: f["size"] for f in files}
    sent, errors, lock = [0], [], threading.Lock()

    def stream():
        sock = socket.create_connection((host, port), timeout=timeout,
                                        source_address=(bind, 0) if bind else None)
        try:
            sock.settimeout(None)
            _timeouts(sock, timeout)
            sock.sendall(MAGIC + token.encode())
            if _recv_exact(sock, 2) != b"OK":
                raise Refused("the receiver refused the token")
            while True:
                try:
                    path, offset, length = work.get_nowait()
                except queue.Empty:
                    break
                full = verify_manifest._safe_join(root, path)
                with open(full, "rb") as fh:
                    if os.fstat(fh.fileno()).st_size != sizes[path]:
                        raise ValueError(f"{path} changed on the head: {os.fstat(fh.fileno()).st_size} bytes, "
                                         f"the manifest says {sizes[path]}")
                    head = json.dumps({"path": path, "offset": offset, "length": length}).encode()
                    sock.sendall(HDR.pack(len(head)) + head)
                    done = 0
                    while done < length:
                        try:
                            n = os.sendfile(sock.fileno(), fh.fileno(), offset + done, length - done)
                        except BlockingIOError:
                            raise TimeoutError(f"the receiver took no bytes within {timeout:g} s") from None
                        if n == 0:
                            raise EOFError(f"{path} ended early at {offset + done}")
                        done += n
                if _recv_exact(sock, 2) != b"OK":
                    raise Refused(f"no acknowledgement of {path}@{offset}")
                with lock:
                    sent[0] += length
            end = json.dumps({"path": ""}).encode()
            sock.sendall(HDR.pack(len(end)) + end)
        finally:
            sock.close()

    def guarded():
        try:
            stream()
        except (Refused, OSError, EOFError, ValueError, TimeoutError) as err:
            with lock:
                errors.append(f"{type(err).__name__}: {err}")

    t0 = time.monotonic()
    threads = [threading.Thread(target=guarded, daemon=True) for _ in range(max(1, min(streams, work.qsize() or 1)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    total = sum(sizes.values())
    return {"ok": not errors and sent[0] == total, "bytes": sent[0], "expected_bytes": total,
            "seconds": round(seconds, 3), "streams": len(threads), "errors": errors[-5:],
            "gbit_s": round(sent[0] * 8 / seconds / 1e9, 3) if seconds > 0 else 0.0}


# ---------------------------------------------------------------------------------------------- CLI

def main(argv=None):
    ap = argparse.ArgumentParser(description="zero-copy weights share over the fabric (standard library)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--dir", required=True)
    r.add_argument("--expected", required=True)
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, default=0)
    r.add_argument("--token-file", required=True)
    r.add_argument("--state-file", required=True)
    r.add_argument("--stop-file", default="")
    r.add_argument("--timeout", type=float, default=60.0)
    r.add_argument("--deadline", type=float, default=6 * 3600.0)
    s = sub.add_parser("send")
    s.add_argument("--src", required=True)
    s.add_argument("--files", required=True)
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--bind", default="")
    s.add_argument("--token-file", required=True)
    s.add_argument("--streams", type=int, default=4)
    s.add_argument("--chunk", type=int, default=CHUNK)
    s.add_argument("--timeout", type=float, default=60.0)
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        token = read_token(args.token_file)
        if args.cmd == "recv":
            os.makedirs(args.dir, exist_ok=True)
            receiver = Receiver(args.dir, verify_manifest.load_json(args.expected), token, timeout=args.timeout)
            report = receiver.serve(args.bind, args.port, args.state_file, deadline=args.deadline,
                                    stop_file=args.stop_file)
        else:
            doc = verify_manifest.load_json(args.files)
            report = send(args.src, doc["files"], args.host, args.port, token, bind=args.bind,
                          streams=args.streams, chunk=args.chunk, timeout=args.timeout)
    except (OSError, ValueError, KeyError) as err:
        print(json.dumps({"ok": False, "error": f"{type(err).__name__}: {err}"}))
        return 2
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
