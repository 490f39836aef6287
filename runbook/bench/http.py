"""A minimal asyncio HTTP/1.1 client for the streaming requests (keep-alive pool, chunked decoding).

Why not aiohttp for generation requests: measured on the loaded lab box, aiohttp's request
construction put 1-6 ms (up to 18 ms with 4 streams released together) between the client's send
stamp and the server seeing the request line, i.e. straight into TTFT; and one coroutine wake-up per
SSE event limited a single core to a few thousand events/s. Here a pre-encoded request is written to
a pooled socket, and the response is decoded inside ``Protocol.data_received`` -- synchronously, once
per socket read: chunked transfer-encoding, Content-Length, or read-to-close -- and handed to a
callback together with the read's timestamp (``time.perf_counter``). TLS via ``ssl``. No proxies,
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


class HTTPError(Exception):
    pass


class _Proto(asyncio.Protocol):
    """One connection; one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.state = "idle"           # idle | head | body | done
        self.closed = False
        self.mode = ""                # chunked | length | eof
        self.left = 0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.on_body: BodyCallback | None = None
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
            if self.buf and self.on_body:
                self.on_body(bytes(self.buf), clock())
                self.buf.clear()
            self._finish()
        elif self.state in ("head", "body"):
            self._fail(ConnectionResetError("connection closed by server"))

    # request lifecycle
    def start(self, on_body: BodyCallback | None) -> None:
        loop = asyncio.get_running_loop()
        self.buf.clear()
        self.state, self.mode, self.left, self.on_body = "head", "", 0, on_body
        self.head_fut, self.done_fut = loop.create_future(), loop.create_future()

    def _fail(self, exc: Exception) -> None:
        self.state = "done"
        self.closed = True
        for f in (self.head_fut, self.done_fut):
            if f is not None and not f.done():
                f.set_exception(exc)
        if self.done_fut is not None and self.done_fut.done():
            self.done_fut.exception()           # mark retrieved: the caller may only await head_fut
        if self.transport is not None:
            self.transport.close()

    def _finish(self) -> None:
        self.state = "done"
        if self.done_fut is not None and not self.done_fut.done():
            self.done_fut.set_result(True)

    def _process(self, t: float) -> None:
        buf = self.buf
        if self.state == "head":
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                return
            lines = bytes(buf[:i]).decode("latin-1").split("\r\n")
            del buf[:i + 4]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/"):
                raise HTTPError(f"bad status line {lines[0]!r}")
            self.status = int(parts[1])
            hdrs: dict[str, str] = {}
            for ln in lines[1:]:
                k, sep, v = ln.partition(":")
                if sep:
                    hdrs[k.strip().lower()] = v.strip()
            self.headers = hdrs
            if "chunked" in hdrs.get("transfer-encoding", "").lower():
                self.mode = "chunked"
            elif "content-length" in hdrs:
                self.mode, self.left = "length", int(hdrs["content-length"])
            else:
                self.mode = "eof"
            self.state = "body"
            if self.head_fut is not None and not self.head_fut.done():
                self.head_fut.set_result(True)
            if self.mode == "length" and self.left == 0:
                self._finish()
                return
        if self.state != "body":
            return
        if self.mode == "chunked":
            out = []
            while True:
                j = buf.find(b"\r\n")
                if j < 0:
                    break
                size = int(bytes(buf[:j]).split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:                       # "0\r\n\r\n" (no trailers expected)
                    if len(buf) < j + 4:
                        break
                    del buf[:]
                    if out and self.on_body:
                        self.on_body(b"".join(out), t)
                    self._finish()
                    return
                if len(buf) < j + 2 + size + 2:
                    break
                out.append(bytes(buf[j + 2:j + 2 + size]))
                del buf[:j + 2 + size + 2]
            if out and self.on_body:
                self.on_body(b"".join(out), t)
        elif self.mode == "length":
            take = bytes(buf[:self.left])
            del buf[:len(take)]
            self.left -= len(take)
            if take and self.on_body:
                self.on_body(take, t)
            if self.left <= 0:
                self._finish()
        else:
            if buf and self.on_body:
                self.on_body(bytes(buf), t)
            buf.clear()


class Response:
    def __init__(self, client: RawHTTP, proto: _Proto):
        self._client, self._proto = client, proto
        self.status, self.headers = proto.status, proto.headers

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
        self._idle: list[_Proto] = []
        self._ssl = _ssl.create_default_context() if self.https else None

    async def _connect(self) -> _Proto:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(_Proto, self.host, self.port, ssl=self._ssl)
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

    def _take(self) -> _Proto | None:
        while self._idle:
            p = self._idle.pop()
            if not p.closed:
                return p
        return None

    async def send(self, raw: bytes, on_body: BodyCallback | None,
                   on_sent: Callable[[], None] | None = None) -> Response:
        """Write a pre-encoded request and wait for the response head; the body is then delivered
        to ``on_body(bytes, t_read)`` as it arrives (``Response.wait()`` for the end). ``on_sent`` is
        called immediately before the bytes are written (the send stamp)."""
        for attempt in (0, 1):
            p = self._take() if attempt == 0 else None
            if p is None:
                p = await self._connect()
            p.start(on_body)
            if on_sent:
                on_sent()
            assert p.transport is not None
            p.transport.write(raw)
            try:
                assert p.head_fut is not None
                await p.head_fut
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
