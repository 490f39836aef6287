"""A request that times out ends quietly: no ``CancelledError`` traceback from the event loop (issue 25).

The client's timeout cancels the future it awaits; closing the connection then ran ``exception()`` on that
cancelled future inside ``connection_lost``, and asyncio printed the CancelledError as an unhandled callback
error. Driven for real: a local server that answers the head and then stalls (or never answers)."""
from __future__ import annotations

import asyncio

import pytest

from runbook.bench.http import HttpProtocol, RawHTTP


async def _stalling_server(send_head: bool, release: asyncio.Event):
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        if send_head:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n")
            await writer.drain()
        await release.wait()                  # stalls until the test ends: the client must time out
        writer.close()
    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("send_head", [True, False], ids=["stalls-in-body", "stalls-before-head"])
def test_a_timed_out_request_leaves_no_event_loop_error(send_head):
    errors: list[dict] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
        release = asyncio.Event()
        server = await _stalling_server(send_head, release)
        port = server.sockets[0].getsockname()[1]
        http = RawHTTP(f"http://127.0.0.1:{port}")
        resp = None
        got: list[bytes] = []
        with pytest.raises(TimeoutError):
            try:
                async with asyncio.timeout(0.3):
                    resp = await http.send(http.request_bytes("POST", "/v1/completions", b"{}"),
                                           lambda b, t: got.append(b))
                    await resp.wait()
            finally:
                if resp is not None:
                    resp.abort()              # what bench.client does after a timeout
        await asyncio.sleep(0.2)              # let connection_lost run
        await http.close()
        release.set()
        await asyncio.sleep(0.05)
        server.close()
        await server.wait_closed()
        assert got == ([b"data:"] if send_head else [])

    asyncio.run(main())
    assert errors == [], [repr(e) for e in errors]


def test_fail_after_a_cancelled_wait_does_not_raise():
    """The unit form: the awaited future was cancelled, then the connection drops."""
    async def main() -> None:
        p = HttpProtocol()
        p.start(None)
        p.state = "body"
        p.done_fut.cancel()
        p.connection_lost(None)               # raised CancelledError before the fix
        assert p.head_fut.exception().__class__ is ConnectionResetError

    asyncio.run(main())
