"""A minimal asyncio HTTP/1.1 client for the streaming requests (keep-alive pool, chunked decoding).

Why not aiohttp for generation requests: measured on the loaded lab box, aiohttp's request
construction put 1-6 ms (up to 18 ms with 4 streams released together) between the client's send
stamp and the server seeing the request line, i.e. straight into TTFT; and one coroutine wake-up per
SSE event limited a single core to a few thousand events/s. Here a pre-encoded request is written to
a pooled socket, and the response is decoded inside ``Protocol.data_received`` -- synchronously, once
per socket read: chunked transfer-encoding, Content-Length, or read-to-close -- and handed to a
callback together with the read's timestamp (``time.perf_counter``). Nothing waits for later bytes:
body bytes that share a read with the head, events inside a chunk still in flight and the last
event beside the terminating chunk are all handed on in the read that brought them
(``tests/unit/test_bench_framing.py`` drives every such framing against the reference server). TLS via ``ssl``. No proxies,
no redirects, no compression (``Accept-Encoding: identity``).
"""
from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

clock = time.perf_counter
BodyCallback = Callable[[bytes, float], None]
HeadCallback = Callable[[int, "dict[str, str]", float], None]


class HTTPError(Exception):
    pass


class HttpProtocol(asyncio.Protocol):
    """One connection; one request in flight at a time.

    Every byte is handed on in the ``data_received`` call that brings it, stamped with that read's
    time: body bytes that arrive in the same read as the response head, the data of a chunk whose
    end (or trailing CRLF) is still in flight, and the last data together with the terminating
    ``0`` chunk. The head is announced (``on_head``) before any of its body bytes, so the caller
    knows the status when the first body bytes reach it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.state = "idle"           # idle | head | body | done
        self.closed = False
        self.mode = ""                # chunked | length | eof
        self.left = 0                 # length: body bytes to come; chunked: bytes of the current chunk
        self.chunk = "size"           # chunked: size | data | crlf | trailer
        self.status = 0
        self.headers: dict[str, str] = {}
        self.t_head = 0.0
        self.on_body: BodyCallback | None = None
        self.on_head: HeadCallback | None = None
        self.head_fut: asyncio.Future | None = None
        self.done_fut: asyncio.Future | None = None

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        t = clock()
        if self.state in ("idle", "done"):
            return                      # unsolicited bytes: ignore (connection will not be reused)
        self.buf += data
        try:
            self._process(t)
        except Exception as e:  # noqa: BLE001 - malformed response
            self._fail(HTTPError(f"bad response: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.state == "body" and self.mode == "eof":
            self._finish()
        elif self.state in ("head", "body"):
            self._fail(ConnectionResetError("connection closed by server"))

    # request lifecycle
    def start(self, on_body: BodyCallback | None, on_head: HeadCallback | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.buf.clear()
        self.state, self.mode, self.left, self.chunk = "head", "", 0, "size"
        self.on_body, self.on_head = on_body, on_head
        self.head_fut, self.done_fut = loop.create_future(), loop.create_future()

    def _fail(self, exc: Exception) -> None:
        self.state = "done"
        self.closed = True
        for f in (self.head_fut, self.done_fut):
            if f is not None and not f.done():
                f.set_exception(exc)
        if self.done_fut is not None and self.done_fut.done() and not self.done_fut.cancelled():
            self.done_fut.exception()           # mark retrieved: the caller may only await head_fut
        # (a cancelled future - the caller's timeout - has nothing to retrieve: exception() would raise
        # CancelledError inside connection_lost and asyncio would print it as a traceback)
        if self.transport is not None:
            self.transport.close()

    def _finish(self) -> None:
        self.state = "done"
        if self.done_fut is not None and not self.done_fut.done():
            self.done_fut.set_result(True)

    def _head(self, t: float) -> bool:
        """Parse the response head if complete; False = wait for more bytes."""
        buf = self.buf
        while True:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                return False
            lines = bytes(buf[:i]).decode("latin-1").split("\r\n")
            del buf[:i + 4]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/"):
                raise HTTPError(f"bad status line {lines[0]!r}")
            status = int(parts[1])
            if 100 <= status < 200:
                continue                        # 100 Continue / 103 Early Hints: the real head follows
            break
        hdrs: dict[str, str] = {}
        for ln in lines[1:]:
            k, sep, v = ln.partition(":")
            if sep:
                hdrs[k.strip().lower()] = v.strip()
        self.status, self.headers, self.t_head = status, hdrs, t
        if "chunked" in hdrs.get("transfer-encoding", "").lower():
            self.mode = "chunked"
        elif "content-length" in hdrs:
            self.mode, self.left = "length", int(hdrs["content-length"])
        else:
            self.mode = "eof"
        self.state = "body"
        if self.on_head:
            self.on_head(status, hdrs, t)
        if self.head_fut is not None and not self.head_fut.done():
            self.head_fut.set_result(True)
        return True

    def _process(self, t: float) -> None:
        if self.state == "head" and not self._head(t):
            return
        if self.state != "body":
            return
        buf = self.buf
        if self.mode == "length":
            take = bytes(buf[:self.left])
            del buf[:len(take)]
            self.left -= len(take)
            if take and self.on_body:
                self.on_body(take, t)
            if self.left <= 0:
                self._finish()
            return
        if self.mode == "eof":
            if buf and self.on_body:
                self.on_body(bytes(buf), t)
            buf.clear()
            return
        # chunked: walk size line -> data (handed on as far as it has arrived) -> CRLF -> ...
        out: list[bytes] = []
        pos, n = 0, len(buf)
        while pos < n:
            if self.chunk == "data":
                take = min(self.left, n - pos)
                out.append(bytes(buf[pos:pos + take]))
                pos += take
                self.left -= take
                if self.left == 0:
                    self.chunk = "crlf"
            elif self.chunk == "crlf":
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise HTTPError("chunk data not followed by CRLF")
                pos += 2
                self.chunk = "size"
            else:                                   # a size line, or (after the 0 chunk) trailer lines
                j = buf.find(b"\r\n", pos)
                if j < 0:
                    break
                line = bytes(buf[pos:j])
                pos = j + 2
                if self.chunk == "trailer":
                    if not line:                    # the blank line that ends the message
                        del buf[:pos]
                        if out and self.on_body:
                            self.on_body(b"".join(out), t)
                        self._finish()
                        return
                    continue
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    self.chunk = "trailer"
                else:
                    self.chunk, self.left = "data", size
        del buf[:pos]
        if out and self.on_body:
            self.on_body(b"".join(out), t)


class Response:
    def __init__(self, client: RawHTTP, proto: HttpProtocol):
        self._client, self._proto = client, proto
        self.status, self.headers, self.t_head = proto.status, proto.headers, proto.t_head

    async def wait(self) -> None:
        """Wait until the whole body has been delivered to the callback."""
        assert self._proto.done_fut is not None
        await self._proto.done_fut

    def release(self) -> None:
        p = self._proto
        keep = (p.state == "done" and not p.closed and p.mode != "eof"
                and self.headers.get("connection", "").lower() != "close")
        if keep:
            p.state = "idle"
            self._client._idle.append(p)
        elif p.transport is not None:
            p.transport.close()

    def abort(self) -> None:
        if self._proto.transport is not None:
            self._proto.transport.close()


class RawHTTP:
    """Keep-alive pool of HTTP/1.1 connections to one origin."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None):
        u = urlsplit(base_url)
        self.host = u.hostname or "127.0.0.1"
        self.https = u.scheme == "https"
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        hostport = self.host if (u.port is None) else f"{self.host}:{self.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {hostport}\r\nAccept: text/event-stream\r\nAccept-Encoding: identity\r\n{extra}"
        self._idle: list[HttpProtocol] = []
        self._ssl = _ssl.create_default_context() if self.https else None

    async def _connect(self) -> HttpProtocol:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(HttpProtocol, self.host, self.port, ssl=self._ssl)
        return proto

    async def warm(self, n: int) -> None:
        """Open ``n`` idle connections ahead of a timed wave."""
        self._idle = [p for p in self._idle if not p.closed]
        need = n - len(self._idle)
        if need > 0:
            self._idle.extend(await asyncio.gather(*[self._connect() for _ in range(need)]))

    def request_bytes(self, method: str, path: str, body: bytes, content_type: str = "application/json") -> bytes:
        """Pre-encode a request (done before the send stamp)."""
        return (f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n").encode("latin-1") + body

    def _take(self) -> HttpProtocol | None:
        while self._idle:
            p = self._idle.pop()
            if not p.closed:
                return p
        return None

    async def send(self, raw: bytes, on_body: BodyCallback | None,
                   on_sent: Callable[[], None] | None = None,
                   on_head: HeadCallback | None = None) -> Response:
        """Write a pre-encoded request and wait for the response head; the body is delivered to
        ``on_body(bytes, t_read)`` as it arrives (``Response.wait()`` for the end), possibly before
        this returns: ``on_head(status, headers, t_read)`` runs first, in the same read. ``on_sent``
        is called immediately before the bytes are written (the send stamp)."""
        for attempt in (0, 1):
            p = self._take() if attempt == 0 else None
            if p is None:
                p = await self._connect()
            p.start(on_body, on_head)
            if on_sent:
                on_sent()
            assert p.transport is not None
            p.transport.write(raw)
            try:
                assert p.head_fut is not None
                await p.head_fut
            except asyncio.CancelledError:
                p.transport.close()             # the caller's timeout: this connection is never reused
                raise
            except ConnectionResetError:
                # a pooled connection the server had closed: retry once on a fresh one (nothing was received)
                if attempt == 0 and not p.buf:
                    continue
                raise
            return Response(self, p)
        raise HTTPError("unreachable")

    async def close(self) -> None:
        for p in self._idle:
            if p.transport is not None:
                p.transport.close()
        self._idle.clear()
