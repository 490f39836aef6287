"""A small HTTP forward proxy, the lab's apt proxy process: GET/HEAD of absolute ``http://`` URIs and CONNECT
tunnels, to the ``host:port`` pairs it is given only, each ``.deb`` it fetched kept and served again from its cache.

    python -m runbook.lab.netlab.forward_proxy --listen 10.77.0.1:3142 --dir <lab_dir>/aptproxy \\
        --allow deb.debian.org:80 [--allow HOST:PORT ...]

Started and stopped by ``aptproxy.py`` (no netlab module imports this one, so ``-m`` runs it once). A pool file never changes under its name, so a ``.deb`` is cached by URL; indexes (``InRelease``,
``Packages``) always go to the archive. Every request is one line of ``<dir>/requests.log``: time, client, method,
URL, status, bytes, and how it was answered (``archive``, ``cache``, ``tunnel``, ``refused``, ``failed``, ``proxy``).
A request to the proxy itself (``GET /``) answers 200 with ``spec.APT_PROXY_HEADER`` (what ``aptproxy.answers``
asks).
"""
from __future__ import annotations

import argparse
import http.client
import http.server
import os
import select
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from .spec import APT_PROXY_HEADER

UPSTREAM_TIMEOUT = 60      # s, each connect and read toward the archive
CLIENT_TIMEOUT = 120       # s, an idle connection from a node (and an idle tunnel) is closed after this
CHUNK = 64 * 1024
#: hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own: never forwarded either way
HOP_BY_HOP = frozenset({"connection", "proxy-connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"})


def parse_allow(values: list[str]) -> frozenset[tuple[str, int]]:
    """``host:port`` strings -> {(host, port)}; a value without a port or with a bad one is refused (SystemExit)."""
    out = set()
    for v in values:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SystemExit(f"--allow {v!r}: expected HOST:PORT, e.g. deb.debian.org:80")
        out.add((host.lower(), int(port)))
    return frozenset(out)


def cache_path(cache: Path, host: str, port: int, path: str) -> Path | None:
    """Where a ``.deb`` at ``http://host:port/path`` is kept (None when the path is not one to keep: not a .deb, or
    a segment that would leave the cache dir)."""
    parts = [p for p in path.split("/") if p]
    if not parts or not parts[-1].endswith(".deb") or any(p in (".", "..") or "\0" in p for p in parts):
        return None
    return cache.joinpath(f"{host}_{port}", *parts)


class Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, listen: tuple[str, int], allow: frozenset[tuple[str, int]], root: Path):
        self.allow = allow
        self.cache = root / "cache"
        self.cache.mkdir(parents=True, exist_ok=True)
        self._log = open(root / "requests.log", "a", buffering=1)
        self._lock = threading.Lock()
        super().__init__(listen, Handler)

    def record(self, client: str, method: str, url: str, status: int, size: int, how: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {client} {method} {url} {status} {size} {how}\n"
        with self._lock:
            self._log.write(line)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"      # keep-alive and pipelining, as apt uses them
    timeout = CLIENT_TIMEOUT
    server: Proxy

    def setup(self) -> None:
        super().setup()
        self.upstream: dict[tuple[str, int], http.client.HTTPConnection] = {}

    def finish(self) -> None:
        for conn in self.upstream.values():
            conn.close()
        super().finish()

    def log_message(self, format: str, *args) -> None:    # noqa: A002 - the base class's name
        pass                                               # one line per request in requests.log instead

    def do_GET(self) -> None:
        self.forward()

    def do_HEAD(self) -> None:
        self.forward()

    # ----------------------------------------------------------------------------------------------

    def answer(self, status: int, text: str, how: str, url: str = "") -> None:
        body = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header(APT_PROXY_HEADER, "1")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.server.record(self.client_address[0], self.command, url or self.path, status, len(body), how)

    def allowed(self, host: str, port: int) -> bool:
        return (host.lower(), port) in self.server.allow

    def forward(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if not url.scheme:                        # origin form: a request to the proxy itself
            allow = " ".join(f"{h}:{p}" for h, p in sorted(self.server.allow))
            return self.answer(200, f"spark-runbook lab apt proxy; forwards to: {allow}", "proxy")
        if url.scheme != "http" or not url.hostname:
            return self.answer(400, "only absolute http:// URIs here (https goes through CONNECT)", "refused")
        try:
            host, port = url.hostname, url.port or 80
        except ValueError:
            return self.answer(400, f"bad port in {self.path}", "refused")
        if not self.allowed(host, port):
            return self.answer(403, f"{host}:{port} is not an apt source of the lab host", "refused")
        kept = cache_path(self.server.cache, host.lower(), port, url.path) if self.command == "GET" else None
        if kept is not None and kept.is_file():
            return self.from_cache(kept)
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
        headers["Host"] = url.netloc
        conn = self.upstream.get((host, port))
        try:
            if conn is None:
                conn = self.upstream[(host, port)] = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT)
            conn.request(self.command, target, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            self.drop(host, port)
            return self.answer(502, f"{host}:{port}: {exc}", "failed")
        self.relay(resp, kept, host, port)

    def relay(self, resp: http.client.HTTPResponse, kept: Path | None, host: str, port: int) -> None:
        """The archive's answer to the node, its body streamed (and kept when ``kept`` and complete)."""
        length = resp.getheader("Content-Length")
        bodiless = self.command == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        if length is None and not bodiless:       # read to the end: the node learns the end from the close
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        sent, tmp = 0, None
        if kept is not None and resp.status == 200 and length is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".part-", dir=kept.parent)
            tmp = (os.fdopen(fd, "wb"), Path(name))
        got = 0
        try:
            while not bodiless:
                chunk = resp.read(CHUNK)
                if not chunk:
                    break
                got += len(chunk)
                if tmp:
                    tmp[0].write(chunk)
                    if str(got) == length:
                        # complete: kept before the node gets its last byte, so the node's next request (apt asks
                        # again at once) finds it in the cache instead of racing this thread's rename to the origin
                        tmp[0].close()
                        os.replace(tmp[1], kept)
                        tmp = None
                self.wfile.write(chunk)
                sent += len(chunk)
        except (OSError, http.client.HTTPException) as exc:
            self.drop(host, port)
            self.close_connection = True          # the node sees a short body and retries
            self.server.record(self.client_address[0], self.command, self.path, resp.status, sent, f"failed: {exc}")
            return
        finally:
            if tmp:                               # short: nothing kept
                tmp[0].close()
                tmp[1].unlink(missing_ok=True)
        if resp.will_close:
            self.drop(host, port)
        self.server.record(self.client_address[0], self.command, self.path, resp.status, sent, "archive")

    def from_cache(self, kept: Path) -> None:
        size = kept.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.debian.binary-package")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        with open(kept, "rb") as f:
            while chunk := f.read(CHUNK):
                self.wfile.write(chunk)
        self.server.record(self.client_address[0], self.command, self.path, 200, size, "cache")

    def drop(self, host: str, port: int) -> None:
        conn = self.upstream.pop((host, port), None)
        if conn is not None:
            conn.close()

    def do_CONNECT(self) -> None:
        """A tunnel (https sources) to an allowed host:port; bytes copied both ways until either side closes."""
        host, sep, port = self.path.rpartition(":")
        if not sep or not port.isdigit() or not self.allowed(host, int(port)):
            self.close_connection = True
            return self.answer(403, f"{self.path} is not an apt source of the lab host", "refused")
        try:
            far = socket.create_connection((host, int(port)), timeout=UPSTREAM_TIMEOUT)
        except OSError as exc:
            self.close_connection = True
            return self.answer(502, f"{self.path}: {exc}", "failed")
        self.send_response_only(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        moved = 0
        near = self.connection
        try:
            while True:
                ready, _, _ = select.select([near, far], [], [], CLIENT_TIMEOUT)
                if not ready:
                    break
                for src in ready:
                    data = src.recv(CHUNK)
                    if not data:
                        raise EOFError
                    (far if src is near else near).sendall(data)
                    moved += len(data)
        except (EOFError, OSError):
            pass
        finally:
            far.close()
            self.close_connection = True
        self.server.record(self.client_address[0], "CONNECT", self.path, 200, moved, "tunnel")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.lab.netlab.forward_proxy", description=__doc__.split("\n")[0])
    ap.add_argument("--listen", required=True, help="ADDRESS:PORT to listen on (the lab bridge's host address)")
    ap.add_argument("--dir", required=True, type=Path, help="where the cache and requests.log live")
    ap.add_argument("--allow", action="append", default=[], help="HOST:PORT requests may go to (repeat)")
    args = ap.parse_args(argv)
    addr, _, port = args.listen.rpartition(":")
    if not addr or not port.isdigit():
        ap.error(f"--listen {args.listen!r}: expected ADDRESS:PORT")
    allow = parse_allow(args.allow)
    if not allow:
        ap.error("give at least one --allow HOST:PORT")
    args.dir.mkdir(parents=True, exist_ok=True)
    server = Proxy((addr, int(port)), allow, args.dir)
    print(f"listening on {addr}:{port}; forwarding to {' '.join(sorted(f'{h}:{p}' for h, p in allow))}",
          file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
