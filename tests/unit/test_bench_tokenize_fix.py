"""Issue 37 item 2: after the head's API was killed during 07, the step's terminal line said "the server must serve
POST /tokenize (vLLM does)" -- a missing endpoint -- while nothing answered at all. A server that does not answer and
one that answers 404 now get different fixes (real sockets on loopback, no double)."""
from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from runbook.benchmark.client import ServerAPI
from runbook.errors import BenchError


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]          # closed again: connections are refused


def test_a_server_that_does_not_answer_is_named_gone_not_missing_an_endpoint():
    api = ServerAPI(f"http://127.0.0.1:{_closed_port()}", "tiny")
    try:
        with pytest.raises(BenchError) as ei:
            asyncio.run(api.tokenize("hello", timeout=5))
    finally:
        api.close()
    text = str(ei.value)
    assert "does not answer" in text and "runbook status" in text and "must serve POST /tokenize" not in text


class _NoTokenize(BaseHTTPRequestHandler):
    def do_POST(self):                     # noqa: N802 - http.server's name
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        body = b'{"detail": "Not Found"}'
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_without_tokenize_is_told_it_must_serve_it():
    server = HTTPServer(("127.0.0.1", 0), _NoTokenize)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api = ServerAPI(f"http://127.0.0.1:{server.server_address[1]}", "tiny")
    try:
        with pytest.raises(BenchError) as ei:
            asyncio.run(api.tokenize("hello", timeout=5))
    finally:
        api.close()
        server.shutdown()
        server.server_close()
    assert "must serve POST /tokenize" in str(ei.value) and "404" in str(ei.value)
